// The runtime profiler (actors/layer_timer.hpp -> LayerTimings -> the scheduler's Profile):
// every layer call of every micro-batch reaches the profile under the kind its stage gives
// it, with the layer's device memory; on a model whose backward does strictly more work than
// its forward (a recompute of the forward plus two GEMMs per forward GEMM), the measured
// backward-with-recompute exceeds the forward for every decoder. Counts are exact; times are
// only compared by relations that hold with a wide margin on a loaded 2-core machine.
#include <gtest/gtest.h>

#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

struct TrainResult {
  Profile profile;
  IterationPlan plan;
  std::vector<std::string> log;
};

// embedding, decoders 1..4, tail 5; plan F[0-1] F[2-3] T[4-5] B[3-2] B[1-0]
constexpr int kL = 6;
IterationPlan test_plan() { return make_uniform_plan(kL, 2, 2, 1); }

TrainResult train(const ModelLayout& m, const std::string& backend, int steps, int64_t M,
                  MicroBatchShape shape, std::optional<IterationPlan> plan) {
  SessionOptions o;
  o.backend = backend;
  o.workers = 2;
  o.micro_batches = M;
  o.micro = shape;
  o.shards = 1;
  o.plan = plan;
  o.save_attention = false;  // the layers as make_layer(m, l) builds them (expect_structure)
  TestSession s(m, random_weights(m, 5), o);
  const int64_t n = M * shape.tokens();
  for (int t = 0; t < steps; ++t) {
    std::vector<int32_t> ids, tg;
    random_tokens(m.config.vocab_size, n, 70 + t, ids, tg);
    s.forward_backward(ids, tg);
    s.step(1e-4);
  }
  s.synchronize();
  return {s.profile(), s.plan(), s.replan_log()};
}

ModelConfig heavy_config() {
  ModelConfig c = tiny_config(false, true, 4);
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 512;
  return c;
}

/// Exact structure of a profile after `passes` passes of `M` micro-batches with test_plan():
/// which series exist, how many samples each saw, the memory of every layer.
void expect_structure(const Profile& p, const ModelLayout& m, int64_t samples, MicroBatchShape shape,
                      DType compute, DType grad, const std::string& what) {
  ASSERT_EQ(p.num_layers(), kL) << what;
  EXPECT_EQ(p.n_seq(), shape.n_seq);
  EXPECT_EQ(p.seq_len(), shape.seq_len);
  for (int l = 0; l < kL; ++l) {
    const LayerProfile& lp = p.layer(l);
    const bool in_tail = l >= 4;
    EXPECT_EQ(lp.fwd.seen(), in_tail ? 0 : samples) << what << " layer " << l;
    EXPECT_EQ(lp.bwd.seen(), in_tail ? 0 : samples) << what << " layer " << l;
    // only decoders recompute (the embedding's backward is a scatter-add)
    EXPECT_EQ(lp.recompute.seen(), l >= 1 && l <= 3 ? samples : 0) << what << " layer " << l;
    EXPECT_EQ(lp.tail.seen(), in_tail ? samples : 0) << what << " layer " << l;
    for (ProfileKind k :
         {ProfileKind::forward, ProfileKind::recompute, ProfileKind::backward, ProfileKind::tail}) {
      const SmoothedTime& st = lp.series(k);
      if (st.seen() == 0) continue;
      EXPECT_EQ(st.kept(), samples - 1) << what << " layer " << l << " " << profile_kind_name(k);
      EXPECT_GT(st.value(), 0) << what << " layer " << l << " " << profile_kind_name(k);
    }
    int64_t numel = 0;
    for (int g : m.groups_of(l)) numel += m.groups[size_t(g)].numel;
    EXPECT_EQ(lp.weight_bytes, numel * int64_t(dtype_size(compute))) << what << " layer " << l;
    EXPECT_EQ(lp.grad_bytes, numel * int64_t(dtype_size(grad))) << what << " layer " << l;
    EXPECT_EQ(lp.scratch_peak_bytes, int64_t(make_layer(m, l)->scratch_bytes(shape, compute)))
        << what << " layer " << l;
  }
  EXPECT_TRUE(p.settled(1.0, 3)) << what;  // every needed series has >= 3 kept samples
}

TEST(Profiler, EveryLayerCallReachesTheProfileOnTheCpuBackend) {
  ModelLayout m = make_layout(heavy_config());
  const MicroBatchShape shape{2, 64};
  const int steps = 3;
  const int64_t M = 4;
  TrainResult r = train(m, "cpu", steps, M, shape, test_plan());
  expect_structure(r.profile, m, steps * M, shape, DType::f32, DType::f32, "cpu");
  EXPECT_NE(r.profile.device.find("cpu"), std::string::npos) << r.profile.device;
  EXPECT_TRUE(r.log.empty());  // explicit plan
  EXPECT_EQ(r.plan.stages, test_plan().stages);
  double fwd = 0, bwd = 0;
  for (int l = 1; l <= 3; ++l) {
    const LayerProfile& lp = r.profile.layer(l);
    const double b = lp.bwd.value() + lp.recompute.value();
    std::printf("decoder %d: forward %.3f ms, recompute %.3f ms, backward %.3f ms\n", l - 1,
                lp.fwd.value() * 1e3, lp.recompute.value() * 1e3, lp.bwd.value() * 1e3);
    EXPECT_GT(b, lp.fwd.value()) << "decoder " << l - 1;
    fwd += lp.fwd.value();
    bwd += b;
  }
  EXPECT_GT(bwd, 1.5 * fwd);
  // the tail stage (decoder 4 forward + backward with recompute, then the LM head's fused
  // forward + loss + backward) did more work than one decoder's forward
  EXPECT_GT(r.profile.layer(4).tail.value(), r.profile.layer(3).fwd.value());
}

TEST(Profiler, ProfilingOffLeavesTheProfileEmpty) {
  ModelLayout m = make_layout(tiny_config(false, true, 4));
  SessionOptions o;
  o.workers = 2;
  o.micro_batches = 2;
  o.micro = {2, 5};
  o.profiling.enabled = false;
  TestSession s(m, random_weights(m, 5), o);
  std::vector<int32_t> ids, tg;
  random_tokens(m.config.vocab_size, 2 * 10, 1, ids, tg);
  s.forward_backward(ids, tg);
  s.step(1e-4);
  s.synchronize();
  const Profile p = s.profile();
  ASSERT_EQ(p.num_layers(), kL);
  for (int l = 0; l < kL; ++l)
    for (ProfileKind k :
         {ProfileKind::forward, ProfileKind::recompute, ProfileKind::backward, ProfileKind::tail})
      EXPECT_EQ(p.layer(l).series(k).seen(), 0) << l;
  EXPECT_TRUE(s.replan_log().empty());
}

TEST(ProfilerCuda, EventTimesReachTheProfile) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  ModelLayout m = make_layout(heavy_config());
  // 1,024 tokens a micro-batch: at a few hundred tokens one decoder's kernels take tens of
  // microseconds, and a host thread preempted between two launches of a timed layer once made
  // one decoder's forward read longer than its backward (H100); the three decoders' sums below
  // compare the work, not a single interval's jitter
  const MicroBatchShape shape{4, 256};
  const int steps = 3;
  const int64_t M = 4;
  TrainResult r = train(m, "cuda", steps, M, shape, test_plan());
  const DType ct = DType::bf16;
  expect_structure(r.profile, m, steps * M, shape, ct, DType::f32, "cuda");
  EXPECT_NE(r.profile.device.find("cuda"), std::string::npos) << r.profile.device;
  double fwd = 0, bwd = 0;
  for (int l = 1; l <= 3; ++l) {
    const LayerProfile& lp = r.profile.layer(l);
    std::printf("decoder %d: forward %.1f us, recompute %.1f us, backward %.1f us\n", l - 1,
                lp.fwd.value() * 1e6, lp.recompute.value() * 1e6, lp.bwd.value() * 1e6);
    EXPECT_GT(lp.fwd.value(), 0.0) << "decoder " << l - 1;
    EXPECT_LT(lp.fwd.value(), 1.0) << "event times are seconds";
    fwd += lp.fwd.value();
    bwd += lp.bwd.value() + lp.recompute.value();
  }
  EXPECT_GT(bwd, fwd) << "the backward stages (recompute + backward) did more work than the forward";
}

}  // namespace
}  // namespace rp::test
