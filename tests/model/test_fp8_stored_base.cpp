// A LoRA decoder over a base stored as fp8 with FP8 linears on (model/fp8_linear.hpp,
// LayerArgs::fp8_stored_base) on the CPU ops: the layer lists its dense linears as runnable
// from their stored codes, and the direct path (the stored codes and row scales in the FP8
// GEMM) against the old one (the dequantized weights requantized with one scale per tensor)
// and against the fp32 decoder on the dequantized weights: the two FP8 paths are close, and
// the direct one is at least as close to the fp32 reference in the output, the input gradient
// and the adapters' gradients (its weights are rounded once, when stored; the old path rounds
// them again onto a tensor-wide grid). One linear from stored codes, forward and input
// gradient, within the e4m3 rounding bound of the fp64 product with the dequantized weight.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/fp8.hpp"
#include "model/fp8_linear.hpp"
#include "model/layer_memory.hpp"
#include "tests/model/fp8_stored_util.hpp"

namespace rp {
namespace {

using namespace rp::test;

// How far the direct path may be from the fp32 reference (relative L2): the FP8 decoder's
// bounds against the compute-dtype decoder (tests/model/test_fp8_linear.cpp: 0.08 forward, 0.2
// backward on this tiny layer, where few terms per sum average the e4m3 rounding little).
constexpr double kForwardBound = 0.08, kBackwardBound = 0.2;
// How far the two FP8 paths may be apart: the old path's own error on these weights (rows 16x
// apart in magnitude, requantized onto one grid per tensor: 0.09 forward, up to 0.14 backward
// measured) plus the direct path's (up to 0.07), rounded up.
constexpr double kApartForward = 0.15, kApartBackward = 0.25;

struct Outputs {
  VecF y, dx, dadapter;
};

// One forward and one backward of `layer` on the base group `base` (raw bytes: fp32 values,
// or storage where the layer reads it) and the adapters, filling the FP8 cache first.
Outputs run_layer(Fp8StoredBase& f, const Layer& layer, std::vector<uint8_t> base, bool stored) {
  const MicroBatchShape s{2, 8};
  const int64_t T = s.tokens(), H = f.t.c.hidden_size;
  VecF x = ref::randn(size_t(T * H), 31), dy = ref::randn(size_t(T * H), 32, 0.1f);
  Outputs r{ref::nan_vec(size_t(T * H)), ref::nan_vec(size_t(T * H)),
            VecF(f.t.params[size_t(f.ag)].size(), 0.f)};
  std::vector<float> scratch(layer.scratch_bytes(s) / 4 + 1, std::nanf(""));
  std::vector<uint8_t> cache(layer.fp8_weight_bytes(true) + 16);
  LayerArgs a;
  a.ops = f.t.ops.get();
  a.shape = s;
  a.params = {base.data(), f.t.params[size_t(f.ag)].data()};
  a.grads = {nullptr, r.dadapter.data()};
  a.scratch = scratch.data();
  a.scratch_bytes = layer.scratch_bytes(s);
  a.fp8_weights = cache.data();
  a.fp8_weights_bytes = layer.fp8_weight_bytes(true);
  a.fp8_fill_weights = true;
  a.fp8_stored_base = stored;
  a.x = x.data();
  a.y = r.y.data();
  layer.forward(a);
  a.y = nullptr;
  a.dy = dy.data();
  a.dx = r.dx.data();
  layer.backward(a);
  return r;
}

std::vector<uint8_t> as_bytes(const VecF& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::unique_ptr<Layer> fp8_layer(const ModelLayout& m, bool fp8) {
  LayerOptions lo;
  lo.fp8 = fp8;
  lo.fp8_stored_direct = fp8;
  return make_layer(m, Fp8StoredBase::kLayer, lo);
}

// e4m3 rounding of v under scale s moves it by at most half a step: 2^-4 of |v| (3 mantissa
// bits) or, below the normal range, 2^-10 of s; the fp32 product v = a * b and the division
// by s add a few 2^-24 of |v| (2^-22 here).
double rounding(double v, double s) {
  return std::max(std::ldexp(std::fabs(v), -4), std::ldexp(s, -10)) + std::ldexp(std::fabs(v), -22);
}

// y = x W^T and dx = dy W for W [out, in] stored as fp8 (W = diag(s_w) C exactly): each term's
// error is its activation's (x's, or dy s_w's) rounding times |C| s_w or |C|; the fp32 sums add
// K 2^-24 of sum |terms|.
TEST(Fp8StoredBase, LinearFromStoredCodesWithinTheRoundingBound) {
  auto ops = make_cpu_ops();
  const int64_t n = 6, in = 48, out = 32;
  VecF w = ref::randn(size_t(out * in), 51, 0.05f), x = ref::randn(size_t(n * in), 52),
       dy = ref::randn(size_t(n * out), 53, 0.01f);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) w[size_t(r * in + c)] *= std::ldexp(1.f, int(r % 6) - 3);
  std::vector<uint8_t> stored(weight_format_bytes(WeightFormat::fp8, out * in, in));
  quantize_weights(WeightFormat::fp8, w.data(), stored.data(), out * in, in);
  VecF deq(w.size());
  dequantize_weights(WeightFormat::fp8, stored.data(), deq.data(), out * in, in);
  std::vector<uint8_t> wq(size_t(out * in)), wtq(size_t(out * in)), codes(size_t(n * std::max(in, out)));
  VecF row_scale(static_cast<size_t>(out)), ones(static_cast<size_t>(in), 1.f), act(static_cast<size_t>(n));
  fp8_stored_weight(*ops, stored.data(), out, in, wq.data(), wtq.data(), row_scale.data());
  const Fp8Linear f{{wq.data(), wtq.data(), nullptr, row_scale.data(), ones.data()},
                    {codes.data(), act.data()}};
  VecF y = ref::nan_vec(size_t(n * out)), dx = ref::nan_vec(size_t(n * in));
  fp8_linear_fwd(*ops, f, x.data(), y.data(), n, in, out, false);
  VecF sx = act;  // the per-token scales of x
  fp8_linear_bwd_input(*ops, f, dy.data(), dx.data(), n, in, out, false);
  const VecF sd = act;  // of dy s_w
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double want = 0, e = 0;
      for (int64_t i = 0; i < in; ++i) {
        const double wv = deq[size_t(o * in + i)], xv = x[size_t(t * in + i)];
        want += xv * wv;
        e += rounding(xv, sx[size_t(t)]) * std::fabs(wv) + double(in) * std::ldexp(std::fabs(xv * wv), -23);
      }
      ASSERT_NEAR(y[size_t(t * out + o)], want, e) << "y token " << t << ", output " << o;
    }
    for (int64_t i = 0; i < in; ++i) {
      double want = 0, e = 0;
      for (int64_t o = 0; o < out; ++o) {
        const double c = deq[size_t(o * in + i)] / row_scale[size_t(o)],
                     v = dy[size_t(t * out + o)] * double(row_scale[size_t(o)]);
        want += dy[size_t(t * out + o)] * double(deq[size_t(o * in + i)]);
        e += rounding(v, sd[size_t(t)]) * std::fabs(c) + double(out) * std::ldexp(std::fabs(v * c), -23);
      }
      ASSERT_NEAR(dx[size_t(t * in + i)], want, e) << "dx token " << t << ", input " << i;
    }
  }
}

// The forward quantizes x in one pass (Ops::fp8_quantize_rows_col_scaled without column scales):
// the per-token scales and codes equal fp8_scale_rows' and fp8_quantize_rows', and the output
// the GEMM of those, bit for bit, on inputs with a zero row and rows 2^12 apart.
TEST(Fp8StoredBase, OnePassQuantizationEqualsTheTwoPasses) {
  auto ops = make_cpu_ops();
  const int64_t n = 5, in = 64, out = 48;
  VecF w = ref::randn(size_t(out * in), 61, 0.05f), x = ref::randn(size_t(n * in), 62);
  for (int64_t c = 0; c < in; ++c) {
    x[size_t(in + c)] = 0.f;
    x[size_t(3 * in + c)] *= 4096.f;
  }
  std::vector<uint8_t> stored(weight_format_bytes(WeightFormat::fp8, out * in, in));
  quantize_weights(WeightFormat::fp8, w.data(), stored.data(), out * in, in);
  std::vector<uint8_t> wq(size_t(out * in)), codes(size_t(n * in)), want_codes(size_t(n * in));
  VecF row_scale(static_cast<size_t>(out)), s = ref::nan_vec(size_t(n)), want_s = ref::nan_vec(size_t(n));
  fp8_stored_weight(*ops, stored.data(), out, in, wq.data(), nullptr, row_scale.data());
  const Fp8Linear f{{wq.data(), nullptr, nullptr, row_scale.data(), nullptr}, {codes.data(), s.data()}};
  VecF y = ref::nan_vec(size_t(n * out)), want_y = ref::nan_vec(size_t(n * out));
  fp8_linear_fwd(*ops, f, x.data(), y.data(), n, in, out, false);
  ops->fp8_scale_rows(x.data(), n, in, Fp8Format::e4m3, want_s.data());
  ops->fp8_quantize_rows(x.data(), want_s.data(), want_codes.data(), n, in, Fp8Format::e4m3);
  ops->gemm_fp8_rows(want_codes.data(), Fp8Format::e4m3, want_s.data(), wq.data(), Fp8Format::e4m3,
                     row_scale.data(), want_y.data(), n, in, out, false);
  EXPECT_EQ(0, std::memcmp(s.data(), want_s.data(), s.size() * 4)) << "the per-token scales";
  EXPECT_EQ(codes, want_codes);
  EXPECT_EQ(0, std::memcmp(y.data(), want_y.data(), y.size() * 4)) << "the outputs";
  EXPECT_EQ(s[1], fp8::scale_from_amax(0.f, Fp8Format::e4m3)) << "the zero row's scale";
}

TEST(Fp8StoredBase, ListsItsDenseLinears) {
  Fp8StoredBase f;
  std::vector<int64_t> want;
  for (const char* n : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                        "gate_proj.weight", "up_proj.weight", "down_proj.weight"})
    want.push_back(f.t.tensor(Fp8StoredBase::kLayer, n).offset);
  EXPECT_EQ(fp8_layer(f.t.lay, true)->fp8_stored_tensors(), want);
  EXPECT_TRUE(fp8_layer(f.t.lay, false)->fp8_stored_tensors().empty()) << "FP8 linears off";
  LoraConfig q8 = fp8_base_lora();
  q8.base_format = WeightFormat::q8_0;
  EXPECT_TRUE(fp8_layer(make_layout(f.t.c, q8), true)->fp8_stored_tensors().empty()) << "a q8_0 base";
  // the storage form fits in the compute-dtype slot the uploader copies it into (2 bytes a weight)
  for (const TensorSpec& ts : f.t.lay.groups[size_t(Fp8StoredBase::kLayer)].tensors)
    if (ts.format == WeightFormat::fp8) {
      EXPECT_LE(weight_format_bytes(ts.format, ts.numel(), weight_format_cols(ts.shape)),
                size_t(ts.numel()) * 2);
    }
}

TEST(Fp8StoredBase, DirectPathCloseToTheOldAndAtLeastAsCloseToFp32) {
  Fp8StoredBase f;
  auto fp8 = fp8_layer(f.t.lay, true), plain = fp8_layer(f.t.lay, false);
  std::vector<uint8_t> stored = as_bytes(f.deq);
  f.put_stored(stored, 4, fp8->fp8_stored_tensors());
  const Outputs fp32 = run_layer(f, *plain, as_bytes(f.deq), false);
  const Outputs old = run_layer(f, *fp8, as_bytes(f.deq), false);
  const Outputs direct = run_layer(f, *fp8, stored, true);
  struct Part {
    const char* name;
    const VecF Outputs::*v;
    double bound, apart_bound;
  };
  for (const Part p : {Part{"y", &Outputs::y, kForwardBound, kApartForward},
                       Part{"dx", &Outputs::dx, kBackwardBound, kApartBackward},
                       Part{"adapter gradients", &Outputs::dadapter, kBackwardBound, kApartBackward}}) {
    const double e_old = ref::rel_err(old.*p.v, fp32.*p.v), e_direct = ref::rel_err(direct.*p.v, fp32.*p.v);
    const double apart = ref::rel_err(direct.*p.v, old.*p.v);
    std::printf("[ info ] fp8-stored base, %s: relative error to fp32 old %.4f, direct %.4f; apart %.4f\n",
                p.name, e_old, e_direct, apart);
    EXPECT_GT(apart, 1e-5) << p.name << ": the direct path is not taken";
    EXPECT_LT(apart, p.apart_bound) << p.name;
    EXPECT_LT(e_direct, p.bound) << p.name;
    EXPECT_LE(e_direct, e_old) << p.name << ": the direct path is farther from the fp32 reference";
  }
}

}  // namespace
}  // namespace rp
