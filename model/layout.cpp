#include "model/layout.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string_view>

#include "kernels/weight_format.hpp"

#include <fmt/format.h>

namespace rp {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

int ParamGroup::find(const std::string& tensor_name) const {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == tensor_name) return int(i);
  return -1;
}

int64_t ParamGroup::direct_bytes(DType compute) const {
  WeightFormat f;
  switch (compute) {
    case DType::f32: f = WeightFormat::f32; break;
    case DType::bf16: f = WeightFormat::bf16; break;
    case DType::f16: f = WeightFormat::f16; break;
    default: return 0;
  }
  const auto esz = int64_t(dtype_size(compute));
  const int64_t prefix = numel * esz;
  if (!frozen || storage_bytes < prefix) return 0;
  const bool ok = std::all_of(tensors.begin(), tensors.end(), [&](const TensorSpec& t) {
    return (t.format == f && t.byte_offset == t.offset * esz) || t.byte_offset >= prefix;
  });
  return ok ? prefix : 0;
}

LayerKind ModelLayout::kind(int layer) const {
  if (layer == 0) return LayerKind::embedding;
  if (layer == num_layers() - 1) return LayerKind::tail;
  return LayerKind::decoder;
}

std::vector<int> ModelLayout::groups_of(int layer) const {
  if (layer == num_layers() - 1 && config.tie_word_embeddings) return {layer, 0};
  if (const int a = adapter_group(layer); a >= 0) return {layer, a};  // base first, then its adapters
  return {layer};
}

std::vector<int> ModelLayout::groups_of(const std::vector<int>& layers) const {
  std::vector<int> gs;
  for (int l : layers)
    for (int g : groups_of(l)) gs.push_back(g);
  std::sort(gs.begin(), gs.end());
  gs.erase(std::unique(gs.begin(), gs.end()), gs.end());
  return gs;
}

std::vector<int> ModelLayout::groups_uploaded(const std::vector<int>& layers, bool backward_stage) const {
  std::vector<int> read;
  for (int l : layers)
    if (!backward_stage || kind(l) != LayerKind::embedding) read.push_back(l);
  return groups_of(read);
}

int ModelLayout::adapter_group(int layer) const {
  if (!lora || layer < 1 || layer > int(config.num_hidden_layers)) return -1;
  return int(config.num_hidden_layers) + 1 + layer;
}

double LoraConfig::scaling() const { return use_rslora ? alpha / std::sqrt(double(r)) : alpha / double(r); }

void freeze_group(ModelLayout& m, int g, WeightFormat base) {
  if (g < 0 || size_t(g) >= m.groups.size())
    throw std::out_of_range(fmt::format("freeze_group: group {} outside [0, {})", g, m.groups.size()));
  ParamGroup& grp = m.groups[size_t(g)];
  const int64_t block = weight_format_block(base);
  // a router (mlp.gate.weight) decides which experts run: it keeps 16 bits when the base is
  // quantized, as bitsandbytes' QLoRA leaves Qwen3-MoE's router unquantized
  const bool quantized = base != WeightFormat::f32 && base != WeightFormat::bf16 && base != WeightFormat::f16;
  auto is_router = [](const std::string& n) {
    auto ends = [&](const char* suf) {
      const size_t k = std::char_traits<char>::length(suf);
      return n.size() >= k && n.compare(n.size() - k, k, suf) == 0;
    };
    return ends("mlp.gate.weight") || ends("mlp.router.weight");  // Qwen3-MoE / GPT-OSS
  };
  // mxfp4 is the experts' format (GPT-OSS checkpoints ship them so, and an expert dequantized
  // from such a checkpoint re-encodes to the same codes): the other matrices stay bf16, as the
  // checkpoint's attention, router and embeddings do
  auto is_expert = [](const std::string& n) { return n.find(".mlp.experts.") != std::string::npos; };
  for (TensorSpec& t : grp.tensors) {
    t.format = t.shape.size() == 2 && t.numel() % block == 0 ? base : WeightFormat::f32;
    if (quantized && t.format == base && is_router(t.name)) t.format = WeightFormat::bf16;
    if (base == WeightFormat::mxfp4 && t.format == base && !is_expert(t.name)) t.format = WeightFormat::bf16;
  }
  // a plain 16-bit base: its compute copy first, the f32 tensors after it
  const bool plain16 = base == WeightFormat::bf16 || base == WeightFormat::f16;
  int64_t bytes = plain16 ? grp.numel * 2 : 0;
  for (TensorSpec& t : grp.tensors) {
    if (plain16 && t.format == base) {
      t.byte_offset = t.offset * 2;
      continue;
    }
    t.byte_offset = bytes;
    bytes += int64_t(weight_format_bytes(t.format, t.numel(), weight_format_cols(t.shape)));
  }
  grp.frozen = true;
  grp.storage_bytes = bytes;
}

int64_t ModelLayout::total_numel() const {
  int64_t n = 0;
  for (auto& g : groups) n += g.numel;
  return n;
}

namespace {
void add(ParamGroup& g, std::string name, std::vector<int64_t> shape) {
  TensorSpec t{std::move(name), std::move(shape), g.numel};
  g.numel += t.numel();
  g.tensors.push_back(std::move(t));
}
}  // namespace

ModelLayout make_layout(const ModelConfig& c) {
  c.validate();
  ModelLayout m;
  m.config = c;
  const int64_t H = c.hidden_size, V = c.vocab_size, F = c.intermediate_size, D = c.head_dim;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  ParamGroup emb{"embed", {}, 0};
  add(emb, "model.embed_tokens.weight", {V, H});
  m.groups.push_back(std::move(emb));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    ParamGroup g{fmt::format("layer.{}", i), {}, 0};
    const std::string p = fmt::format("model.layers.{}.", i);
    // Order within a decoder group (the layer kernels rely on it via find()):
    if (!c.post_norms) add(g, p + "input_layernorm.weight", {H});  // OLMo 2: none
    // a projection's bias (GPT-OSS: all four; Qwen2: q, k, v) follows its weight
    auto linear = [&](const char* name, int64_t out, int64_t in) {
      add(g, fmt::format("{}self_attn.{}.weight", p, name), {out, in});
      const bool biased = std::string_view(name) == "o_proj" ? c.attention_bias : c.has_qkv_bias();
      if (biased) add(g, fmt::format("{}self_attn.{}.bias", p, name), {out});
    };
    linear("q_proj", nq * D, H);
    linear("k_proj", nkv * D, H);
    linear("v_proj", nkv * D, H);
    if (c.qk_norm) {
      add(g, p + "self_attn.q_norm.weight", {c.qk_norm_whole ? nq * D : D});
      add(g, p + "self_attn.k_norm.weight", {c.qk_norm_whole ? nkv * D : D});
    }
    linear("o_proj", H, nq * D);
    if (c.attention_sinks) add(g, p + "self_attn.sinks", {nq});
    add(g, p + "post_attention_layernorm.weight", {H});
    if (c.gemma()) add(g, p + "pre_feedforward_layernorm.weight", {H});  // Gemma's norm before the MLP
    if (c.is_moe_layer(i)) {
      // sparse block: the router, then each projection of every expert, expert by expert, so
      // one projection of all experts is a stacked [E, out, in] tensor (the grouped linears');
      // GPT-OSS: the router's bias, and after the weights each projection's biases stacked
      // [E, out] (HF's interleaved gate_up_proj is split into gate and up by the loader)
      const int64_t E = c.num_experts, Fe = c.moe_intermediate_size;
      const char* router = c.gpt_oss() ? "mlp.router" : "mlp.gate";
      add(g, fmt::format("{}{}.weight", p, router), {E, H});
      if (c.gpt_oss()) add(g, fmt::format("{}{}.bias", p, router), {E});
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
        for (int64_t e = 0; e < E; ++e)
          add(g, fmt::format("{}mlp.experts.{}.{}.weight", p, e, proj),
              proj[0] == 'd' ? std::vector<int64_t>{H, Fe} : std::vector<int64_t>{Fe, H});
      if (c.gpt_oss())
        for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
          for (int64_t e = 0; e < E; ++e)
            add(g, fmt::format("{}mlp.experts.{}.{}.bias", p, e, proj), {proj[0] == 'd' ? H : Fe});
      m.groups.push_back(std::move(g));
      continue;
    }
    add(g, p + "mlp.gate_proj.weight", {F, H});
    add(g, p + "mlp.up_proj.weight", {F, H});
    add(g, p + "mlp.down_proj.weight", {H, F});
    // OLMo 2's and Gemma's norm after the MLP
    if (c.post_norms || c.gemma()) add(g, p + "post_feedforward_layernorm.weight", {H});
    m.groups.push_back(std::move(g));
  }
  ParamGroup head{"head", {}, 0};
  add(head, "model.norm.weight", {H});
  if (!c.tie_word_embeddings) add(head, "lm_head.weight", {V, H});
  m.groups.push_back(std::move(head));
  return m;
}

}  // namespace rp
