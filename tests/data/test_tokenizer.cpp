// Byte-level BPE tokenizer: exact Qwen3 ids on llama.cpp's vectors, round trips, special
// tokens, pre-tokenizer composition and Split behaviours.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common.hpp"
#include "data/pretokenizer.hpp"
#include "data/tokenizer.hpp"

using namespace rp;
using rp::test::fixture;
using rp::test::qwen;
using rp::test::read_file;

namespace {
struct VocabCase {
  std::string input;
  std::vector<int32_t> expected;
};

// llama.cpp format: every input is followed by "\n__ggml_vocab_test__\n"; the .out file
// has one line of ids per input.
std::vector<VocabCase> load_vocab_cases() {
  std::string inp = read_file(fixture("qwen3-tokenizer/ggml-vocab-qwen2.gguf.inp"));
  std::string out = read_file(fixture("qwen3-tokenizer/ggml-vocab-qwen2.gguf.out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  size_t pos = 0;
  for (size_t k; (k = inp.find(sep, pos)) != std::string::npos; pos = k + sep.size())
    cases.push_back({inp.substr(pos, k - pos), {}});
  EXPECT_EQ(pos, inp.size()) << "text after the last separator";
  std::istringstream lines(out);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    EXPECT_LT(i, cases.size()) << "more output lines than inputs";
    if (i >= cases.size()) break;
    std::istringstream ss(line);
    int32_t id;
    while (ss >> id) cases[i].expected.push_back(id);
    ++i;
  }
  EXPECT_EQ(i, cases.size()) << "output lines vs inputs";
  return cases;
}
}  // namespace

TEST(Tokenizer, QwenVocabVectorsExact) {
  auto cases = load_vocab_cases();
  ASSERT_EQ(cases.size(), 46u);  // 46 inputs, each closed by a separator line
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    EXPECT_EQ(qwen().encode(c.input), c.expected) << "case " << i << ": \"" << c.input << "\"";
    EXPECT_EQ(qwen().decode(qwen().encode(c.input)), c.input) << "round trip, case " << i;
  }
}

TEST(Tokenizer, KnownIdsAndMetadata) {
  const auto& t = qwen();
  EXPECT_EQ(t.vocab_size(), 151669u);
  EXPECT_EQ(t.token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(t.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.token_id("Hello"), 9707);
  EXPECT_EQ(t.token_id("ĠHello"), 21927);
  EXPECT_EQ(t.token_id("no-such-token-xyz"), -1);
  EXPECT_EQ(t.eos_id(), 151645);  // tokenizer_config.json: eos_token <|im_end|>
  EXPECT_EQ(t.bos_id(), -1);      // bos_token null
  EXPECT_NE(t.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_TRUE(t.is_special(151643));
  EXPECT_FALSE(t.is_special(9707));
  EXPECT_EQ(t.token_text(21927), "ĠHello");
  EXPECT_THROW(t.decode({int32_t(t.vocab_size())}), std::out_of_range);
  EXPECT_THROW(t.decode({-1}), std::out_of_range);
}

TEST(Tokenizer, SpecialTokensMatchedLiterally) {
  const auto& t = qwen();
  std::string s = "<|im_start|>user\nHello<|im_end|>\n";
  std::vector<int32_t> want = {151644, 872, 198, 9707, 151645, 198};
  EXPECT_EQ(t.encode(s), want);
  auto plain = t.encode(s, /*allow_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 151644), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 151645), 0);
  EXPECT_GT(plain.size(), want.size());
  EXPECT_EQ(t.decode(plain), s);
  // <think> is an added token that is not special: matched even with allow_special=false.
  int32_t think = t.token_id("<think>");
  ASSERT_GE(think, 0);
  auto th = t.encode("a<think>b", false);
  EXPECT_NE(std::find(th.begin(), th.end(), think), th.end());
  // Special token glued to text on both sides.
  auto glued = t.encode("x<|endoftext|>y");
  ASSERT_EQ(glued.size(), 3u);
  EXPECT_EQ(glued[1], 151643);
}

TEST(Tokenizer, OffsetsPointAtTokenStarts) {
  const auto& t = qwen();
  std::string s = "Hello, world!<|im_end|> 12 apples";
  std::vector<size_t> off;
  auto ids = t.encode_with_offsets(s, off);
  ASSERT_EQ(ids.size(), off.size());
  size_t pos = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(off[i], pos) << "token " << i;
    pos += t.decode({ids[i]}).size();
  }
  EXPECT_EQ(pos, s.size());
}

TEST(Tokenizer, RoundTripSotuExcerptAndOddBytes) {
  const auto& t = qwen();
  for (auto& e : std::filesystem::directory_iterator(fixture("sotu-excerpt"))) {
    if (e.path().extension() != ".txt") continue;
    std::string text = read_file(e.path().string());
    ASSERT_GT(text.size(), 1000u);
    auto ids = t.encode(text);
    EXPECT_LT(ids.size(), text.size() / 3) << "English prose should be > 3 bytes/token";
    EXPECT_EQ(t.decode(ids), text) << e.path();
  }
  std::string odd =
      "\xff\xfe"
      "abc\xc3 \xe2\x82 end\x80";  // invalid UTF-8
  EXPECT_EQ(t.decode(t.encode(odd)), odd);
  std::string ws(5000, ' ');
  ws += "x\n\n\t\t  \r\n";
  EXPECT_EQ(t.decode(t.encode(ws)), ws);
}

namespace {
// A tiny byte-level tokenizer: 256 byte tokens plus the given merges.
nlohmann::json tiny_tokenizer(const nlohmann::json& pre,
                              const std::vector<std::pair<std::string, std::string>>& merges) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(uint8_t(b))] = b;
  nlohmann::json jm = nlohmann::json::array();
  int next = 256;
  for (auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    jm.push_back(a + " " + b);
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", jm}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"added_tokens", nlohmann::json::array()}};
}
const nlohmann::json kByteLevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
}  // namespace

TEST(Tokenizer, DigitsThenByteLevelLikeSmolLM) {
  std::vector<std::pair<std::string, std::string>> merges = {{"1", "2"}, {"Ġ", "12"}, {"a", "b"}};
  auto plain = Tokenizer::from_json(tiny_tokenizer(kByteLevel, merges), "tiny");
  nlohmann::json seq = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, kByteLevel}}};
  auto smol = Tokenizer::from_json(tiny_tokenizer(seq, merges), "tiny-smollm");
  int32_t ab = plain.token_id("ab"), sp12 = plain.token_id("Ġ12");
  ASSERT_GE(ab, 256);
  ASSERT_GE(sp12, 256);
  // GPT-2 regex alone: "ab", " 12" -> merges apply inside " 12".
  EXPECT_EQ(plain.encode("ab 12"), (std::vector<int32_t>{ab, sp12}));
  // Digits first: "ab ", "1", "2"; then ByteLevel splits "ab " into "ab", " ".
  EXPECT_EQ(smol.encode("ab 12"), (std::vector<int32_t>{ab, ' ', '1', '2'}));
  EXPECT_EQ(smol.decode(smol.encode("x 2024 y")), "x 2024 y");
}

TEST(Tokenizer, MergesAsPairsAndPrefixSpace) {
  auto j = tiny_tokenizer(kByteLevel, {{"Ġ", "h"}, {"Ġh", "i"}});
  j["model"]["merges"] =
      nlohmann::json::array({nlohmann::json::array({"Ġ", "h"}), nlohmann::json::array({"Ġh", "i"})});
  j["pre_tokenizer"]["add_prefix_space"] = true;
  auto t = Tokenizer::from_json(j, "tiny-pairs");
  int32_t shi = t.token_id("Ġhi");
  ASSERT_GE(shi, 0);
  EXPECT_EQ(t.encode("hi"), std::vector<int32_t>{shi});   // prefix space added
  EXPECT_EQ(t.encode(" hi"), std::vector<int32_t>{shi});  // already there: not doubled
  EXPECT_EQ(t.decode(t.encode("hi")), " hi");
}

TEST(Tokenizer, UnsupportedInputsThrowNamingTheSource) {
  auto j = tiny_tokenizer(kByteLevel, {});
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  try {
    Tokenizer::from_json(j, "some/tokenizer.json");
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("some/tokenizer.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Metaspace"), std::string::npos) << e.what();
  }
  auto k = tiny_tokenizer(kByteLevel, {{"x", "y"}});
  k["model"]["merges"] = {"x zz"};
  EXPECT_THROW(Tokenizer::from_json(k, "bad-merge"), std::runtime_error);
  EXPECT_THROW(Tokenizer::from_file(fixture("does-not-exist.json")), std::runtime_error);
}

// An id must be a JSON integer that fits the token id type: 2^32 + 7 used to wrap to 7 (and
// train " God" as token 7), 7.9 and true were truncated. Each is refused with one line naming
// the file, the token and the id.
TEST(Tokenizer, IdsThatAreNotIntegersInRangeAreRefusedNamingTheToken) {
  const auto God = byte_to_unicode(uint8_t(' ')) + "God";
  const std::vector<std::pair<nlohmann::json, std::string>> bad = {
      {nlohmann::json(uint64_t(1) << 32 | 7), "4294967303"},
      {nlohmann::json(int64_t(1) << 31), "2147483648"},
      {nlohmann::json(-1), "-1"},
      {nlohmann::json(7.9), "7.9"},
      {nlohmann::json(true), "true"},
      {nlohmann::json("7"), "\"7\""}};
  for (const auto& [id, text] : bad) {
    for (bool added : {false, true}) {
      auto j = tiny_tokenizer(kByteLevel, {});
      if (added) j["added_tokens"] = {{{"content", "<|God|>"}, {"id", id}, {"special", true}}};
      else j["model"]["vocab"][God] = id;
      try {
        Tokenizer::from_json(j, "bad/tokenizer.json");
        ADD_FAILURE() << "id " << text << " was accepted";
      } catch (const std::runtime_error& e) {
        const std::string m = e.what();
        EXPECT_EQ(m.rfind("bad/tokenizer.json: ", 0), 0u) << m;
        EXPECT_NE(m.find(added ? "<|God|>" : God), std::string::npos) << m;
        EXPECT_NE(m.find("has id " + text), std::string::npos) << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      }
    }
  }
  auto ok = tiny_tokenizer(kByteLevel, {});
  ok["model"]["vocab"][God] = 300;
  EXPECT_EQ(Tokenizer::from_json(ok, "ok").token_id(God), 300);
}

// A pre-tokenizer regex that backtracks catastrophically (`(a+)+b|.` on runs of 'a') is cut
// off by PCRE2's match limit: encoding fails at once with one line naming the tokenizer file
// instead of taking tens of seconds (28.7 s on a 23 KB line before the bound), while ordinary
// patterns on long runs (a megabyte of spaces, letters) still encode.
TEST(Tokenizer, ACatastrophicallyBacktrackingRegexFailsFastNamingTheFile) {
  nlohmann::json seq = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(a+)+b|."}}}, {"behavior", "Isolated"}}, kByteLevel}}};
  const Tokenizer t = Tokenizer::from_json(tiny_tokenizer(seq, {}), "evil/tokenizer.json");
  EXPECT_EQ(t.encode("aab").size(), 3u);  // short text: fine
  std::string line;
  while (line.size() < 23000) line += std::string(20, 'a') + "c";
  const auto t0 = std::chrono::steady_clock::now();
  try {
    t.encode(line);
    ADD_FAILURE() << "no throw";
  } catch (const RegexWorkExceeded& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("evil/tokenizer.json: ", 0), 0u) << m;
    EXPECT_NE(m.find("(a+)+b|."), std::string::npos) << m;
    EXPECT_LT(m.size(), 400u) << m;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  const Tokenizer gpt2 = Tokenizer::from_json(tiny_tokenizer(kByteLevel, {}), "gpt2");
  for (char c : {' ', 'a', '!', '7'}) {
    const std::string run(1 << 20, c);
    EXPECT_EQ(gpt2.decode(gpt2.encode(run + "x")), run + "x") << int(c);
  }
}

namespace {
std::vector<std::string> split_with(const std::string& behavior, const std::string& text) {
  nlohmann::json seq = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}},
        {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  auto pt = PreTokenizer::from_json(seq, "test");
  std::vector<Piece> pieces;
  pt.split(text, 0, pieces);
  std::vector<std::string> out;
  for (auto& p : pieces) out.push_back(text.substr(p.off, p.len));
  return out;
}
using V = std::vector<std::string>;
}  // namespace

// Expected values: the examples of HF tokenizers' SplitDelimiterBehavior documentation.
TEST(PreTokenizer, SplitBehaviours) {
  const std::string s = "the-final--countdown";
  EXPECT_EQ(split_with("Removed", s), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split_with("Isolated", s), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split_with("MergedWithPrevious", s), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split_with("MergedWithNext", s), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split_with("Contiguous", s), (V{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenizer, ByteToUnicodeTable) {
  EXPECT_EQ(byte_to_unicode(' '), "Ġ");
  EXPECT_EQ(byte_to_unicode('\n'), "Ċ");
  EXPECT_EQ(unicode_to_byte(0x120), ' ');
}

// Throughput on the full sotu corpus (~10 MB) when it is present and RP_DATA_BENCH is set.
TEST(Tokenizer, SotuThroughputOptional) {
  const char* dir = "/work/shared/data/sotu";
  if (!std::getenv("RP_DATA_BENCH") || !std::filesystem::exists(dir)) GTEST_SKIP() << "set RP_DATA_BENCH=1";
  size_t bytes = 0, tokens = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".txt") continue;
    std::string text = read_file(e.path().string());
    bytes += text.size();
    auto ids = qwen().encode(text);
    tokens += ids.size();
    EXPECT_EQ(qwen().decode(ids), text);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("sotu: %zu bytes -> %zu tokens in %.2f s (%.1f MB/s)\n", bytes, tokens, s, bytes / s / 1e6);
  EXPECT_LT(s, 60.0);
}

// NFC through utf8proc: the 1,500 random strings of scripts/make_nfc_cases.py (decomposed
// accents, conjoining Hangul jamo, ...) give exactly HF tokenizers' ids for Qwen3, whose
// normalizer is NFC. Most of them are not in NFC, so an identity normalizer fails here.
TEST(Tokenizer, NfcMatchesHuggingFaceOnRandomDecomposedStrings) {
  const auto j = nlohmann::json::parse(read_file(fixture("qwen3-tokenizer/nfc_cases.json")));
  const auto& cases = j.at("cases");
  ASSERT_EQ(cases.size(), 1500u);
  ASSERT_GT(j.at("not_nfc").get<int>(), 500);
  size_t wrong = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    if (qwen().encode(text) != want && ++wrong <= 5) ADD_FAILURE() << "differs from HF for: " << text;
  }
  EXPECT_EQ(wrong, 0u) << "of " << cases.size();
}

// Offsets of a normalised text still point into the input: e.g. "e" + U+0301 composes to one
// "é" (NFC), and the tokens after it keep their input offsets.
TEST(Tokenizer, NfcOffsetsPointIntoTheInput) {
  const std::string text = "Cafe\xCC\x81 au lait, voila\xCC\x80!";  // NFD e-acute, a-grave
  const std::string nfc = "Caf\xC3\xA9 au lait, voil\xC3\xA0!";
  std::vector<size_t> off;
  const auto ids = qwen().encode_with_offsets(text, off);
  EXPECT_EQ(ids, qwen().encode(nfc));
  EXPECT_EQ(qwen().decode(ids), nfc);
  ASSERT_EQ(off.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = qwen().decode({ids[i]});
    if (piece == " au" || piece == " lait" || piece == "!") {
      EXPECT_EQ(text.compare(off[i], piece.size(), piece), 0) << piece << " at " << off[i];
    }
  }
  EXPECT_TRUE(std::is_sorted(off.begin(), off.end()));
  // invalid UTF-8 next to decomposed text: bytes kept, the valid part normalised
  const std::string bad =
      "e\xCC\x81\xFF"
      "e\xCC\x81";
  EXPECT_EQ(qwen().decode(qwen().encode(bad)), "\xC3\xA9\xFF\xC3\xA9");
}

// The post-processor's special tokens, as HF's tokenizer(text) adds them: LLaMA-3's
// Sequence[ByteLevel, TemplateProcessing] puts <|begin_of_text|> first; Bert-style puts cls
// first and sep last; a tokenizer without one adds nothing.
TEST(Tokenizer, PostProcessorSpecialTokens) {
  auto j = nlohmann::json::parse(read_file(fixture("smollm2-tokenizer/tokenizer.json")));
  const int bos = 128000;
  j["added_tokens"].push_back({{"id", bos}, {"content", "<|begin_of_text|>"}, {"special", true}});
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", nlohmann::json::array()},
         {"special_tokens",
          {{"<|begin_of_text|>",
            {{"id", "<|begin_of_text|>"}, {"ids", {bos}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  const Tokenizer t = Tokenizer::from_json(j, "llama3-like");
  std::vector<int32_t> want = {bos};
  for (int32_t id : t.encode("Hello world")) want.push_back(id);
  EXPECT_EQ(t.encode_with_special_tokens("Hello world"), want);
  EXPECT_EQ(t.encode("Hello world").front(), want[1]);  // encode() alone adds nothing
  EXPECT_EQ(t.prefix_tokens(), std::vector<int32_t>{bos});
  EXPECT_TRUE(t.suffix_tokens().empty());

  j["post_processor"] = {
      {"type", "BertProcessing"}, {"cls", {"<|im_start|>", 1}}, {"sep", {"<|im_end|>", 2}}};
  const Tokenizer b = Tokenizer::from_json(j, "bert-like");
  EXPECT_EQ(b.prefix_tokens(), std::vector<int32_t>{1});
  EXPECT_EQ(b.suffix_tokens(), std::vector<int32_t>{2});

  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<|nope|>"}, {"type_id", 0}}}}}}};
  EXPECT_THROW(Tokenizer::from_json(j, "bad-post"), std::runtime_error);
  j["post_processor"] = {{"type", "Whatever"}};
  try {
    Tokenizer::from_json(j, "odd-post");
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("odd-post: unsupported post_processor type \"Whatever\""),
              std::string::npos)
        << e.what();
  }
  j["post_processor"] = nullptr;
  EXPECT_TRUE(Tokenizer::from_json(j, "none").prefix_tokens().empty());
}
