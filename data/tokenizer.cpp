#include "data/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error_text.hpp"
#include "data/normalizer.hpp"
#include "data/pretokenizer.hpp"

namespace rp {

namespace {
struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StrMap = std::unordered_map<std::string, V, SvHash, std::equal_to<>>;

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

struct MergeInfo {
  int32_t rank, id;
};

inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A token id of tokenizer.json: a JSON integer in [0, 2^31 - 1) (ids are int32_t, and
/// vocab_size = max id + 1 must fit too). Anything else (a float, a boolean, a negative id,
/// one at or above 2^31 - 1, which nlohmann would wrap) throws one line naming the file,
/// the token and the value.
int32_t token_id_of(const nlohmann::json& v, const std::string& where, const char* what,
                    const std::string& token) {
  constexpr int64_t kLimit = std::numeric_limits<int32_t>::max();
  const bool integer = v.is_number_integer();
  const bool in_range =
      integer && (v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(kLimit)
                                         : v.get<int64_t>() >= 0 && v.get<int64_t>() < kLimit);
  if (!in_range)
    throw std::runtime_error(fmt::format("{}: {} \"{}\" has id {}: expected an integer in [0, {})", where,
                                         what, excerpt(token), excerpt(v.dump()), kLimit));
  return int32_t(v.get<int64_t>());
}

// eos_token / bos_token in tokenizer_config.json: a string, {"content": "..."} or null.
std::string config_token(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return {};
  const auto& v = cfg.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string())
    return v.at("content").get<std::string>();
  return {};
}
}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> id_to_token;  // as written in tokenizer.json
  std::vector<std::string> id_to_bytes;  // decoded bytes
  std::vector<uint8_t> kind;             // 0 unused, 1 vocab, 2 added, 3 added+special
  StrMap<int32_t> vocab;
  StrMap<int32_t> added;
  std::array<std::vector<AddedToken>, 256> added_by_first_byte;  // longest first
  std::unordered_map<uint64_t, MergeInfo> merges;
  std::array<int32_t, 256> byte_ids{};
  PreTokenizer pre;
  bool ignore_merges = false;
  bool nfc = false;                     // normalizer NFC
  std::vector<int32_t> prefix, suffix;  // post_processor's special tokens around one sequence
  int32_t eos = -1, bos = -1;
  std::string chat_template;

  mutable std::mutex mu;
  mutable StrMap<std::vector<int32_t>> cache;

  std::string source;  // where the tokenizer came from (its tokenizer.json), for errors
  void bpe(const std::string& word, std::vector<int32_t>& out) const;
  /// pre.split, with `source` named in a RegexWorkExceeded.
  void split(std::string_view text, size_t base, std::vector<Piece>& out) const;
  void encode_piece(std::string_view text, const Piece& p, std::vector<int32_t>& ids,
                    std::vector<size_t>* offsets, std::string& word) const;
  void encode(std::string_view text, bool allow_special, std::vector<int32_t>& ids,
              std::vector<size_t>* offsets) const;
};

// Classic BPE: repeatedly merge the adjacent pair with the lowest merge rank (leftmost on
// ties), via a min-heap of candidate pairs with lazy invalidation (as HF tokenizers does).
void Tokenizer::Impl::bpe(const std::string& word, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int prev, next;
  };
  std::vector<Sym> syms(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    int32_t id = byte_ids[static_cast<unsigned char>(word[i])];
    if (id < 0)
      throw std::runtime_error(fmt::format("tokenizer: byte 0x{:02x} has no token in the vocab",
                                           static_cast<unsigned char>(word[i])));
    syms[i] = {id, int(i) - 1, i + 1 < word.size() ? int(i) + 1 : -1};
  }
  struct Cand {
    int32_t rank;
    int pos;
    int32_t id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int a) {
    if (a < 0 || syms[a].next < 0) return;
    auto it = merges.find(pair_key(syms[a].id, syms[syms[a].next].id));
    if (it != merges.end()) heap.push({it->second.rank, a, it->second.id});
  };
  for (size_t i = 0; i + 1 < word.size(); ++i) push(int(i));
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& s = syms[c.pos];
    if (s.id < 0 || s.next < 0) continue;
    auto it = merges.find(pair_key(s.id, syms[s.next].id));
    if (it == merges.end() || it->second.rank != c.rank) continue;  // stale entry
    int nx = s.next;
    s.id = c.id;
    s.next = syms[nx].next;
    if (s.next >= 0) syms[s.next].prev = c.pos;
    syms[nx].id = -1;
    push(s.prev);
    push(c.pos);
  }
  for (int i = word.empty() ? -1 : 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

void Tokenizer::Impl::encode_piece(std::string_view text, const Piece& p, std::vector<int32_t>& ids,
                                   std::vector<size_t>* offsets, std::string& word) const {
  word.clear();
  if (p.prefix_space) word.push_back(' ');
  word.append(text.substr(p.off, p.len));
  if (word.empty()) return;
  size_t first = ids.size();
  {
    std::lock_guard<std::mutex> lk(mu);
    auto it = cache.find(word);
    if (it != cache.end()) ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
  if (ids.size() == first) {
    std::vector<int32_t> res;
    if (ignore_merges) {  // the whole word is a vocab token: take it as is (LLaMA-3)
      std::string mapped;
      for (unsigned char c : word) mapped += byte_to_unicode(c);
      auto it = vocab.find(mapped);
      if (it != vocab.end()) res.push_back(it->second);
    }
    if (res.empty()) bpe(word, res);
    ids.insert(ids.end(), res.begin(), res.end());
    std::lock_guard<std::mutex> lk(mu);
    if (cache.size() > (1u << 20)) cache.clear();
    cache.emplace(word, std::move(res));
  }
  if (offsets) {
    size_t cum = 0, pre = p.prefix_space ? 1 : 0;
    for (size_t i = first; i < ids.size(); ++i) {
      offsets->push_back(p.off + (cum > pre ? cum - pre : 0));
      cum += id_to_bytes[ids[i]].size();
    }
  }
}

void Tokenizer::Impl::split(std::string_view text, size_t base, std::vector<Piece>& out) const {
  try {
    pre.split(text, base, out);
  } catch (const RegexWorkExceeded& e) {
    throw RegexWorkExceeded(fmt::format("{}: {}", source, e.what()));
  }
}

void Tokenizer::Impl::encode(std::string_view text, bool allow_special, std::vector<int32_t>& ids,
                             std::vector<size_t>* offsets) const {
  std::vector<Piece> pieces;
  std::string word, norm;
  std::vector<NormalizedRun> runs;
  auto flush = [&](size_t b, size_t e) {
    if (e <= b) return;
    pieces.clear();
    const std::string_view seg = text.substr(b, e - b);
    if (nfc && nfc_normalize(seg, norm, runs)) {  // offsets map back to the input
      split(norm, 0, pieces);
      const size_t first = offsets ? offsets->size() : 0;
      for (const auto& p : pieces) encode_piece(norm, p, ids, offsets, word);
      if (offsets)
        for (size_t k = first; k < offsets->size(); ++k)
          (*offsets)[k] = b + original_offset(runs, (*offsets)[k]);
      return;
    }
    split(seg, b, pieces);
    for (const auto& p : pieces) encode_piece(text, p, ids, offsets, word);
  };
  size_t seg = 0, i = 0;
  while (i < text.size()) {
    const auto& bucket = added_by_first_byte[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (const auto& t : bucket) {
      if (t.special && !allow_special) continue;
      if (text.substr(i, t.content.size()) == t.content) {
        hit = &t;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    flush(seg, i);
    ids.push_back(hit->id);
    if (offsets) offsets->push_back(i);
    i += hit->content.size();
    seg = i;
  }
  flush(seg, text.size());
}

// ---- post-processor --------------------------------------------------------------------
// post_processor: the special tokens HF's encode(add_special_tokens=True) puts around a
// single sequence. TemplateProcessing ("single": SpecialToken items before / after the
// Sequence "A"), BertProcessing / RobertaProcessing (cls before, sep after), ByteLevel
// (offsets only: nothing), Sequence of these.
static void read_post_processor(const nlohmann::json& p, const Tokenizer& t, const std::string& where,
                                std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (p.is_null()) return;
  const std::string type = p.value("type", std::string());
  auto id_of = [&](const std::string& tok) {
    const int32_t id = t.token_id(tok);
    if (id < 0)
      throw std::runtime_error(
          fmt::format("{}: post_processor names token \"{}\", which is not in the vocab", where, tok));
    return id;
  };
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const auto& c : p.at("processors")) read_post_processor(c, t, where, prefix, suffix);
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    const auto& cls = p.at("cls");
    const auto& sep = p.at("sep");
    prefix.push_back(token_id_of(cls.at(1), where, "post_processor.cls token", cls.at(0).dump()));
    suffix.insert(suffix.begin(),
                  token_id_of(sep.at(1), where, "post_processor.sep token", sep.at(0).dump()));
    return;
  }
  if (type != "TemplateProcessing")
    throw std::runtime_error(
        fmt::format("{}: unsupported post_processor type \"{}\" (expected TemplateProcessing, "
                    "ByteLevel, BertProcessing, RobertaProcessing or Sequence)",
                    where, type));
  std::vector<int32_t> before, after;
  bool seen = false;
  for (const auto& item : p.at("single")) {
    if (item.contains("Sequence")) {
      seen = true;
      continue;
    }
    const std::string tok = item.at("SpecialToken").at("id").get<std::string>();
    std::vector<int32_t> ids;
    const auto& st = p.value("special_tokens", nlohmann::json::object());
    if (st.contains(tok) && st.at(tok).contains("ids")) {
      for (const auto& v : st.at(tok).at("ids"))
        ids.push_back(token_id_of(v, where, "post_processor.special_tokens token", tok));
    } else ids.push_back(id_of(tok));
    (seen ? after : before).insert((seen ? after : before).end(), ids.begin(), ids.end());
  }
  prefix.insert(prefix.end(), before.begin(), before.end());
  suffix.insert(suffix.begin(), after.begin(), after.end());
}

// ---- construction -----------------------------------------------------------------------

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": invalid JSON: " + e.what());
  }
  Tokenizer t = from_json(j, path);
  auto cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) {
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(read_text_file(cfg_path.string()));
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(cfg_path.string() + ": invalid JSON: " + e.what());
    }
    std::string eos = config_token(cfg, "eos_token"), bos = config_token(cfg, "bos_token");
    if (!eos.empty() && t.token_id(eos) >= 0) t.impl_->eos = t.token_id(eos);
    if (!bos.empty() && t.token_id(bos) >= 0) t.impl_->bos = t.token_id(bos);
    if (cfg.contains("chat_template") && cfg.at("chat_template").is_string())
      t.impl_->chat_template = cfg.at("chat_template").get<std::string>();
  }
  return t;
}

Tokenizer Tokenizer::from_json(const nlohmann::json& j, const std::string& where) {
  Tokenizer t;
  Impl& m = *t.impl_;
  m.source = where;
  try {
    const auto& model = j.at("model");
    std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE")
      throw std::runtime_error(fmt::format("{}: unsupported model type \"{}\" (only BPE)", where, type));
    m.ignore_merges = model.value("ignore_merges", false);

    // normalizer: null, NFC, or a Sequence of NFC.
    if (j.contains("normalizer") && !j.at("normalizer").is_null()) {
      m.nfc = true;
      const auto& n = j.at("normalizer");
      auto ok = [](const nlohmann::json& x) { return x.value("type", std::string()) == "NFC"; };
      bool fine = ok(n);
      if (!fine && n.value("type", std::string()) == "Sequence") {
        fine = true;
        for (const auto& c : n.at("normalizers")) fine = fine && ok(c);
      }
      if (!fine)
        throw std::runtime_error(
            fmt::format("{}: unsupported normalizer {} (only null or NFC)", where, n.dump()));
    }

    int32_t max_id = -1;
    const auto& vocab = model.at("vocab");
    m.vocab.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int32_t id = token_id_of(it.value(), where, "model.vocab token", it.key());
      m.vocab.emplace(it.key(), id);
      max_id = std::max(max_id, id);
    }
    std::vector<AddedToken> added;
    if (j.contains("added_tokens"))
      for (const auto& a : j.at("added_tokens")) {
        const std::string content = a.at("content").get<std::string>();
        AddedToken at{content, token_id_of(a.at("id"), where, "added_tokens entry", content),
                      a.value("special", false)};
        if (at.content.empty())
          throw std::runtime_error(where + ": invalid added token " + excerpt(a.dump()));
        max_id = std::max(max_id, at.id);
        added.push_back(std::move(at));
      }
    size_t n = size_t(max_id + 1);
    m.id_to_token.assign(n, {});
    m.id_to_bytes.assign(n, {});
    m.kind.assign(n, 0);
    for (const auto& [tok, id] : m.vocab) {
      m.id_to_token[id] = tok;
      m.kind[id] = 1;
      std::string bytes;  // un-map the GPT-2 byte alphabet; unknown chars stay as UTF-8
      for (size_t i = 0; i < tok.size();) {
        unsigned char c = tok[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        len = std::min(len, tok.size() - i);
        uint32_t cp = len == 1 ? c : len == 2 ? ((c & 0x1F) << 6) | (tok[i + 1] & 0x3F) : 0x110000;
        int b = unicode_to_byte(cp);
        if (b >= 0) bytes.push_back(char(b));
        else bytes.append(tok, i, len);
        i += len;
      }
      m.id_to_bytes[id] = std::move(bytes);
    }
    for (const auto& a : added) {
      m.id_to_token[a.id] = a.content;
      m.id_to_bytes[a.id] = a.content;
      m.kind[a.id] = a.special ? 3 : 2;
      m.added[a.content] = a.id;
      m.added_by_first_byte[static_cast<unsigned char>(a.content[0])].push_back(a);
    }
    for (auto& bucket : m.added_by_first_byte)
      std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken& x, const AddedToken& y) {
        return x.content.size() > y.content.size();
      });
    for (int b = 0; b < 256; ++b) {
      auto it = m.vocab.find(byte_to_unicode(uint8_t(b)));
      m.byte_ids[b] = it == m.vocab.end() ? -1 : it->second;
    }

    const auto& merges = model.at("merges");
    m.merges.reserve(merges.size());
    int32_t rank = 0;
    for (const auto& mg : merges) {
      std::string a, b;
      if (mg.is_string()) {
        const auto& s = mg.get_ref<const std::string&>();
        size_t sp = s.find(' ', 1);
        if (sp == std::string::npos)
          throw std::runtime_error(fmt::format("{}: merge \"{}\" is not \"a b\"", where, s));
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2) {
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      } else {
        throw std::runtime_error(fmt::format("{}: merge #{} is neither \"a b\" nor [a, b]", where, rank));
      }
      auto ia = m.vocab.find(a), ib = m.vocab.find(b), im = m.vocab.find(a + b);
      if (ia == m.vocab.end() || ib == m.vocab.end() || im == m.vocab.end())
        throw std::runtime_error(
            fmt::format("{}: merge #{} (\"{}\" \"{}\") uses a token not in the vocab", where, rank, a, b));
      m.merges.emplace(pair_key(ia->second, ib->second), MergeInfo{rank, im->second});
      ++rank;
    }

    m.pre = PreTokenizer::from_json(j.contains("pre_tokenizer") ? j.at("pre_tokenizer") : nlohmann::json(),
                                    where);
    if (j.contains("post_processor"))
      read_post_processor(j.at("post_processor"), t, where, m.prefix, m.suffix);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{}: malformed tokenizer.json: {}", where, e.what()));
  }
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>", "<|eot_id|>"})
    if (int32_t id = t.token_id(name); id >= 0) {
      m.eos = id;
      break;
    }
  return t;
}

// ---- queries ----------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode(text, allow_special, ids, nullptr);
  return ids;
}

std::vector<int32_t> Tokenizer::encode_with_offsets(std::string_view text, std::vector<size_t>& byte_offsets,
                                                    bool allow_special) const {
  std::vector<int32_t> ids;
  byte_offsets.clear();
  impl_->encode(text, allow_special, ids, &byte_offsets);
  return ids;
}

std::vector<int32_t> Tokenizer::encode_with_special_tokens(std::string_view text) const {
  std::vector<int32_t> ids = impl_->prefix;
  impl_->encode(text, true, ids, nullptr);
  ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

const std::vector<int32_t>& Tokenizer::prefix_tokens() const { return impl_->prefix; }
const std::vector<int32_t>& Tokenizer::suffix_tokens() const { return impl_->suffix; }

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= impl_->kind.size() || impl_->kind[id] == 0)
      throw std::out_of_range(fmt::format("Tokenizer::decode: no token with id {}", id));
    out += impl_->id_to_bytes[id];
  }
  return out;
}

bool Tokenizer::has_token(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->kind.size() && impl_->kind[size_t(id)] != 0;
}

int32_t Tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added.find(token); it != impl_->added.end()) return it->second;
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return -1;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->id_to_token.size())
    throw std::out_of_range(fmt::format("Tokenizer::token_text: id {} out of range", id));
  return impl_->id_to_token[id];
}

size_t Tokenizer::vocab_size() const { return impl_->kind.size(); }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
void Tokenizer::set_eos_id(int32_t id) { impl_->eos = id; }
void Tokenizer::set_bos_id(int32_t id) { impl_->bos = id; }

void Tokenizer::set_eos_token(std::string_view token) {
  int32_t id = token_id(token);
  if (id < 0) throw std::invalid_argument(fmt::format("Tokenizer::set_eos_token: no token \"{}\"", token));
  impl_->eos = id;
}

void Tokenizer::set_bos_token(std::string_view token) {
  int32_t id = token_id(token);
  if (id < 0) throw std::invalid_argument(fmt::format("Tokenizer::set_bos_token: no token \"{}\"", token));
  impl_->bos = id;
}

const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
void Tokenizer::set_chat_template(std::string jinja_text) { impl_->chat_template = std::move(jinja_text); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->kind.size() && impl_->kind[id] == 3;
}

}  // namespace rp
