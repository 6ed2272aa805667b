// A Hugging Face GPT-OSS checkpoint's expert tensors in rp::ModelSource (formats/model_source_impl.hpp):
// each layout tensor "model.layers.N.mlp.experts.<e>.{gate,up,down}_proj.{weight,bias}" is a
// slice of the checkpoint's stacked tensor, cut when it is read, so opening a model reads
// nothing and reading holds one expert's tensor at a time. The values are those of
// gpt_oss_experts_from_hf (formats/gpt_oss_hf.cpp, the reference for the conversion), and an
// MXFP4 slice is copied into mxfp4 storage as its codes and exponents (mxfp4_from_hf).
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "formats/format_fail.hpp"
#include "formats/model_source_impl.hpp"
#include "kernels/dtype.hpp"
#include "kernels/weight_format.hpp"
#include "model/error_text.hpp"

namespace rp {

using Loc = ModelSource::Impl::Loc;
using OssSlice = ModelSource::Impl::OssSlice;

namespace {

// E2M1 values of the 16 codes (OCP MX spec; transformers' FP4_VALUES), as gpt_oss_hf.cpp
constexpr float kFp4[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/// `n` elements of `e` from element `at` as bytes: U8 as stored, other dtypes holding the
/// byte values 0..255 (a checkpoint re-saved in floats) converted; anything else throws.
void bytes_of(const SafetensorsFile& f, const SafetensorsEntry& e, int64_t at, int64_t n, uint8_t* out) {
  if (e.dtype == "U8") {
    f.read_bytes(e, uint64_t(at), uint64_t(n), out);
    return;
  }
  const std::vector<float> vals = f.read_f32_range(e, at, n);
  for (int64_t i = 0; i < n; ++i) {
    const float v = vals[size_t(i)];
    if (!(v >= 0 && v <= 255) || v != std::floor(v))
      format_fail(f.path(), fmt::format("tensor '{}': expected bytes (U8), found {}", e.name, v));
    out[i] = uint8_t(v);
  }
}

/// Layout row o of slice `s` is row `hf_row(o)` of the expert's stacked [out, ...] tensor.
int64_t hf_row(const OssSlice& s, int64_t o) { return s.part == 2 ? o : 2 * o + s.part; }

/// All out_hf rows of expert o.expert in an MXFP4 stack (both halves of a fused gate/up), read
/// at once: blocks [out_hf, G * 16] and scales [out_hf, G].
struct Mxfp4Rows {
  std::vector<uint8_t> blocks, scales;
};

Mxfp4Rows expert_rows(const OssSlice& o, int64_t out_hf, int64_t G) {
  Mxfp4Rows x;
  x.blocks.resize(size_t(out_hf * G * 16));
  x.scales.resize(size_t(out_hf * G));
  bytes_of(*o.file, *o.data, o.expert * out_hf * G * 16, out_hf * G * 16, x.blocks.data());
  bytes_of(*o.scales_file, *o.scales, o.expert * out_hf * G, out_hf * G, x.scales.data());
  return x;
}

/// The checkpoint's stacked tensor `name` with the expected shape, or a one-line error.
const SafetensorsSet::Where& stacked(const ModelSource::Impl& s, const std::string& name,
                                     const std::vector<int64_t>& shape, const std::string& where) {
  auto it = s.safetensors.tensors.find(name);
  if (it == s.safetensors.tensors.end() || !s.tensors.count(name))
    format_fail(where,
                fmt::format("missing tensor '{}' (expected shape [{}])", name, fmt::join(shape, ", ")));
  if (it->second.entry->shape != shape)
    format_fail(where, fmt::format("tensor '{}': expected shape [{}], got [{}]", name, fmt::join(shape, ", "),
                                   fmt::join(it->second.entry->shape, ", ")));
  return it->second;
}

/// The slices of one projection ("gate_up_proj" or "down_proj" of layer prefix `p`): plain
/// [E, in, out] or MXFP4 "_blocks" [E, out, in/32, 16] + "_scales" [E, out, in/32].
struct Source {
  OssSlice proto;
  std::vector<std::string> used;  ///< the checkpoint names it reads
};

Source projection(const ModelSource::Impl& s, const std::string& name, int64_t E, int64_t out, int64_t in,
                  const std::string& where) {
  Source r;
  if (s.tensors.count(name + "_blocks")) {
    if (in % 32 != 0)
      format_fail(where, fmt::format("tensor '{}_blocks': input size {} is not a multiple of 32", name, in));
    const auto& b = stacked(s, name + "_blocks", {E, out, in / 32, 16}, where);
    const auto& sc = stacked(s, name + "_scales", {E, out, in / 32}, where);
    r.proto.file = b.file;
    r.proto.data = b.entry;
    r.proto.scales_file = sc.file;
    r.proto.scales = sc.entry;
    r.used = {name + "_blocks", name + "_scales"};
  } else {
    const auto& w = stacked(s, name, {E, in, out}, where);
    r.proto.file = w.file;
    r.proto.data = w.entry;
    r.used = {name};
  }
  return r;
}

}  // namespace

void gpt_oss_hf_expert_slices(ModelSource::Impl& s, const std::string& where) {
  const ModelConfig& c = s.header.config;
  const int64_t E = c.num_experts, H = c.hidden_size, F = c.moe_intermediate_size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.mlp.experts.", l);
    const Source gu = projection(s, p + "gate_up_proj", E, 2 * F, H, where);
    const Source down = projection(s, p + "down_proj", E, H, F, where);
    Source gub, db;
    const auto& gb = stacked(s, p + "gate_up_proj_bias", {E, 2 * F}, where);
    gub.proto.file = gb.file, gub.proto.data = gb.entry, gub.used = {p + "gate_up_proj_bias"};
    const auto& dbw = stacked(s, p + "down_proj_bias", {E, H}, where);
    db.proto.file = dbw.file, db.proto.data = dbw.entry, db.used = {p + "down_proj_bias"};
    struct Out {  // a layout tensor of each expert: its stack, name, part and shape
      const Source* src;
      const char* suffix;
      int part;
      std::vector<int64_t> shape;
    };
    const Out outs[] = {{&gu, "gate_proj.weight", 0, {F, H}},   {&gu, "up_proj.weight", 1, {F, H}},
                        {&down, "down_proj.weight", 2, {H, F}}, {&gub, "gate_proj.bias", 0, {F}},
                        {&gub, "up_proj.bias", 1, {F}},         {&db, "down_proj.bias", 2, {H}}};
    for (const Source* src : std::initializer_list<const Source*>{&gu, &down, &gub, &db})
      for (const std::string& n : src->used) s.tensors.erase(n);
    for (const Out& o : outs)
      for (int64_t e = 0; e < E; ++e) {
        const std::string name = fmt::format("{}{}.{}", p, e, o.suffix);
        if (s.tensors.count(name))
          format_fail(where, fmt::format("tensor '{}' appears twice (per-expert and stacked)", name));
        Loc loc;
        loc.shape = o.shape;
        loc.oss = o.src->proto;
        loc.oss->expert = e;
        loc.oss->part = o.part;
        s.tensors.emplace(name, std::move(loc));
      }
  }
}

std::vector<float> gpt_oss_read_f32(const OssSlice& o, const std::vector<int64_t>& shape) {
  const int64_t out = shape[0], in = shape.size() == 2 ? shape[1] : 1;
  const int64_t out_hf = o.part == 2 ? out : 2 * out;  // the stack's output width
  std::vector<float> w(size_t(out * in));
  if (o.scales) {  // MXFP4: rows of in/32 blocks of 16 bytes, one scale each
    const int64_t G = in / 32;
    const Mxfp4Rows x = expert_rows(o, out_hf, G);
    for (int64_t r = 0; r < out; ++r) {
      const uint8_t* blocks = x.blocks.data() + hf_row(o, r) * G * 16;
      const uint8_t* scales = x.scales.data() + hf_row(o, r) * G;
      float* y = w.data() + r * in;
      for (int64_t g = 0; g < G; ++g) {
        const int exponent = int(scales[g]) - 127;
        for (int64_t b = 0; b < 16; ++b) {
          const unsigned v = blocks[g * 16 + b];
          y[g * 32 + 2 * b] = std::ldexp(kFp4[v & 15u], exponent);
          y[g * 32 + 2 * b + 1] = std::ldexp(kFp4[v >> 4], exponent);
        }
      }
    }
  } else {  // HF's x @ W: the stack is [E, in, out_hf], the layout's [out, in] its transpose
    const std::vector<float> x = o.file->read_f32_range(*o.data, o.expert * in * out_hf, in * out_hf);
    for (int64_t i = 0; i < in; ++i)
      for (int64_t r = 0; r < out; ++r) w[size_t(r * in + i)] = x[size_t(i * out_hf + hf_row(o, r))];
  }
  return w;
}

bool gpt_oss_read_stored(const OssSlice& o, const std::vector<int64_t>& shape, WeightFormat fmt, void* dst) {
  if (fmt != WeightFormat::mxfp4 || !o.scales || shape.size() != 2) return false;
  const int64_t out = shape[0], G = shape[1] / 32, out_hf = o.part == 2 ? out : 2 * out;
  const Mxfp4Rows x = expert_rows(o, out_hf, G);
  uint8_t* q = static_cast<uint8_t*>(dst);
  for (int64_t r = 0; r < out; ++r)
    mxfp4_from_hf(x.blocks.data() + hf_row(o, r) * G * 16, x.scales.data() + hf_row(o, r) * G, 1, G,
                  q + size_t(r * G) * 17);
  return true;
}

}  // namespace rp
