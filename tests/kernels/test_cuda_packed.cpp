// CUDA packed-sequence ops and KV-cache attention against their CPU twins (skipped without a
// GPU): random bf16 inputs, NaN-poisoned outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/kernels/test_cuda_fixtures.hpp"

namespace rp::cudatest {
namespace {
using ref::randn;
constexpr double kTol = 2e-2;

std::vector<int32_t> packed_positions(int64_t S, int64_t L) {  // examples of 1..23 tokens, cut at L
  std::vector<int32_t> p;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0, start = 0, len = 3 + s; t < L; ++t) {
      if (t - start == len) start = t, len = 1 + (len * 7 + 5) % 23;
      p.push_back(int32_t(t - start));
    }
  return p;
}
}  // namespace

TEST_F(CudaOpsTest, RopeAtPositions) {
  const int64_t T = 37, heads = 3, D = 64;
  VecF x = randn(size_t(T * heads * D), 31), inv(size_t(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) inv[size_t(i)] = std::pow(10000.f, -2.f * float(i) / float(D));
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t((t * 13) % 29);
  DT xd = upload(x, DType::bf16), pd = upload_i32(pos);
  run([&](Ops& o) { o.rope_fwd_at(xd.get(), pd.as<int32_t>(), T, heads, D, inv.data(), 1.f); });
  VecF r = x;
  cpu_->rope_fwd_at(r.data(), pos.data(), T, heads, D, inv.data(), 1.f);
  EXPECT_TRUE(close(download(xd), r, kTol, "rope_fwd_at"));
  run([&](Ops& o) { o.rope_bwd_at(xd.get(), pd.as<int32_t>(), T, heads, D, inv.data(), 1.f); });
  EXPECT_TRUE(close(download(xd), x, kTol, "rope_bwd_at undoes it"));
}

TEST_F(CudaOpsTest, PackedAttentionMatchesCpu) {
  for (auto [S, L, nq, nkv, D] :
       std::vector<std::array<int64_t, 5>>{{2, 96, 4, 2, 64}, {1, 200, 8, 8, 128}}) {
    const float scale = float(1.0 / std::sqrt(double(D)));
    const auto pos = packed_positions(S, L);
    VecF q = randn(size_t(S * L * nq * D), 41), k = randn(size_t(S * L * nkv * D), 42);
    VecF v = randn(size_t(S * L * nkv * D), 43), dout = randn(size_t(S * L * nq * D), 44);
    DT qd = upload(q, DType::bf16), kd = upload(k, DType::bf16), vd = upload(v, DType::bf16);
    DT dod = upload(dout, DType::bf16), pd = upload_i32(pos);
    DT o = poisoned(S * L * nq * D, DType::bf16), lse = poisoned(S * nq * L, DType::f32);
    DT dq = poisoned(S * L * nq * D, DType::bf16), dk = poisoned(S * L * nkv * D, DType::bf16);
    DT dv = poisoned(S * L * nkv * D, DType::bf16);
    DeviceBuffer scratch(dev(), Ops::attention_scratch_bytes(S, L, nq, nkv, D));
    run([&](Ops& op) {
      op.attention_fwd_packed(qd.get(), kd.get(), vd.get(), o.get(), lse.as<float>(), pd.as<int32_t>(), S, L,
                              nq, nkv, D, scale, scratch.get());
      op.attention_bwd_packed(qd.get(), kd.get(), vd.get(), o.get(), lse.as<float>(), dod.get(),
                              pd.as<int32_t>(), dq.get(), dk.get(), dv.get(), S, L, nq, nkv, D, scale,
                              scratch.get());
    });
    VecF ro(q.size()), rl(size_t(S * nq * L)), rdq(q.size()), rdk(k.size()), rdv(v.size());
    std::vector<char> cs(Ops::attention_scratch_bytes(S, L, nq, nkv, D));
    cpu_->attention_fwd_packed(q.data(), k.data(), v.data(), ro.data(), rl.data(), pos.data(), S, L, nq, nkv,
                               D, scale, cs.data());
    VecF go = download(o);  // the backward starts from the device's rounded o
    cpu_->attention_bwd_packed(q.data(), k.data(), v.data(), go.data(), rl.data(), dout.data(), pos.data(),
                               rdq.data(), rdk.data(), rdv.data(), S, L, nq, nkv, D, scale, cs.data());
    EXPECT_TRUE(close(go, ro, kTol, "o"));
    EXPECT_TRUE(close(download(lse), rl, 1e-3, "lse"));
    EXPECT_TRUE(close(download(dq), rdq, 3e-2, "dq"));
    EXPECT_TRUE(close(download(dk), rdk, 3e-2, "dk"));
    EXPECT_TRUE(close(download(dv), rdv, 3e-2, "dv"));
  }
}

TEST_F(CudaOpsTest, AttentionDecodeMatchesCpu) {
  const int64_t past = 70, n = 5, nq = 8, nkv = 2, D = 64, C = 128;  // a cache of 128 rows
  VecF q = randn(size_t(n * nq * D), 51), k = randn(size_t(C * nkv * D), 52),
       v = randn(size_t(C * nkv * D), 53);
  DT qd = upload(q, DType::bf16), kd = upload(k, DType::bf16), vd = upload(v, DType::bf16);
  DT o = poisoned(n * nq * D, DType::bf16);
  run([&](Ops& op) {
    op.attention_decode(qd.get(), kd.get(), vd.get(), o.get(), past, n, nq, nkv, D, 0.125f);
  });
  VecF r(q.size());
  cpu_->attention_decode(q.data(), k.data(), v.data(), r.data(), past, n, nq, nkv, D, 0.125f);
  EXPECT_TRUE(close(download(o), r, kTol, "decode"));
}

}  // namespace rp::cudatest
