// bench_throughput's random weights (bench/random_weights.hpp): a frozen group's bytes are the
// same however they are made (in memory, every group on one thread; or one group at a time on
// several threads, as the disk tier's source does), for each storage form, in a model with
// many small tensors (a mixture-of-experts decoder) and with tensors made whole (fp8), and
// equal to the definition: every tensor filled chunk by chunk from its seeds, then quantized.
#include <gtest/gtest.h>

#include <cstring>

#include "bench/random_weights.hpp"
#include "bench/tier_option_names.hpp"
#include "model/lora.hpp"

namespace rp::test {
namespace {

ModelLayout moe_layout(const std::string& base_format) {
  ModelConfig c;
  c.architecture = "qwen3_moe";
  c.qk_norm = true;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = false;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 192;  // 192 x 256 = 49,152 values a tensor: one chunk each
  c.decoder_sparse_step = 1;
  c.norm_topk_prob = true;
  c.validate();
  LoraConfig l;
  l.r = 4;
  l.alpha = 8;
  set_lora_targets(l, {"q_proj", "v_proj"});
  l.base_format = parse_weight_format(base_format);
  return make_layout(c, l);
}

// The definition: each tensor's values chunk by chunk of whole rows (bench::kChunkValues values
// at most, at least one row), each chunk from its own seed, then the whole tensor quantized.
std::vector<std::byte> reference_group(const ModelLayout& m, int g) {
  const ParamGroup& grp = m.groups[size_t(g)];
  std::vector<std::byte> out(size_t(grp.storage_bytes));
  for (size_t ti = 0; ti < grp.tensors.size(); ++ti) {
    const TensorSpec& t = grp.tensors[ti];
    const int64_t cols = std::max<int64_t>(1, weight_format_cols(t.shape));
    const int64_t rows_per = std::max<int64_t>(1, bench::kChunkValues / cols);
    std::vector<float> v(size_t(t.numel()));
    for (int64_t r0 = 0; r0 * cols < t.numel(); r0 += rows_per)
      bench::fill_chunk(t, g, ti, r0 / rows_per, v.data() + r0 * cols,
                        std::min(rows_per * cols, t.numel() - r0 * cols));
    quantize_weights(t.format, v.data(), out.data() + t.byte_offset, t.numel(), cols);
  }
  return out;
}

class BenchWeights : public ::testing::TestWithParam<const char*> {};

TEST_P(BenchWeights, FrozenGroupBytesDoNotDependOnHowTheyAreMade) {
  const ModelLayout m = moe_layout(GetParam());
  std::vector<std::vector<float>> w;
  std::vector<std::vector<uint8_t>> in_memory;
  bench::random_weights(m, w, in_memory, /*lazy=*/false);
  int frozen = 0;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    if (!m.groups[g].frozen) continue;
    ++frozen;
    const std::vector<std::byte> want = reference_group(m, int(g));
    ASSERT_EQ(in_memory[g].size(), want.size()) << m.groups[g].name;
    EXPECT_EQ(0, std::memcmp(in_memory[g].data(), want.data(), want.size()))
        << m.groups[g].name << " in memory";
    for (int threads : {1, 3, 16}) {
      // zeroed, as the runtime's host buffers are (a layout may leave bytes between tensors);
      // every tensor's values are random, so one left unwritten shows
      std::vector<std::byte> made(size_t(m.groups[g].storage_bytes));
      bench::make_frozen_group(m, int(g), made, threads);
      EXPECT_EQ(0, std::memcmp(made.data(), want.data(), want.size()))
          << m.groups[g].name << " made on " << threads << " threads";
    }
  }
  EXPECT_EQ(frozen, m.num_layers());  // embeddings, decoders, head: all frozen under LoRA
}

TEST(BenchWeights, ChunksAreSeededApart) {  // a mix-up of (group, tensor, chunk) would repeat values
  const ModelLayout m = moe_layout("nf4");
  const TensorSpec& t = m.groups[1].tensors.back();
  std::vector<float> a(64), b(64), c(64);
  bench::fill_chunk(t, 1, 0, 0, a.data(), 64);
  bench::fill_chunk(t, 1, 0, 1, b.data(), 64);
  bench::fill_chunk(t, 2, 0, 0, c.data(), 64);
  EXPECT_NE(0, std::memcmp(a.data(), b.data(), sizeof(float) * 64));
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), sizeof(float) * 64));
}

INSTANTIATE_TEST_SUITE_P(Formats, BenchWeights, ::testing::Values("bf16", "q8_0", "q4_0", "nf4", "fp8"));

}  // namespace
}  // namespace rp::test

// bench_throughput's tier errors name its options: each key, every time it appears, and the words
// about two of them.
namespace rp::test {
namespace {
TEST(BenchTierOptionNames, EachKeyIsTheOptionThatSetsIt) {
  EXPECT_EQ(bench::tier_option_names("frozen_tier.host_budget_gib: 1 GiB cannot hold this run; raise "
                                     "frozen_tier.host_budget_gib"),
            "--tier-host-budget-gib: 1 GiB cannot hold this run; raise --tier-host-budget-gib");
  EXPECT_EQ(
      bench::tier_option_names("frozen_tier.host_budget_gib: decides what stays resident itself; give it "
                               "or resident_gib, not both"),
      "--tier-host-budget-gib: decides what stays resident itself; give it or --tier-resident-gib, not both");
  EXPECT_EQ(
      bench::tier_option_names("frozen_tier.path: x; frozen_tier.ring_gib: y; frozen_tier.spill_layers: z"),
      "--frozen-tier: x; --tier-ring-gib: y; --tier-spill-layers: z");
  EXPECT_EQ(bench::tier_option_names("nothing of the tier"), "nothing of the tier");
}
}  // namespace
}  // namespace rp::test
