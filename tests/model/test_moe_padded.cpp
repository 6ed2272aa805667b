// The sparse MLP block in the padded expert layout (MoeBufs::padded, Ops::moe_pad) against the
// unpadded one on the CPU backend, for a tiny Qwen3-MoE block with per-expert LoRA adapters on
// gate_up_proj and down_proj (base trainable) and a tiny GPT-OSS block (biased experts, whose
// pad rows of g, u, m and ys are nonzero): the forward output, the input gradient, every weight
// gradient (router, experts, biases) and every adapter gradient equal the unpadded run's within
// fp32 rounding, on a routing that does need padding.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/moe_buckets.hpp"
#include "model/layer_memory.hpp"
#include "model/lora.hpp"
#include "model/moe_block.hpp"
#include "tests/model/test_layer_util.hpp"

namespace rp {
namespace {

using namespace rp::test;

ModelConfig tiny_moe(bool gpt_oss) {
  ModelConfig c = tiny_config(TinyOpts{true, false, "default"});
  c.architecture = gpt_oss ? "gpt_oss" : "qwen3_moe";
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {1};
  if (gpt_oss) c.swiglu_alpha = 1.702, c.swiglu_limit = 7.0, c.mlp_only_layers = {};  // every layer sparse
  return c;
}

struct Run {
  VecF y, dhn;
  std::vector<VecF> grads;  // decoder group, adapter group (empty without adapters)
  int64_t rows = 0;         // the sorted rows of the last chunk (padded: > T*k)
};

struct Block {
  ModelConfig c;
  LoraConfig lc;
  ModelLayout lay;
  std::vector<VecF> params;  // the decoder group of layer 1, its adapter group
  std::unique_ptr<Ops> ops = make_cpu_ops(2);
  Block(bool gpt_oss, bool lora) : c(tiny_moe(gpt_oss)) {
    lc.r = 3;
    lc.alpha = 5;
    lc.target_parameters = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
    lay = lora ? make_layout(c, lc) : make_layout(c);
    std::mt19937 g(3);
    std::normal_distribution<float> n(0.f, 1.f);
    std::vector<int> groups{1};
    if (lora) groups.push_back(lay.adapter_group(1));
    for (int gi : groups) {
      VecF p(size_t(lay.groups[size_t(gi)].numel));
      for (float& v : p) v = 0.3f * n(g);
      params.push_back(std::move(p));
    }
  }
  Run run(bool padded, int64_t T) {
    const MoeBlock block(lay, 1);
    DecoderDims d;
    d.hidden = c.hidden_size;
    d.experts = c.num_experts;
    d.experts_per_tok = c.num_experts_per_tok;
    d.expert_ffn = c.moe_intermediate_size;
    d.lora_rank = lc.r;
    d.expert_lora = block.adapted();
    d.expert_padded = padded;
    ScratchCarver count(nullptr);
    MoeBufs b;
    carve_moe_scratch(d, size_t(T), 4, true, count, b);
    std::vector<float> scratch(count.used() / 4 + 1, std::nanf(""));  // poisoned: pads must be written
    ScratchCarver sc(scratch.data());
    carve_moe_scratch(d, size_t(T), 4, true, sc, b);
    const int64_t H = c.hidden_size;
    const VecF hn = ref::randn(size_t(T * H), 11), h1 = ref::randn(size_t(T * H), 12);
    const VecF dy = ref::randn(size_t(T * H), 13);
    Run r;
    r.y.assign(size_t(T * H), std::nanf(""));
    r.dhn.assign(size_t(T * H), std::nanf(""));
    for (const VecF& p : params) r.grads.emplace_back(p.size(), 0.f);
    MoeAdapterArgs la;
    if (params.size() > 1) la = {params[1].data(), r.grads[1].data()};
    block.forward(*ops, params[0].data(), hn.data(), h1.data(), r.y.data(), T, b, nullptr, la);
    const VecF counts(size_t(c.num_experts), 1.f);
    block.backward(*ops, params[0].data(), r.grads[0].data(), hn.data(), dy.data(), r.dhn.data(), T, b,
                   counts.data(), 0.01f, la);
    r.rows = b.offsets[c.num_experts];  // the CPU's device offsets are host memory
    return r;
  }
};

void expect_equal_runs(Block& blk, int64_t T) {
  const Run u = blk.run(false, T), p = blk.run(true, T);
  const int64_t R = T * blk.c.num_experts_per_tok;
  EXPECT_EQ(u.rows, R);
  ASSERT_GT(p.rows, R) << "the routing needs padding (else the test checks nothing)";
  EXPECT_LE(p.rows, padded_rows_bound(R, kExpertPadFraction));
  EXPECT_LT(ref::rel_err(p.y, u.y), 1e-6) << "y";
  EXPECT_LT(ref::rel_err(p.dhn, u.dhn), 1e-6) << "dhn";
  for (size_t g = 0; g < u.grads.size(); ++g) {
    EXPECT_LT(ref::rel_err(p.grads[g], u.grads[g]), 1e-6)
        << (g == 0 ? "weight gradients" : "adapter gradients");
    double sum = 0;
    for (float v : u.grads[g]) sum += std::abs(v);
    EXPECT_GT(sum, 0.0) << "group " << g << " got gradients";
  }
}

TEST(MoePadded, Qwen3MoeBlockWithExpertAdaptersEqualsUnpadded) {
  Block blk(false, true);
  expect_equal_runs(blk, 45);
}

TEST(MoePadded, GptOssBlockWithBiasedExpertsEqualsUnpadded) {
  Block blk(true, false);
  expect_equal_runs(blk, 45);
}

// The padded layout's buffers (and the planner's estimate, which carves the same way) hold
// padded_rows_bound(C*k) sorted rows; the assignment-indexed ones stay C*k.
TEST(MoePadded, ScratchHoldsTheBound) {
  DecoderDims d;
  d.hidden = 32, d.experts = 8, d.experts_per_tok = 2, d.expert_ffn = 12;
  const size_t C = 100;
  ScratchCarver a(nullptr), b(nullptr);
  MoeBufs u, p;
  carve_moe_scratch(d, C, 4, true, a, u);
  d.expert_padded = true;
  carve_moe_scratch(d, C, 4, true, b, p);
  const int64_t bound = padded_rows_bound(200, kExpertPadFraction);
  EXPECT_EQ(u.rows, 200);
  EXPECT_EQ(p.rows, bound);
  EXPECT_EQ(bound, 214);  // ceil(200 / 0.94) + 1
  EXPECT_TRUE(p.padded && !u.padded);
  // every [R, .] buffer grows by the extra rows: xs, ys, dys [R, H], g, u, m, dg, du [R, Fe], token [R]
  const size_t extra = size_t(bound - 200);
  const size_t grown = b.used() - a.used(), need = extra * (3 * 32 + 5 * 12 + 1) * 4;
  EXPECT_GE(grown, need);
  EXPECT_LE(grown, need + 20 * kScratchAlign);  // the takes' alignment
}

}  // namespace
}  // namespace rp
