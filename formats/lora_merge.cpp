// Folding LoRA adapters into the base weights (roundpipe/adapter.hpp): from the runtime's
// parameter groups (merge_adapters) and from a PEFT adapter folder onto a loaded base model
// (merge_peft_adapter).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "formats/checkpoint.hpp"
#include "formats/format_fail.hpp"
#include "formats/peft_experts.hpp"
#include "formats/phi3_hf.hpp"
#include "model/error_text.hpp"
#include "model/lora.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/model_source.hpp"

namespace rp {

namespace fs = std::filesystem;

namespace {

constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr const char* kLmHead = "lm_head.weight";
constexpr const char* kSuffixA = ".lora_A.weight";
constexpr const char* kSuffixB = ".lora_B.weight";

/// "model.layers.0.self_attn.q_proj" of "model.layers.0.self_attn.q_proj.lora_A.weight".
std::string module_of(const std::string& a_name) {
  return a_name.substr(0, a_name.size() - std::strlen(kSuffixA));
}

bool is_expert_tensor(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

/// Folds the expert adapters of sparse decoder `decoder` (model/lora.hpp expert_lora_tensors):
/// W_e += s B_e A_e for every expert e of each targeted projection. `adapter(name, shape)` is
/// an adapter tensor's values, `weight(name, out, in)` the base matrix of one expert
/// ("model.layers.<i>.mlp.experts.<e>.<gate|up|down>_proj.weight"; null: not held now, skipped).
void fold_experts(const LoraConfig& l, const ModelConfig& c, int64_t decoder, double s,
                  const std::function<const float*(const std::string&, const std::vector<int64_t>&)>& adapter,
                  const std::function<float*(const std::string&, int64_t, int64_t)>& weight) {
  if (!c.is_moe_layer(decoder)) return;
  for (int p = 0; p < kExpertProjs; ++p) {
    if (!lora_targets_experts(l, ExpertProj(p))) continue;
    const auto specs = expert_lora_tensors(c, decoder, ExpertProj(p), l.r);
    const float* a = adapter(specs[0].first, specs[0].second);
    const int64_t r = l.r, in = specs[0].second[2];
    for (size_t k = 1; k < specs.size(); ++k) {
      const char* proj = p == int(ExpertProj::down) ? "down_proj" : k == 1 ? "gate_proj" : "up_proj";
      const float* b = adapter(specs[k].first, specs[k].second);
      const int64_t out = specs[k].second[1];
      for (int64_t e = 0; e < c.num_experts; ++e)
        if (float* w =
                weight(fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", decoder, e, proj), out, in))
          fold_lora(w, a + e * r * in, b + e * out * r, out, in, r, s);
    }
  }
}

}  // namespace

void fold_lora(float* w, const float* a, const float* b, int64_t out, int64_t in, int64_t r, double scaling) {
  std::vector<double> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t k = 0; k < r; ++k) {
      const double bk = double(b[o * r + k]);
      const float* ak = a + k * in;
      for (int64_t i = 0; i < in; ++i) row[size_t(i)] += bk * double(ak[i]);
    }
    float* wo = w + o * in;
    for (int64_t i = 0; i < in; ++i) wo[i] = float(double(wo[i]) + scaling * row[size_t(i)]);
  }
}

void fold_decoder_adapters(const ModelLayout& layout, int l, const float* adapters, const ParamGroup& base,
                           float* base_data) {
  const double s = layout.lora->scaling();
  const int ga = layout.adapter_group(l);
  const ParamGroup& ad = layout.groups.at(size_t(ga));
  fold_experts(
      *layout.lora, layout.config, l - 1, s,
      [&](const std::string& name, const std::vector<int64_t>&) {
        const int i = ad.find(name);
        if (i < 0)
          throw std::invalid_argument(fmt::format("merge_adapters: group '{}' lacks '{}'", ad.name, name));
        return adapters + ad.tensors[size_t(i)].offset;
      },
      [&](const std::string& name, int64_t out, int64_t in) {
        const int i = base.find(name);
        if (i < 0 || base.tensors[size_t(i)].shape != std::vector<int64_t>{out, in})
          throw std::invalid_argument(
              fmt::format("merge_adapters: group '{}' lacks '{}' [{}, {}]", base.name, name, out, in));
        return base_data + base.tensors[size_t(i)].offset;
      });
  for (const TensorSpec& ta : ad.tensors) {
    if (!ta.name.ends_with(kSuffixA) || is_expert_tensor(ta.name)) continue;
    const std::string mod = module_of(ta.name);
    const int ib = ad.find(mod + kSuffixB), iw = base.find(mod + ".weight");
    if (ib < 0 || iw < 0)
      throw std::invalid_argument(
          fmt::format("merge_adapters: group '{}': '{}' has no lora_B or base weight", ad.name, ta.name));
    const TensorSpec& tb = ad.tensors[size_t(ib)];
    const TensorSpec& tw = base.tensors[size_t(iw)];
    const int64_t r = ta.shape.at(0), in = ta.shape.at(1), out = tb.shape.at(0);
    if (tw.shape != std::vector<int64_t>{out, in} || tb.shape.at(1) != r)
      throw std::invalid_argument(fmt::format("merge_adapters: '{}': shapes [{}], [{}] do not fit [{}]", mod,
                                              fmt::join(ta.shape, ", "), fmt::join(tb.shape, ", "),
                                              fmt::join(tw.shape, ", ")));
    fold_lora(base_data + tw.offset, adapters + ta.offset, adapters + tb.offset, out, in, r, s);
  }
}

MergedWeights merge_adapters(const ModelLayout& layout, const std::vector<const float*>& group_data) {
  if (!layout.lora) throw std::invalid_argument("merge_adapters: the layout has no LoRA adapters");
  if (group_data.size() != layout.groups.size())
    throw std::invalid_argument(fmt::format("merge_adapters: {} group buffers for {} groups",
                                            group_data.size(), layout.groups.size()));
  MergedWeights m;
  m.layout = make_layout(layout.config);
  m.groups.resize(m.layout.groups.size());
  for (size_t g = 0; g < m.layout.groups.size(); ++g) {
    const ParamGroup& dst = m.layout.groups[g];
    const ParamGroup& src = layout.groups[g];
    if (!group_data[g])
      throw std::invalid_argument(fmt::format("merge_adapters: no data for group '{}'", src.name));
    m.groups[g].assign(size_t(dst.numel), 0.0f);
    for (const TensorSpec& t : dst.tensors) {
      const int i = src.find(t.name);
      if (i < 0 || src.tensors[size_t(i)].numel() != t.numel())
        throw std::invalid_argument(
            fmt::format("merge_adapters: group '{}' lacks tensor '{}'", src.name, t.name));
      std::memcpy(m.groups[g].data() + t.offset, group_data[g] + src.tensors[size_t(i)].offset,
                  size_t(t.numel()) * sizeof(float));
    }
  }
  for (int l = 1; l <= int(layout.config.num_hidden_layers); ++l) {
    const int ga = layout.adapter_group(l);
    if (!group_data[size_t(ga)])
      throw std::invalid_argument(
          fmt::format("merge_adapters: no data for group '{}'", layout.groups.at(size_t(ga)).name));
    fold_decoder_adapters(layout, l, group_data[size_t(ga)], m.layout.groups[size_t(l)],
                          m.groups[size_t(l)].data());
  }
  return m;
}

void save_merged_checkpoint(const std::string& dir, const ModelLayout& layout,
                            const std::vector<const float*>& group_data, const nlohmann::json& tokenizer_json,
                            const std::string& chat_template, DType dtype) {
  const MergedWeights m = merge_adapters(layout, group_data);
  std::vector<const float*> ptrs;
  for (const auto& g : m.groups) ptrs.push_back(g.data());
  save_hf_checkpoint(dir, m.layout, ptrs, tokenizer_json, chat_template, dtype);
}

namespace {

/// The base model a PEFT adapter folds into: `shape` of each of its tensors (nullopt: no such
/// tensor), `data` of those held now (null: not held, its fold is skipped after the checks).
struct FoldTarget {
  std::function<std::optional<std::vector<int64_t>>(const std::string&)> shape;
  std::function<float*(const std::string&)> data;
};

/// A PEFT adapter as the fold reads it onto a base `c` from `source`: checked against the base's
/// kind, GPT-OSS's gate/up expert adapters regrouped, Phi-3's fused ones split into their parts.
struct PreparedAdapter {
  PreparedAdapter(const ModelConfig& c, const std::string& source, const PeftAdapter& adapter)
      : a(adapter), st_path((fs::path(a.dir) / kAdapterWeightsFile).string()) {
    try {  // expert adapters on a dense base: refused, as a training run on the pair is
      check_lora_expert_targets(c, a.lora);
    } catch (const std::invalid_argument& e) {
      format_fail(a.dir, fmt::format("{} (base {})", e.what(), source));
    }
    regrouped = gpt_oss_gate_up(a.tensors, c);
    parts = split_fused_adapters(a.tensors, c, a.lora.r, st_path);  // Phi-3 (formats/phi3_hf.hpp)
  }
  const PeftAdapter& a;
  const std::string st_path;
  std::map<std::string, HostTensor> regrouped, parts;
};

/// W += scaling B A for every adapter of `p` (and its modules_to_save copied over) into the base
/// tensors `t` holds, every adapter checked against the base's shapes whether held or not; the
/// base is `c` read from `source` (for errors), already untied when the adapter unties it.
void fold_peft_adapter(const ModelConfig& c, const std::string& source, const PreparedAdapter& p,
                       const FoldTarget& t) {
  const PeftAdapter& a = p.a;
  const std::string& st_path = p.st_path;
  const std::map<std::string, HostTensor>&regrouped = p.regrouped, &parts = p.parts;
  const double s = a.lora.scaling();
  for (int64_t i = 0; i < c.num_hidden_layers && lora_has_expert_targets(a.lora); ++i)
    fold_experts(
        a.lora, c, i, s,
        [&](const std::string& name, const std::vector<int64_t>& shape) {
          const HostTensor* at = nullptr;
          if (const auto it = regrouped.find(name); it != regrouped.end()) at = &it->second;
          else if (const auto jt = a.tensors.find(name); jt != a.tensors.end()) at = &jt->second;
          if (!at || at->shape != shape)
            format_fail(st_path, fmt::format("the experts' adapter '{}' [{}]: missing or of another shape",
                                             name, fmt::join(shape, ", ")));
          return at->data.data();
        },
        [&](const std::string& name, int64_t out, int64_t in) {
          if (t.shape(name) != std::vector<int64_t>{out, in})
            format_fail(st_path,
                        fmt::format("the base model {} has no '{}' [{}, {}]", source, name, out, in));
          return t.data(name);
        });
  for (const auto& [name, ta] : parts) {
    // lora_B (with its A), modules_to_save tensors, the experts' (above)
    if (!name.ends_with(kSuffixA) || is_expert_tensor(name)) continue;
    const std::string mod = module_of(name);
    const auto ib = parts.find(mod + kSuffixB);
    if (ib == parts.end())
      format_fail(st_path, fmt::format("key '{}': missing (the pair of '{}')",
                                       peft_tensor_key(mod + kSuffixB), peft_tensor_key(name)));
    const HostTensor& tb = ib->second;
    const std::optional<std::vector<int64_t>> ws = t.shape(mod + ".weight");
    if (!ws)
      format_fail(st_path, fmt::format("key '{}': the base model {} has no '{}.weight'",
                                       peft_tensor_key(name), source, mod));
    const int64_t r = a.lora.r;
    if (ws->size() != 2 || ta.shape != std::vector<int64_t>{r, (*ws)[1]})
      format_fail(st_path, fmt::format("key '{}': expected shape [{}, {}], got [{}]", peft_tensor_key(name),
                                       r, ws->size() == 2 ? (*ws)[1] : -1, fmt::join(ta.shape, ", ")));
    if (tb.shape != std::vector<int64_t>{(*ws)[0], r})
      format_fail(st_path,
                  fmt::format("key '{}': expected shape [{}, {}], got [{}]", peft_tensor_key(mod + kSuffixB),
                              (*ws)[0], r, fmt::join(tb.shape, ", ")));
    if (float* w = t.data(mod + ".weight"))
      fold_lora(w, ta.data.data(), tb.data.data(), (*ws)[0], (*ws)[1], r, s);
  }
  for (const auto& [name, tb] : a.tensors)
    if (name.ends_with(kSuffixB) && !is_expert_tensor(name) &&
        !a.tensors.count(name.substr(0, name.size() - std::strlen(kSuffixB)) + kSuffixA))
      format_fail(st_path, fmt::format("key '{}': its lora_A is missing", peft_tensor_key(name)));
  for (const char* name : {kEmbed, kLmHead, "model.norm.weight"}) {
    const auto it = a.tensors.find(name);
    if (it == a.tensors.end()) continue;
    // tied (not untied above): the one matrix of both ends
    const std::string dst = c.tie_word_embeddings && std::string(name) == kLmHead ? kEmbed : name;
    const std::optional<std::vector<int64_t>> ds = t.shape(dst);
    if (ds != it->second.shape)
      format_fail(st_path, fmt::format("key '{}': expected shape [{}] of the base model's '{}', got [{}]",
                                       peft_tensor_key(name),
                                       ds ? fmt::format("{}", fmt::join(*ds, ", ")) : std::string("?"), dst,
                                       fmt::join(it->second.shape, ", ")));
    if (float* w = t.data(dst)) std::copy(it->second.data.begin(), it->second.data.end(), w);
  }
}

}  // namespace

void merge_peft_adapter(LoadedModel& m, const PeftAdapter& a) {
  if (peft_adapter_unties(a, m.config)) untie_embeddings(m);
  const FoldTarget whole{[&](const std::string& name) -> std::optional<std::vector<int64_t>> {
                           const auto it = m.tensors.find(name);
                           if (it == m.tensors.end()) return std::nullopt;
                           return it->second.shape;
                         },
                         [&](const std::string& name) { return m.tensors.at(name).data.data(); }};
  fold_peft_adapter(m.config, m.source, PreparedAdapter(m.config, m.source, a), whole);
}

namespace {

/// The base model of adapter `a` read from `adapter_dir`: `base` when given, else the local file
/// its run recorded, else its base_model_name_or_path (as given or relative to the folder).
std::string adapter_base_model(const std::string& adapter_dir, const PeftAdapter& a,
                               const std::string& base) {
  std::string path = base;
  if (path.empty()) {
    const std::string cfg = (fs::path(adapter_dir) / kAdapterConfigFile).string();
    if (a.base_model_name_or_path.empty())
      format_fail(cfg,
                  "key 'base_model_name_or_path': expected the base model, got nothing; pass the base model "
                  "explicitly "
                  "(--base of roundpipe generate / merge / export-gguf)");
    std::error_code ec;
    path = a.base_model_name_or_path;
    // a run's adapter names a portable model id; the local file it trained on is recorded beside it
    if (const std::string local = adapter_base_path(adapter_dir); !local.empty() && fs::exists(local, ec))
      path = local;
    if (!fs::exists(path, ec) && fs::path(path).is_relative() && fs::exists(fs::path(adapter_dir) / path, ec))
      path = (fs::path(adapter_dir) / path).lexically_normal().string();
    if (!fs::exists(path, ec))
      format_fail(
          cfg,
          fmt::format(
              "key 'base_model_name_or_path': '{}' is not a local model (a .gguf file or a Hugging Face "
              "folder, as given or relative to the adapter folder{}); pass the base model explicitly (--base "
              "of roundpipe generate / merge / export-gguf)",
              a.base_model_name_or_path,
              adapter_base_path(adapter_dir).empty()
                  ? std::string()
                  : fmt::format(", nor is {}'s '{}'", kAdapterBaseFile, adapter_base_path(adapter_dir))));
  }
  return path;
}

}  // namespace

LoadedModel load_merged_adapter(const std::string& adapter_dir, const std::string& base,
                                std::string* base_path) {
  const PeftAdapter a = read_peft_adapter(adapter_dir);
  const std::string path = adapter_base_model(adapter_dir, a, base);
  LoadedModel m = load_model(path);
  merge_peft_adapter(m, a);
  if (base_path) *base_path = path;
  return m;
}

namespace {

/// Whether `path` is a PEFT adapter folder (it holds adapter_config.json); a `base` given for
/// anything else is refused.
bool is_adapter_folder(const std::string& path, const std::string& base) {
  std::error_code ec;
  if (fs::is_directory(path, ec) && fs::exists(fs::path(path) / kAdapterConfigFile, ec)) return true;
  if (!base.empty())
    throw std::invalid_argument(
        fmt::format("--base: only for a LoRA adapter folder; {} has no {}", path, kAdapterConfigFile));
  return false;
}

}  // namespace

LoadedModel load_model_or_adapter(const std::string& path, const std::string& base) {
  return is_adapter_folder(path, base) ? load_merged_adapter(path, base, nullptr) : load_model(path);
}

ModelSource open_model_or_adapter(const std::string& path, const std::string& base) {
  return is_adapter_folder(path, base) ? ModelSource::from_loaded(load_merged_adapter(path, base, nullptr))
                                       : ModelSource::open(path);
}

std::string merge_peft_folder(const std::string& adapter_dir, const std::string& out_dir,
                              const std::string& base, DType dtype) {
  check_model_output_folder(out_dir, {adapter_dir, base});
  const PeftAdapter a = read_peft_adapter(adapter_dir);
  const std::string path = adapter_base_model(adapter_dir, a, base);
  check_model_output_folder(out_dir, {path});  // the base named by the adapter, now resolved
  ModelSource src = ModelSource::open(path);
  if (peft_adapter_unties(a, src.config())) src.untie_embeddings();
  const ModelConfig& c = src.config();
  const ModelLayout layout = make_layout(c);
  std::map<std::string, std::pair<size_t, const TensorSpec*>> where;  // each tensor's group and place
  for (size_t g = 0; g < layout.groups.size(); ++g)
    for (const TensorSpec& t : layout.groups[g].tensors) where[t.name] = {g, &t};
  const auto shape = [&](const std::string& name) -> std::optional<std::vector<int64_t>> {
    const auto it = where.find(name);
    if (it == where.end()) return std::nullopt;
    return it->second.second->shape;
  };
  // every check first, nothing held: a refused adapter writes nothing
  const PreparedAdapter prepared(c, src.header().source, a);
  fold_peft_adapter(c, src.header().source, prepared,
                    {shape, [](const std::string&) -> float* { return nullptr; }});
  std::vector<float> group;
  size_t held = 0;
  const FoldTarget part{shape, [&](const std::string& name) -> float* {
                          const auto it = where.find(name);
                          if (it == where.end() || it->second.first != held) return nullptr;
                          return group.data() + it->second.second->offset;
                        }};
  const GroupReader read = [&](size_t g) {  // one group of the base at a time, the adapter folded in
    std::vector<float>().swap(group);
    group.resize(size_t(layout.groups.at(g).numel));
    read_model_group(src, layout, int(g), group);
    held = g;
    fold_peft_adapter(c, src.header().source, prepared, part);
    return group.data();
  };
  save_model_folder(out_dir, layout, read, src.header().tokenizer_json, src.header().chat_template, dtype,
                    "merge");
  return path;
}

}  // namespace rp
