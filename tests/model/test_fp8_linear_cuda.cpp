// FP8 linears (model/fp8_linear.hpp, LayerOptions::fp8) on the CUDA backend against the CPU
// backend (skips without a GPU, or on one without FP8 tensor cores):
//  - one linear on the same bf16 inputs: the weight's scale and codes (W and W^T) equal bit
//    for bit; y = x W^T and dx = dy W within kLinearBound (the GPU rounds its output to bf16
//    and its FP8 tensor cores sum each k-block at reduced precision, Ops::gemm_fp8);
//  - a whole FP8 decoder, forward and backward, with bf16 and with FP8 weight gradients: y, dx
//    and the weight gradients within kDecoderBound (FP8 weight gradients within
//    kDecoderFp8WgradBound; the GPU keeps every activation in bf16, the CPU in fp32, so a value near a
//    code boundary may round to the neighbouring FP8 code on one backend only).
#include <gtest/gtest.h>

#include <cstring>

#include "model/fp8_linear.hpp"
#include "roundpipe/errors.hpp"
#include "tests/kernels/test_cuda_util.hpp"
#include "tests/model/test_layer_util.hpp"

namespace rp {
namespace {

using cudatest::DT;
using cudatest::rounded;
using test::VecF;

constexpr double kLinearBound = 1e-2;   // relative error (L2), one linear
constexpr double kDecoderBound = 5e-2;  // relative error (L2), decoder outputs and gradients
// FP8 weight gradients quantize both of their operands (dy^T and the recomputed x^T), so a
// bf16-against-fp32 difference in either flips codes at twice the places: measured 3.9e-2 to
// 5.8e-2 on an H100 (the bf16 weight gradients of the same run: 2.5e-2 to 4.1e-2).
constexpr double kDecoderFp8WgradBound = 8e-2;

class CudaFp8 : public cudatest::CudaFp8DeviceTest {
 protected:
  std::vector<uint8_t> bytes(const DT& d, size_t n) {
    std::vector<uint8_t> h(n);
    cs().copy_d2h(h.data(), d.get(), n);
    cs().synchronize();
    return h;
  }
};

TEST_F(CudaFp8, LinearCodesEqualAndProductsClose) {
  const int64_t n = 64, in = 256, out = 128;
  auto cpu = make_cpu_ops();
  VecF x = ref::randn(size_t(n * in), 1), w = ref::randn(size_t(out * in), 2, 0.1f);
  VecF dy = ref::randn(size_t(n * out), 3, 1e-3f);
  DT dx_ = upload(x, DType::bf16), dw = upload(w, DType::bf16), ddy = upload(dy, DType::bf16);
  DT wq = alloc(out * in, DType::i32), wtq = alloc(out * in, DType::i32), ws = alloc(1, DType::f32);
  DT aq = alloc(n * std::max(in, out), DType::i32), as = alloc(1, DType::f32);
  DT y = poisoned(n * out, DType::bf16), dxo = poisoned(n * in, DType::bf16);
  run([&](Ops& o) {
    fp8_quantize_weight(o, dw.get(), out, in, wq.as<uint8_t>(), wtq.as<uint8_t>(), ws.as<float>());
    const Fp8Linear f{{wq.as<uint8_t>(), wtq.as<uint8_t>(), ws.as<float>()},
                      {aq.as<uint8_t>(), as.as<float>()}};
    fp8_linear_fwd(o, f, dx_.get(), y.get(), n, in, out, false);
    fp8_linear_bwd_input(o, f, ddy.get(), dxo.get(), n, in, out, false);
  });
  // the CPU twin on the same (bf16-rounded) values
  std::vector<uint8_t> cwq(size_t(out * in)), cwtq(size_t(out * in)), caq(size_t(n * std::max(in, out)));
  float cws = 0, cas = 0;
  fp8_quantize_weight(*cpu, w.data(), out, in, cwq.data(), cwtq.data(), &cws);
  const Fp8Linear cf{{cwq.data(), cwtq.data(), &cws}, {caq.data(), &cas}};
  VecF cy(size_t(n * out)), cdx(size_t(n * in));
  fp8_linear_fwd(*cpu, cf, x.data(), cy.data(), n, in, out, false);
  fp8_linear_bwd_input(*cpu, cf, dy.data(), cdx.data(), n, in, out, false);

  EXPECT_EQ(bytes(wq, cwq.size()), cwq);
  EXPECT_EQ(bytes(wtq, cwtq.size()), cwtq);
  EXPECT_EQ(download(ws)[0], cws);
  const double ey = ref::rel_err(download(y), cy), edx = ref::rel_err(download(dxo), cdx);
  std::printf("linear: y relative error %.2e, dx %.2e (bound %.0e)\n", ey, edx, kLinearBound);
  EXPECT_LT(ey, kLinearBound);
  EXPECT_LT(edx, kLinearBound);
}

TEST_F(CudaFp8, DecoderForwardBackwardCloseToTheCpuBackend) {
  // tiny_config: hidden 32, q 32, kv 16, ffn 48 (multiples of 16, as cuBLASLt's FP8 GEMM needs)
  test::TinyModel m(test::TinyOpts{true, false, "default"});
  const MicroBatchShape s{2, 16};
  const int64_t T = s.tokens(), H = m.layout.config.hidden_size;
  // bf16 weight gradients, then FP8 ones (each dy's codes made once for both of its GEMMs)
  for (bool fp8_wgrad : {false, true}) {
    SCOPED_TRACE(fp8_wgrad ? "fp8 weight gradients" : "bf16 weight gradients");
    LayerOptions lo;
    lo.fp8 = true;
    lo.fp8_weight_gradients = fp8_wgrad;
    auto layer = make_layer(m.layout, 1, lo);
    VecF w = rounded(DType::bf16, m.params[1]);
    VecF x = ref::randn(size_t(T * H), 5), dy = ref::randn(size_t(T * H), 6, 0.1f);
    DT dw = upload(w, DType::bf16), dxin = upload(x, DType::bf16), ddy = upload(dy, DType::bf16);
    const DType gt = ops().grad_dtype();
    DT dgrad = alloc(int64_t(w.size()), gt),
       dcache = alloc(int64_t(layer->fp8_weight_bytes(true)), DType::i32);
    DT dscratch = alloc(int64_t(layer->scratch_bytes(s, DType::bf16)), DType::i32);
    DT y = poisoned(T * H, DType::bf16), dx = poisoned(T * H, DType::bf16);
    run([&](Ops& o) { o.fill(gt, dgrad.get(), dgrad.n, 0.f); });
    auto args = [&](Ops& o, const void* params, void* grads, void* cache, void* scratch,
                    size_t scratch_bytes) {
      LayerArgs a;
      a.ops = &o;
      a.shape = s;
      a.params = {params};
      a.grads = {grads};
      a.scratch = scratch;
      a.scratch_bytes = scratch_bytes;
      a.fp8_weights = cache;
      a.fp8_weights_bytes = layer->fp8_weight_bytes(true);
      a.fp8_fill_weights = true;
      return a;
    };
    // the forward into y, then the backward from dy into dx, with the same arguments
    auto forward_backward = [&](LayerArgs a, const void* xin, void* yout, const void* dyin, void* dxout) {
      a.x = xin;
      a.y = yout;
      layer->forward(a);
      a.y = nullptr;
      a.dy = dyin;
      a.dx = dxout;
      layer->backward(a);
    };
    run([&](Ops& o) {
      forward_backward(args(o, dw.get(), dgrad.get(), dcache.get(), dscratch.get(), dscratch.buf.bytes()),
                       dxin.get(), y.get(), ddy.get(), dx.get());
    });
    // the CPU backend on the bf16-rounded weights and inputs
    auto cpu = make_cpu_ops();
    VecF cgrad(w.size(), 0.f), cy(size_t(T * H)), cdx(size_t(T * H));
    std::vector<uint8_t> ccache(layer->fp8_weight_bytes(true));
    std::vector<float> cscratch(layer->scratch_bytes(s) / 4 + 1);
    forward_backward(args(*cpu, w.data(), cgrad.data(), ccache.data(), cscratch.data(), cscratch.size() * 4),
                     x.data(), cy.data(), dy.data(), cdx.data());
    const double ey = ref::rel_err(download(y), cy), edx = ref::rel_err(download(dx), cdx);
    const VecF g = download(dgrad);
    std::printf("decoder: y relative error %.2e, dx %.2e (bound %.0e)\n", ey, edx, kDecoderBound);
    EXPECT_LT(ey, kDecoderBound);
    EXPECT_LT(edx, kDecoderBound);
    for (const char* t :
         {"q_proj.weight", "k_proj.weight", "o_proj.weight", "gate_proj.weight", "down_proj.weight"}) {
      const TensorSpec& ts = m.tensor(1, t);
      VecF a1(g.begin() + ts.offset, g.begin() + ts.offset + ts.numel());
      VecF b1(cgrad.begin() + ts.offset, cgrad.begin() + ts.offset + ts.numel());
      const double e = ref::rel_err(a1, b1);
      std::printf("decoder: d%s relative error %.2e\n", t, e);
      EXPECT_LT(e, fp8_wgrad ? kDecoderFp8WgradBound : kDecoderBound) << t;
    }
  }
}

}  // namespace
}  // namespace rp
