// Packed sequences through the whole runtime: several examples in one sequence, with
// positions restarting per example, train exactly as the same examples one padded example
// per sequence (losses and weights after two steps; CPU backend, fp32).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "data/dataset.hpp"
#include "roundpipe/session.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp {
namespace {
using namespace rp::test;

struct Trained {
  std::vector<StepResult> steps;
  std::vector<std::vector<float>> weights;
};

Trained train(const ModelLayout& m, const PackedSequences& p, int workers) {
  SessionOptions o;
  o.workers = workers;
  o.micro_batches = p.size();
  o.micro = {1, p.seq_len};
  o.async = false;
  o.adam = adam_opts();
  Session s(m, random_weights(m, 3), o);
  Trained r;
  for (int t = 0; t < 2; ++t) {
    if (p.positions.empty()) s.forward_backward(p.ids, p.targets);
    else s.forward_backward(p.ids, p.targets, p.positions);
    s.step(1e-3);
  }
  for (int t = 0; t < 2; ++t) r.steps.push_back(s.wait(t));
  r.weights = s.master_weights();
  return r;
}
}  // namespace

TEST(Packing, PackedSequencesTrainAsTheExamplesOneByOne) {
  for (bool qwen3 : {false, true}) {
    const ModelLayout m = make_layout(tiny_config(qwen3, !qwen3));
    Dataset d;
    std::mt19937_64 rng(5);
    for (int64_t n : {5, 9, 3, 7, 6, 2, 20}) {  // the last one is cut to seq_len
      Example ex;
      for (int64_t i = 0; i < n; ++i) {
        ex.ids.push_back(int32_t(rng() % 67));
        ex.loss_mask.push_back(i > 0 && rng() % 5 != 0);
      }
      d.examples.push_back(ex);
    }
    const PackedSequences packed = pack_sequences(d, 16, 0, true), padded = pack_sequences(d, 16, 0, false);
    ASSERT_EQ(packed.size(), 4);  // [5 9] [3 7 6] [2] [16 of 20]
    ASSERT_EQ(padded.size(), 7);
    const Trained a = train(m, packed, 2), b = train(m, padded, 3);
    for (int t = 0; t < 2; ++t) {
      EXPECT_EQ(a.steps[size_t(t)].tokens, b.steps[size_t(t)].tokens);
      EXPECT_NEAR(a.steps[size_t(t)].loss_sum, b.steps[size_t(t)].loss_sum,
                  1e-5 * b.steps[size_t(t)].loss_sum)
          << "step " << t << (qwen3 ? " qwen3" : " llama");
    }
    for (size_t g = 0; g < a.weights.size(); ++g)
      EXPECT_LT(rel_err(a.weights[g], b.weights[g]), 1e-5) << "group " << g;
    // and the packing matters: without its positions the packed batch computes something else
    PackedSequences unpos = packed;
    unpos.positions.clear();
    const Trained c = train(m, unpos, 2);
    EXPECT_GT(std::abs(c.steps[0].loss_sum - b.steps[0].loss_sum), 1e-4 * b.steps[0].loss_sum);
  }
}

// LongRoPE (original context 14, sequences of 16): a packed micro-batch takes the short or the
// long table by its largest position + 1 (its padding, positions restarting at 0, counted), so
// the packed rows [5 9], [3 7 6] and [2] (its padding at 0..13) keep the short one and
// [16 of 20] takes the long one, as each example alone (padded, its padding a
// position-restarting tail) does; a row's length alone would put every row on the long table.
TEST(Packing, LongRopePicksEachMicroBatchsTableByItsPositions) {
  ModelConfig c = tiny_config(false, true);
  c.rope_scaling.type = "longrope";
  c.rope_scaling.original_max_position_embeddings = 14;
  c.rope_scaling.short_factor = {1.0, 1.4, 2.0, 3.0};
  c.rope_scaling.long_factor = {1.5, 3.0, 7.0, 12.0};
  const ModelLayout m = make_layout(c);
  Dataset d;
  std::mt19937_64 rng(5);
  for (int64_t n : {5, 9, 3, 7, 6, 2, 20}) {
    Example ex;
    for (int64_t i = 0; i < n; ++i) {
      ex.ids.push_back(int32_t(1 + rng() % 66));  // 0 only as padding
      ex.loss_mask.push_back(i > 0 && rng() % 5 != 0);
    }
    d.examples.push_back(ex);
  }
  const PackedSequences packed = pack_sequences(d, 16, 0, true);
  PackedSequences padded = pack_sequences(d, 16, 0, false);
  ASSERT_EQ(padded.size(), 7);
  padded.positions.resize(padded.ids.size());
  for (int64_t r = 0; r < padded.size(); ++r) {
    const auto row = padded.ids.begin() + r * 16;
    const int64_t n = std::find(row, row + 16, 0) - row;  // the example, then its padding
    for (int64_t t = 0; t < 16; ++t) padded.positions[size_t(r * 16 + t)] = int32_t(t < n ? t : t - n);
  }
  const Trained a = train(m, packed, 2), b = train(m, padded, 3);
  for (int t = 0; t < 2; ++t)
    EXPECT_NEAR(a.steps[size_t(t)].loss_sum, b.steps[size_t(t)].loss_sum, 1e-5 * b.steps[size_t(t)].loss_sum)
        << "step " << t;
  for (size_t g = 0; g < a.weights.size(); ++g)
    EXPECT_LT(rel_err(a.weights[g], b.weights[g]), 1e-5) << "group " << g;
  // the padded rows without positions go by their length, 16: all on the long table
  padded.positions.clear();
  const Trained l = train(m, padded, 3);
  EXPECT_GT(std::abs(l.steps[0].loss_sum - b.steps[0].loss_sum), 1e-4 * b.steps[0].loss_sum);
}

TEST(Packing, BadPositionsAreRefused) {
  const ModelLayout m = make_layout(tiny_config(false, true));
  SessionOptions o;
  o.micro = {2, 8};
  Session s(m, random_weights(m, 3), o);
  std::vector<int32_t> ids(16, 1), tg(16, 2), pos(16, 0);
  pos[9] = 2;  // token 1 of the second sequence cannot be at position 2
  try {
    s.forward_backward(ids, tg, pos);
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("position 2 at token 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.forward_backward(ids, tg, std::vector<int32_t>(15, 0)), std::invalid_argument);
}

}  // namespace rp
