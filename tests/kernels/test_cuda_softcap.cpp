// Gemma 2's logit soft-capping on the CUDA backend against the CPU twins (themselves checked
// against double-precision references in test_softcap_ops.cpp), in bf16 and f16: attention with
// soft-capped scores on the tensor-core path (head_dim 64 / 128 / 256; with a window, packed
// positions, GQA, the 4-warp forward with the unpipelined backward), on the row kernels (head_dim
// 40 and Gemma's 256; impl 1 forcing them), KV-cache decoding, and the fused LM head +
// cross-entropy with a final cap (vectorised and not). Inputs are rounded to the device dtype by
// the upload, outputs NaN-poisoned. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/kernels/test_cuda_fixtures.hpp"

namespace rp::cudatest {
namespace {
using ref::randn;

class CudaSoftcap : public CudaTest, public ::testing::WithParamInterface<DType> {
 protected:
  DType dtype() const override { return GetParam(); }
  void SetUp() override {
    CudaTest::SetUp();
    cpu_ = make_cpu_ops(4);
  }
  void set_impl(Ops& op, int impl) {
#ifdef RP_HAVE_CUDA
    cuda::set_attention_impl(op, impl);
#else
    (void)op, (void)impl;
#endif
  }

  struct Case {
    int64_t S, L, nq, nkv, D, window;
    bool packed;
    float cap;
    int impl = 0;  // 0 automatic, 1 the row kernels, 2 the 4-warp forward and unpipelined backward
  };

  // Forward and backward on the GPU and on the CPU (same rounded inputs; the CPU backward
  // starts from the GPU's o).
  void check_attention(const Case& c) {
    const auto [S, L, nq, nkv, D, window, packed, cap, impl] = c;
    SCOPED_TRACE(::testing::Message()
                 << dtype_name(ct()) << " S " << S << " L " << L << " nq " << nq << " nkv " << nkv << " D "
                 << D << " window " << window << " packed " << packed << " cap " << cap << " impl " << impl);
    const DType t = ct();
    const float scale = float(1.0 / std::sqrt(double(D)));
    const int64_t T = S * L;
    // scores of a few units: a cap of 2 bends them well into the tanh
    VecF q = randn(size_t(T * nq * D), 161, 2.f), k = randn(size_t(T * nkv * D), 162, 2.f),
         v = randn(size_t(T * nkv * D), 163);
    VecF dout = randn(size_t(T * nq * D), 164);
    std::vector<int32_t> pos;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = 0, start = 0; i < L; ++i) {
        if (i - start == 37 + 11 * s) start = i;
        pos.push_back(int32_t(i - start));
      }
    DT qd = upload(q, t), kd = upload(k, t), vd = upload(v, t), dod = upload(dout, t), pd = upload_i32(pos);
    DT o = poisoned(T * nq * D, t), lse = poisoned(S * nq * L, DType::f32);
    DT dq = poisoned(T * nq * D, t), dk = poisoned(T * nkv * D, t), dv = poisoned(T * nkv * D, t);
    DeviceBuffer scratch(dev(), Ops::attention_scratch_bytes(S, L, nq, nkv, D));
    Ops::AttentionVariant gv;
    gv.window = window;
    gv.softcap = cap;
    gv.pos = packed ? pd.as<int32_t>() : nullptr;
    run([&](Ops& op) {
      set_impl(op, impl);
      op.attention_fwd_v(qd.get(), kd.get(), vd.get(), o.get(), lse.as<float>(), S, L, nq, nkv, D, scale, gv,
                         scratch.get());
      op.attention_bwd_v(qd.get(), kd.get(), vd.get(), o.get(), lse.as<float>(), dod.get(), dq.get(),
                         dk.get(), dv.get(), S, L, nq, nkv, D, scale, gv, scratch.get());
      set_impl(op, 0);
    });
    Ops::AttentionVariant cv = gv;
    cv.pos = packed ? pos.data() : nullptr;
    VecF ro(q.size()), rl(size_t(S * nq * L)), rdq(q.size()), rdk(k.size()), rdv(v.size());
    std::vector<char> cs(Ops::attention_scratch_bytes(S, L, nq, nkv, D));
    cpu_->attention_fwd_v(q.data(), k.data(), v.data(), ro.data(), rl.data(), S, L, nq, nkv, D, scale, cv,
                          cs.data());
    VecF go = download(o);
    cpu_->attention_bwd_v(q.data(), k.data(), v.data(), go.data(), rl.data(), dout.data(), rdq.data(),
                          rdk.data(), rdv.data(), S, L, nq, nkv, D, scale, cv, cs.data());
    EXPECT_TRUE(close(go, ro, 1e-2, "o"));
    EXPECT_TRUE(close(download(lse), rl, 1e-4, "lse"));
    EXPECT_TRUE(close(download(dq), rdq, 3e-2, "dq"));
    EXPECT_TRUE(close(download(dk), rdk, 3e-2, "dk"));
    EXPECT_TRUE(close(download(dv), rdv, 2e-2, "dv"));
  }
  std::unique_ptr<Ops> cpu_;
};

}  // namespace

// Tensor-core path: several 64-row tiles with a partial last one, windows inside and past a
// tile, packed examples, GQA 1 to 4, the narrow configuration (impl 2), head_dims 128 and
// Gemma's 256 (the latter only where a block may hold its 165 KiB of shared memory; elsewhere
// the same calls run on the row kernels and must match as well).
TEST_P(CudaSoftcap, AttentionMatchesCpuTensorCores) {
  check_attention({1, 200, 8, 4, 256, 0, false, 50.0f});
  check_attention({2, 150, 4, 2, 256, 70, false, 2.0f});
  check_attention({2, 130, 4, 1, 256, 0, true, 2.0f});
  for (float cap : {2.0f, 50.0f}) check_attention({2, 200, 8, 2, 64, 0, false, cap});
  check_attention({2, 200, 8, 2, 64, 65, false, 2.0f});
  check_attention({2, 150, 8, 4, 64, 0, true, 2.0f});
  check_attention({2, 150, 8, 8, 64, 3, true, 2.0f, 2});
  check_attention({1, 130, 4, 1, 128, 0, false, 2.0f});
  check_attention({1, 130, 4, 2, 128, 70, true, 2.0f, 2});
}

// The row kernels: head_dim 40 (which the tensor-core kernels do not take), and impl 1
// forcing them at 256 and 64.
TEST_P(CudaSoftcap, AttentionMatchesCpuRows) {
  check_attention({2, 100, 4, 2, 40, 0, false, 2.0f});
  check_attention({2, 100, 4, 2, 40, 7, true, 2.0f});
  check_attention({1, 70, 4, 2, 256, 0, false, 2.0f, 1});
  check_attention({1, 70, 4, 2, 256, 16, false, 2.0f, 1});
  check_attention({2, 90, 8, 1, 64, 5, true, 2.0f, 1});
}

// KV-cache decoding with a cap (and a window) against the CPU twin.
TEST_P(CudaSoftcap, DecodeMatchesCpu) {
  const DType t = ct();
  const int64_t past = 70, n = 5, nq = 8, nkv = 2, C = 128;  // a cache of 128 rows
  for (int64_t D : {64, 256}) {
    VecF q = randn(size_t(n * nq * D), 181, 2.f), k = randn(size_t(C * nkv * D), 182, 2.f),
         v = randn(size_t(C * nkv * D), 183);
    DT qd = upload(q, t), kd = upload(k, t), vd = upload(v, t);
    for (int64_t window : {0, 16}) {
      DT o = poisoned(n * nq * D, t);
      Ops::AttentionVariant var;
      var.window = window;
      var.softcap = 2.0f;
      const float scale = float(1.0 / std::sqrt(double(D)));
      run([&](Ops& op) {
        op.attention_decode_v(qd.get(), kd.get(), vd.get(), o.get(), past, n, nq, nkv, D, scale, var);
      });
      VecF r(q.size());
      cpu_->attention_decode_v(q.data(), k.data(), v.data(), r.data(), past, n, nq, nkv, D, scale, var);
      EXPECT_TRUE(close(download(o), r, 1e-2,
                        ("decode D " + std::to_string(D) + " window " + std::to_string(window)).c_str()));
    }
  }
}

// The fused LM head + cross-entropy with a final cap: loss, dh and the dW increment, for a
// vocabulary that is a multiple of the vector width and one that is not; loss scaling on.
TEST_P(CudaSoftcap, CrossEntropyMatchesCpu) {
  const DType t = ct();
  for (int64_t V : {256, 251}) {
    SCOPED_TRACE(::testing::Message() << "V " << V);
    const int64_t T = 300, H = 64;
    const float cap = 3.0f, ls = 8.0f;
    VecF h = randn(size_t(T * H), 191), w = randn(size_t(V * H), 192, 0.5f), dw0 = randn(size_t(V * H), 193);
    std::vector<int32_t> tg(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) tg[size_t(i)] = i % 7 == 3 ? -100 : int32_t((i * 131 + 7) % V);
    DT hd = upload(h, t), wd = upload(w, t), tgd = upload_i32(tg);
    DT loss = poisoned(2, DType::f32), dh = poisoned(T * H, t), dw = upload(dw0, DType::f32);
    DeviceBuffer scratch(dev(), Ops::lm_head_ce_scratch_bytes(T, H, V));
    run([&](Ops& o) {
      o.lm_head_cross_entropy(hd.get(), wd.get(), tgd.as<int32_t>(), T, H, V, loss.as<float>(), dh.get(),
                              dw.get(), scratch.get(), ls, cap);
    });
    VecF rloss(2), rdh(size_t(T * H)), rdw = dw0;
    std::vector<char> cs(Ops::lm_head_ce_scratch_bytes(T, H, V));
    cpu_->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, rloss.data(), rdh.data(), rdw.data(),
                                cs.data(), ls, cap);
    const VecF gl = download(loss);
    EXPECT_EQ(gl[1], rloss[1]);
    EXPECT_NEAR(gl[0], rloss[0], 3e-3 * std::abs(rloss[0]));
    EXPECT_TRUE(close(download(dh), rdh, 2e-2, "dh"));
    const VecF gdw = download(dw);
    VecF inc(gdw.size()), rinc(gdw.size());
    for (size_t i = 0; i < gdw.size(); ++i) {
      inc[i] = gdw[i] - dw0[i];
      rinc[i] = rdw[i] - dw0[i];
    }
    EXPECT_TRUE(close(inc, rinc, 2e-2, "dw increment"));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtype, CudaSoftcap, ::testing::Values(DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace rp::cudatest
