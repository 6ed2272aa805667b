// Generation (roundpipe/generate.hpp): prefill logits equal Hugging Face's (the golden tiny
// LLaMA and Qwen3 of tests/fixtures/hf_golden, fp32 on the CPU backend), decoding with the
// KV cache equals recomputing every prefix from scratch, the samplers follow HF's warpers,
// and (with the default model and tests/fixtures/generate/smollm2_greedy.json, made by
// scripts/make_generate_fixture.py with transformers) greedy decoding of SmolLM2 gives
// transformers' tokens one for one.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/chat_template.hpp"
#include "data/tokenizer.hpp"
#include "formats/safetensors.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/device.hpp"
#include "roundpipe/errors.hpp"
#include "roundpipe/generate.hpp"

namespace rp {
namespace {

// "tiny_llama" -> tests/fixtures/hf_golden/tiny_llama; a name with a folder ("hf_moe/...") as is
std::string golden_dir(const std::string& name) {
  return std::string(RP_FIXTURES_DIR) + (name.find('/') == std::string::npos ? "/hf_golden/" : "/") + name;
}

double rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

int32_t argmax_row(const std::vector<float>& lg, int64_t row, int64_t V) {
  return int32_t(std::max_element(lg.begin() + row * V, lg.begin() + (row + 1) * V) - (lg.begin() + row * V));
}

}  // namespace

TEST(Generate, PrefillLogitsMatchHuggingFace) {
  // the Qwen3-MoE and GPT-OSS goldens route through the same sparse block as training; GPT-OSS's
  // prompt rows attend through attention_decode_v (window 3, sinks); OLMo 2's post-norms,
  // Granite's multipliers, Phi-3's window (7) and Gemma's norms, GeGLU, sliding / global layers
  // (Gemma 3: per-layer RoPE base), Phi-4-mini's partial rotary, Gemma 2's soft-capped scores
  // and logits through the same generator; LongRoPE's long table (24-token prompts over a
  // 16-token original context) and short one (golden_short's 12-token prompts)
  for (const char* name :
       {"tiny_llama", "tiny_qwen3", "hf_moe/tiny_qwen3_moe", "hf_moe/tiny_qwen3_moe_tied",
        "hf_gpt_oss/tiny_gpt_oss", "tiny_olmo2", "tiny_granite", "tiny_phi3", "tiny_gemma2", "tiny_gemma3",
        "tiny_phi4", "tiny_gemma2_softcap", "tiny_phi3_longrope", "tiny_phi3_longrope/short"}) {
    std::string n = name, file = "/golden.safetensors";
    if (n.size() > 6 && n.compare(n.size() - 6, 6, "/short") == 0) {  // the fixture's second golden file
      n.resize(n.size() - 6);
      file = "/golden_short.safetensors";
    }
    const std::string dir = golden_dir(n);
    const LoadedModel lm = load_model(dir);
    SafetensorsFile golden(dir + file);
    const HostTensor ids = golden.read_f32(*golden.find("ids")),
                     logits = golden.read_f32(*golden.find("logits"));
    const int64_t L = ids.shape[1], V = lm.config.vocab_size;
    Generator gen(lm, {.backend = "cpu"});
    for (int64_t s = 0; s < ids.shape[0]; ++s) {
      std::vector<int32_t> seq;
      for (int64_t t = 0; t < L; ++t) seq.push_back(int32_t(ids.data[size_t(s * L + t)]));
      const std::vector<float> got = gen.logits(seq);
      const std::vector<float> want(logits.data.begin() + s * L * V, logits.data.begin() + (s + 1) * L * V);
      EXPECT_LT(rel(got, want), 1e-5) << name << " sequence " << s;
    }
    if (cuda_device_count() == 0) continue;  // bf16 storage on the GPU: bf16 tolerance
    Generator cu(lm, {.backend = "cuda", .dtype = DType::bf16});
    std::vector<int32_t> seq;
    for (int64_t t = 0; t < L; ++t) seq.push_back(int32_t(ids.data[size_t(t)]));
    const std::vector<float> want(logits.data.begin(), logits.data.begin() + L * V);
    EXPECT_LT(rel(cu.logits(seq), want), 3e-2) << name << " on " << cu.device_name();
    // decoding through the cache: the last prompt row's logits equal the prefill's
    GenerateOptions o;
    o.max_new_tokens = 1;
    EXPECT_EQ(cu.generate(seq, o).front(), argmax_row(cu.logits(seq), L - 1, V)) << name;
  }
}

// Greedy decoding through the cache (prefill, then one token at a time) equals taking the
// argmax of a full recomputation of every prefix; stop ids end it; the cache limit is kept.
TEST(Generate, CachedDecodingEqualsRecomputingEveryPrefix) {
  // GPT-OSS: one token at a time through a sliding window of 3 must equal the full recompute;
  // Gemma 2 with soft-capping: the capped scores of the cached rows as well. LongRoPE (original
  // context 16): the 5-token prompt decodes on the short table up to 16 tokens, then (as
  // transformers' Phi-3 recomputes its cache there) on the long one
  for (const char* name : {"tiny_llama", "tiny_qwen3", "hf_gpt_oss/tiny_gpt_oss", "tiny_olmo2", "tiny_phi3",
                           "tiny_gemma3", "tiny_phi4", "tiny_gemma2_softcap", "tiny_phi3_longrope"}) {
    const LoadedModel lm = load_model(golden_dir(name));
    Generator gen(lm, {.backend = "cpu", .max_context = 64});
    const int32_t V = int32_t(lm.config.vocab_size);
    const std::vector<int32_t> prompt = {5 % V, 77 % V, 3 % V, 140 % V, 9 % V};
    GenerateOptions o;
    o.max_new_tokens = 20;
    std::vector<int32_t> streamed;
    const std::vector<int32_t> out = gen.generate(prompt, o, [&](int32_t id) {
      streamed.push_back(id);
      return true;
    });
    ASSERT_EQ(out.size(), 20u);
    EXPECT_EQ(streamed, out);
    std::vector<int32_t> seq = prompt;
    for (int32_t id : out) {
      const auto lg = gen.logits(seq);
      EXPECT_EQ(argmax_row(lg, int64_t(seq.size()) - 1, lm.config.vocab_size), id)
          << name << " at " << seq.size();
      seq.push_back(id);
    }
    o.stop_ids = {out[3]};
    const auto stopped = gen.generate(prompt, o);
    EXPECT_EQ(stopped,
              std::vector<int32_t>(
                  out.begin(), out.begin() + 1 + (std::find(out.begin(), out.end(), out[3]) - out.begin())));
    o.stop_ids.clear();
    o.max_new_tokens = 1000;
    EXPECT_EQ(int64_t(gen.generate(prompt, o).size()), 64 - int64_t(prompt.size()) + 1);  // cache full
    EXPECT_THROW(gen.generate({}, o), std::invalid_argument);
    EXPECT_THROW(gen.generate({int32_t(lm.config.vocab_size)}, o), std::invalid_argument);
  }
}

// LongRoPE (original context 16): sampling through the cache equals sampling from a full
// recomputation of every prefix (the same draws), which takes the long table for every key once
// the sequence passes 16 tokens; the cached keys of the short table are recomputed there, as
// transformers' Phi-3 generation drops its cache. Sampling, unlike the argmax, follows every
// change of the probabilities, and eight seeds make a kept short-table cache show.
TEST(Generate, LongRopeDecodingRecomputesTheCacheAtTheSwitch) {
  const LoadedModel lm = load_model(golden_dir("tiny_phi3_longrope"));
  Generator gen(lm, {.backend = "cpu", .max_context = 64});
  const int64_t V = lm.config.vocab_size;
  const std::vector<int32_t> prompt = {5, 77, 3, 100, 9};
  GenerateOptions o;
  o.max_new_tokens = 24;
  o.temperature = 1.0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    o.seed = seed;
    const std::vector<int32_t> out = gen.generate(prompt, o);
    ASSERT_EQ(out.size(), 24u);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> unif(0.0, 1.0);
    std::vector<int32_t> seq = prompt;
    for (int32_t id : out) {
      const std::vector<float> lg = gen.logits(seq);
      const std::vector<float> last(lg.end() - V, lg.end());
      ASSERT_EQ(pick_token(last, o, unif(rng)), id) << "seed " << seed << " at " << seq.size();
      seq.push_back(id);
    }
  }
}

TEST(Generate, PickTokenFollowsTheWarpers) {
  const std::vector<float> lg = {1.0f, 3.0f, 3.0f, 2.0f};
  GenerateOptions o;
  EXPECT_EQ(pick_token(lg, o, 0.9), 1);  // greedy: the first maximum
  o.temperature = 1;
  o.top_k = 1;
  EXPECT_EQ(pick_token(lg, o, 0.99), 1);
  o.top_k = 0;
  o.top_p = 0.3;  // the two tokens of e^3 hold 2 e^3 / (e + 2 e^3 + e^2) = 0.67: the first reaches 0.3
  EXPECT_EQ(pick_token(lg, o, 0.99), 1);
  o.top_p = 1;
  // the full softmax: cumulative probabilities 1, 2 (e^3 each), then e^2, then e^1 in sorted order
  const double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  EXPECT_EQ(pick_token(lg, o, 0.5 * std::exp(3.0) / z), 1);
  EXPECT_EQ(pick_token(lg, o, 1.5 * std::exp(3.0) / z), 2);
  EXPECT_EQ(pick_token(lg, o, (2 * std::exp(3.0) + 0.5 * std::exp(2.0)) / z), 3);
  EXPECT_EQ(pick_token(lg, o, 0.999999), 0);
  o.temperature = 1e-3;  // near-greedy
  EXPECT_EQ(pick_token(lg, o, 0.3), 1);
}

// A KV cache the device cannot hold is one error naming the positions, and the weights' copies
// still in flight when it is found finish before their buffers go (the default model's were
// copied from freed memory: a crash, not an error); positions past int32 are refused first.
TEST(Generate, AContextTheDeviceCannotHoldIsOneError) {
  std::vector<std::string> models = {golden_dir("tiny_llama")};
  const auto smol = std::filesystem::path(RP_SOURCE_DIR) / "assets/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (std::filesystem::exists(smol)) models.push_back(smol.string());  // large enough to have copies queued
  for (const std::string& m : models) {
    const LoadedModel lm = load_model(m);
    for (const int64_t positions : {int64_t(99999999), int64_t(std::numeric_limits<int32_t>::max())}) {
      if (m == models.front() && positions == 99999999) continue;  // tiny_llama holds that much
      try {
        Generator gen(lm, {.backend = "cpu", .max_context = positions});
        ADD_FAILURE() << m << ": a KV cache of " << positions << " positions was allocated";
      } catch (const DeviceOutOfMemory& e) {
        EXPECT_NE(std::string(e.what()).find(fmt::format("a KV cache of {} positions", positions)),
                  std::string::npos)
            << e.what();
      }
    }
    EXPECT_THROW(Generator(lm, {.backend = "cpu", .max_context = int64_t(1) << 40}), std::invalid_argument);
    EXPECT_THROW(Generator(lm, {.backend = "cpu", .max_context = -1}), std::invalid_argument);
  }
}

// Sampling options that are NaN (Python's generate(temperature=float("nan")) sampled from NaN
// probabilities and returned text) or infinite are refused.
TEST(Generate, NaNSamplingOptionsAreRefused) {
  const LoadedModel lm = load_model(golden_dir("tiny_llama"));
  Generator gen(lm, {.backend = "cpu", .max_context = 16});
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const auto& [t, p] : {std::pair{nan, 1.0}, {1.0, nan}, {inf, 1.0}, {-1.0, 1.0}, {1.0, 0.0}}) {
    GenerateOptions o;
    o.max_new_tokens = 2;
    o.temperature = t;
    o.top_p = p;
    EXPECT_THROW(gen.generate({1, 2, 3}, o), std::invalid_argument) << t << " " << p;
  }
}

// transformers' greedy tokens for the default model (scripts/make_generate_fixture.py).
TEST(Generate, GreedySmolLM2EqualsTransformers) {
  const std::filesystem::path root = RP_SOURCE_DIR;
  const auto fixture = std::filesystem::path(RP_FIXTURES_DIR) / "generate/smollm2_greedy.json";
  const auto model = root / "assets/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "default model missing: run scripts/setup.sh";
  if (!std::filesystem::exists(fixture))
    GTEST_SKIP() << "no " << fixture
                 << ": run scripts/make_generate_fixture.py where transformers and torch are "
                    "installed (the lent GPU machine) and commit its output";
  const auto j = nlohmann::json::parse(std::ifstream(fixture));
  const LoadedModel lm = load_model(model.string());
  Generator gen(lm, {.backend = "cpu"});
  const Tokenizer tok = Tokenizer::from_json(lm.tokenizer_json, "smollm2");
  for (const auto& c : j.at("cpu_f32")) {
    GenerateOptions o;
    o.max_new_tokens = c.at("max_new_tokens").get<int64_t>();
    o.stop_ids = c.at("eos").get<std::vector<int32_t>>();
    const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    // our chat template and tokenizer give transformers' prompt ...
    if (c.at("prompt").contains("messages")) {
      std::vector<ChatMessage> msgs;
      for (const auto& m : c.at("prompt").at("messages")) msgs.push_back({m.at("role"), m.at("content"), {}});
      EXPECT_EQ(tok.encode(render_chat_text(detect_chat_template(lm.chat_template), msgs, nullptr, true)),
                prompt);
    } else {
      EXPECT_EQ(tok.encode_with_special_tokens(c.at("prompt").at("text").get<std::string>()), prompt);
    }
    // ... and greedy decoding its tokens
    EXPECT_EQ(gen.generate(prompt, o), c.at("output_ids").get<std::vector<int32_t>>()) << c.at("prompt");
  }
  if (cuda_device_count() == 0 || !j.contains("cuda_bf16")) return;
  // bf16 on a GPU: two bf16 implementations sum in different orders, so where the two best
  // next tokens are closer than bf16's rounding (0.125 at logits near 25) either may win and
  // the texts part there. The generations must agree up to the first difference, and that
  // difference must be such a near tie: both tokens within kTie of the best fp32 logit of the
  // same prefix (the CPU generator's, equal to transformers' fp32 above). Found on the H200:
  // "What is the capital of France?" starts with 504 (25.33) or 60 (25.24).
  constexpr float kTie = 0.25f;
  Generator cu(lm, {.backend = "cuda", .dtype = DType::bf16});
  int agreed = 0, total = 0;
  for (const auto& c : j.at("cuda_bf16")) {
    GenerateOptions o;
    o.max_new_tokens = c.at("max_new_tokens").get<int64_t>();
    o.stop_ids = c.at("eos").get<std::vector<int32_t>>();
    const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto want = c.at("output_ids").get<std::vector<int32_t>>();
    const auto got = cu.generate(prompt, o);
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    total += int(want.size());
    agreed += int(i);
    if (i == got.size() && i == want.size()) continue;
    ASSERT_TRUE(i < got.size() && i < want.size()) << "one generation stops early: " << c.at("prompt");
    std::vector<int32_t> prefix = prompt;
    prefix.insert(prefix.end(), want.begin(), want.begin() + long(i));
    const std::vector<float> lg = gen.logits(prefix);
    const float* last = lg.data() + (prefix.size() - 1) * size_t(lm.config.vocab_size);
    const float best = *std::max_element(last, last + lm.config.vocab_size);
    EXPECT_GE(last[got[i]], best - kTie)
        << "bf16 on " << cu.device_name() << " parts at token " << i << " with " << got[i] << " (fp32 logit "
        << last[got[i]] << ", best " << best << "): " << c.at("prompt");
    EXPECT_GE(last[want[i]], best - kTie) << "transformers' token " << want[i] << " at " << i;
  }
  // most tokens agree (a test that compared nothing would pass)
  EXPECT_GE(agreed, total / 2) << agreed << " of " << total << " bf16 tokens equal transformers'";
}

}  // namespace rp
