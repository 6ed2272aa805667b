#include "formats/tokenizer_export.hpp"
#include "model/error_text.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace rp {

using nlohmann::json;

namespace {

// Pre-tokenizer regexes, as HF tokenizer.json files of these families spell them.
const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// o200k (GPT-4o, GPT-OSS): llama.cpp's "gpt-4o" pre-tokenizer, tiktoken's o200k_base pattern
const char* kGpt4oRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json byte_level(bool use_regex) {
  return {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json split_then_bytes(const char* regex) {
  json split = {
      {"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
  return {{"type", "Sequence"}, {"pretokenizers", json::array({split, byte_level(false)})}};
}

}  // namespace

nlohmann::json tokenizer_json_from_gguf(const GgufFile& f) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(one_line(fmt::format("{}: {}", f.path(), what)));
  };
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    fail(fmt::format("tokenizer.ggml.model '{}' is not supported (only byte-level BPE 'gpt2')", model));
  const json& tokens = f.get("tokenizer.ggml.tokens");
  if (!tokens.is_array() || tokens.empty()) fail("tokenizer.ggml.tokens: expected a non-empty string array");
  const int64_t n = int64_t(tokens.size());
  json types = f.has("tokenizer.ggml.token_type") ? f.get("tokenizer.ggml.token_type") : json::array();
  if (!types.is_array() || (!types.empty() && int64_t(types.size()) != n))
    fail(fmt::format("tokenizer.ggml.token_type: expected {} entries, got {}", n,
                     types.is_array() ? types.size() : 0));

  json vocab = json::object();
  json added = json::array();
  for (int64_t id = 0; id < n; ++id) {
    if (!tokens[size_t(id)].is_string()) fail(fmt::format("tokenizer.ggml.tokens[{}] is not a string", id));
    const std::string& tok = tokens[size_t(id)].get_ref<const std::string&>();
    if (!vocab.contains(tok)) vocab[tok] = id;
    int64_t type = 1;
    if (!types.empty()) {
      if (!types[size_t(id)].is_number_integer())
        fail(fmt::format("tokenizer.ggml.token_type[{}] is not an integer", id));
      type = types[size_t(id)].get<int64_t>();
    }
    if (type == 3 || type == 4)
      added.push_back({{"id", id},
                       {"content", tok},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", type == 4},
                       {"special", type == 3}});
  }

  json merges = json::array();
  if (f.has("tokenizer.ggml.merges")) {
    const json& m = f.get("tokenizer.ggml.merges");
    if (!m.is_array()) fail("tokenizer.ggml.merges: expected a string array");
    merges.get_ref<json::array_t&>().reserve(m.size());
    for (size_t i = 0; i < m.size(); ++i) {
      if (!m[i].is_string()) fail(fmt::format("tokenizer.ggml.merges[{}] is not a string", i));
      const std::string& s = m[i].get_ref<const std::string&>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= s.size())
        fail(fmt::format("tokenizer.ggml.merges[{}] '{}' is not \"<left> <right>\"", i, s));
      merges.push_back(json::array({s.substr(0, sp), s.substr(sp + 1)}));
    }
  }

  const std::string pre = f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "gpt2";
  json pre_tok;
  bool ignore_merges = false;
  if (pre == "smollm") {
    pre_tok = {{"type", "Sequence"},
               {"pretokenizers",
                json::array({{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)})}};
  } else if (pre == "qwen2") {
    pre_tok = split_then_bytes(kQwen2Regex);
  } else if (pre == "gpt-4o") {
    pre_tok = split_then_bytes(kGpt4oRegex);
  } else if (pre == "llama-bpe" || pre == "llama3") {
    pre_tok = split_then_bytes(kLlama3Regex);
    ignore_merges = true;
  } else {
    pre_tok = byte_level(true);
  }

  json post = nullptr;
  const bool add_bos = f.has("tokenizer.ggml.add_bos_token") &&
                       f.get("tokenizer.ggml.add_bos_token").is_boolean() &&
                       f.get("tokenizer.ggml.add_bos_token").get<bool>();
  if (add_bos && f.has("tokenizer.ggml.bos_token_id")) {
    const int64_t bos = f.get_int("tokenizer.ggml.bos_token_id");
    if (bos < 0 || bos >= n) fail(fmt::format("tokenizer.ggml.bos_token_id {} is out of range", bos));
    const std::string b = tokens[size_t(bos)].get<std::string>();
    auto special = [&](int type_id) { return json{{"SpecialToken", {{"id", b}, {"type_id", type_id}}}}; };
    auto seq = [&](const char* s, int type_id) {
      return json{{"Sequence", {{"id", s}, {"type_id", type_id}}}};
    };
    post = {
        {"type", "TemplateProcessing"},
        {"single", json::array({special(0), seq("A", 0)})},
        {"pair", json::array({special(0), seq("A", 0), special(1), seq("B", 1)})},
        {"special_tokens", {{b, {{"id", b}, {"ids", json::array({bos})}, {"tokens", json::array({b})}}}}}};
  }

  json j = json::object();
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = std::move(added);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = std::move(pre_tok);
  j["post_processor"] = std::move(post);
  j["decoder"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", ignore_merges},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  return j;
}

std::string gguf_pre_of_tokenizer_json(const nlohmann::json& tj) {
  if (!tj.is_object() || !tj.contains("pre_tokenizer")) return "";
  const json& p = tj["pre_tokenizer"];
  auto is = [](const json& j, const char* type) { return j.is_object() && j.value("type", "") == type; };
  auto byte_level_with = [&](const json& j, bool regex) {
    return is(j, "ByteLevel") && j.value("use_regex", true) == regex;
  };
  if (byte_level_with(p, true)) return "gpt2";
  if (!is(p, "Sequence") || !p.contains("pretokenizers") || !p["pretokenizers"].is_array() ||
      p["pretokenizers"].size() != 2)
    return "";
  const json& a = p["pretokenizers"][0];
  const json& b = p["pretokenizers"][1];
  if (is(a, "Digits") && a.value("individual_digits", false) && byte_level_with(b, true)) return "smollm";
  if (!is(a, "Split") || !byte_level_with(b, false) || !a.contains("pattern") || !a["pattern"].is_object())
    return "";
  const std::string re = a["pattern"].value("Regex", "");
  if (re == kQwen2Regex) return "qwen2";
  if (re == kLlama3Regex) return "llama-bpe";
  if (re == kGpt4oRegex) return "gpt-4o";
  return "";
}

std::string token_content(const nlohmann::json& tj, int64_t id) {
  if (id < 0 || !tj.is_object()) return "";
  if (auto a = tj.find("added_tokens"); a != tj.end() && a->is_array())
    for (const auto& t : *a)
      if (t.is_object() && t.value("id", int64_t(-1)) == id && t.contains("content") &&
          t["content"].is_string())
        return t["content"].get<std::string>();
  auto m = tj.find("model");
  if (m == tj.end() || !m->is_object()) return "";
  auto v = m->find("vocab");
  if (v == m->end() || !v->is_object()) return "";
  for (auto it = v->begin(); it != v->end(); ++it)
    if (it->is_number_integer() && it->get<int64_t>() == id) return it.key();
  return "";
}

nlohmann::json tokenizer_config_json(const nlohmann::json& tj, int64_t bos_id, int64_t eos_id, int64_t pad_id,
                                     const std::string& chat_template, int64_t model_max_length) {
  json c = json::object();
  c["tokenizer_class"] = "PreTrainedTokenizerFast";
  c["clean_up_tokenization_spaces"] = false;
  c["model_max_length"] = model_max_length;
  for (auto [key, id] : {std::pair{"bos_token", bos_id}, {"eos_token", eos_id}, {"pad_token", pad_id}}) {
    std::string s = token_content(tj, id);
    if (!s.empty()) c[key] = s;
  }
  if (!chat_template.empty()) c["chat_template"] = chat_template;
  return c;
}

}  // namespace rp
