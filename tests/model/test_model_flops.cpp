// model_flops_per_token (model/model_flops.hpp), the MFU numerator of the trainer and
// bench_throughput, against counts written out by hand from each config's numbers.
#include <gtest/gtest.h>

#include <string>

#include "model/config.hpp"
#include "model/model_flops.hpp"

namespace rp {
namespace {

ModelConfig example_config(const std::string& name) {
  return load_config_file(std::string(RP_SOURCE_DIR) + "/examples/configs/" + name + ".json");
}

// Qwen3-1.7B: H 2048, 16 q heads / 8 kv heads of 128, FFN 6144, 28 layers, vocab 151936, tied.
TEST(ModelFlops, DenseQwen3HandCount) {
  const ModelLayout m = make_layout(example_config("qwen3-1.7b"));
  const int64_t S = 4096;
  const double decoder = 2048.0 * 2048                  // q_proj [16 x 128, 2048]
                         + 2048.0 * 1024                // k_proj [8 x 128, 2048]
                         + 2048.0 * 1024                // v_proj
                         + 2048.0 * 2048                // o_proj
                         + 3.0 * 2048 * 6144;           // gate, up, down
  const double head = 151936.0 * 2048;                  // the tied LM head multiplies every token too
  const double attention = 28 * 6.0 * 16 * 128 * 4096;  // 12 nq D x S/2 keys per query, causal
  const ModelFlops f = model_flops(m, S);
  EXPECT_DOUBLE_EQ(f.trained_matmul_params, 28 * decoder + head);
  EXPECT_DOUBLE_EQ(f.frozen_matmul_params, 0);
  EXPECT_DOUBLE_EQ(f.attention, attention);
  EXPECT_DOUBLE_EQ(model_flops_per_token(m, S), 6 * (28 * decoder + head) + attention);
  // about 11.7 GFLOPs per token
  EXPECT_NEAR(model_flops_per_token(m, S), 11.73e9, 0.01e9);
  EXPECT_THROW(model_flops(m, 0), std::invalid_argument);
}

// LoRA: the frozen base counts 4 FLOPs per weight (forward, input gradient; no weight
// gradient), a module trained fully beside the adapters 6.
TEST(ModelFlops, LoraFrozenBaseCountsNoWeightGradient) {
  const ModelConfig c = example_config("qwen3-1.7b");
  LoraConfig lora;
  lora.r = 16;
  lora.alpha = 32;
  lora.target_modules = {"all-linear"};
  const int64_t S = 2048;
  const double decoder = 2.0 * 2048 * 2048 + 2.0 * 2048 * 1024 + 3.0 * 2048 * 6144;
  const double head = 151936.0 * 2048;
  const double attention = 28 * 6.0 * 16 * 128 * 2048;
  EXPECT_DOUBLE_EQ(model_flops_per_token(make_layout(c, lora), S), 4 * (28 * decoder + head) + attention);
  lora.modules_to_save = {"lm_head"};  // tied: the embedding group, which the LM head reads, is trained
  EXPECT_DOUBLE_EQ(model_flops_per_token(make_layout(c, lora), S), 4 * 28 * decoder + 6 * head + attention);
}

// Qwen3-30B-A3B (H 2048, 32 q / 4 kv heads of 128, 128 experts top-8 of FFN 768, untied vocab
// 151936) with its first decoder made dense (mlp_only_layers [0], FFN 6144): a sparse layer
// counts its router and 8 experts, never 128.
TEST(ModelFlops, Qwen3MoeHandCount) {
  ModelConfig c = example_config("qwen3-30b-a3b");
  c.mlp_only_layers = {0};
  const ModelLayout m = make_layout(c);
  const int64_t S = 8192;
  const double attention_proj = 2048.0 * 4096 + 2048.0 * 512 + 2048.0 * 512 + 4096.0 * 2048;  // q, k, v, o
  const double dense = attention_proj + 3.0 * 2048 * 6144;
  const double sparse = attention_proj + 128.0 * 2048 /*router*/ + 8 * 3.0 * 2048 * 768 /*top-8 experts*/;
  const double head = 151936.0 * 2048;
  const double attention = 48 * 6.0 * 32 * 128 * 8192;
  const ModelFlops f = model_flops(m, S);
  EXPECT_DOUBLE_EQ(f.trained_matmul_params, dense + 47 * sparse + head);
  EXPECT_DOUBLE_EQ(f.attention, attention);
  EXPECT_DOUBLE_EQ(model_flops_per_token(m, S), 6 * (dense + 47 * sparse + head) + attention);
}

// GPT-OSS-20B: H 2880, 64 q / 8 kv heads of 64, 24 layers all sparse (32 experts top-4 of FFN
// 2880), untied vocab 201088; even layers attend to a window of 128 keys.
TEST(ModelFlops, GptOssHandCount) {
  const ModelLayout m = make_layout(example_config("gpt-oss-20b"));
  const int64_t S = 4096;
  const double layer = 2880.0 * 4096 + 2880.0 * 512 + 2880.0 * 512 + 4096.0 * 2880  // q, k, v, o
                       + 32.0 * 2880                                                // router
                       + 4 * 3.0 * 2880 * 2880;                                     // top-4 experts
  const double head = 201088.0 * 2880;
  // a sliding layer's queries see (128^2 / 2 + (4096 - 128) 128) / 4096 = 126 keys on average,
  // a full layer's 4096 / 2
  const double sliding_keys = (128.0 * 128 / 2 + (4096.0 - 128) * 128) / 4096;
  ASSERT_DOUBLE_EQ(sliding_keys, 126);
  const double attention = 12 * (12.0 * 64 * 64 * 126) + 12 * (12.0 * 64 * 64 * 2048);
  const ModelFlops f = model_flops(m, S);
  EXPECT_DOUBLE_EQ(f.trained_matmul_params, 24 * layer + head);
  EXPECT_DOUBLE_EQ(f.attention, attention);
  EXPECT_DOUBLE_EQ(model_flops_per_token(m, S), 6 * (24 * layer + head) + attention);
  // the count the trainer used before (3 H intermediate_size per layer: one expert, no
  // router) was about half of this
  const double one_expert = 24 * (2880.0 * 4096 * 2 + 2880.0 * 512 * 2 + 3.0 * 2880 * 2880) + head;
  EXPECT_LT(6 * one_expert + 24 * 6.0 * 64 * 64 * 4096, 0.6 * model_flops_per_token(m, S));
}

TEST(ModelFlops, AttendedPairs) {
  EXPECT_DOUBLE_EQ(attended_pairs(10, 0), 50);
  EXPECT_DOUBLE_EQ(attended_pairs(10, 10), 50);     // a window as long as the sequence is full attention
  EXPECT_DOUBLE_EQ(attended_pairs(10, 4), 8 + 24);  // 4^2 / 2 + 6 x 4
}

}  // namespace
}  // namespace rp
