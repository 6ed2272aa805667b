// A step whose batches hold no target token (every target kIgnoreIndex) has no gradient: it is
// skipped and reported as such, in both optimizer modes and with or without the norm guard.
// An AdamW call with a zero gradient used to move the weights by momentum and weight decay.
#include <gtest/gtest.h>

#include <cstring>

#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

constexpr int64_t kM = 2, kNSeq = 1, kSeqLen = 6;

/// Trains steps 0 and 1 on data, step 2 on a batch without targets, step 3 on data; returns
/// the step results and the weights after step 1 and after step 2.
struct EmptyRun {
  std::vector<StepResult> results;
  std::vector<std::vector<float>> after1, after2, after3;
};

EmptyRun run(bool async, double max_norm) {
  ModelLayout m = make_layout(tiny_config(false, true, 2));
  TestSessionOptions o;
  o.workers = 2;
  o.micro_batches = kM;
  o.micro = {kNSeq, kSeqLen};
  o.async = async;
  o.adam = adam_opts();  // weight decay on: a zero-gradient update would change the weights
  o.max_grad_norm = max_norm;
  TestSession s(m, random_weights(m, 5), o);
  EmptyRun r;
  for (int t = 0; t < 4; ++t) {
    std::vector<int32_t> ids, tg;
    random_tokens(m.config.vocab_size, kM * kNSeq * kSeqLen, 40 + t, ids, tg);
    if (t == 2) std::fill(tg.begin(), tg.end(), -100);
    s.forward_backward(ids, tg);
    s.step(lr_at(t));
    s.synchronize();
    if (t == 1) r.after1 = s.master_weights();
    if (t == 2) r.after2 = s.master_weights();
    if (t == 3) r.after3 = s.master_weights();
  }
  for (int t = 0; t < 4; ++t) r.results.push_back(s.wait(t));
  return r;
}

bool same(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  for (size_t g = 0; g < a.size(); ++g)
    if (std::memcmp(a[g].data(), b[g].data(), a[g].size() * sizeof(float)) != 0) return false;
  return a.size() == b.size();
}

TEST(EmptySteps, AStepWithoutTargetsIsSkippedAndChangesNothing) {
  for (bool async : {false, true})
    for (double max_norm : {0.0, 1.0}) {
      SCOPED_TRACE(::testing::Message() << (async ? "async" : "sync") << ", max_grad_norm " << max_norm);
      const EmptyRun r = run(async, max_norm);
      ASSERT_EQ(r.results.size(), 4u);
      EXPECT_EQ(r.results[2].tokens, 0);
      EXPECT_TRUE(r.results[2].skipped);
      for (int t : {0, 1, 3}) {
        EXPECT_FALSE(r.results[t].skipped) << t;
        EXPECT_GT(r.results[t].tokens, 0) << t;
      }
      EXPECT_TRUE(same(r.after1, r.after2)) << "the empty step moved the weights";
      EXPECT_FALSE(same(r.after2, r.after3)) << "the step after it must train again";
    }
}

}  // namespace
}  // namespace rp::test
