// GPT-OSS expert tensors between Hugging Face's form and the layout's (formats/gpt_oss_hf.hpp).
// Reference: transformers' modeling_gpt_oss.py (GptOssExperts: gate = gate_up[..., ::2],
// up = gate_up[..., 1::2], x @ W with W [in, out]) and integrations/mxfp4.py
// (_convert_moe_packed_tensors: FP4_VALUES, low nibble first, ldexp by scale - 127, blocks of
// 32 values along the input dimension of a [E, out, in / 32, 16] byte tensor).
#include "formats/gpt_oss_hf.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "formats/format_fail.hpp"

namespace rp {

namespace {

// E2M1 values of the 16 codes (OCP MX spec; transformers' FP4_VALUES)
constexpr float kFp4[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

HostTensor take(LoadedModel& m, const std::string& name, const std::vector<int64_t>& shape,
                const std::string& where) {
  auto it = m.tensors.find(name);
  if (it == m.tensors.end())
    format_fail(where,
                fmt::format("missing tensor '{}' (expected shape [{}])", name, fmt::join(shape, ", ")));
  if (it->second.shape != shape)
    format_fail(where, fmt::format("tensor '{}': expected shape [{}], got [{}]", name, fmt::join(shape, ", "),
                                   fmt::join(it->second.shape, ", ")));
  HostTensor t = std::move(it->second);
  m.tensors.erase(it);
  return t;
}

// A projection of all experts as [E, out, in] fp32: "<name>" in HF's [E, in, out] (the
// matmul's right operand), or "<name>_blocks" [E, out, in/32, 16] + "<name>_scales"
// [E, out, in/32] (MXFP4, byte values read as floats).
std::vector<float> expert_weights(LoadedModel& m, const std::string& name, int64_t E, int64_t out, int64_t in,
                                  const std::string& where) {
  std::vector<float> w(size_t(E * out * in));
  if (m.tensors.count(name + "_blocks")) {
    if (in % 32 != 0)
      format_fail(where, fmt::format("tensor '{}_blocks': input size {} is not a multiple of 32", name, in));
    const int64_t G = in / 32;
    const HostTensor blocks = take(m, name + "_blocks", {E, out, G, 16}, where);
    const HostTensor scales = take(m, name + "_scales", {E, out, G}, where);
    for (int64_t r = 0; r < E * out * G; ++r) {
      const float s = scales.data[size_t(r)];
      if (!(s >= 0 && s <= 255))
        format_fail(where, fmt::format("tensor '{}_scales': expected bytes (U8)", name));
      const int exponent = int(s) - 127;
      for (int64_t b = 0; b < 16; ++b) {
        const float byte = blocks.data[size_t(r * 16 + b)];
        if (!(byte >= 0 && byte <= 255))
          format_fail(where, fmt::format("tensor '{}_blocks': expected bytes (U8)", name));
        const unsigned v = unsigned(byte);
        w[size_t(r * 32 + 2 * b)] = std::ldexp(kFp4[v & 15u], exponent);
        w[size_t(r * 32 + 2 * b + 1)] = std::ldexp(kFp4[v >> 4], exponent);
      }
    }
    return w;
  }
  const HostTensor t = take(m, name, {E, in, out}, where);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o)
        w[size_t((e * out + o) * in + i)] = t.data[size_t((e * in + i) * out + o)];
  return w;
}

void put(LoadedModel& m, const std::string& name, std::vector<int64_t> shape, const float* src,
         const std::string& where) {
  HostTensor h;
  h.shape = std::move(shape);
  h.data.assign(src, src + h.numel());
  if (!m.tensors.emplace(name, std::move(h)).second)
    format_fail(where, fmt::format("tensor '{}' appears twice (per-expert and stacked)", name));
}

}  // namespace

bool is_mxfp4_tensor_name(const std::string& name) {
  auto ends = [&](const char* s) {
    const size_t k = std::strlen(s);
    return name.size() >= k && name.compare(name.size() - k, k, s) == 0;
  };
  return ends("_blocks") || ends("_scales");
}

void gpt_oss_experts_from_hf(LoadedModel& m, const std::string& where) {
  const ModelConfig& c = m.config;
  const int64_t E = c.num_experts, H = c.hidden_size, F = c.moe_intermediate_size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.mlp.experts.", l);
    // gate_up [E, 2F, H] in [out, in] with gate / up rows interleaved
    const std::vector<float> gu = expert_weights(m, p + "gate_up_proj", E, 2 * F, H, where);
    const std::vector<float> down = expert_weights(m, p + "down_proj", E, H, F, where);
    const HostTensor gub = take(m, p + "gate_up_proj_bias", {E, 2 * F}, where);
    const HostTensor db = take(m, p + "down_proj_bias", {E, H}, where);
    std::vector<float> gate(static_cast<size_t>(F * H)), up(static_cast<size_t>(F * H));
    std::vector<float> gb(static_cast<size_t>(F)), ub(static_cast<size_t>(F));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t f = 0; f < F; ++f) {
        std::memcpy(&gate[size_t(f * H)], &gu[size_t(((e * 2 * F) + 2 * f) * H)], size_t(H) * 4);
        std::memcpy(&up[size_t(f * H)], &gu[size_t(((e * 2 * F) + 2 * f + 1) * H)], size_t(H) * 4);
        gb[size_t(f)] = gub.data[size_t(e * 2 * F + 2 * f)];
        ub[size_t(f)] = gub.data[size_t(e * 2 * F + 2 * f + 1)];
      }
      const std::string pe = fmt::format("{}{}.", p, e);
      put(m, pe + "gate_proj.weight", {F, H}, gate.data(), where);
      put(m, pe + "up_proj.weight", {F, H}, up.data(), where);
      put(m, pe + "down_proj.weight", {H, F}, &down[size_t(e * H * F)], where);
      put(m, pe + "gate_proj.bias", {F}, gb.data(), where);
      put(m, pe + "up_proj.bias", {F}, ub.data(), where);
      put(m, pe + "down_proj.bias", {H}, &db.data[size_t(e * H)], where);
    }
  }
}

GptOssHfLayerExperts gpt_oss_layer_experts_to_hf(const ModelLayout& layout, int64_t l, const float* base) {
  const ModelConfig& c = layout.config;
  const int64_t E = c.num_experts, H = c.hidden_size, F = c.moe_intermediate_size;
  const ParamGroup& g = layout.groups.at(size_t(l + 1));
  const std::string p = fmt::format("model.layers.{}.mlp.experts.", l);
  GptOssHfLayerExperts out;
  out.specs = {{p + "gate_up_proj", {E, H, 2 * F}},
               {p + "gate_up_proj_bias", {E, 2 * F}},
               {p + "down_proj", {E, F, H}},
               {p + "down_proj_bias", {E, H}}};
  auto tensor = [&](int64_t e, const char* what) {
    const std::string n = fmt::format("{}{}.{}", p, e, what);
    const int i = g.find(n);
    if (i < 0)
      throw std::invalid_argument(
          fmt::format("gpt_oss_layer_experts_to_hf: '{}' not in group '{}'", n, g.name));
    return base + g.tensors[size_t(i)].offset;
  };
  if (!base) return out;
  std::vector<float> gu(size_t(E * H * 2 * F)), gub(size_t(E * 2 * F)), down(size_t(E * F * H)),
      db(size_t(E * H));
  for (int64_t e = 0; e < E; ++e) {
    const float *gw = tensor(e, "gate_proj.weight"), *uw = tensor(e, "up_proj.weight");
    const float *dw = tensor(e, "down_proj.weight"), *gbp = tensor(e, "gate_proj.bias");
    const float *ubp = tensor(e, "up_proj.bias"), *dbp = tensor(e, "down_proj.bias");
    for (int64_t h = 0; h < H; ++h)
      for (int64_t f = 0; f < F; ++f) {
        gu[size_t((e * H + h) * 2 * F + 2 * f)] = gw[f * H + h];
        gu[size_t((e * H + h) * 2 * F + 2 * f + 1)] = uw[f * H + h];
      }
    for (int64_t f = 0; f < F; ++f) {
      gub[size_t(e * 2 * F + 2 * f)] = gbp[f];
      gub[size_t(e * 2 * F + 2 * f + 1)] = ubp[f];
      for (int64_t h = 0; h < H; ++h) down[size_t((e * F + f) * H + h)] = dw[h * F + f];
    }
    std::memcpy(&db[size_t(e * H)], dbp, size_t(H) * 4);
  }
  out.values = {std::move(gu), std::move(gub), std::move(down), std::move(db)};
  return out;
}

bool is_gpt_oss_expert_name(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos;
}

}  // namespace rp
