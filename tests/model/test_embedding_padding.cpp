// transformers' decoders (LLaMA, Mistral, Qwen2/3, Qwen3-MoE, GPT-OSS, OLMo 2, Granite, Phi-3,
// Gemma 2/3) build their embedding as nn.Embedding(vocab, hidden, padding_idx=pad_token_id):
// the lookup of the pad_token_id row gives that row no gradient. A whole-model backward with pad
// ids in the input leaves the row with what the LM head alone gives it (tied), or zero (untied);
// the other rows, and a model without pad_token_id, keep the lookup's gradient.
#include <gtest/gtest.h>

#include <vector>

#include "tests/model/test_layer_util.hpp"

namespace rp {
namespace {

using namespace rp::test;

/// The whole model's backward over `ids`: the gradients (one buffer per group) before the
/// embedding's backward, and after it.
struct Grads {
  std::vector<VecF> before_embedding, after;
};

Grads backward(TinyModel& m, const MicroBatchShape& s, const std::vector<int32_t>& ids,
               const std::vector<int32_t>& targets) {
  std::vector<VecF> grads = m.zero_grads();
  Grads out;
  m.backward(s, ids, targets, grads, [&] { out.before_embedding = grads; });
  out.after = std::move(grads);
  return out;
}

VecF row(const VecF& table, int64_t r, int64_t H) {
  return VecF(table.begin() + r * H, table.begin() + (r + 1) * H);
}

TEST(EmbeddingPadding, ThePadRowGetsOnlyTheLmHeadsGradient) {
  const MicroBatchShape s{2, 6};
  const int32_t pad = 5, other = 9;
  std::vector<int32_t> ids = random_ids(s.tokens(), 67, 21), targets = random_ids(s.tokens(), 67, 22);
  for (int32_t& id : ids)
    if (id == pad || id == other) id = 1;
  for (size_t i : {1u, 4u, 6u, 11u}) ids[i] = pad;  // pad == eos in the data: inside and at the ends
  ids[7] = other;
  for (bool tied : {true, false}) {
    TinyOpts o;
    o.tied = tied;
    o.pad_token_id = pad;
    TinyModel m(o);
    const int64_t H = m.layout.config.hidden_size;
    const Grads g = backward(m, s, ids, targets);
    const VecF lm_head_only = tied ? row(g.before_embedding[0], pad, H) : VecF(size_t(H), 0.0f);
    if (tied) {
      ASSERT_NE(lm_head_only, VecF(size_t(H), 0.0f));  // the tied head does reach the row
    }
    EXPECT_EQ(row(g.after[0], pad, H), lm_head_only) << (tied ? "tied" : "untied");
    // a row looked up that is not the pad row still gets the lookup's gradient
    EXPECT_NE(row(g.after[0], other, H), row(g.before_embedding[0], other, H)) << (tied ? "tied" : "untied");
    // without pad_token_id the row is an ordinary one
    o.pad_token_id = -1;
    TinyModel plain(o);
    const Grads p = backward(plain, s, ids, targets);
    EXPECT_NE(row(p.after[0], pad, H), row(p.before_embedding[0], pad, H)) << (tied ? "tied" : "untied");
    // the other groups (decoders, the tail) do not depend on it (up to the CPU ops' threaded sums)
    for (size_t gi = 1; gi < g.after.size(); ++gi)
      EXPECT_LT(ref::rel_err(g.after[gi], ref::to_d(p.after[gi])), 1e-5) << gi;
  }
}

}  // namespace
}  // namespace rp
