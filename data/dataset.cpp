#include "data/dataset.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/tokenizer.hpp"

namespace rp {

namespace {
namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, size_t line, const std::string& what) {
  std::string msg = fmt::format("{}:{}: {}", path, line, what);
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  throw std::runtime_error(msg);
}

int32_t require_eos(const Tokenizer& tok, const std::string& path) {
  int32_t eos = tok.eos_id();
  if (eos < 0) throw std::runtime_error(path + ": the tokenizer has no eos token (set one with set_eos_token)");
  return eos;
}

const char* type_name(const nlohmann::json& v) { return v.type_name(); }

const std::string& get_string(const nlohmann::json& obj, const char* key, const std::string& ctx,
                              const std::string& path, size_t line) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(path, line, fmt::format("{}missing key \"{}\" (expected a string)", ctx, key));
  if (!it->is_string())
    fail(path, line, fmt::format("{}expected a string at key \"{}\", got {}", ctx, key, type_name(*it)));
  return it->get_ref<const std::string&>();
}

void append_document(const Tokenizer& tok, std::string_view text, int32_t eos, Dataset& d) {
  auto ids = tok.encode(text);
  d.text_stream.insert(d.text_stream.end(), ids.begin(), ids.end());
  d.text_stream.push_back(eos);
  ++d.num_documents;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

Dataset load_jsonl(const std::string& path, const Tokenizer& tok, ChatTemplate chat) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  Dataset d;
  std::string line;
  size_t lineno = 0;
  std::vector<ChatMessage> msgs;
  while (std::getline(f, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 BOM
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      std::string w = e.what();
      if (auto p = w.find("] "); p != std::string::npos) w = w.substr(p + 2);  // drop "[json.exception...]"
      fail(path, lineno, "invalid JSON: " + w);
    }
    if (!j.is_object()) fail(path, lineno, fmt::format("expected a JSON object, got {}", type_name(j)));

    if (j.contains("messages")) {
      const auto& m = j.at("messages");
      if (!m.is_array()) fail(path, lineno, fmt::format("expected an array at key \"messages\", got {}", type_name(m)));
      msgs.clear();
      bool has_assistant = false;
      for (size_t i = 0; i < m.size(); ++i) {
        std::string ctx = fmt::format("messages[{}]: ", i);
        if (!m[i].is_object()) fail(path, lineno, ctx + "expected an object with \"role\" and \"content\"");
        ChatMessage cm{get_string(m[i], "role", ctx, path, lineno), get_string(m[i], "content", ctx, path, lineno)};
        if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
          fail(path, lineno, fmt::format("{}unknown role \"{}\" (expected system, user or assistant)", ctx, cm.role));
        has_assistant = has_assistant || cm.role == "assistant";
        msgs.push_back(std::move(cm));
      }
      if (!has_assistant) fail(path, lineno, "expected at least one \"assistant\" message (nothing to train on)");
      RenderedChat r = render_chat(tok, chat, msgs);
      d.examples.push_back({std::move(r.ids), std::move(r.loss_mask)});
    } else if (j.contains("prompt") || j.contains("completion")) {
      const std::string& prompt = get_string(j, "prompt", "", path, lineno);
      const std::string& completion = get_string(j, "completion", "", path, lineno);
      if (prompt.empty() && completion.empty())
        fail(path, lineno, "\"prompt\" and \"completion\" are both empty (nothing to train on)");
      Example ex;
      ex.ids = tok.encode(prompt);
      ex.loss_mask.assign(ex.ids.size(), 0);
      auto c = tok.encode(completion);
      ex.ids.insert(ex.ids.end(), c.begin(), c.end());
      ex.ids.push_back(require_eos(tok, path));
      ex.loss_mask.resize(ex.ids.size(), 1);
      d.examples.push_back(std::move(ex));
    } else if (j.contains("text")) {
      append_document(tok, get_string(j, "text", "", path, lineno), require_eos(tok, path), d);
    } else {
      fail(path, lineno, "expected a key \"text\", \"prompt\"+\"completion\" or \"messages\"");
    }
  }
  if (d.examples.empty() && d.num_documents == 0) throw std::runtime_error(path + ": no examples");
  return d;
}

Dataset load_text_corpus(const std::string& path, const Tokenizer& tok) {
  int32_t eos = require_eos(tok, path);
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw std::runtime_error(path + ": no .txt files in this directory");
  } else {
    files.push_back(path);
  }
  Dataset d;
  for (const auto& f : files) append_document(tok, read_all(f), eos, d);
  return d;
}

Dataset load_dataset(const std::string& path, const Tokenizer& tok, ChatTemplate chat) {
  if (!fs::is_directory(path) && fs::path(path).extension() == ".jsonl") return load_jsonl(path, tok, chat);
  return load_text_corpus(path, tok);
}

/// Whether example `ex` keeps a target when cut to n <= L + 1 tokens.
bool keeps_target(const Example& ex, size_t L) {
  const size_t n = std::min(ex.ids.size(), L + 1);
  for (size_t t = 1; t < n; ++t)
    if (ex.loss_mask[t] != 0) return true;
  return false;
}

PackedSequences pack_sequences(const Dataset& data, int64_t seq_len, int32_t pad_id, size_t max_bytes) {
  if (seq_len < 1) throw std::invalid_argument(fmt::format("pack_sequences: seq_len must be >= 1, got {}", seq_len));
  if (pad_id < 0) throw std::invalid_argument(fmt::format("pack_sequences: pad_id must be >= 0, got {}", pad_id));
  PackedSequences p;
  p.seq_len = seq_len;
  const size_t L = size_t(seq_len);
  // the rows and their bytes first: nothing is allocated for an impossible seq_len
  size_t rows = 0;
  for (const auto& ex : data.examples) {
    if (ex.loss_mask.size() != ex.ids.size())
      throw std::invalid_argument("pack_sequences: an example's loss_mask and ids differ in length");
    rows += keeps_target(ex, L) ? 1 : 0;
  }
  if (data.text_stream.size() > 1) rows += (data.text_stream.size() - 2) / L + 1;
  size_t bytes = 0;
  if (__builtin_mul_overflow(rows, L, &bytes) || __builtin_mul_overflow(bytes, 2 * sizeof(int32_t), &bytes) ||
      (max_bytes > 0 && bytes > max_bytes))
    throw std::length_error(fmt::format(
        "packing {} sequences of {} tokens needs {:.1f} GiB of host memory (ids and targets), {:.1f} GiB are "
        "available",
        rows, seq_len, double(rows) * double(L) * 8 / double(1ull << 30),
        double(max_bytes) / double(1ull << 30)));
  p.ids.reserve(rows * L);
  p.targets.reserve(rows * L);
  auto add_row = [&](const int32_t* tok, const uint8_t* mask, size_t n) {  // n <= L + 1 tokens
    size_t base = p.ids.size();
    p.ids.resize(base + L, pad_id);
    p.targets.resize(base + L, kIgnoreIndex);
    for (size_t t = 0; t < std::min(n, L); ++t) {
      p.ids[base + t] = tok[t];
      if (t + 1 < n && (!mask || mask[t + 1])) p.targets[base + t] = tok[t + 1];
    }
  };
  for (const auto& ex : data.examples) {
    if (!keeps_target(ex, L)) {
      ++p.dropped_examples;
      continue;
    }
    add_row(ex.ids.data(), ex.loss_mask.data(), std::min(ex.ids.size(), L + 1));
  }
  const auto& s = data.text_stream;
  for (size_t start = 0; start + 1 < s.size(); start += L)
    add_row(s.data() + start, nullptr, std::min(L + 1, s.size() - start));
  return p;
}

int64_t TokenBatch::num_targets() const {
  return int64_t(std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != kIgnoreIndex; }));
}

// ---- BatchStream ------------------------------------------------------------------------

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

BatchStream::BatchStream(PackedSequences seqs, uint64_t seed, bool shuffle)
    : seqs_(std::move(seqs)), seed_(seed), shuffle_(shuffle) {
  if (seqs_.size() == 0) throw std::invalid_argument("BatchStream: no sequences (empty data set?)");
}

void BatchStream::ensure_epoch(int64_t e) {
  if (e == perm_epoch_) return;
  size_t n = num_sequences();
  perm_.resize(n);
  for (size_t i = 0; i < n; ++i) perm_[i] = i;
  if (shuffle_) {
    std::mt19937_64 rng(splitmix64(seed_ ^ splitmix64(uint64_t(e))));
    for (size_t i = n - 1; i > 0; --i) std::swap(perm_[i], perm_[rng() % (i + 1)]);
  }
  perm_epoch_ = e;
}

size_t BatchStream::sequence_at(int64_t p) {
  int64_t n = int64_t(num_sequences());
  ensure_epoch(p / n);
  return perm_[size_t(p % n)];
}

void BatchStream::seek(int64_t position) {
  if (position < 0) throw std::invalid_argument("BatchStream::seek: negative position");
  pos_ = position;
}

TokenBatch BatchStream::next(int64_t n_seq) {
  if (n_seq < 1) throw std::invalid_argument(fmt::format("BatchStream::next: n_seq must be >= 1, got {}", n_seq));
  TokenBatch b;
  b.n_seq = n_seq;
  b.seq_len = seqs_.seq_len;
  const size_t L = size_t(seqs_.seq_len);
  b.ids.resize(size_t(n_seq) * L);
  b.targets.resize(size_t(n_seq) * L);
  for (int64_t r = 0; r < n_seq; ++r) {
    size_t s = sequence_at(pos_++);
    std::copy_n(seqs_.ids.begin() + s * L, L, b.ids.begin() + r * L);
    std::copy_n(seqs_.targets.begin() + s * L, L, b.targets.begin() + r * L);
  }
  return b;
}

}  // namespace rp
