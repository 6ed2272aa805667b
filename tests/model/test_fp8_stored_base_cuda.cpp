// A LoRA decoder over a base stored as fp8, run from the stored codes (LayerArgs::
// fp8_stored_base, model/fp8_linear.hpp) on the CUDA backend: against the CPU backend's run of
// the same path (y, dx and the adapters' gradients agree within a bound: the GPU keeps
// activations in bf16 and sums each FP8 k-block at reduced precision, so a value near a code
// boundary may round to the neighbouring code on one backend only), and against the exact
// decoder (fp32, no FP8), to which it is at least as close as the per-tensor path. Skipped,
// saying why, without a GPU, without FP8 tensor cores, or where cuBLASLt refuses the
// per-row-scale GEMM (the layer then keeps the dequantize + requantize path).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "roundpipe/errors.hpp"
#include "tests/kernels/test_cuda_util.hpp"
#include "tests/model/fp8_stored_util.hpp"

namespace rp {
namespace {

using cudatest::DT;
using cudatest::rounded;
using test::VecF;

struct Outputs {
  VecF y, dx, dadapter;
};

class CudaFp8Stored : public cudatest::CudaFp8DeviceTest {
 protected:
  static constexpr MicroBatchShape kShape{2, 16};  // cuBLASLt's FP8 GEMM: sides multiples of 16

  static std::unique_ptr<Layer> layer_of(const test::Fp8StoredBase& f, bool fp8, bool stored_direct) {
    LayerOptions lo;
    lo.fp8 = fp8;
    lo.fp8_stored_direct = stored_direct;
    return make_layer(f.t.lay, test::Fp8StoredBase::kLayer, lo);
  }

  // One forward and one backward of `layer` through `o`: base group `b`, adapters `adp`, their
  // gradient `g` (zeroed by the caller), the FP8 weight cache filled first when the layer has one.
  static void call(Ops& o, const Layer& layer, bool stored, const void* b, const void* adp, void* g,
                   void* cache, void* scratch, size_t sb, const void* xin, void* yout, const void* dyin,
                   void* dxout) {
    LayerArgs a;
    a.ops = &o;
    a.shape = kShape;
    a.params = {b, adp};
    a.grads = {nullptr, g};
    a.scratch = scratch;
    a.scratch_bytes = sb;
    a.fp8_weights = cache;
    a.fp8_weights_bytes = layer.fp8_weight_bytes(true);
    a.fp8_fill_weights = cache != nullptr;
    a.fp8_stored_base = stored;
    a.x = xin;
    a.y = yout;
    layer.forward(a);
    a.y = nullptr;
    a.dy = dyin;
    a.dx = dxout;
    layer.backward(a);
  }

  VecF x() const { return rounded(DType::bf16, ref::randn(size_t(kShape.tokens() * hidden()), 41)); }
  VecF dy() const { return rounded(DType::bf16, ref::randn(size_t(kShape.tokens() * hidden()), 42, 0.1f)); }
  int64_t hidden() const { return f_.t.c.hidden_size; }
  VecF base() const { return rounded(DType::bf16, f_.deq); }
  VecF adapters() const { return rounded(DType::bf16, f_.t.params[size_t(f_.ag)]); }

  // The decoder on the GPU in bf16: from the stored codes (stored: the base group as the uploader
  // leaves it, storage bytes in the stored linears' slots), or from the dequantized weights.
  Outputs on_gpu(const Layer& layer, bool stored) {
    const int64_t T = kShape.tokens(), H = hidden();
    VecF b = base(), ad = adapters(), xin = x(), dyin = dy();
    std::vector<uint8_t> host16(b.size() * 2);
    {
      DT tmp = upload(b, DType::bf16);
      cs().copy_d2h(host16.data(), tmp.get(), host16.size());
      cs().synchronize();
    }
    if (stored) f_.put_stored(host16, 2, layer.fp8_stored_tensors());
    DT dbase = alloc(int64_t(b.size()), DType::bf16);
    cs().copy_h2d(dbase.get(), host16.data(), host16.size());
    cs().synchronize();
    DT dad = upload(ad, DType::bf16), dx_in = upload(xin, DType::bf16), ddy = upload(dyin, DType::bf16);
    const DType gt = ops().grad_dtype();
    const int64_t cache_bytes = layer.fp8_weight_bytes(true);
    DT dgrad = alloc(int64_t(ad.size()), gt), dcache = alloc(std::max<int64_t>(cache_bytes, 4), DType::i32);
    DT dscratch = alloc(int64_t(layer.scratch_bytes(kShape, DType::bf16)), DType::i32);
    DT y = poisoned(T * H, DType::bf16), dx = poisoned(T * H, DType::bf16);
    run([&](Ops& o) { o.fill(gt, dgrad.get(), dgrad.n, 0.f); });
    run([&](Ops& o) {
      call(o, layer, stored, dbase.get(), dad.get(), dgrad.get(), cache_bytes ? dcache.get() : nullptr,
           dscratch.get(), dscratch.buf.bytes(), dx_in.get(), y.get(), ddy.get(), dx.get());
    });
    return {download(y), download(dx), download(dgrad)};
  }

  // The decoder on the CPU backend in fp32, on the same inputs.
  Outputs on_cpu(const Layer& layer, bool stored) {
    const int64_t T = kShape.tokens(), H = hidden();
    const VecF b = base();
    VecF ad = adapters(), xin = x(), dyin = dy();
    std::vector<uint8_t> host32(b.size() * 4);
    std::memcpy(host32.data(), b.data(), host32.size());
    if (stored) f_.put_stored(host32, 4, layer.fp8_stored_tensors());
    auto cpu = make_cpu_ops();
    Outputs r{VecF(size_t(T * H)), VecF(size_t(T * H)), VecF(ad.size(), 0.f)};
    std::vector<uint8_t> cache(layer.fp8_weight_bytes(true) + 16);
    std::vector<float> scratch(layer.scratch_bytes(kShape) / 4 + 1);
    call(*cpu, layer, stored, host32.data(), ad.data(), r.dadapter.data(),
         layer.fp8_weight_bytes(true) ? cache.data() : nullptr, scratch.data(), scratch.size() * 4,
         xin.data(), r.y.data(), dyin.data(), r.dx.data());
    return r;
  }

  void skip_without_row_scales() {
    const bool ok = ops().gemm_fp8_rows_supported();
    std::printf("[ info ] gemm_fp8_rows_supported() on %s: %s\n", dev().name().c_str(), ok ? "yes" : "no");
    if (!ok) GTEST_SKIP() << "cuBLASLt offers no FP8 GEMM with outer-vector scales here";
  }

  test::Fp8StoredBase f_;
};

struct Part {
  const char* name;
  const VecF Outputs::*v;
};
constexpr Part kParts[] = {
    {"y", &Outputs::y}, {"dx", &Outputs::dx}, {"adapter gradients", &Outputs::dadapter}};

TEST_F(CudaFp8Stored, DirectPathCloseToTheCpuBackend) {
  skip_without_row_scales();
  if (IsSkipped()) return;
  auto layer = layer_of(f_, true, true);
  ASSERT_EQ(layer->fp8_stored_tensors().size(), 7u);
  const Outputs gpu = on_gpu(*layer, true), cpu = on_cpu(*layer, true);
  // The per-tensor path's decoder agrees with the CPU to 5e-2 (measured on an H200: y 2.7%,
  // dx 3.8%); this one measured 6.1% (y), 6.9% (dx) and 5.9% (adapter gradients) there: with
  // one scale per token, a token whose bf16 activations (GPU) and fp32 ones (CPU) reach a
  // slightly different amax re-rounds its whole row on one backend, where a tensor-wide amax
  // rarely moves. How close each path is to the exact decoder is the next test's. The bound
  // guards against a broken kernel: a per-row amax that only one warp saw gave dx 62%.
  constexpr double kStoredBound = 8e-2;
  for (const Part& p : kParts) {
    const double e = ref::rel_err(gpu.*p.v, cpu.*p.v);
    std::printf("[ info ] fp8-stored decoder, GPU vs CPU: %s %.2e (bound %.0e)\n", p.name, e, kStoredBound);
    EXPECT_LT(e, kStoredBound) << p.name;
  }
}

// Fidelity, not agreement: against the exact decoder (fp32 on the CPU over the dequantized
// weights, no FP8), the GPU's direct path from the stored codes is at least as close as its
// per-tensor path (the dequantized weights requantized onto one grid per tensor: rounded twice).
// The GPU's bf16 decoder without FP8 gives the floor both share (bf16 activations).
TEST_F(CudaFp8Stored, DirectPathAtLeastAsCloseToTheExactDecoderAsThePerTensorPath) {
  skip_without_row_scales();
  if (IsSkipped()) return;
  auto direct = layer_of(f_, true, true), per_tensor = layer_of(f_, true, false),
       plain = layer_of(f_, false, false);
  const Outputs exact = on_cpu(*plain, false);
  const Outputs d = on_gpu(*direct, true), t = on_gpu(*per_tensor, false), b = on_gpu(*plain, false);
  for (const Part& p : kParts) {
    const double ed = ref::rel_err(d.*p.v, exact.*p.v), et = ref::rel_err(t.*p.v, exact.*p.v),
                 eb = ref::rel_err(b.*p.v, exact.*p.v);
    std::printf(
        "[ info ] fp8-stored decoder on the GPU vs the exact one, %s: direct %.4f, per tensor %.4f, "
        "bf16 without FP8 %.4f\n",
        p.name, ed, et, eb);
    EXPECT_LT(eb, ed) << p.name << ": FP8 should cost some fidelity; is the FP8 path taken?";
    EXPECT_LE(ed, et) << p.name << ": the direct path is farther from the exact decoder";
  }
}

}  // namespace
}  // namespace rp
