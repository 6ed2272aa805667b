#include "trainer/lora_setup.hpp"

#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kernels/weight_format.hpp"
#include "model/lora.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/session.hpp"

namespace rp {

namespace {

// Base group g of `layout` from the loaded tensors (which are erased as they are used): fp32
// for a trainable group, the storage form for a frozen one.
void take_base_group(LoadedModel& base, const ModelLayout& layout, size_t g, RunWeights& out) {
  const ParamGroup& grp = layout.groups[g];
  std::vector<float> f32;
  std::vector<uint8_t> st;
  if (grp.frozen) st.resize(size_t(grp.storage_bytes));
  else f32.resize(size_t(grp.numel));
  for (const TensorSpec& t : grp.tensors) {
    std::string name = t.name;
    if (name == "lm_head.weight" && !base.tensors.count(name) && layout.config.tie_word_embeddings)
      name = "model.embed_tokens.weight";
    auto it = base.tensors.find(name);
    if (it == base.tensors.end())
      throw std::runtime_error(fmt::format("{}: tensor '{}' missing for the LoRA base", base.source, t.name));
    if (it->second.numel() != t.numel())
      throw std::runtime_error(fmt::format("{}: tensor '{}' has {} values, the model config says {}",
                                           base.source, t.name, it->second.numel(), t.numel()));
    if (grp.frozen) quantize_weights(t.format, it->second.data.data(), st.data() + t.byte_offset, t.numel());
    else std::copy(it->second.data.begin(), it->second.data.end(), f32.begin() + t.offset);
    base.tensors.erase(it);  // each tensor belongs to one group: the fp32 copy goes as it is used
  }
  out.trainable[g] = std::move(f32);
  out.frozen[g] = std::move(st);
}

}  // namespace

RunWeights lora_run_weights(const TrainSpec& spec, LoadedModel& base, const std::string& adapter_dir) {
  std::optional<PeftAdapter> adapter;
  if (!adapter_dir.empty()) adapter = read_peft_adapter(adapter_dir);
  LoraConfig lora;
  if (spec.lora) {
    lora = *spec.lora;
  } else {
    lora = adapter->lora;
    lora.seed = spec.seed;
  }
  if (adapter && peft_adapter_unties(*adapter, base.config)) {
    spdlog::info("{}: the adapter trains one end of the tied embeddings alone; the base is untied",
                 adapter_dir);
    untie_embeddings(base);
  }
  RunWeights w;
  w.layout = make_layout(base.config, lora);
  const size_t G = w.layout.groups.size();
  w.trainable.assign(G, {});
  w.frozen.assign(G, {});
  const size_t n_base = size_t(w.layout.num_layers());
  for (size_t g = 0; g < n_base; ++g) take_base_group(base, w.layout, g, w);
  base.tensors.clear();
  for (size_t g = n_base; g < G; ++g) w.trainable[g] = lora_initial_group(w.layout, int(g));
  if (adapter) {
    load_peft_adapter(*adapter, w.layout, w.trainable);
    spdlog::info("adapter {}: r {}, alpha {:g}, {} target modules, {} expert parameters", adapter_dir, lora.r,
                 lora.alpha, lora.target_modules.size(), lora.target_parameters.size());
  }
  int64_t frozen_bytes = 0, trainable = 0;
  for (const auto& g : w.layout.groups) g.frozen ? frozen_bytes += g.storage_bytes : trainable += g.numel;
  spdlog::info(
      "LoRA r {} (alpha {:g}{}), base weights frozen in {} ({:.1f} MB), {:.2f} M trainable parameters",
      lora.r, lora.alpha, lora.use_rslora ? ", rsLoRA" : "", weight_format_name(lora.base_format),
      double(frozen_bytes) / 1e6, double(trainable) / 1e6);
  return w;
}

std::vector<std::vector<float>> all_group_weights(const Session& session) {
  std::vector<std::vector<float>> out;
  for (size_t g = 0; g < session.layout().groups.size(); ++g)
    out.push_back(session.group_weights_f32(int(g)));
  return out;
}

PlainModel merged_model(const Session& session) {
  const std::vector<std::vector<float>> all = all_group_weights(session);
  std::vector<const float*> ptrs;
  for (const auto& g : all) ptrs.push_back(g.data());
  MergedWeights m = merge_adapters(session.layout(), ptrs);
  return PlainModel{std::move(m.layout), std::move(m.groups)};
}

}  // namespace rp
