#include "trainer/lora_setup.hpp"

#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "base/host_resources.hpp"
#include "kernels/weight_format.hpp"
#include "model/lora.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/session.hpp"

namespace rp {

namespace {

/// The host memory the run's weights take: frozen groups in their storage form, fp32 for the
/// trainable ones (the optimizer's moments come on top, sized by the Session).
void check_host_memory(const ModelLayout& layout, const std::string& where, bool frozen_on_disk) {
  double need = 0;
  for (const auto& g : layout.groups)
    need += g.frozen ? (frozen_on_disk ? 0.0 : double(g.storage_bytes)) : 4.0 * double(g.numel);
  const size_t avail = host_available_bytes();
  if (avail > 0 && !(need <= double(avail)))
    throw std::runtime_error(fmt::format(
        "{}: the LoRA run's weights (frozen base in {}) need about {} of host "
        "memory, {} is available",
        where, weight_format_name(layout.lora->base_format), byte_text(need), byte_text(double(avail))));
}

}  // namespace

WeightFormat base_format_of_model(const ModelSource& base, std::string& why) {
  std::optional<WeightFormat> common;
  bool mixed = false;
  for (const ParamGroup& g : make_layout(base.config()).groups)
    for (const TensorSpec& t : g.tensors) {
      if (t.shape.size() < 2) continue;  // 1-D weights stay f32 in any base_format
      const std::string name = t.name == "lm_head.weight" && base.config().tie_word_embeddings
                                   ? "model.embed_tokens.weight"
                                   : t.name;
      const std::optional<WeightFormat> f = base.float_format(name);
      if (!f || (common && *common != *f)) mixed = true;
      if (f && !common) common = f;
    }
  if (common && !mixed) {
    why = fmt::format(
        "the base's own {} (base_format follows a f32, f16 or bf16 base unless lora.base_format is set)",
        weight_format_name(*common));
    return *common;
  }
  why =
      "bf16: the base's matrices are not all f32, f16 or bf16 (base_format follows only such a base; "
      "lora.base_format sets it)";
  return WeightFormat::bf16;
}

RunWeights lora_run_weights(const TrainSpec& spec, ModelSource& base, const std::string& adapter_dir,
                            std::shared_ptr<const ModelSource> lazy) {
  std::optional<PeftAdapter> adapter;
  if (!adapter_dir.empty()) adapter = read_peft_adapter(adapter_dir);
  LoraConfig lora;
  if (spec.lora) {
    lora = *spec.lora;
    // the spec's settings win; a scaling other than the adapter's changes what its weights do
    if (adapter && adapter->lora.scaling() != lora.scaling())
      spdlog::warn(
          "{}: the adapter was trained with lora_alpha {:g}{} (scaling {:g}); {} sets alpha {:g}{} "
          "(scaling {:g}), so its adapters start out with another effect",
          adapter_dir, adapter->lora.alpha, adapter->lora.use_rslora ? ", rsLoRA" : "",
          adapter->lora.scaling(), spec.source, lora.alpha, lora.use_rslora ? ", rsLoRA" : "",
          lora.scaling());
  } else {
    lora = adapter->lora;
    lora.seed = spec.seed;
  }
  if (adapter && peft_adapter_unties(*adapter, base.config())) {
    spdlog::info("{}: the adapter trains one end of the tied embeddings alone; the base is untied",
                 adapter_dir);
    base.untie_embeddings();
  }
  std::string follows;  // the rule's reason when the spec names no base_format
  if (!spec.lora || spec.lora_base_format_from_model) lora.base_format = base_format_of_model(base, follows);
  if (lora.base_format == WeightFormat::mxfp4 && base.config().num_experts == 0) {
    // mxfp4 is the experts' form only (model/layout.cpp): a model without experts is a bf16 base
    spdlog::warn(
        "{}: base_format mxfp4 applies to experts, and this model has none: its weights are frozen in bf16",
        spec.source);
    lora.base_format = WeightFormat::bf16;
  }
  RunWeights w;
  w.layout = make_layout(base.config(), lora);
  const bool later = lazy && lazy.get() == &base && spec.frozen_tier.has_value();
  check_host_memory(w.layout, base.header().source, later);
  const size_t G = w.layout.groups.size();
  const size_t n_base = size_t(w.layout.num_layers());
  // tensor by tensor from the mapped files: peak host memory is the storage form plus one
  // tensor's fp32 copy (with a disk tier, the frozen groups one at a time when the session asks)
  const int64_t as_stored = read_base_groups(base, w.layout, w.trainable, w.frozen, later);
  if (later)
    w.source = FrozenSource{model_files_identity(base.header().source),
                            [lazy, layout = w.layout](int g, std::span<std::byte> out) {
                              read_frozen_group(*lazy, layout, g, out);
                            }};
  spdlog::debug("{}: {} base tensors copied in their file form", base.header().source, as_stored);
  for (size_t g = n_base; g < G; ++g) w.trainable[g] = lora_initial_group(w.layout, int(g));
  if (adapter) {
    load_peft_adapter(*adapter, w.layout, w.trainable);
    spdlog::info("adapter {}: r {}, alpha {:g}, target modules {}{}", adapter_dir, lora.r, lora.alpha,
                 fmt::join(lora.target_modules, ", "),
                 lora.target_parameters.empty()
                     ? std::string()
                     : fmt::format(", expert parameters {}", fmt::join(lora.target_parameters, ", ")));
  }
  int64_t frozen_bytes = 0, trainable = 0;
  for (const auto& g : w.layout.groups) g.frozen ? frozen_bytes += g.storage_bytes : trainable += g.numel;
  std::string form = weight_format_name(lora.base_format);
  if (lora.base_format == WeightFormat::mxfp4) form = "mxfp4 (experts; the other weights bf16)";
  spdlog::info(
      "LoRA r {} (alpha {:g}{}), base weights frozen in {} ({:.1f} MB){}, {:.2f} M trainable parameters",
      lora.r, lora.alpha, lora.use_rslora ? ", rsLoRA" : "", form, double(frozen_bytes) / 1e6,
      follows.empty() ? std::string() : fmt::format(" [{}]", follows), double(trainable) / 1e6);
  return w;
}

std::vector<std::vector<float>> all_group_weights(const Session& session) {
  std::vector<std::vector<float>> out;
  for (size_t g = 0; g < session.layout().groups.size(); ++g)
    out.push_back(session.group_weights_f32(int(g)));
  return out;
}

PlainModel merged_model(const Session& session) {
  // Group by group: the base groups of a LoRA layout hold make_layout(config)'s tensors at the
  // same offsets, so each merged group is the session's fp32 copy of that group with its
  // layer's adapters folded in (fold_lora, as merge_adapters folds them): the peak is the fp32
  // model once plus one group, not twice the model.
  const ModelLayout& lay = session.layout();
  if (!lay.lora) throw std::invalid_argument("merged_model: the session trains no LoRA adapters");
  PlainModel m{make_layout(lay.config), {}};
  m.groups.resize(m.layout.groups.size());
  for (size_t g = 0; g < m.layout.groups.size(); ++g) {
    const ParamGroup& dst = m.layout.groups[g];
    const ParamGroup& src = lay.groups[g];
    for (const TensorSpec& t : dst.tensors) {
      const int i = src.find(t.name);
      if (i < 0 || src.tensors[size_t(i)].offset != t.offset || src.tensors[size_t(i)].shape != t.shape)
        throw std::invalid_argument(
            fmt::format("merged_model: group '{}' holds '{}' elsewhere", src.name, t.name));
    }
    m.groups[g] = session.group_weights_f32(int(g));
    m.groups[g].resize(size_t(dst.numel));
    const int ga = lay.kind(int(g)) == LayerKind::decoder ? lay.adapter_group(int(g)) : -1;
    if (ga < 0) continue;
    const std::vector<float> a = session.group_weights_f32(ga);
    fold_decoder_adapters(lay, int(g), a.data(), dst, m.groups[g].data());
  }
  return m;
}

}  // namespace rp
