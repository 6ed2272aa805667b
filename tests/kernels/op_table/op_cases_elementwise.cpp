// Op-table cases of the memory-bound ops at Qwen3-1.7B shapes (8192 tokens, hidden 2048, 16
// query heads of 128, FFN 6144): RMSNorm (also as Qwen3's q_norm and with Gemma's weight offset),
// RoPE (full and Phi-4-mini's partial rotary), q norm + RoPE in one call, SwiGLU, GeGLU, the
// residual add, the memory helpers, dropout, and the dequantization of every stored weight form
// (50M values).
#include <cmath>
#include <memory>
#include <string>

#include "kernels/weight_format.hpp"
#include "tests/kernels/op_table/op_table.hpp"

namespace rp::optable {

namespace {

constexpr Kind C = Kind::compute, F32 = Kind::f32, U8 = Kind::u8;

std::string mat(int64_t r, int64_t c) { return "[" + std::to_string(r) + ", " + std::to_string(c) + "]"; }

void add_rmsnorm(std::vector<OpCase>& v, const std::string& tag, int64_t R, int64_t n, float w_offset) {
  const std::string sh = mat(R, n) + (w_offset != 0 ? " w_offset=1" : "");
  const Fill wf = w_offset != 0 ? normal(0.1f) : normal(1.f);
  OpCase f{"rmsnorm_fwd_" + tag, "rmsnorm_fwd", sh};
  f.tensors = {input("x", C, R * n), input("w", C, n, wf), output("y", C, R * n)};
  f.run = [=](Ops& o, const Buffers& b) { o.rmsnorm_fwd(b[0], b[1], b[2], R, n, 1e-6f, w_offset); };
  v.push_back(f);
  OpCase bw{"rmsnorm_bwd_" + tag, "rmsnorm_bwd", sh + " dx +=, dw f32 +="};
  bw.tensors = {input("x", C, R * n), input("w", C, n, wf), input("dy", C, R * n), inout("dx", C, R * n),
                inout("dw", F32, n, normal(0.1f))};
  bw.run = [=](Ops& o, const Buffers& b) {
    o.rmsnorm_bwd(b[0], b[1], b[2], b[3], b[4], R, n, 1e-6f, true, w_offset);
  };
  v.push_back(bw);
}

// In place on x [T, heads, D], rotating the first R features (theta 1e6, Qwen3's).
void add_rope(std::vector<OpCase>& v, const std::string& tag, int64_t T, int64_t heads, int64_t D,
              int64_t R) {
  auto inv = std::make_shared<std::vector<float>>(size_t(R / 2));
  for (int64_t i = 0; i < R / 2; ++i) (*inv)[size_t(i)] = float(std::pow(1e6, -2.0 * double(i) / double(R)));
  const std::string sh = "[" + std::to_string(T) + ", " + std::to_string(heads) + ", " + std::to_string(D) +
                         "]" + (R != D ? " rotary_dim=" + std::to_string(R) : "");
  const int64_t rd = R == D ? 0 : R;
  for (bool bwd : {false, true}) {
    OpCase c{std::string(bwd ? "rope_bwd_" : "rope_fwd_") + tag, bwd ? "rope_bwd" : "rope_fwd",
             sh + " in place"};
    c.tensors = {inout("x", C, T * heads * D)};
    c.run = [=](Ops& o, const Buffers& b) {
      if (bwd) o.rope_bwd(b[0], 1, T, heads, D, inv->data(), 1.f, rd);
      else o.rope_fwd(b[0], 1, T, heads, D, inv->data(), 1.f, rd);
    };
    v.push_back(c);
  }
}

// Qwen3's per-head q norm followed by RoPE, one call each way, on [T, heads, D] (theta 1e6);
// the backward's dy is an input the CPU twin rotates in place (the op's contract: scratch).
void add_qk_norm_rope(std::vector<OpCase>& v, const std::string& tag, int64_t T, int64_t heads, int64_t D) {
  auto inv = std::make_shared<std::vector<float>>(size_t(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) (*inv)[size_t(i)] = float(std::pow(1e6, -2.0 * double(i) / double(D)));
  const int64_t n = T * heads * D;
  const std::string sh =
      "[" + std::to_string(T) + ", " + std::to_string(heads) + ", " + std::to_string(D) + "]";
  auto shape = [=] {
    Ops::QkNormRope s;
    s.n_seq = 1;
    s.seq_len = T;
    s.heads = heads;
    s.head_dim = D;
    s.inv_freq = inv->data();
    return s;
  };
  OpCase f{"qk_norm_rope_fwd_" + tag, "qk_norm_rope_fwd", sh};
  f.tensors = {input("x", C, n), input("w", C, D), output("y", C, n)};
  f.run = [=](Ops& o, const Buffers& b) { o.qk_norm_rope_fwd(b[0], b[1], b[2], shape()); };
  v.push_back(f);
  OpCase bw{"qk_norm_rope_bwd_" + tag, "qk_norm_rope_bwd", sh + " dw f32 +="};
  bw.tensors = {input("x", C, n), input("w", C, D), input("dy", C, n), output("dx", C, n),
                inout("dw", F32, D, normal(0.1f))};
  bw.run = [=](Ops& o, const Buffers& b) { o.qk_norm_rope_bwd(b[0], b[1], b[2], b[3], b[4], shape()); };
  v.push_back(bw);
}

// swiglu / geglu forward and backward over n elements.
void add_glu(std::vector<OpCase>& v, const std::string& kind, int64_t n, const std::string& sh) {
  const bool geglu = kind == "geglu";
  OpCase f{kind + "_fwd", kind + "_fwd", sh};
  f.tensors = {input("g", C, n), input("u", C, n), output("h", C, n)};
  f.run = [=](Ops& o, const Buffers& b) {
    if (geglu) o.geglu_fwd(b[0], b[1], b[2], n);
    else o.swiglu_fwd(b[0], b[1], b[2], n);
  };
  v.push_back(f);
  OpCase bw{kind + "_bwd", kind + "_bwd", sh};
  bw.tensors = {input("g", C, n), input("u", C, n), input("dh", C, n), output("dg", C, n),
                output("du", C, n)};
  bw.run = [=](Ops& o, const Buffers& b) {
    if (geglu) o.geglu_bwd(b[0], b[1], b[2], b[3], b[4], n);
    else o.swiglu_bwd(b[0], b[1], b[2], b[3], b[4], n);
  };
  v.push_back(bw);
}

void add_helpers(std::vector<OpCase>& v, int64_t TH, int64_t TF, const std::string& sth,
                 const std::string& stf) {
  OpCase a{"add_residual", "add", sth};
  a.tensors = {input("a", C, TH), input("b", C, TH), output("y", C, TH)};
  a.run = [=](Ops& o, const Buffers& b) { o.add(b[0], b[1], b[2], TH); };
  v.push_back(a);
  OpCase cp{"copy", "copy", stf};
  cp.tensors = {input("src", C, TF), output("dst", C, TF)};
  cp.run = [=](Ops& o, const Buffers& b) { o.copy(o.dtype(), b[1], b[0], TF); };
  v.push_back(cp);
  OpCase ca{"cast_f32_to_compute", "cast", stf + " f32 -> compute"};
  ca.tensors = {input("src", F32, TF), output("dst", C, TF)};
  ca.run = [=](Ops& o, const Buffers& b) { o.cast(o.dtype(), b[1], DType::f32, b[0], TF); };
  v.push_back(ca);
  OpCase ai{"add_into_f32", "add_into", stf + " f32 += compute"};
  ai.tensors = {input("src", C, TF), inout("dst", F32, TF)};
  ai.run = [=](Ops& o, const Buffers& b) { o.add_into(DType::f32, b[1], o.dtype(), b[0], TF, 0.5f); };
  v.push_back(ai);
  OpCase fl{"fill_f32", "fill", stf + " f32"};
  fl.tensors = {output("x", F32, TF)};
  fl.run = [=](Ops& o, const Buffers& b) { o.fill(DType::f32, b[0], TF, 0.25f); };
  v.push_back(fl);
  OpCase dr{"dropout", "dropout", stf + " p=0.1"};
  dr.tensors = {input("x", C, TF), output("y", C, TF)};
  dr.run = [=](Ops& o, const Buffers& b) { o.dropout(b[0], b[1], TF / 64, 64, 0.1f, 1234, 7); };
  v.push_back(dr);
}

// Ops::dequantize of n values stored in format f (quantized on the host), src_off bytes into
// the allocation; fp8 rows of `cols` values. Bytes: the storage read plus the output written.
void add_dequantize(std::vector<OpCase>& v, WeightFormat f, int64_t n, int64_t cols, size_t src_off) {
  const int64_t sb = int64_t(weight_format_bytes(f, n, cols));
  OpCase c{std::string("dequantize_") + weight_format_name(f) + (src_off ? "_offset2" : ""), "dequantize",
           std::to_string(n) + " values -> compute" + (src_off ? " (src +2 bytes)" : "")};
  Fill stored = [=](std::vector<float>& out, uint64_t seed) {
    std::vector<float> x(static_cast<size_t>(n));
    normal(0.02f)(x, seed);
    std::vector<uint8_t> q(static_cast<size_t>(sb));
    quantize_weights(f, x.data(), q.data(), n, cols);
    std::fill(out.begin(), out.end(), 0.f);
    for (int64_t i = 0; i < sb; ++i) out[src_off + size_t(i)] = float(q[size_t(i)]);
  };
  c.tensors = {input("src", U8, sb + int64_t(src_off), stored), output("dst", C, n)};
  c.run = [=](Ops& o, const Buffers& b) { o.dequantize(f, b.u(0) + src_off, b[1], n, cols); };
  v.push_back(c);
}

}  // namespace

void add_elementwise_cases(std::vector<OpCase>& v, Size s) {
  const bool big = s == Size::bench;
  const int64_t T = big ? 8192 : 48, H = big ? 2048 : 64, nq = big ? 16 : 4, D = big ? 128 : 32,
                F = big ? 6144 : 96;
  add_rmsnorm(v, "hidden", T, H, 0.f);
  add_rmsnorm(v, "qnorm", T * nq, D, 0.f);
  add_rmsnorm(v, "gemma_offset", T, H, 1.f);
  add_rope(v, "full", T, nq, D, D);
  add_rope(v, "partial", T, nq, D, D * 3 / 4);
  add_qk_norm_rope(v, "q", T, nq, 128);  // head_dim 128 at both sizes: the one-pass kernel's shape
  add_glu(v, "swiglu", T * F, mat(T, F));
  add_glu(v, "geglu", T * F, mat(T, F));
  add_helpers(v, T * H, T * F, mat(T, H), mat(T, F));
  const int64_t n = big ? 4096 * 12288 : 4096, cols = big ? 4096 : 256;
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16, WeightFormat::q8_0,
                         WeightFormat::q4_0, WeightFormat::nf4, WeightFormat::fp8})
    add_dequantize(v, f, n, f == WeightFormat::fp8 ? cols : 0, 0);
  add_dequantize(v, WeightFormat::q8_0, n, 0, 2);
}

}  // namespace rp::optable
