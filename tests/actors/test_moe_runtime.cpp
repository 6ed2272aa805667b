// Mixture-of-experts models in the runtime: the router statistics of a micro-batch travel
// through its stages (each forward stage adds its sparse layers', the tail completes them, the
// backward stages read the whole forward pass's), so the load-balancing loss's gradient reaches
// every sparse layer as in the sequential loop (tests/actors/runtime_reference.hpp), whatever
// stage holds which layer. Checked against that loop over three steps, async and sync, with the
// sparse layers spread over two forward stages, the tail and two backward stages; the step's
// expert assignments (StepResult::expert_tokens) equal the loop's; and a LoRA layout (frozen
// experts) trains like the loop too; the padded expert layout of "expert_gemm": "bucketed" as well.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "actors/session_testing.hpp"
#include "model/lora.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

constexpr int64_t kNSeq = 2, kSeqLen = 6, kM = 3;

// layers: 0 embedding, 1 sparse, 2 dense (mlp_only_layers), 3-4 sparse, 5 tail
ModelConfig tiny_moe(bool aux) {
  ModelConfig c = tiny_moe_config(6, false);
  c.router_aux_loss_coef = 0.05;
  c.output_router_logits = aux;
  return c;
}

IterationPlan spread_plan() {
  IterationPlan p;
  p.num_layers = 6;
  p.stages = {{StageKind::forward, 0, 1},
              {StageKind::forward, 2, 3},
              {StageKind::tail, 4, 5},
              {StageKind::backward, 2, 3},
              {StageKind::backward, 0, 1}};
  validate_plan(p, "spread plan");
  return p;
}

std::vector<int32_t> ids_of(const ModelLayout& m, int t, std::vector<int32_t>* targets) {
  std::vector<int32_t> ids;
  random_tokens(m.config.vocab_size, kM * kNSeq * kSeqLen, 300 + uint64_t(t) * 7, ids, *targets);
  return ids;
}

struct MoeRun {
  std::vector<double> losses, aux;
  std::vector<std::vector<double>> expert_tokens;
  std::vector<std::vector<float>> weights;
};

MoeRun reference(const ModelLayout& m, const std::vector<std::vector<float>>& w0, bool async, int steps) {
  auto w = computed_weights(m, w0);
  std::vector<std::vector<std::vector<float>>> versions{w};
  std::vector<TextbookAdamW> opt(m.groups.size());
  MoeRun out;
  for (int t = 0; t < steps; ++t) {
    const auto& used = versions[size_t(std::max(0, t - (async ? 1 : 0)))];
    std::vector<std::vector<double>> grads(m.groups.size());
    for (size_t g = 0; g < grads.size(); ++g) grads[g].assign(w[g].size(), 0.0);
    double loss = 0, count = 0;
    std::vector<double> experts;
    std::vector<int32_t> tg, ids = ids_of(m, t, &tg);
    sequential_forward_backward(m, used, ids, tg, kM, {kNSeq, kSeqLen}, grads, loss, count, &experts);
    out.losses.push_back(loss / count);
    out.expert_tokens.push_back(experts);
    for (size_t g = 0; g < grads.size(); ++g) {
      if (m.groups[g].frozen) continue;
      for (auto& x : grads[g]) x /= count;
      opt[g].step(w[g], grads[g], adam_opts(), lr_at(t));
    }
    versions.push_back(w);
  }
  out.weights = w;
  return out;
}

MoeRun runtime(const ModelLayout& m, const std::vector<std::vector<float>>& w0, bool async, int steps,
               bool bucketed = false) {
  TestSessionOptions o;
  o.device.expert_gemm_bucketed = bucketed;
  o.workers = 2;
  o.micro_batches = kM;
  o.micro = {kNSeq, kSeqLen};
  o.async = async;
  o.adam = adam_opts();
  o.shards = 2;
  o.plan = spread_plan();
  TestSession s(m, w0, o);
  MoeRun r;
  for (int t = 0; t < steps; ++t) {
    std::vector<int32_t> tg, ids = ids_of(m, t, &tg);
    s.forward_backward(ids, tg);
    s.step(lr_at(t));
  }
  for (int t = 0; t < steps; ++t) {
    const StepResult sr = s.wait(t);
    r.losses.push_back(sr.loss_sum / sr.tokens);
    r.aux.push_back(sr.moe_aux_loss);
    r.expert_tokens.push_back(sr.expert_tokens);
  }
  s.synchronize();
  for (int g = 0; g < int(m.groups.size()); ++g) r.weights.push_back(s.group_weights_f32(g));
  return r;
}

void expect_same(const ModelLayout& m, const MoeRun& got, const MoeRun& ref, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t t = 0; t < ref.losses.size(); ++t) {
    EXPECT_NEAR(got.losses[t], ref.losses[t], 1e-5 * ref.losses[t]) << what << " step " << t;
    ASSERT_EQ(got.expert_tokens[t].size(), size_t(m.config.num_experts)) << what;
    for (size_t e = 0; e < ref.expert_tokens[t].size(); ++e)
      EXPECT_EQ(got.expert_tokens[t][e], ref.expert_tokens[t][e]) << what << " step " << t << " expert " << e;
    double total = 0;
    for (double x : got.expert_tokens[t]) total += x;
    // every token of every micro-batch routed to k experts in each sparse layer
    EXPECT_EQ(total, double(kM * kNSeq * kSeqLen * m.config.num_experts_per_tok * m.config.num_moe_layers()))
        << what;
  }
  for (size_t g = 0; g < m.groups.size(); ++g)
    EXPECT_LT(rel_err(got.weights[g], ref.weights[g]), 2e-5) << what << " group " << m.groups[g].name;
}

TEST(MoeRuntime, RouterStatisticsTravelWithTheMicroBatchAndTrainLikeTheLoop) {
  for (bool aux : {true, false})
    for (bool async : {true, false}) {
      const std::string what =
          fmt::format("{}, {}", aux ? "load-balancing loss" : "no aux loss", async ? "async" : "sync");
      const ModelLayout m = make_layout(tiny_moe(aux));
      const auto w0 = random_weights(m, 11);
      const MoeRun ref = reference(m, w0, async, 3);
      const MoeRun got = runtime(m, w0, async, 3);
      expect_same(m, got, ref, what);
      // the padded expert layout ("expert_gemm": "bucketed") trains the same
      expect_same(m, runtime(m, w0, async, 3, true), ref, what + ", bucketed");
      for (double a : got.aux) {
        EXPECT_GT(a, 0.0) << what;  // the statistic is reported with or without its loss term
        EXPECT_LT(a, double(m.config.num_experts_per_tok) * m.config.num_experts) << what;
      }
    }
}

TEST(MoeRuntime, LoraOnAFrozenMoeBaseTrainsLikeTheLoop) {
  LoraConfig l;
  l.r = 4;
  l.alpha = 8;
  l.target_modules = {"all-linear"};
  l.base_format = WeightFormat::bf16;
  const ModelLayout m = make_layout(tiny_moe(true), l);
  // adapters reach attention everywhere and the dense layer's MLP, never the experts
  int dense_mlp_adapters = 0;
  for (const auto& g : m.groups)
    for (const auto& t : g.tensors) {
      if (t.name.find("lora_") == std::string::npos) continue;
      EXPECT_EQ(t.name.find("experts"), std::string::npos) << t.name;
      EXPECT_EQ(t.name.find("mlp.gate."), std::string::npos) << t.name;
      dense_mlp_adapters += t.name.find("model.layers.1.mlp.") == 0;
    }
  EXPECT_EQ(dense_mlp_adapters, 6);  // gate, up and down of the dense layer, A and B each
  auto w0 = random_weights(m, 5);
  for (int g = int(m.config.num_hidden_layers) + 2; g < int(m.groups.size()); ++g)
    w0[size_t(g)] = lora_initial_group(m, g);
  for (bool async : {true, false}) {
    const MoeRun ref = reference(m, w0, async, 3);
    const MoeRun got = runtime(m, w0, async, 3);
    expect_same(m, got, ref, async ? "lora async" : "lora sync");
  }
  // MLP-only targets: the sparse layers' adapter groups are empty, the dense layer's trains
  l.target_modules = {"gate_proj", "down_proj"};
  const ModelLayout mlp = make_layout(tiny_moe(true), l);
  auto w1 = random_weights(mlp, 6);
  for (int g = int(mlp.config.num_hidden_layers) + 2; g < int(mlp.groups.size()); ++g)
    w1[size_t(g)] = lora_initial_group(mlp, g);
  expect_same(mlp, runtime(mlp, w1, true, 2), reference(mlp, w1, true, 2), "lora on the dense MLP only");
  // ... and on a model without a dense layer they match nothing: refused, naming the key
  ModelConfig sparse = tiny_moe(true);
  sparse.mlp_only_layers.clear();
  try {
    make_layout(sparse, l);
    ADD_FAILURE() << "gate_proj on an all-sparse model was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lora.target_modules: 'gate_proj' matches no linear"),
              std::string::npos)
        << e.what();
  }
}

// GPT-OSS (tiny_gpt_oss_config: sliding-window and full layers with sinks and biases, biased
// experts with the clamped SwiGLU, load-balancing loss on) over the same spread plan: trained
// fully, and with LoRA on its attention over a frozen bf16 base.
TEST(MoeRuntime, GptOssTrainsLikeTheLoop) {
  const ModelLayout m = make_layout(tiny_gpt_oss_config());
  const auto w0 = random_weights(m, 13);
  for (bool async : {true, false})
    expect_same(m, runtime(m, w0, async, 3), reference(m, w0, async, 3),
                async ? "gpt-oss async" : "gpt-oss sync");
  LoraConfig l;
  l.r = 4;
  l.alpha = 8;
  l.target_modules = {"all-linear"};  // the attention's four projections: every layer is sparse
  l.base_format = WeightFormat::bf16;
  const ModelLayout lm = make_layout(tiny_gpt_oss_config(), l);
  int adapters = 0;
  for (const auto& g : lm.groups)
    for (const auto& t : g.tensors)
      adapters +=
          t.name.find("self_attn.") != std::string::npos && t.name.find("lora_A") != std::string::npos;
  EXPECT_EQ(adapters, 4 * 4);
  auto w1 = random_weights(lm, 7);
  for (int g = int(lm.config.num_hidden_layers) + 2; g < int(lm.groups.size()); ++g)
    w1[size_t(g)] = lora_initial_group(lm, g);
  expect_same(lm, runtime(lm, w1, true, 3), reference(lm, w1, true, 3), "gpt-oss lora");
  // the checkpoint's own format: experts in mxfp4, the other matrices bf16
  l.base_format = WeightFormat::mxfp4;
  const ModelLayout qm = make_layout(tiny_gpt_oss_config(), l);
  EXPECT_EQ(
      qm.groups[1].tensors[size_t(qm.groups[1].find("model.layers.0.mlp.experts.1.up_proj.weight"))].format,
      WeightFormat::mxfp4);
  EXPECT_EQ(qm.groups[1].tensors[size_t(qm.groups[1].find("model.layers.0.self_attn.q_proj.weight"))].format,
            WeightFormat::bf16);
  expect_same(qm, runtime(qm, w1, false, 2), reference(qm, w1, false, 2), "gpt-oss lora, mxfp4 experts");
}

// Per-expert adapters (target_parameters) with attention adapters, on a base frozen in each
// storage form: the pipeline trains them like the sequential loop, and they train (B leaves 0).
TEST(MoeRuntime, ExpertLoraOnEveryFrozenFormatTrainsLikeTheLoop) {
  for (WeightFormat f : {WeightFormat::bf16, WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::nf4}) {
    const std::string what = fmt::format("expert lora, base {}", weight_format_name(f));
    LoraConfig l;
    l.r = 4;
    l.alpha = 8;
    l.target_modules = {"q_proj", "o_proj"};
    l.target_parameters = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
    l.base_format = f;
    const ModelLayout m = make_layout(tiny_moe(true), l);
    auto w0 = random_weights(m, 7);
    for (int g = int(m.config.num_hidden_layers) + 2; g < int(m.groups.size()); ++g)
      w0[size_t(g)] = lora_initial_group(m, g);
    const MoeRun ref = reference(m, w0, true, 2);
    const MoeRun got = runtime(m, w0, true, 2);
    expect_same(m, got, ref, what);
    // the experts' lora_B moved off its zero start
    const int ag = m.adapter_group(1);
    const ParamGroup& g = m.groups[size_t(ag)];
    const TensorSpec& b = g.tensors[size_t(g.find("model.layers.0.mlp.experts.down_proj.lora_B.weight"))];
    double moved = 0;
    for (int64_t i = 0; i < b.numel(); ++i)
      moved = std::max(moved, double(std::abs(got.weights[size_t(ag)][size_t(b.offset + i)])));
    EXPECT_GT(moved, 0.0) << what;
  }
}

}  // namespace
}  // namespace rp::test
