// The CUDA backend's GPT-OSS ops against their CPU twins (kernels/cpu/cpu_gptoss.cpp, itself
// checked against dense references in test_gptoss_ops.cpp), in bf16 and f16: attention with
// a sliding window, sinks and packed positions on the tensor-core path (head_dim 64/128), the
// row kernels (other head_dims, or forced with impl 1) and KV-cache decoding; the default
// variant against the plain ops; the per-expert bias (with empty groups and more groups than
// one launch takes) and the clamped SwiGLU at its bounds. Inputs are rounded to the device
// dtype by the upload, outputs NaN-poisoned. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/kernels/test_cuda_fixtures.hpp"

namespace rp::cudatest {
namespace {
using ref::randn;

// Examples of 1..23 tokens (long = false) or of 130 tokens and the rest (long = true), cut at L.
std::vector<int32_t> packed_positions(int64_t S, int64_t L, bool long_examples = false) {
  std::vector<int32_t> p;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0, start = 0, len = long_examples ? 130 : 3 + s; t < L; ++t) {
      if (t - start == len) start = t, len = long_examples ? L : 1 + (len * 7 + 5) % 23;
      p.push_back(int32_t(t - start));
    }
  return p;
}

// ||got - ref|| / max(||ref||, floor) <= tol, and no NaN. With a window of 1 and no sink every
// row's softmax has one weight, p = 1, so dq and dk are zero in exact arithmetic: the CPU twin
// gets exact zeros (its o is v, so Di = dO.o equals dP = dO.v bit for bit), while the GPU's
// p = exp2(s*log2e - lse*log2e) and its dP - Di (an MMA sum against Di's warp sum) leave
// rounding noise near 1e-7 per element. close()'s relative error then divides by zero and
// reports ~1e25 for a correct result; the floor gives the comparison the gradients' scale.
::testing::AssertionResult close_floor(const VecF& got, const VecF& ref, double floor_norm, double tol,
                                       const char* what) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  size_t nan = 0;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    nan += std::isnan(got[i]) ? 1 : 0;
    const double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  const double e = std::sqrt(num) / std::max(std::sqrt(den), floor_norm);
  if (nan == 0 && e <= tol) return ::testing::AssertionSuccess() << what << " err " << e;
  return ::testing::AssertionFailure()
         << what << ": err " << e << " > " << tol << " (|ref| " << std::sqrt(den) << ", floor " << floor_norm
         << ", " << nan << " NaN of " << got.size() << ")";
}

double l2_norm(const VecF& x) {
  double s = 0;
  for (float a : x) s += double(a) * double(a);
  return std::sqrt(s);
}

class CudaGptOss : public CudaTest, public ::testing::WithParamInterface<DType> {
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
    bool sinks;
    int packed;    // 0: no positions, 1: short packed examples, 2: long ones (130 tokens, the rest)
    int impl = 0;  // 0 automatic, 1 the row kernels, 2 the 4-warp forward and unpipelined backward
  };

  // Forward and backward of the variant on the GPU and on the CPU (same rounded inputs; the
  // CPU backward starts from the GPU's o).
  void check_attention(const Case& c) {
    const auto [S, L, nq, nkv, D, window, with_sinks, packed, impl] = c;
    SCOPED_TRACE(::testing::Message() << dtype_name(ct()) << " S " << S << " L " << L << " nq " << nq
                                      << " nkv " << nkv << " D " << D << " window " << window << " sinks "
                                      << with_sinks << " packed " << packed << " impl " << impl);
    const DType t = ct();
    const float scale = float(1.0 / std::sqrt(double(D)));
    const int64_t T = S * L;
    VecF q = randn(size_t(T * nq * D), 61), k = randn(size_t(T * nkv * D), 62),
         v = randn(size_t(T * nkv * D), 63);
    VecF dout = randn(size_t(T * nq * D), 64), sinks = randn(size_t(nq), 65, 2.f);
    const auto pos = packed_positions(S, L, packed == 2);
    DT qd = upload(q, t), kd = upload(k, t), vd = upload(v, t), dod = upload(dout, t), sd = upload(sinks, t);
    DT pd = upload_i32(pos);
    DT o = poisoned(T * nq * D, t), lse = poisoned(S * nq * L, DType::f32);
    DT dq = poisoned(T * nq * D, t), dk = poisoned(T * nkv * D, t), dv = poisoned(T * nkv * D, t);
    VecF ds0(size_t(nq), 0.25f);
    DT dsd = upload(ds0, DType::f32);
    DeviceBuffer scratch(dev(), Ops::attention_scratch_bytes(S, L, nq, nkv, D));
    Ops::AttentionVariant gv;
    gv.window = window;
    gv.sinks = with_sinks ? sd.get() : nullptr;
    gv.dsinks = with_sinks ? dsd.get() : nullptr;
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
    VecF rds = ds0;
    cv.sinks = with_sinks ? sinks.data() : nullptr;
    cv.dsinks = with_sinks ? rds.data() : nullptr;
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
    // dq and dk against 1% of dv's norm at least (close_floor: zero for a window of 1)
    const double floor_norm = 1e-2 * l2_norm(rdv);
    EXPECT_TRUE(close_floor(download(dq), rdq, floor_norm, 3e-2, "dq"));
    EXPECT_TRUE(close_floor(download(dk), rdk, floor_norm, 3e-2, "dk"));
    EXPECT_TRUE(close(download(dv), rdv, 2e-2, "dv"));
    if (with_sinks) {
      EXPECT_TRUE(close(download(dsd), rds, 2e-2, "dsinks"));
    }
  }
  std::unique_ptr<Ops> cpu_;
};

}  // namespace

// Tensor-core path: head_dim 64 and 128, several 64-row tiles with a partial last one; windows
// 1 (the diagonal only), 2, 3, around the 64-key tile (63, 64, 65), L-1 and 128 (> L for
// L = 100), sinks on and off, packed positions, GQA ratios 1 to 8, the 4-warp forward with
// the unpipelined backward (impl 2).
TEST_P(CudaGptOss, AttentionVariantsMatchCpuTensorCores) {
  for (int64_t window : {1, 2, 3, 63, 64, 65, 199, 128})
    for (bool sinks : {false, true}) check_attention({2, 200, 8, 2, 64, window, sinks, 0});
  for (int64_t window : {1, 2, 65}) check_attention({2, 200, 8, 2, 64, window, window == 2, 0, 2});
  check_attention({2, 150, 8, 4, 64, 2, true, 1, 2});
  check_attention({1, 100, 4, 4, 64, 128, true, 0});
  for (int64_t ratio : {1, 2, 4, 8}) check_attention({2, 150, 8, 8 / ratio, 64, 3, true, 1});
  check_attention({2, 150, 8, 4, 64, 0, true, 1});    // sinks, no window, packed
  check_attention({2, 200, 8, 4, 64, 0, true, 2});    // long examples: tiles partly in two examples
  check_attention({2, 200, 8, 2, 64, 70, false, 2});  // window and long examples
  check_attention({1, 130, 4, 1, 128, 70, true, 0});  // head_dim 128
  check_attention({1, 130, 4, 2, 128, 0, true, 1});
}

// The row kernels: a head_dim the tensor cores do not take, and impl 1 forcing them.
TEST_P(CudaGptOss, AttentionVariantsMatchCpuRows) {
  for (int64_t window : {1, 2, 3, 99, 128})
    for (bool sinks : {false, true}) check_attention({2, 100, 4, 2, 40, window, sinks, window == 3 ? 1 : 0});
  check_attention({2, 90, 8, 1, 64, 5, true, 1, 1});
  check_attention({1, 90, 8, 8, 64, 17, true, 0, 1});
  check_attention({1, 200, 4, 2, 40, 0, true, 2});
}

// The default variant (and a window >= L without sinks) runs the plain ops: the same forward
// bits; the backward's dq is summed with float atomics (ours and cuDNN's), so the order and
// the last bit may differ between two identical calls.
TEST_P(CudaGptOss, DefaultVariantEqualsThePlainOps) {
  const DType t = ct();
  const int64_t S = 2, L = 96, nq = 8, nkv = 2, D = 64;
  const float scale = 0.125f;
  VecF q = randn(size_t(S * L * nq * D), 71), k = randn(size_t(S * L * nkv * D), 72);
  VecF v = randn(size_t(S * L * nkv * D), 73), dout = randn(size_t(S * L * nq * D), 74);
  DT qd = upload(q, t), kd = upload(k, t), vd = upload(v, t), dod = upload(dout, t);
  DT pd = upload_i32(packed_positions(S, L));
  DeviceBuffer scratch(dev(), Ops::attention_scratch_bytes(S, L, nq, nkv, D));
  for (bool packed : {false, true})
    for (int64_t window : {int64_t(0), L, int64_t(1000)}) {
      SCOPED_TRACE(::testing::Message() << "packed " << packed << " window " << window);
      std::array<DT, 2> o, dq, dk, dv, lse;
      for (int i = 0; i < 2; ++i) {
        o[i] = poisoned(S * L * nq * D, t), dq[i] = poisoned(S * L * nq * D, t);
        dk[i] = poisoned(S * L * nkv * D, t), dv[i] = poisoned(S * L * nkv * D, t);
        lse[i] = poisoned(S * nq * L, DType::f32);
      }
      Ops::AttentionVariant var;
      var.window = window;
      var.pos = packed ? pd.as<int32_t>() : nullptr;
      run([&](Ops& op) {
        if (packed) {
          op.attention_fwd_packed(qd.get(), kd.get(), vd.get(), o[0].get(), lse[0].as<float>(),
                                  pd.as<int32_t>(), S, L, nq, nkv, D, scale, scratch.get());
          op.attention_bwd_packed(qd.get(), kd.get(), vd.get(), o[0].get(), lse[0].as<float>(), dod.get(),
                                  pd.as<int32_t>(), dq[0].get(), dk[0].get(), dv[0].get(), S, L, nq, nkv, D,
                                  scale, scratch.get());
        } else {
          op.attention_fwd(qd.get(), kd.get(), vd.get(), o[0].get(), lse[0].as<float>(), S, L, nq, nkv, D,
                           scale, scratch.get());
          op.attention_bwd(qd.get(), kd.get(), vd.get(), o[0].get(), lse[0].as<float>(), dod.get(),
                           dq[0].get(), dk[0].get(), dv[0].get(), S, L, nq, nkv, D, scale, scratch.get());
        }
        op.attention_fwd_v(qd.get(), kd.get(), vd.get(), o[1].get(), lse[1].as<float>(), S, L, nq, nkv, D,
                           scale, var, scratch.get());
        op.attention_bwd_v(qd.get(), kd.get(), vd.get(), o[1].get(), lse[1].as<float>(), dod.get(),
                           dq[1].get(), dk[1].get(), dv[1].get(), S, L, nq, nkv, D, scale, var,
                           scratch.get());
      });
      EXPECT_EQ(download(o[0]), download(o[1]));
      EXPECT_EQ(download(lse[0]), download(lse[1]));
      EXPECT_TRUE(close(download(dq[1]), download(dq[0]), 2e-3, "dq"));
      EXPECT_TRUE(close(download(dk[1]), download(dk[0]), 2e-3, "dk"));
      EXPECT_TRUE(close(download(dv[1]), download(dv[0]), 2e-3, "dv"));
    }
  // decode: the same row computation as attention_decode
  const int64_t past = 40, n = 3;
  DT o1 = poisoned(n * nq * D, t), o2 = poisoned(n * nq * D, t);
  run([&](Ops& op) {
    op.attention_decode(qd.get(), kd.get(), vd.get(), o1.get(), past, n, nq, nkv, D, scale);
    op.attention_decode_v(qd.get(), kd.get(), vd.get(), o2.get(), past, n, nq, nkv, D, scale, {});
  });
  EXPECT_TRUE(close(download(o2), download(o1), 1e-3, "decode"));
}

// KV-cache decoding with a window and sinks against the CPU twin.
TEST_P(CudaGptOss, DecodeWithWindowAndSinksMatchesCpu) {
  const DType t = ct();
  const int64_t past = 70, n = 5, nq = 8, nkv = 2, D = 64, C = 128;  // a cache of 128 rows
  VecF q = randn(size_t(n * nq * D), 81), k = randn(size_t(C * nkv * D), 82),
       v = randn(size_t(C * nkv * D), 83);
  VecF sinks = randn(size_t(nq), 84, 2.f);
  DT qd = upload(q, t), kd = upload(k, t), vd = upload(v, t), sd = upload(sinks, t);
  for (int64_t window : {1, 16, 128})
    for (bool with_sinks : {false, true}) {
      DT o = poisoned(n * nq * D, t);
      Ops::AttentionVariant gv, cv;
      gv.window = cv.window = window;
      gv.sinks = with_sinks ? sd.get() : nullptr;
      cv.sinks = with_sinks ? sinks.data() : nullptr;
      run([&](Ops& op) {
        op.attention_decode_v(qd.get(), kd.get(), vd.get(), o.get(), past, n, nq, nkv, D, 0.125f, gv);
      });
      VecF r(q.size());
      cpu_->attention_decode_v(q.data(), k.data(), v.data(), r.data(), past, n, nq, nkv, D, 0.125f, cv);
      EXPECT_TRUE(close(download(o), r, 1e-2, ("decode window " + std::to_string(window)).c_str()));
    }
}

// Per-expert bias: groups with no rows, N not a multiple of 32, and 300 groups (two launches);
// the backward is deterministic (two runs give the same bits) and accumulates.
TEST_P(CudaGptOss, GroupedBiasMatchesCpu) {
  const DType t = ct();
  for (auto [E, N] : std::vector<std::array<int64_t, 2>>{{5, 77}, {300, 40}, {1, 2880}}) {
    std::vector<int32_t> off(size_t(E + 1), 0);
    for (int64_t e = 0; e < E; ++e)
      off[size_t(e + 1)] = off[size_t(e)] + int32_t(e % 3 == 1 ? 0 : (e * 5) % 17 + 1);
    if (E == 1) off[1] = 700;
    const int64_t R = off[size_t(E)];
    VecF y = randn(size_t(R * N), 91), b = randn(size_t(E * N), 92), dy = randn(size_t(R * N), 93);
    DT yd = upload(y, t), bd = upload(b, t), dyd = upload(dy, t);
    VecF db0 = randn(size_t(E * N), 94);
    DT db1 = upload(db0, DType::f32), db2 = upload(db0, DType::f32);
    run([&](Ops& op) {
      op.grouped_bias_fwd(yd.get(), bd.get(), off.data(), E, N);
      op.grouped_bias_bwd(dyd.get(), db1.get(), off.data(), E, N);
      op.grouped_bias_bwd(dyd.get(), db2.get(), off.data(), E, N);
    });
    VecF ry = y, rdb = db0;
    cpu_->grouped_bias_fwd(ry.data(), b.data(), off.data(), E, N);
    cpu_->grouped_bias_bwd(dy.data(), rdb.data(), off.data(), E, N);
    const std::string what = "E " + std::to_string(E);
    EXPECT_TRUE(close(download(yd), ry, 5e-3, (what + " y").c_str()));
    const VecF g1 = download(db1);
    EXPECT_TRUE(close(g1, rdb, 1e-5, (what + " db").c_str()));
    EXPECT_EQ(g1, download(db2)) << what << ": the bias gradient is not deterministic";
  }
}

// Clamped SwiGLU (alpha 1.702, limit 7 as GPT-OSS) with inputs on and beyond the bounds.
TEST_P(CudaGptOss, ClampedSwigluMatchesCpu) {
  const DType t = ct();
  const int64_t n = 4099;
  VecF g = randn(size_t(n), 95, 5.f), u = randn(size_t(n), 96, 5.f), dh = randn(size_t(n), 97);
  g[0] = 7.f, g[1] = -7.f, g[2] = 9.f, u[0] = 7.f, u[1] = -7.f, u[2] = -9.f;
  DT gd = upload(g, t), ud = upload(u, t), dhd = upload(dh, t);
  DT h = poisoned(n, t), dg = poisoned(n, t), du = poisoned(n, t);
  run([&](Ops& op) {
    op.swiglu_clamped_fwd(gd.get(), ud.get(), h.get(), n, 1.702f, 7.f);
    op.swiglu_clamped_bwd(gd.get(), ud.get(), dhd.get(), dg.get(), du.get(), n, 1.702f, 7.f);
  });
  VecF rh(static_cast<size_t>(n)), rdg(static_cast<size_t>(n)), rdu(static_cast<size_t>(n));
  cpu_->swiglu_clamped_fwd(g.data(), u.data(), rh.data(), n, 1.702f, 7.f);
  cpu_->swiglu_clamped_bwd(g.data(), u.data(), dh.data(), rdg.data(), rdu.data(), n, 1.702f, 7.f);
  EXPECT_TRUE(close(download(h), rh, 5e-3, "h"));
  const VecF gdg = download(dg), gdu = download(du);
  EXPECT_TRUE(close(gdg, rdg, 5e-3, "dg"));
  EXPECT_TRUE(close(gdu, rdu, 5e-3, "du"));
  EXPECT_EQ(gdg[0], 0.f);  // g == limit: no gradient (torch.clamp)
  EXPECT_EQ(gdu[0], 0.f);
  EXPECT_EQ(gdu[1], 0.f);
  EXPECT_NE(gdg[1], 0.f);  // the gate has no lower bound
}

INSTANTIATE_TEST_SUITE_P(Dtype, CudaGptOss, ::testing::Values(DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace rp::cudatest
