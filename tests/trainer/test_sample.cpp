// sample() (the text around the generator that `roundpipe generate` and the trainer's
// before/after samples use) on a model whose vocabulary has rows its tokenizer has no token
// for, as Qwen3 pads 151,669 tokens to 151,936 rows: such ids are generated (as Hugging
// Face's generate does, which never masks them) and decode to nothing (as its decode skips
// them), instead of stopping the run.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "data/pretokenizer.hpp"
#include "data/tokenizer.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/generate.hpp"
#include "trainer/sample.hpp"

namespace rp {
namespace {

// Byte-level BPE over the 256 byte tokens (ids 0..255), no merges.
nlohmann::json byte_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(uint8_t(b))] = b;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"added_tokens", nlohmann::json::array()}};
}

// tiny_llama (vocab 256) padded to `rows` vocabulary rows. With `favour_padding`, every
// real row of the LM head is zero and two padded rows are +u and -u, so the largest logit
// is always a padded id (h.u != 0 for a random u).
LoadedModel padded_tiny_llama(int64_t rows, bool favour_padding) {
  LoadedModel m = load_model((std::filesystem::path(RP_FIXTURES_DIR) / "hf_golden/tiny_llama").string());
  const int64_t V = m.config.vocab_size, H = m.config.hidden_size;
  m.config.vocab_size = rows;
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"}) {
    HostTensor& t = m.tensors.at(name);
    t.shape = {rows, H};
    t.data.resize(size_t(rows * H), 0.f);
  }
  if (favour_padding) {
    HostTensor& head = m.tensors.at("lm_head.weight");
    std::fill(head.data.begin(), head.data.begin() + V * H, 0.f);
    std::mt19937 g(7);
    std::normal_distribution<float> n(0.f, 1.f);
    for (int64_t j = 0; j < H; ++j) {
      const float u = n(g);
      head.data[size_t((rows - 2) * H + j)] = 10 * u;
      head.data[size_t((rows - 1) * H + j)] = -10 * u;
    }
  }
  m.tokenizer_json = byte_tokenizer();
  m.source = "padded tiny_llama";
  return m;
}

}  // namespace

TEST(Sample, IdsWithoutATokenAreGeneratedAndDecodeToNothing) {
  const LoadedModel m = padded_tiny_llama(300, true);
  Generator gen(m, {.backend = "cpu", .max_context = 64});
  SampleRequest r;
  r.text = "ab";
  r.generate.max_new_tokens = 5;
  std::string streamed;
  const SampleResult res = sample(gen, m, r, [&](const std::string& s) { streamed += s; });
  ASSERT_EQ(res.ids.size(), 5u);
  for (int32_t id : res.ids) EXPECT_GE(id, 298) << "the padded rows win every step";
  EXPECT_EQ(res.text, "");
  EXPECT_EQ(streamed, "");
}

TEST(Sample, PaddingLeavesRealTokensAlone) {
  // the same model without the favoured padding: what it generates decodes as the
  // tokenizer alone would decode the ids that have tokens
  const LoadedModel m = padded_tiny_llama(300, false);
  Generator gen(m, {.backend = "cpu", .max_context = 64});
  SampleRequest r;
  r.text = "ab";
  r.generate.max_new_tokens = 6;
  const SampleResult res = sample(gen, m, r);
  ASSERT_EQ(res.ids.size(), 6u);
  const Tokenizer tok = Tokenizer::from_json(byte_tokenizer(), "bytes");
  std::vector<int32_t> known;
  for (int32_t id : res.ids)
    if (tok.has_token(id)) known.push_back(id);
  EXPECT_EQ(res.text, tok.decode(known));
  EXPECT_FALSE(tok.has_token(256));
  EXPECT_FALSE(tok.has_token(-1));
  EXPECT_TRUE(tok.has_token(255));
}

// A stop request ends the generation between tokens, with the tokens so far; one made before
// the prompt runs generates nothing.
TEST(Sample, AnInterruptEndsTheGenerationBetweenTokens) {
  const LoadedModel m = padded_tiny_llama(300, false);
  Generator gen(m, {.backend = "cpu", .max_context = 64});
  SampleRequest r;
  r.text = "ab";
  r.generate.max_new_tokens = 20;
  int asked = 0;
  r.interrupt = [&] { return ++asked > 3; };  // before the prompt, then after tokens 1, 2 and 3
  SampleResult res = sample(gen, m, r);
  EXPECT_TRUE(res.interrupted);
  EXPECT_EQ(res.ids.size(), 3u);
  r.interrupt = [] { return true; };
  res = sample(gen, m, r);
  EXPECT_TRUE(res.interrupted);
  EXPECT_TRUE(res.ids.empty());
  r.interrupt = [] { return false; };
  res = sample(gen, m, r);
  EXPECT_FALSE(res.interrupted);
  EXPECT_EQ(res.ids.size(), 20u);
}

}  // namespace rp
