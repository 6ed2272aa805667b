// Analytic cost model: parameter counts, FLOP formulas, the seq^2 term, memory terms.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/layout.hpp"
#include "scheduler/cost_model.hpp"

namespace rp {
namespace {

ModelShape qwen3_1_7b() {
  ModelShape m;
  m.vocab_size = 151936, m.hidden_size = 2048, m.intermediate_size = 6144, m.num_layers = 28;
  m.num_heads = 16, m.num_kv_heads = 8, m.head_dim = 128, m.tie_word_embeddings = true, m.qk_norm = true;
  return m;
}

// Mistral-7B-v0.1 (a window on every layer) and Qwen2.5-7B (biased q/k/v): read as `plan`
// reads them (config.json through ModelConfig) and as bare JSON, both count what the
// checkpoint holds (7,241,732,096 and 7,615,616,512 parameters) and layer by layer what the
// layout allocates.
// OLMo-2-1124-7B (q/k norms over all heads: 2 x 4096 weights a layer, not 2 x head_dim),
// Granite-3.1-8B and Phi-3-mini-4k (a 2047-token window on every layer), counted as transformers
// builds them (7,298,617,344, 8,170,848,256 and 3,821,079,552), and each layer's count equal to
// what the layout allocates for it.
TEST(CostModel, Olmo2GraniteAndPhi3CountTheirCheckpointsParameters) {
  for (auto [name, params] : {std::pair{"olmo-2-1124-7b", int64_t(7298617344)},
                              {"granite-3.1-8b", int64_t(8170848256)},
                              {"phi-3-mini-4k-instruct", int64_t(3821079552)}}) {
    SCOPED_TRACE(name);
    const std::string path = std::string(RP_SOURCE_DIR) + "/examples/configs/" + name + ".json";
    const ModelConfig c = load_config_file(path);
    const ModelShape m = model_shape_from_config(c);
    EXPECT_EQ(model_parameters(m), params);
    EXPECT_EQ(m.qk_norm_whole, c.architecture == "olmo2");
    const ModelLayout layout = make_layout(c);
    EXPECT_EQ(layer_parameters(m, 1), layout.groups[1].numel);
    EXPECT_EQ(m.attention_window(31), c.architecture == "phi3" ? 2047 : 0);
  }
}

// Gemma-2-2B and Gemma-3-1B-pt (two more norms a layer, tied; Gemma 3's q/k norms per head),
// counted as transformers builds them (2,614,341,888 and 999,885,952), each layer's count equal
// to what the layout allocates, and the sliding layers' windows (Gemma 2 from layer 0 every
// second one, Gemma 3 all but every sixth).
TEST(CostModel, GemmaCountsItsCheckpointsParameters) {
  for (auto [name, params] :
       {std::pair{"gemma-2-2b", int64_t(2614341888)}, {"gemma-3-1b-pt", int64_t(999885952)}}) {
    SCOPED_TRACE(name);
    const std::string path = std::string(RP_SOURCE_DIR) + "/examples/configs/" + name + ".json";
    const ModelConfig c = load_config_file(path);
    const ModelShape m = model_shape_from_config(c);
    EXPECT_EQ(model_parameters(m), params);
    EXPECT_TRUE(m.sandwich_norms);
    const ModelLayout layout = make_layout(c);
    for (int l = 1; l <= 3; ++l) EXPECT_EQ(layer_parameters(m, l), layout.groups[size_t(l)].numel) << l;
    const bool g3 = c.architecture == "gemma3_text";
    EXPECT_EQ(m.attention_window(0), g3 ? 512 : 4096);
    EXPECT_EQ(m.attention_window(1), g3 ? 512 : 0);
    EXPECT_EQ(m.attention_window(5), 0);
  }
}

TEST(CostModel, MistralAndQwen2CountTheirCheckpointsParameters) {
  for (auto [name, params] :
       {std::pair{"mistral-7b-v0.1", int64_t(7241732096)}, {"qwen2.5-7b", int64_t(7615616512)}}) {
    SCOPED_TRACE(name);
    const std::string path = std::string(RP_SOURCE_DIR) + "/examples/configs/" + name + ".json";
    const ModelConfig c = load_config_file(path);
    std::ifstream f(path);
    const ModelShape from_json = model_shape_from_hf_json(nlohmann::json::parse(f), path);
    for (const ModelShape& m : {model_shape_from_config(c), from_json}) {
      EXPECT_EQ(model_parameters(m), params);
      EXPECT_EQ(m.qkv_bias, c.architecture == "qwen2");
      EXPECT_EQ(m.attention_window(0), c.architecture == "mistral" ? 4096 : 0);
      EXPECT_EQ(m.attention_window(c.num_hidden_layers - 1), c.architecture == "mistral" ? 4096 : 0);
    }
    EXPECT_EQ(c.num_parameters(), params);
  }
}

TEST(CostModel, ParameterCountsMatchQwen3_1_7B) {
  ModelShape m = qwen3_1_7b();
  // q 2048x2048, k/v 1024x2048, o 2048x2048, MLP 3x2048x6144, two norms, q/k norms
  const int64_t dec = 2048 * 2048 * 2 + 2 * 1024 * 2048 + 3 * 2048 * 6144 + 2 * 2048 + 2 * 128;
  EXPECT_EQ(layer_parameters(m, 1), dec);
  EXPECT_EQ(layer_parameters(m, 0), 151936LL * 2048);
  EXPECT_EQ(layer_parameters(m, 29), 151936LL * 2048 + 2048);  // the tail reads the tied head
  int64_t total = 0;
  for (int l = 0; l <= 28; ++l) total += layer_parameters(m, l);
  EXPECT_NEAR(double(total + 2048), 1.72e9, 0.01e9);  // Qwen3-1.7B: 1.72 B with tied embeddings
  EXPECT_THROW(layer_parameters(m, 30), std::invalid_argument);
}

TEST(CostModel, DecoderFlopsFollowTheFormula) {
  ModelShape m = qwen3_1_7b();
  DeviceModel d;
  const int64_t n_seq = 2, S = 4096;
  auto e = estimate_layers(m, n_seq, S, d);
  ASSERT_EQ(e.size(), 30u);
  const double T = double(n_seq * S);
  const double gemm_params = 2048.0 * 2048 * 2 + 2.0 * 1024 * 2048 + 3.0 * 2048 * 6144;
  const double attn = 2.0 * n_seq * 16 * double(S) * S * 128;  // causal QK^T + PV
  EXPECT_NEAR(e[1].fwd_flops, 2 * T * gemm_params + attn, 1e-9 * e[1].fwd_flops);
  // backward with recompute: 3x the GEMMs, 1 + 2.5 x attention
  EXPECT_NEAR(e[1].bwd_flops, 6 * T * gemm_params + 3.5 * attn, 1e-9 * e[1].bwd_flops);
  const double ratio = e[1].cost.bwd / e[1].cost.fwd;
  EXPECT_GT(ratio, 2.8);
  EXPECT_LT(ratio, 3.7);
  // the tail: LM head forward + dh + dW
  EXPECT_NEAR(e[29].bwd_flops, 6 * T * 2048.0 * 151936, 1e-9 * e[29].bwd_flops);
  EXPECT_GT(e[29].cost.tail, 3 * e[1].cost.fwd);
  // decoders inside the tail stage run forward then backward-with-recompute
  EXPECT_DOUBLE_EQ(e[5].cost.tail, e[5].cost.fwd + e[5].cost.bwd);
  d.tail_recomputes = false;
  EXPECT_DOUBLE_EQ(estimate_layers(m, n_seq, S, d)[5].cost.tail, e[5].cost.bwd);
}

// FP8 linears (DeviceModel::fp8_flops): the dense linears' forward and input gradient at the
// FP8 rate, the same FLOPs; weight gradients, attention and the LM head unchanged; the
// decoders' scratch holds one linear's input codes more.
TEST(CostModel, Fp8LinearsRunAtTheFp8Rate) {
  ModelShape m = qwen3_1_7b();
  DeviceModel d;
  d.peak_flops = 655e12;
  const auto base = estimate_layers(m, 1, 8192, d);
  d.fp8_flops = 1110e12;
  const auto f = estimate_layers(m, 1, 8192, d);
  EXPECT_DOUBLE_EQ(f[1].fwd_flops, base[1].fwd_flops);
  EXPECT_DOUBLE_EQ(f[1].bwd_flops, base[1].bwd_flops);
  // the forward's GEMMs dominate: faster, but not by the whole rate ratio (attention, norms, the
  // quantization passes)
  EXPECT_LT(f[1].cost.fwd, 0.9 * base[1].cost.fwd);
  EXPECT_GT(f[1].cost.fwd, base[1].cost.fwd * 655.0 / 1110.0);
  // backward: 3 GEMMs per linear, of which the weight gradient stays at peak_flops
  EXPECT_LT(f[1].cost.bwd, base[1].cost.bwd);
  EXPECT_GT(f[1].cost.bwd / base[1].cost.bwd, f[1].cost.fwd / base[1].cost.fwd);
  EXPECT_DOUBLE_EQ(f[29].cost.tail, base[29].cost.tail);  // the LM head stays bf16
  EXPECT_DOUBLE_EQ(f[0].cost.fwd, base[0].cost.fwd);
  // codes of [T, max(H, Q)] bytes (C = T here), a 256-byte aligned scale and the backward's
  // kept producer scales (the SwiGLU backward's dy scales for the input gradients)
  EXPECT_EQ(f[1].cost.scratch_bytes - base[1].cost.scratch_bytes,
            8192 * std::max<int64_t>(2048, 6144) + 2 * 256);
  d.fp8_flops = -1;
  EXPECT_THROW(estimate_layers(m, 1, 8192, d), std::invalid_argument);
}

// The quantization passes an FP8 forward pays, as the decoder runs them (model/layers.cpp):
// q's and gate's inputs are read once (the norms computed their scales), down's too (SwiGLU's
// scale), o's twice (its own amax pass); k, v and up reuse codes and pay nothing. Halving the
// quantization kernels' bandwidth adds exactly those bytes' time again.
TEST(CostModel, Fp8QuantizationPassesFollowTheDecodersCodeReuse) {
  ModelShape m = qwen3_1_7b();
  DeviceModel d;
  d.fp8_flops = 1110e12;
  d.fp8_quant_efficiency = 0.5;
  const double T = 8192, H = double(m.hidden_size), Q = double(m.num_heads * m.head_dim),
               F = double(m.intermediate_size);
  const auto a = estimate_layers(m, 1, 8192, d);
  d.fp8_quant_efficiency = 0.25;
  const auto b = estimate_layers(m, 1, 8192, d);
  // bytes per pass: bf16 reads (2 per element each) and one byte of codes
  const double bytes = 3 * T * H /* q */ + 5 * T * Q /* o */ + 3 * T * H /* gate */ + 3 * T * F /* down */;
  const double want = bytes / (d.mem_bandwidth * 0.25) - bytes / (d.mem_bandwidth * 0.5);
  EXPECT_NEAR(b[1].cost.fwd - a[1].cost.fwd, want, want * 1e-9);
  d.fp8_quant_efficiency = 0;
  EXPECT_THROW(estimate_layers(m, 1, 8192, d), std::invalid_argument);
}

// FP8 weight gradients (DeviceModel::fp8_weight_gradients): the backward's FLOPs unchanged, its
// GEMM time lower (the seven weight-gradient GEMMs at the FP8 rate: seen with quantization
// made free), the forward unchanged; each
// weight gradient writes dy^T's codes in the pass that makes dy's row codes for the input
// gradient (one byte more per element, no amax or read of its own) and quantizes (but for k,
// v, up) x^T: halving the quantization kernels' bandwidth adds exactly those bytes' time again
// beyond what the FP8 input gradients add. The
// scratch holds two more code buffers (dy^T, x^T) of [max(H, Q, K, F), T] and two scales.
// Ignored without fp8_flops.
// FP8 weight gradients need an input width that is a multiple of 16 (model/fp8_linear.hpp): a
// model none of whose linears has one runs them in bf16, and plans the same with the key on or
// off; with one such width (o_proj's input, the attention width) the plan changes again.
TEST(CostModel, Fp8WeightGradientsOnlyWhereTheInputWidthAllowsThem) {
  ModelShape m = qwen3_1_7b();
  m.hidden_size = 2040, m.intermediate_size = 6120;         // q, k, v, gate, up, down: widths 2040 and 6120
  m.num_heads = 17, m.num_kv_heads = 17, m.head_dim = 120;  // o_proj: 2040
  DeviceModel d;
  d.fp8_flops = 1110e12;
  const auto off = estimate_layers(m, 1, 8192, d);
  d.fp8_weight_gradients = true;
  const auto on = estimate_layers(m, 1, 8192, d);
  EXPECT_DOUBLE_EQ(on[1].cost.bwd, off[1].cost.bwd);
  m.num_heads = 16, m.num_kv_heads = 8, m.head_dim = 128;  // o_proj's input is 2048 wide
  d.fp8_weight_gradients = false;
  const auto off_o = estimate_layers(m, 1, 8192, d);
  d.fp8_weight_gradients = true;
  EXPECT_NE(estimate_layers(m, 1, 8192, d)[1].cost.bwd, off_o[1].cost.bwd);
}

TEST(CostModel, Fp8WeightGradientsRunAtTheFp8Rate) {
  ModelShape m = qwen3_1_7b();
  DeviceModel d;
  d.fp8_flops = 1110e12;
  d.fp8_quant_efficiency = 1e6;
  const auto f = estimate_layers(m, 1, 8192, d);
  d.fp8_weight_gradients = true;
  const auto w = estimate_layers(m, 1, 8192, d);
  EXPECT_DOUBLE_EQ(w[1].bwd_flops, f[1].bwd_flops);
  EXPECT_DOUBLE_EQ(w[1].cost.fwd, f[1].cost.fwd);
  EXPECT_LT(w[1].cost.bwd, 0.95 * f[1].cost.bwd);
  const int64_t T = 8192, F = 6144;
  EXPECT_EQ(w[1].cost.scratch_bytes - f[1].cost.scratch_bytes, 2 * T * F + 2 * 256)
      << "two code buffers of [F, T] and their two 256-byte aligned scales (the kept scales are "
         "there without FP8 weight gradients too)";
  EXPECT_EQ(w[1].cost.scratch_fwd_bytes, f[1].cost.scratch_fwd_bytes);

  const double H = double(m.hidden_size), Q = double(m.num_heads * m.head_dim),
               K = double(m.num_kv_heads * m.head_dim), Fd = double(F), Td = double(T);
  d.fp8_quant_efficiency = 0.5;
  const auto a = estimate_layers(m, 1, 8192, d);
  d.fp8_quant_efficiency = 0.25;
  const auto b = estimate_layers(m, 1, 8192, d);
  d.fp8_weight_gradients = false;
  const auto a0 = [&] {
    d.fp8_quant_efficiency = 0.5;
    return estimate_layers(m, 1, 8192, d);
  }();
  const auto b0 = [&] {
    d.fp8_quant_efficiency = 0.25;
    return estimate_layers(m, 1, 8192, d);
  }();
  // dy^T of q, k, v, o, gate, up, down: one byte of codes each (dy read once for both codes);
  // x^T of q (k, v reuse), o, gate (up reuses), down: an amax and a transposed quantize each
  // (two bf16 reads, one byte of codes; the runtime takes some of these amaxes from the
  // producers, which the model does not credit: scheduler/cost_model.cpp, linear_wgrad)
  const double bytes = 1 * Td * (Q + K + K + H + Fd + Fd + H) + 5 * Td * (H + Q + H + Fd);
  const double want = bytes / (d.mem_bandwidth * 0.25) - bytes / (d.mem_bandwidth * 0.5);
  EXPECT_NEAR((b[1].cost.bwd - a[1].cost.bwd) - (b0[1].cost.bwd - a0[1].cost.bwd), want, want * 1e-6);
  d.fp8_flops = 0;
  d.fp8_weight_gradients = true;
  EXPECT_DOUBLE_EQ(estimate_layers(m, 1, 8192, d)[1].cost.bwd,
                   estimate_layers(m, 1, 8192, DeviceModel{})[1].cost.bwd);
}

TEST(CostModel, AttentionGrowsWithTheSquareOfTheSequence) {
  ModelShape m = qwen3_1_7b();
  DeviceModel d;
  // same tokens per micro-batch, sequences 4x longer: only the S^2 term grows (4x)
  auto a = estimate_layers(m, 8, 2048, d), b = estimate_layers(m, 2, 8192, d);
  const double attn_a = 2.0 * 8 * 16 * 2048.0 * 2048 * 128, attn_b = 2.0 * 2 * 16 * 8192.0 * 8192 * 128;
  EXPECT_NEAR(b[3].fwd_flops - a[3].fwd_flops, attn_b - attn_a, 1e-6 * attn_b);
  EXPECT_GT(b[3].cost.fwd, a[3].cost.fwd);
  EXPECT_DOUBLE_EQ(b[0].cost.fwd, a[0].cost.fwd);
}

TEST(CostModel, MemoryTerms) {
  ModelShape m = qwen3_1_7b();
  DeviceModel d;
  auto e = estimate_layers(m, 1, 8192, d);
  const LayerCost& c = e[2].cost;
  EXPECT_EQ(c.weight_bytes, layer_parameters(m, 2) * 2);
  EXPECT_EQ(c.grad_bytes, layer_parameters(m, 2) * 4);
  EXPECT_EQ(c.act_bytes, 8192LL * 2048 * 2);
  EXPECT_EQ(e[0].cost.io_bytes, 8192 * 4);
  EXPECT_EQ(e[29].cost.io_bytes, 8192 * 4);
  EXPECT_EQ(e[0].cost.scratch_bytes, 0);
  // the decoder's buffers in bf16 (one MLP chunk of all 8192 tokens): backward xn, h1 [T,H];
  // q, o, qr, dout, dq [T,Q]; k, v, kr, dk, dv [T,K]; hn, dhn [C,H]; g, u, m, dm, dg, du [C,F];
  // lse fp32 [nq, T]; attention scratch. Forward: no lse, dout, dq, dk, dv, dhn, dm, dg, du.
  const int64_t T = 8192, H = 2048, Q = 2048, K = 1024, F = 6144;
  const int64_t attn = (2 * 64 * 8192 + 8192 * (16 + Q + 2 * K)) * 4;
  EXPECT_EQ(c.scratch_bytes,
            (2 * T * H + 5 * T * Q + 5 * T * K + 2 * T * H + 6 * T * F) * 2 + T * 16 * 4 + attn);
  EXPECT_EQ(c.scratch_fwd_bytes, (2 * T * H + 3 * T * Q + 3 * T * K + T * H + 3 * T * F) * 2 + attn);
  // with 4096-token MLP chunks the [C, *] buffers halve
  d.mlp_chunk_tokens = 4096;
  const LayerCost c2 = estimate_layers(m, 1, 8192, d)[2].cost;
  EXPECT_EQ(c.scratch_bytes - c2.scratch_bytes, (2 * 4096 * H + 6 * 4096 * F) * 2);
}

TEST(CostModel, MoeShapeFromConfigJson) {
  nlohmann::json j = {{"model_type", "qwen3_moe"},
                      {"vocab_size", 151936},
                      {"hidden_size", 4096},
                      {"num_hidden_layers", 94},
                      {"num_attention_heads", 64},
                      {"num_key_value_heads", 4},
                      {"head_dim", 128},
                      {"num_experts", 128},
                      {"num_experts_per_tok", 8},
                      {"moe_intermediate_size", 1536},
                      {"intermediate_size", 12288},
                      {"tie_word_embeddings", false}};
  ModelShape m = model_shape_from_hf_json(j, "config.json");
  EXPECT_EQ(m.num_experts, 128);
  EXPECT_TRUE(m.qk_norm);
  // 235B parameters in total, 22B active
  int64_t total = 0;
  for (int l = 0; l <= 95; ++l) total += layer_parameters(m, l);
  EXPECT_NEAR(double(total), 235e9, 2e9);
  auto e = estimate_layers(m, 1, 4096, DeviceModel{});
  // active FLOPs per token of one layer: attention projections + 8 experts + router
  const double act = 2.0 * (4096.0 * 8192 * 2 + 2.0 * 4096 * 512 + 8 * 3.0 * 4096 * 1536 + 4096.0 * 128);
  const double attn = 2.0 * 64 * 4096.0 * 4096 * 128;
  EXPECT_NEAR(e[1].fwd_flops, 4096 * act + attn, 1e-6 * e[1].fwd_flops);
  j.erase("hidden_size");
  try {
    model_shape_from_hf_json(j, "config.json");
    FAIL();
  } catch (const std::invalid_argument& x) {
    EXPECT_NE(std::string(x.what()).find("'hidden_size'"), std::string::npos) << x.what();
  }
}

TEST(CostModel, DenseShapeFromModelConfigAndErrors) {
  ModelConfig c;
  c.vocab_size = 1000, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2;
  ModelShape m = model_shape_from_config(c);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_NO_THROW(estimate_layers(m, 1, 16, DeviceModel{}));
  EXPECT_THROW(estimate_layers(m, 0, 16, DeviceModel{}), std::invalid_argument);
  m.num_kv_heads = 3;
  EXPECT_THROW(estimate_layers(m, 1, 16, DeviceModel{}), std::invalid_argument);
  DeviceModel bad;
  bad.peak_flops = 0;
  EXPECT_THROW(estimate_layers(model_shape_from_config(c), 1, 16, bad), std::invalid_argument);
}

}  // namespace
}  // namespace rp

namespace rp {
namespace {

// Causal pairs (query i, key j <= i) within a window of W keys, counted one by one.
double counted_pairs(int64_t S, int64_t W) {
  double n = 0;
  for (int64_t i = 0; i < S; ++i) n += double(W > 0 ? std::min(i + 1, W) : i + 1);
  return n;
}

nlohmann::json gpt_oss_20b_json() {
  return {{"model_type", "gpt_oss"},
          {"vocab_size", 201088},
          {"hidden_size", 2880},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 64},
          {"num_key_value_heads", 8},
          {"head_dim", 64},
          {"num_local_experts", 32},
          {"num_experts_per_tok", 4},
          {"intermediate_size", 2880},
          {"sliding_window", 128},
          {"tie_word_embeddings", false}};
}

TEST(CostModel, SlidingWindowLayersCountOnlyTheBand) {
  const int64_t S = 4096, W = 128, nseq = 2;
  ModelShape m = model_shape_from_hf_json(gpt_oss_20b_json(), "config.json");
  ASSERT_EQ(m.attention_windows.size(), 4u);
  // transformers' default for GPT-OSS: even decoders slide
  EXPECT_EQ(m.attention_window(0), W);
  EXPECT_EQ(m.attention_window(1), 0);
  auto e = estimate_layers(m, nseq, S, DeviceModel{});
  // decoders 0 (sliding) and 1 (full) differ only in their attention
  const double saved = e[2].fwd_flops - e[1].fwd_flops;
  const double expected = 4.0 * nseq * 64 * 64 * (counted_pairs(S, 0) - counted_pairs(S, W));
  EXPECT_NEAR(saved, expected, 0.005 * expected);
  EXPECT_GT(e[2].bwd_flops, e[1].bwd_flops);
  EXPECT_LT(e[1].cost.fwd, e[2].cost.fwd);
  // a sequence no longer than the window is attended in full
  auto s = estimate_layers(m, nseq, W, DeviceModel{});
  EXPECT_DOUBLE_EQ(s[1].fwd_flops, s[2].fwd_flops);
}

TEST(CostModel, LayerTypesChooseTheSlidingLayers) {
  nlohmann::json j = gpt_oss_20b_json();
  j["layer_types"] = {"full_attention", "full_attention", "sliding_attention", "full_attention"};
  ModelShape m = model_shape_from_hf_json(j, "config.json");
  EXPECT_EQ(m.attention_window(0), 0);
  EXPECT_EQ(m.attention_window(2), 128);
  // the same through the model's own config parser
  const std::string dir = ::testing::TempDir() + "/cost_model_gpt_oss";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << j.dump();
  ModelShape c = model_shape_from_config(load_config_file(dir + "/config.json"));
  EXPECT_EQ(c.attention_windows, m.attention_windows);
  // Qwen3 writes a sliding_window it does not use: no sliding layers, no windows
  nlohmann::json q = {{"model_type", "qwen3"},    {"vocab_size", 1000},
                      {"hidden_size", 64},        {"num_hidden_layers", 2},
                      {"num_attention_heads", 4}, {"intermediate_size", 128},
                      {"sliding_window", 4096},   {"layer_types", {"full_attention", "full_attention"}}};
  EXPECT_TRUE(model_shape_from_hf_json(q, "config.json").attention_windows.empty());
  // sliding layers need a window; a wrong-length layer_types names the key
  j.erase("sliding_window");
  nlohmann::json short_types = gpt_oss_20b_json();
  short_types["layer_types"] = {"full_attention"};
  for (const auto& [bad, key] : {std::pair{j, "'sliding_window'"}, std::pair{short_types, "'layer_types'"}}) {
    try {
      model_shape_from_hf_json(bad, "config.json");
      ADD_FAILURE() << "accepted " << bad.dump();
    } catch (const std::invalid_argument& x) {
      EXPECT_NE(std::string(x.what()).find(key), std::string::npos) << x.what();
    }
  }
}

}  // namespace
}  // namespace rp
