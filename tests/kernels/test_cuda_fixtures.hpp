// Fixtures shared by the CUDA backend's op tests (test_cuda_ops.cpp, test_cuda_gqa.cpp): a
// device plus the CPU twin, and a causal attention run on the GPU (random bf16 inputs, NaN-
// poisoned outputs) with its check against the CPU backend on the same rounded inputs.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/ops.hpp"
#include "tests/kernels/test_cuda_util.hpp"
#ifdef RP_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace rp::cudatest {

class CudaOpsTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    cpu_ = make_cpu_ops(4);
  }
  /// A device copy of raw bytes (e.g. FP8 codes) in an i32 buffer rounded up, with a spare
  /// word; the bytes past h are zero.
  DT upload_bytes(const std::vector<uint8_t>& h) {
    DT d = alloc(int64_t(h.size() + 3) / 4 + 1, DType::i32);
    std::vector<uint8_t> padded(size_t(d.n) * 4, 0);
    std::copy(h.begin(), h.end(), padded.begin());
    cs().copy_h2d(d.get(), padded.data(), padded.size());
    cs().synchronize();
    return d;
  }
  std::vector<uint8_t> download_bytes(const void* p, int64_t n) {
    std::vector<uint8_t> h(static_cast<size_t>(n));
    cs().copy_d2h(h.data(), p, size_t(n));
    cs().synchronize();
    return h;
  }
  std::unique_ptr<Ops> cpu_;
};

// Random bf16 inputs (seeds seed..seed+3), outputs poisoned, attention forward with
// implementation `impl` (cuda_backend.hpp: 0 auto, 1 simple, 2/3 flash, 4 cuDNN), then
// backward with `bwd_impl` (-1: the same) on the GPU.
class CudaAttentionTest : public CudaOpsTest {
 protected:
  struct Run {
    VecF q, k, v, dout;      // host inputs (rounded to bf16 by the upload)
    DT o, lse, dq, dk, dv;   // GPU results
    int64_t bwd_passes = 0;  // cuda::attention_bwd_passes after the backward
  };
  // Applied to the ops before each run (CUDA builds); -1 / 0 leave the device's setting
  // (RP_CUDA_ATTENTION_GQA) and the contract's scratch size.
  int gqa_mode = -1;         // cuda::set_attention_gqa
  size_t scratch_bytes = 0;  // cuda::set_attention_scratch_bytes (at most the contract here)

  static bool skip_without_cudnn(int impl, int bwd_impl = -1) {
#ifdef RP_HAVE_CUDA
    return (impl == 4 || bwd_impl == 4) && !cuda::cudnn_attention_available();
#else
    (void)impl, (void)bwd_impl;
    return false;
#endif
  }
  Run run_attention(int64_t S, int64_t L, int64_t nq, int64_t nkv, int64_t D, uint64_t seed, int impl,
                    int bwd_impl = -1) {
    const int64_t T = S * L;
    const float scale = float(1.0 / std::sqrt(double(D)));
    Run r;
    r.q = ref::randn(size_t(T * nq * D), uint32_t(seed));
    r.k = ref::randn(size_t(T * nkv * D), uint32_t(seed + 1));
    r.v = ref::randn(size_t(T * nkv * D), uint32_t(seed + 2));
    r.dout = ref::randn(size_t(T * nq * D), uint32_t(seed + 3));
    DT qd = upload(r.q, DType::bf16), kd = upload(r.k, DType::bf16), vd = upload(r.v, DType::bf16);
    DT dod = upload(r.dout, DType::bf16);
    r.o = poisoned(T * nq * D, DType::bf16);
    r.lse = poisoned(S * nq * L, DType::f32);
    r.dq = poisoned(T * nq * D, DType::bf16);
    r.dk = poisoned(T * nkv * D, DType::bf16);
    r.dv = poisoned(T * nkv * D, DType::bf16);
    DeviceBuffer scratch(dev(), Ops::attention_scratch_bytes(S, L, nq, nkv, D));
    run([&](Ops& op) {
#ifdef RP_HAVE_CUDA
      cuda::set_attention_impl(op, impl);
      if (gqa_mode >= 0) cuda::set_attention_gqa(op, gqa_mode);
      cuda::set_attention_scratch_bytes(op, scratch_bytes);
#endif
      op.attention_fwd(qd.get(), kd.get(), vd.get(), r.o.get(), r.lse.as<float>(), S, L, nq, nkv, D, scale,
                       scratch.get());
#ifdef RP_HAVE_CUDA
      cuda::set_attention_impl(op, bwd_impl < 0 ? impl : bwd_impl);
#endif
      op.attention_bwd(qd.get(), kd.get(), vd.get(), r.o.get(), r.lse.as<float>(), dod.get(), r.dq.get(),
                       r.dk.get(), r.dv.get(), S, L, nq, nkv, D, scale, scratch.get());
#ifdef RP_HAVE_CUDA
      r.bwd_passes = cuda::attention_bwd_passes(op);
#endif
    });
    return r;
  }
  // Compares run g with the CPU twin on the same (rounded) inputs; the CPU backward uses the
  // GPU's rounded o. Relative errors: o 1e-2, lse 1e-5, dq/dk 2e-2, dv 1e-2 (bf16 budgets).
  void expect_matches_cpu(const Run& g, int64_t S, int64_t L, int64_t nq, int64_t nkv, int64_t D) {
    const int64_t T = S * L;
    const float scale = float(1.0 / std::sqrt(double(D)));
    const VecF &q = g.q, &k = g.k, &v = g.v, &dout = g.dout;
    VecF ro(size_t(T * nq * D), {}), rlse(size_t(S * nq * L), {}), rdq(q.size()), rdk(k.size()),
        rdv(v.size());
    std::vector<char> cs(Ops::attention_scratch_bytes(S, L, nq, nkv, D));
    cpu_->attention_fwd(q.data(), k.data(), v.data(), ro.data(), rlse.data(), S, L, nq, nkv, D, scale,
                        cs.data());
    VecF go = download(g.o);
    cpu_->attention_bwd(q.data(), k.data(), v.data(), go.data(), rlse.data(), dout.data(), rdq.data(),
                        rdk.data(), rdv.data(), S, L, nq, nkv, D, scale, cs.data());
    EXPECT_TRUE(close(go, ro, 1e-2, "o"));
    EXPECT_TRUE(close(download(g.lse), rlse, 1e-5, "lse"));
    EXPECT_TRUE(close(download(g.dq), rdq, 2e-2, "dq"));
    EXPECT_TRUE(close(download(g.dk), rdk, 2e-2, "dk"));
    EXPECT_TRUE(close(download(g.dv), rdv, 1e-2, "dv"));
  }
};

}  // namespace rp::cudatest
