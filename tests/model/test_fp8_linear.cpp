// FP8 base linears (model/fp8_linear.hpp, LayerOptions::fp8) on the CPU ops: a linear's
// forward and input gradient equal a reference written here from the scalar code of
// kernels/fp8.hpp (per-tensor scale from amax, quantize, decode, fp32 product, times both
// scales), with and without a LoRA adapter; an FP8 decoder reads its weights' codes from the
// caller's cache (filled once, then read, whatever the weights do meanwhile), stays close to the
// compute-dtype decoder, refuses a missing or too small cache; an inf or NaN input makes every
// output non-finite (the run's non-finite step handling then sees it).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/fp8.hpp"
#include "model/fp8_linear.hpp"
#include "model/layer_memory.hpp"
#include "model/lora_linear.hpp"
#include "tests/model/test_layer_util.hpp"

namespace rp {
namespace {

using namespace rp::test;

// Reference: the codes of x under its own per-tensor scale, decoded (each value is
// decode(code) * scale; the scale is kept apart as the GEMM applies it to the sum).
struct RefQuant {
  std::vector<double> v;  // decoded codes
  double scale = 1;
};
RefQuant ref_quantize(const VecF& x, Fp8Format f) {
  float amax = 0;
  for (float e : x) amax = std::max(amax, std::fabs(e));
  const float s = fp8::scale_from_amax(amax, f);
  RefQuant q;
  q.scale = s;
  for (float e : x) q.v.push_back(double(fp8::decode(f, fp8::encode(f, e / s))));
  return q;
}
// y[n, out] = sa sb * A[n, k] B[out, k]^T over decoded codes
VecD ref_gemm(const RefQuant& a, const RefQuant& b, int64_t n, int64_t k, int64_t out) {
  VecD y(size_t(n * out));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < out; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += a.v[size_t(i * k + c)] * b.v[size_t(j * k + c)];
      y[size_t(i * out + j)] = s * a.scale * b.scale;
    }
  return y;
}
VecF transpose(const VecF& w, int64_t rows, int64_t cols) {
  VecF t(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = w[size_t(r * cols + c)];
  return t;
}

// One linear's quantized weight in host memory (the CPU ops' "device").
struct HostFp8Weight {
  std::vector<uint8_t> w, wt, act;
  float scale = 0, act_scale = 0;
  HostFp8Weight(Ops& ops, const VecF& wf, int64_t out, int64_t in, int64_t rows)
      : w(size_t(out * in)), wt(size_t(out * in)), act(size_t(rows * std::max(in, out))) {
    fp8_quantize_weight(ops, wf.data(), out, in, w.data(), wt.data(), &scale);
  }
  Fp8Linear linear() { return Fp8Linear{{w.data(), wt.data(), &scale}, {act.data(), &act_scale}}; }
};

TEST(Fp8Linear, ForwardAndInputGradientMatchTheQuantizeDequantizeReference) {
  auto ops = make_cpu_ops();
  const int64_t n = 7, in = 48, out = 24;
  VecF x = ref::randn(size_t(n * in), 1), w = ref::randn(size_t(out * in), 2, 0.2f);
  VecF dy = ref::randn(size_t(n * out), 3, 1e-3f);  // gradients are small: the scale brings them into range
  x[5] = 40.f;   // an outlier sets the tensor's scale, small values lose precision
  x[9] = 1e-4f;  // below the smallest e4m3 code at that scale: becomes 0
  HostFp8Weight hw(*ops, w, out, in, n);
  const Fp8Linear f = hw.linear();
  const RefQuant qw = ref_quantize(w, kFp8ActFormat),
                 qwt = ref_quantize(transpose(w, out, in), kFp8ActFormat);
  EXPECT_EQ(hw.scale, float(qw.scale));

  VecF y = ref::nan_vec(size_t(n * out));
  fp8_linear_fwd(*ops, f, x.data(), y.data(), n, in, out, false);
  const VecD want = ref_gemm(ref_quantize(x, kFp8ActFormat), qw, n, in, out);
  EXPECT_LT(ref::rel_err(y, want), 1e-6);
  // accumulate: adds onto y
  VecF y2 = ref::randn(size_t(n * out), 4);
  const VecF base = y2;
  fp8_linear_fwd(*ops, f, x.data(), y2.data(), n, in, out, true);
  VecD want2 = want;
  for (size_t i = 0; i < want2.size(); ++i) want2[i] += base[i];
  EXPECT_LT(ref::rel_err(y2, want2), 1e-6);
  // the quantization is visible: the fp32 product differs from it
  EXPECT_GT(ref::rel_err(y, ref::linear(ref::to_d(x), ref::to_d(w), n, in, out)), 1e-3);

  VecF dx = ref::nan_vec(size_t(n * in));
  fp8_linear_bwd_input(*ops, f, dy.data(), dx.data(), n, in, out, false);
  EXPECT_LT(ref::rel_err(dx, ref_gemm(ref_quantize(dy, kFp8GradFormat), qwt, n, out, in)), 1e-6);
}

// The weight gradient dW [out, in] += dy^T x from the codes of dy^T and x^T (per-tensor scales:
// a transposition keeps the amax) against the quantize-dequantize reference, added to what
// the gradient held; with x_quantized the second linear reading the same x reuses x^T's codes
// (x itself is not read: a poisoned x changes nothing).
TEST(Fp8Linear, WeightGradientMatchesTheQuantizeDequantizeReference) {
  auto ops = make_cpu_ops();
  const int64_t n = 21, in = 32, out = 24, K = fp8_padded_tokens(n);
  ASSERT_EQ(K, 32);
  VecF x = ref::randn(size_t(n * in), 5), dy = ref::randn(size_t(n * out), 6, 1e-3f);
  x[3] = 25.f;
  std::vector<uint8_t> dyt(size_t(out * K)), xt(size_t(in * K));
  alignas(16) float scales[8] = {};
  const Fp8WgradScratch s{dyt.data(), xt.data(), &scales[0], &scales[4]};
  VecF dw(size_t(out * in), 0.f);
  fp8_linear_bwd_weight(*ops, s, dy.data(), x.data(), dw.data(), n, in, out, kFp8GradFormat, false);
  const VecD want = ref_gemm(ref_quantize(transpose(dy, n, out), kFp8GradFormat),
                             ref_quantize(transpose(x, n, in), kFp8ActFormat), out, n, in);
  EXPECT_LT(ref::rel_err(dw, want), 1e-5);
  EXPECT_GT(ref::rel_err(dw, ref::linear(ref::to_d(transpose(dy, n, out)), ref::to_d(transpose(x, n, in)),
                                         out, n, in)),
            1e-3)
      << "the quantization is not visible";
  // it adds onto the gradient so far
  const VecF dw0 = ref::randn(size_t(out * in), 7, 0.01f);
  VecF acc = dw0;
  fp8_linear_bwd_weight(*ops, s, dy.data(), x.data(), acc.data(), n, in, out, kFp8GradFormat, false);
  VecD want_acc = want;
  for (size_t i = 0; i < want_acc.size(); ++i) want_acc[i] += dw0[i];
  EXPECT_LT(ref::rel_err(acc, want_acc), 1e-5);
  // reuse: a poisoned x with x_quantized gives the same sum again
  const VecF poisoned = ref::nan_vec(x.size());
  VecF dw2(size_t(out * in), 0.f);
  fp8_linear_bwd_weight(*ops, s, dy.data(), poisoned.data(), dw2.data(), n, in, out, kFp8GradFormat, true);
  EXPECT_EQ(dw2, dw);
  EXPECT_THROW(
      fp8_linear_bwd_weight(*ops, s, dy.data(), x.data(), dw.data(), n, 24, out, kFp8GradFormat, false),
      std::invalid_argument);
  EXPECT_THROW(fp8_linear_bwd_weight(*ops, Fp8WgradScratch{}, dy.data(), x.data(), dw.data(), n, in, out,
                                     kFp8GradFormat, false),
               std::invalid_argument);
}

// The weight gradient's call can leave dy's row codes and scale in the linear's scratch (made
// with dy^T's, one amax): the input gradient then reads them instead of dy. Its dx equals the
// call that quantizes dy itself, bit for bit, while a poisoned dy shows it is not read; the
// weight gradient is the one without the shared codes. In both gradient formats.
TEST(Fp8Linear, WeightGradientLeavesDyCodesForTheInputGradient) {
  auto ops = make_cpu_ops();
  const int64_t n = 21, in = 32, out = 24, K = fp8_padded_tokens(n);
  const VecF w = ref::randn(size_t(out * in), 8, 0.2f), x = ref::randn(size_t(n * in), 9);
  VecF dy = ref::randn(size_t(n * out), 10, 1e-3f);
  dy[7] = 0.05f;
  const VecF poisoned = ref::nan_vec(dy.size());
  for (Fp8Format gf : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    HostFp8Weight hw(*ops, w, out, in, n);
    Fp8Linear lin = hw.linear();
    lin.grad_format = gf;
    VecF dx_own(size_t(n * in)), dw_own(size_t(out * in), 0.f);
    std::vector<uint8_t> dyt(size_t(out * K)), xt(size_t(in * K));
    alignas(16) float scales[8] = {};
    const Fp8WgradScratch s{dyt.data(), xt.data(), &scales[0], &scales[4]};
    fp8_linear_bwd_weight(*ops, s, dy.data(), x.data(), dw_own.data(), n, in, out, gf, false);
    fp8_linear_bwd_input(*ops, lin, dy.data(), dx_own.data(), n, in, out, false);
    std::fill(hw.act.begin(), hw.act.end(), uint8_t(0x7f));
    hw.act_scale = std::nanf("");
    VecF dx_shared(size_t(n * in)), dw_shared(size_t(out * in), 0.f);
    fp8_linear_bwd_weight(*ops, s, dy.data(), x.data(), dw_shared.data(), n, in, out, gf, false, &lin.act);
    EXPECT_EQ(dw_shared, dw_own) << fp8_format_name(gf);
    std::vector<uint8_t> want(size_t(n * out));
    float want_scale = 0;
    ops->fp8_scale(dy.data(), n * out, gf, &want_scale);
    ops->fp8_quantize(dy.data(), &want_scale, want.data(), n * out, gf);
    EXPECT_EQ(hw.act_scale, want_scale) << fp8_format_name(gf);
    EXPECT_EQ(std::vector<uint8_t>(hw.act.begin(), hw.act.begin() + n * out), want) << fp8_format_name(gf);
    Fp8Linear coded = lin;
    coded.input_quantized = true;
    fp8_linear_bwd_input(*ops, coded, poisoned.data(), dx_shared.data(), n, in, out, false);
    EXPECT_EQ(dx_shared, dx_own) << fp8_format_name(gf);
  }
  // a weight with row scales folds them into dy's own quantization: shared codes are refused
  HostFp8Weight hw(*ops, w, out, in, n);
  const VecF ones(size_t(in), 1.f), rows(size_t(out), 0.01f);
  Fp8Linear row_scaled = hw.linear();
  row_scaled.weight.row_scale = rows.data();
  row_scaled.weight.ones = ones.data();
  row_scaled.input_quantized = true;
  VecF dx(size_t(n * in));
  EXPECT_THROW(fp8_linear_bwd_input(*ops, row_scaled, dy.data(), dx.data(), n, in, out, false),
               std::invalid_argument);
}

// An input gradient whose dy scale its producer kept (Fp8Linear::input_scaled, as SwiGLU's
// backward keeps gate's and up's) reads dy only to quantize it: with dy's own scale it equals the
// call that takes dy's amax itself, bit for bit, in both formats; a scale of three times that is
// the one used (dx changes; a power of two would only move the exponents).
TEST(Fp8Linear, InputGradientTakesTheProducersScale) {
  auto ops = make_cpu_ops();
  const int64_t n = 19, in = 32, out = 48;
  const VecF w = ref::randn(size_t(out * in), 21, 0.2f);
  VecF dy = ref::randn(size_t(n * out), 22, 1e-3f);
  dy[11] = -0.03f;
  for (Fp8Format gf : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    HostFp8Weight hw(*ops, w, out, in, n);
    Fp8Linear lin = hw.linear();
    lin.grad_format = gf;
    VecF dx_own = ref::randn(size_t(n * in), 23), dx_kept = dx_own, dx_other = dx_own;
    fp8_linear_bwd_input(*ops, lin, dy.data(), dx_own.data(), n, in, out, true);
    float own = 0;
    ops->fp8_scale(dy.data(), n * out, gf, &own);
    Fp8Linear scaled = lin;
    scaled.input_scaled = true;
    hw.act_scale = own;
    fp8_linear_bwd_input(*ops, scaled, dy.data(), dx_kept.data(), n, in, out, true);
    EXPECT_EQ(dx_kept, dx_own) << fp8_format_name(gf);
    EXPECT_EQ(hw.act_scale, own) << "the kept scale is read, not replaced";
    hw.act_scale = 3 * own;
    fp8_linear_bwd_input(*ops, scaled, dy.data(), dx_other.data(), n, in, out, true);
    EXPECT_NE(dx_other, dx_own) << fp8_format_name(gf);
  }
}

// Scales the producers of x and dy computed (Fp8KnownScales) replace the call's own amax passes:
// with the tensors' own scales the weight gradient, dy's row codes and their scale are those of
// the call that computes them, bit for bit, also for a second linear reusing x^T's codes; a
// known scale three times the tensor's own changes the gradient (it is the one used).
TEST(Fp8Linear, WeightGradientTakesTheProducersScales) {
  auto ops = make_cpu_ops();
  const int64_t n = 21, in = 32, out = 24, K = fp8_padded_tokens(n);
  const VecF w = ref::randn(size_t(out * in), 8, 0.2f), x = ref::randn(size_t(n * in), 31);
  const VecF dy = ref::randn(size_t(n * out), 32, 1e-3f);
  std::vector<uint8_t> dyt(size_t(out * K)), xt(size_t(in * K));
  alignas(16) float scales[16] = {};
  const Fp8WgradScratch s{dyt.data(), xt.data(), &scales[0], &scales[4]};
  float* xs = &scales[8];
  float* ds = &scales[12];
  ops->fp8_scale(x.data(), n * in, kFp8ActFormat, xs);
  ops->fp8_scale(dy.data(), n * out, kFp8GradFormat, ds);
  HostFp8Weight hw(*ops, w, out, in, n);
  const Fp8Linear lin = hw.linear();
  // own scales: a first and a second linear (the same x)
  VecF dw_own(size_t(out * in), 0.f), dw2_own(dw_own);
  fp8_linear_bwd_weight(*ops, s, dy.data(), x.data(), dw_own.data(), n, in, out, kFp8GradFormat, false,
                        &lin.act);
  const std::vector<uint8_t> rows_own(hw.act.begin(), hw.act.begin() + n * out);
  const float row_scale_own = hw.act_scale;
  fp8_linear_bwd_weight(*ops, s, dy.data(), x.data(), dw2_own.data(), n, in, out, kFp8GradFormat, true);
  // known scales, the scratch's scales poisoned: they are neither computed nor read
  scales[0] = scales[4] = std::nanf("");
  std::fill(hw.act.begin(), hw.act.end(), uint8_t(0x7f));
  hw.act_scale = std::nanf("");
  VecF dw_known(size_t(out * in), 0.f), dw2_known(dw_known);
  fp8_linear_bwd_weight(*ops, s, dy.data(), x.data(), dw_known.data(), n, in, out, kFp8GradFormat, false,
                        &lin.act, {xs, ds});
  EXPECT_EQ(dw_known, dw_own);
  EXPECT_EQ(std::vector<uint8_t>(hw.act.begin(), hw.act.begin() + n * out), rows_own);
  EXPECT_EQ(hw.act_scale, row_scale_own) << "the known scale is copied beside dy's row codes";
  fp8_linear_bwd_weight(*ops, s, dy.data(), x.data(), dw2_known.data(), n, in, out, kFp8GradFormat, true,
                        nullptr, {xs, ds});
  EXPECT_EQ(dw2_known, dw2_own);
  // the known scales are the ones used
  const float xs_true = *xs, ds_true = *ds;
  for (float* wrong : {xs, ds}) {
    *xs = xs_true;
    *ds = ds_true;
    *wrong *= 3.f;  // not a power of two, which would change every code exactly by its inverse
    VecF dw(size_t(out * in), 0.f);
    fp8_linear_bwd_weight(*ops, s, dy.data(), x.data(), dw.data(), n, in, out, kFp8GradFormat, false, nullptr,
                          {xs, ds});
    EXPECT_GT(ref::rel_err(dw, dw_own), 1e-4) << (wrong == xs ? "x" : "dy") << "'s known scale is not used";
  }
}

// The choice of kFp8GradFormat: dx = dy W against the exact product, dy's codes in e4m3 or
// e5m2, for Gaussian output gradients and for heavy-tailed ones (a Gaussian times e^(2 g'),
// magnitudes over ~6 decades, as gradients of a few tokens dominate).
TEST(Fp8Linear, GradientFormatE4m3IsTheCloser) {
  auto ops = make_cpu_ops();
  const int64_t n = 64, in = 96, out = 128;
  VecF w = ref::randn(size_t(out * in), 41, 0.1f);
  HostFp8Weight hw(*ops, w, out, in, n);
  for (bool heavy : {false, true}) {
    VecF dy = ref::randn(size_t(n * out), 42, 1e-3f);
    if (heavy) {
      const VecF g = ref::randn(dy.size(), 43);
      for (size_t i = 0; i < dy.size(); ++i) dy[i] *= std::exp(2.f * g[i]);
    }
    const VecD exact = ref::linear(ref::to_d(dy), ref::to_d(transpose(w, out, in)), n, out, in);
    double err[2];
    for (int k = 0; k < 2; ++k) {
      Fp8Linear f = hw.linear();
      f.grad_format = k == 0 ? Fp8Format::e4m3 : Fp8Format::e5m2;
      VecF dx(size_t(n * in));
      fp8_linear_bwd_input(*ops, f, dy.data(), dx.data(), n, in, out, false);
      err[k] = ref::rel_err(dx, exact);
    }
    std::printf("dy %s: dx relative error e4m3 %.4f, e5m2 %.4f\n", heavy ? "heavy-tailed" : "Gaussian",
                err[0], err[1]);
    EXPECT_LT(err[0], err[1]) << (heavy ? "heavy-tailed" : "Gaussian");
  }
}

TEST(Fp8Linear, AdaptedLinearAddsTheAdapterInTheComputeDtype) {
  auto ops = make_cpu_ops();
  const int64_t n = 5, in = 32, out = 16, r = 4;
  VecF x = ref::randn(size_t(n * in), 11), w = ref::randn(size_t(out * in), 12, 0.2f);
  VecF params = ref::randn(size_t(r * in + out * r), 13, 0.3f);  // lora_A [r, in], lora_B [out, r]
  LoraLinear l;
  l.in = in;
  l.out = out;
  l.r = r;
  l.a_off = 0;
  l.b_off = r * in;
  VecF ax(size_t(n * r));
  LoraCall c;
  c.ops = ops.get();
  c.params = params.data();
  c.scaling = 0.5f;
  c.ax = ax.data();
  HostFp8Weight hw(*ops, w, out, in, n);
  const Fp8Linear f = hw.linear();
  VecF y = ref::nan_vec(size_t(n * out));
  adapted_linear_fwd(*ops, c, l, x.data(), w.data(), y.data(), n, in, out, 0, &f);
  VecD want = ref_gemm(ref_quantize(x, kFp8ActFormat), ref_quantize(w, kFp8ActFormat), n, in, out);
  const VecD u = ref::linear(ref::to_d(x), VecD(params.begin(), params.begin() + r * in), n, in, r);
  const VecD lo = ref::linear(u, VecD(params.begin() + r * in, params.end()), n, r, out);
  for (size_t i = 0; i < want.size(); ++i) want[i] += 0.5 * lo[i];
  EXPECT_LT(ref::rel_err(y, want), 1e-5);
}

// How far the FP8 decoder may be from the fp32 one (relative L2 error) on this tiny layer
// (hidden 32: few terms per sum, so the e4m3 rounding averages out little). The backward
// compounds the forward's error (recompute), dy's and W^T's quantization.
constexpr double kForwardBound = 0.08, kBackwardBound = 0.2;

// A decoder of the tiny model with and without FP8, its cache in host memory.
struct Fp8Decoder {
  TinyModel m{TinyOpts{true, false, "default"}};
  MicroBatchShape s{2, 5};
  int64_t T = s.tokens(), H = m.layout.config.hidden_size;
  VecF x = ref::randn(size_t(T * H), 21), dy = ref::randn(size_t(T * H), 22);
  std::unique_ptr<Layer> fp8 = [this] {
    LayerOptions lo;
    lo.fp8 = true;
    return make_layer(m.layout, 1, lo);
  }();
  std::unique_ptr<Layer> fp8_wgrad = [this] {
    LayerOptions lo;
    lo.fp8 = true;
    lo.fp8_weight_gradients = true;
    return make_layer(m.layout, 1, lo);
  }();
  std::vector<uint8_t> cache = std::vector<uint8_t>(fp8->fp8_weight_bytes(true) + 256);
  std::vector<float> scratch;
  struct Out {
    VecF y, dx, grads;
  };
  LayerArgs args(const Layer& layer, bool fill) {
    LayerArgs a;
    a.ops = m.ops.get();
    a.shape = s;
    a.params = {m.params[1].data()};
    scratch.assign(layer.scratch_bytes(s) / 4 + 1, std::nanf(""));
    a.scratch = scratch.data();
    a.scratch_bytes = layer.scratch_bytes(s);
    a.x = x.data();
    a.fp8_weights = cache.data();
    a.fp8_weights_bytes = cache.size();
    a.fp8_fill_weights = fill;
    return a;
  }
  VecF forward(const Layer& layer, bool fill) {
    VecF y = ref::nan_vec(size_t(T * H));
    LayerArgs a = args(layer, fill);
    a.y = y.data();
    layer.forward(a);
    return y;
  }
  Out backward(const Layer& layer, bool fill) {
    Out o{{}, ref::nan_vec(size_t(T * H)), VecF(m.params[1].size(), 0.f)};
    LayerArgs a = args(layer, fill);
    a.grads = {o.grads.data()};
    a.dy = dy.data();
    a.dx = o.dx.data();
    layer.backward(a);
    return o;
  }
};

TEST(Fp8Decoder, CloseToTheComputeDtypeDecoderAndReadsItsWeightCache) {
  Fp8Decoder d;
  const VecF plain = d.forward(*d.m.layers[1], false);
  const VecF y = d.forward(*d.fp8, true);
  const double e = ref::rel_err(y, plain);
  std::printf("FP8 decoder forward: y relative error %.4f\n", e);
  EXPECT_GT(e, 1e-4) << "the FP8 path is not taken";
  EXPECT_LT(e, kForwardBound);
  // the cache is read, not filled again: a changed weight changes nothing until the next fill
  const TensorSpec& wq = d.m.tensor(1, "q_proj.weight");
  for (int64_t i = 0; i < wq.numel(); ++i) d.m.params[1][size_t(wq.offset + i)] *= -2.f;
  const VecF again = d.forward(*d.fp8, false);
  EXPECT_EQ(ref::rel_err(again, y), 0.0);
  const VecF refilled = d.forward(*d.fp8, true);
  EXPECT_GT(ref::rel_err(refilled, y), 1e-3);
}

TEST(Fp8Decoder, BackwardCloseToTheComputeDtypeDecoder) {
  Fp8Decoder d;
  const auto plain = d.backward(*d.m.layers[1], false);
  const auto f = d.backward(*d.fp8, true);
  const double edx = ref::rel_err(f.dx, plain.dx);
  std::printf("FP8 decoder backward: dx relative error %.4f\n", edx);
  EXPECT_GT(edx, 1e-4) << "the FP8 path is not taken";
  EXPECT_LT(edx, kBackwardBound);
  for (const char* t : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                        "gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
    const TensorSpec& ts = d.m.tensor(1, t);
    VecF a(f.grads.begin() + ts.offset, f.grads.begin() + ts.offset + ts.numel());
    VecF b(plain.grads.begin() + ts.offset, plain.grads.begin() + ts.offset + ts.numel());
    const double e = ref::rel_err(a, b);
    std::printf("FP8 decoder backward: d%s relative error %.4f\n", t, e);
    EXPECT_LT(e, kBackwardBound) << t;
  }
  // a second backward reading the cache the first filled gives the same result
  const auto again = d.backward(*d.fp8, false);
  EXPECT_EQ(ref::rel_err(again.dx, f.dx), 0.0);
}

// FP8 weight gradients change the weight gradients only: dx is bit for bit the FP8 decoder's;
// every weight gradient differs from it (the FP8 path is taken) and stays close to the
// compute-dtype decoder's. The norms' gradients are not GEMMs and stay as they were.
TEST(Fp8Decoder, WeightGradientsInFp8ChangeOnlyTheWeightGradients) {
  Fp8Decoder d;
  EXPECT_GT(d.fp8_wgrad->scratch_bytes(d.s), d.fp8->scratch_bytes(d.s));
  const auto plain = d.backward(*d.m.layers[1], false);
  const auto f = d.backward(*d.fp8, true);
  const auto w = d.backward(*d.fp8_wgrad, true);
  EXPECT_EQ(ref::rel_err(w.dx, f.dx), 0.0);
  for (const char* t : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                        "gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
    const TensorSpec& ts = d.m.tensor(1, t);
    const auto part = [&](const VecF& g) {
      return VecF(g.begin() + ts.offset, g.begin() + ts.offset + ts.numel());
    };
    const double e = ref::rel_err(part(w.grads), part(plain.grads));
    std::printf("FP8 weight gradients: d%s relative error %.4f (bf16 weight gradient %.4f)\n", t, e,
                ref::rel_err(part(f.grads), part(plain.grads)));
    EXPECT_GT(ref::rel_err(part(w.grads), part(f.grads)), 1e-4)
        << t << ": the FP8 weight gradient is not taken";
    EXPECT_LT(e, kBackwardBound) << t;
  }
  const TensorSpec& norm = d.m.tensor(1, "input_layernorm.weight");
  EXPECT_EQ(VecF(w.grads.begin() + norm.offset, w.grads.begin() + norm.offset + norm.numel()),
            VecF(f.grads.begin() + norm.offset, f.grads.begin() + norm.offset + norm.numel()));
}

TEST(Fp8Decoder, RefusesAMissingOrForwardOnlyCache) {
  Fp8Decoder d;
  EXPECT_EQ(d.m.layers[1]->fp8_weight_bytes(true), 0u);
  EXPECT_LT(d.fp8->fp8_weight_bytes(false), d.fp8->fp8_weight_bytes(true));
  LayerArgs a = d.args(*d.fp8, true);
  VecF y(size_t(d.T * d.H));
  a.y = y.data();
  a.fp8_weights = nullptr;
  EXPECT_THROW(d.fp8->forward(a), std::invalid_argument);
  a = d.args(*d.fp8, true);
  a.y = y.data();
  a.fp8_weights_bytes = d.fp8->fp8_weight_bytes(false);
  EXPECT_NO_THROW(d.fp8->forward(a));  // a forward needs no W^T
  VecF dx(size_t(d.T * d.H)), grads(d.m.params[1].size());
  a.grads = {grads.data()};
  a.dy = d.dy.data();
  a.dx = dx.data();
  EXPECT_THROW(d.fp8->backward(a), std::invalid_argument);
}

TEST(Fp8Linear, ANonFiniteInputMakesEveryOutputNonFinite) {
  // the run's non-finite step handling sees an inf or NaN activation through the scale
  auto ops = make_cpu_ops();
  const int64_t n = 3, in = 16, out = 16;
  VecF w = ref::randn(size_t(out * in), 31, 0.2f);
  HostFp8Weight hw(*ops, w, out, in, n);
  const Fp8Linear f = hw.linear();
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    VecF x = ref::randn(size_t(n * in), 32);
    x[4] = bad;
    VecF y(size_t(n * out), 0.f);
    fp8_linear_fwd(*ops, f, x.data(), y.data(), n, in, out, false);
    int finite = 0;
    for (float v : y) finite += std::isfinite(v) ? 1 : 0;
    EXPECT_EQ(finite, 0) << bad;
  }
}

// Which decoder linears can take FP8 weight gradients: those whose input width (the FP8 GEMM's
// N) is a multiple of 16, of the seven FP8 linears of a dense layer and the four (attention) of
// a sparse one.
TEST(Fp8Linear, WeightGradientReachFollowsTheInputWidths) {
  ModelConfig c;
  c.architecture = "llama";
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.hidden_size = 16;  // q, k, v, gate, up read 16; o reads 2 x 8; down reads 24
  c.intermediate_size = 24;
  Fp8WgradReach r = fp8_wgrad_reach(c);
  EXPECT_EQ(r.linears, 14);
  EXPECT_EQ(r.fp8_wgrad, 12);
  c.intermediate_size = 32;
  EXPECT_EQ(fp8_wgrad_reach(c).fp8_wgrad, 14);
  c.hidden_size = 24;  // o (2 x 8) and down (32) only
  EXPECT_EQ(fp8_wgrad_reach(c).fp8_wgrad, 4);
  c.head_dim = 12;
  c.intermediate_size = 40;
  r = fp8_wgrad_reach(c);
  EXPECT_EQ(r.linears, 14);
  EXPECT_EQ(r.fp8_wgrad, 0);
  // a sparse block's experts stay in the compute dtype: four FP8 linears a layer
  c.architecture = "qwen3_moe";
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.hidden_size = 16;
  c.head_dim = 8;
  r = fp8_wgrad_reach(c);
  EXPECT_EQ(r.linears, 8);
  EXPECT_EQ(r.fp8_wgrad, 8);
  EXPECT_TRUE(fp8_wgrad_width(16));
  EXPECT_FALSE(fp8_wgrad_width(24));
  EXPECT_FALSE(fp8_wgrad_width(0));
}

}  // namespace
}  // namespace rp
