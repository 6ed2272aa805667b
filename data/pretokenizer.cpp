#include "data/pretokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error_text.hpp"
#include "base/utf8.hpp"

namespace rp {

// ---- GPT-2 bytes <-> unicode ------------------------------------------------------------

namespace {
struct ByteTable {
  std::array<std::string, 256> to_str;
  std::array<int16_t, 512> from_cp{};  // code points used are < 324
  ByteTable() {
    from_cp.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
      std::string s;
      if (cp < 0x80) s.push_back(char(cp));
      else {
        s.push_back(char(0xC0 | (cp >> 6)));
        s.push_back(char(0x80 | (cp & 0x3F)));
      }
      to_str[b] = s;
      from_cp[cp] = int16_t(b);
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}
}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_table().to_str[b]; }
int unicode_to_byte(uint32_t cp) { return cp < 512 ? byte_table().from_cp[cp] : -1; }

// ---- Regex ------------------------------------------------------------------------------

namespace {
// One JIT stack per thread, grown to 8 MiB so long whitespace runs cannot exhaust it.
struct JitState {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* ctx = nullptr;
  JitState() {
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    if (stack && ctx) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~JitState() {
    if (ctx) pcre2_match_context_free(ctx);
    if (stack) pcre2_jit_stack_free(stack);
  }
};
thread_local JitState t_jit;
std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}
}  // namespace

Regex::Regex(const std::string& pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE erroff = 0;
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err,
                                &erroff, nullptr);
  if (!c)
    throw std::runtime_error(
        fmt::format("regex /{}/: {} at offset {}", excerpt(pattern), pcre2_message(err), erroff));
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  code_ = c;
  pattern_ = pattern;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  if (!t_jit.ctx) throw std::bad_alloc();
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (!md) throw std::bad_alloc();
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md_owner(md, pcre2_match_data_free);
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data());
  const uint64_t budget = kWorkBase + kWorkPerByte * uint64_t(text.size());
  uint64_t spent = 0;  // the limits tried so far: a bound on the steps PCRE2 took
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = 0;
    for (uint64_t limit = kFirstMatchLimit;; limit *= 16) {
      limit = std::min(limit, budget - spent);
      pcre2_set_match_limit(t_jit.ctx, uint32_t(std::min<uint64_t>(limit, UINT32_MAX)));
      pcre2_set_depth_limit(t_jit.ctx, uint32_t(std::min<uint64_t>(limit, UINT32_MAX)));
      rc = pcre2_match(code, subj, text.size(), pos, PCRE2_NO_UTF_CHECK, md, t_jit.ctx);
      spent += limit;
      if (rc != PCRE2_ERROR_MATCHLIMIT && rc != PCRE2_ERROR_DEPTHLIMIT) break;
      if (spent >= budget)
        throw RegexWorkExceeded(
            fmt::format("pre-tokenizer regex /{}/ needs more than {} matching steps (PCRE2's match limit) "
                        "for {} bytes of text "
                        "(stopped at byte {}): the pattern backtracks catastrophically on this text",
                        excerpt(pattern_), budget, text.size(), pos));
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      throw std::runtime_error(
          fmt::format("pre-tokenizer regex /{}/: {}", excerpt(pattern_), pcre2_message(rc)));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {  // empty match: step over one UTF-8 character
      pos = b + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

// ---- PreTokenizer -----------------------------------------------------------------------

struct PreTokenizer::Step {
  std::shared_ptr<Regex> re;  // null: no splitting (ByteLevel with use_regex=false)
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel only
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

namespace {
SplitBehavior parse_behavior(const std::string& s, const std::string& where) {
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  throw std::runtime_error(fmt::format("{}: unsupported Split behavior \"{}\"", where, s));
}
}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& where) {
  PreTokenizer pt;
  bool byte_level = false;
  auto add = [&](auto&& self, const nlohmann::json& n) -> void {
    if (!n.is_object() || !n.contains("type"))
      throw std::runtime_error(where + ": pre_tokenizer entry without a \"type\"");
    std::string type = n.at("type").get<std::string>();
    if (type == "Sequence") {
      for (const auto& c : n.at("pretokenizers")) self(self, c);
    } else if (type == "Split") {
      Step s;
      const auto& pat = n.at("pattern");
      if (pat.contains("Regex")) s.re = std::make_shared<Regex>(pat.at("Regex").get<std::string>());
      else if (pat.contains("String"))
        s.re = std::make_shared<Regex>(pat.at("String").get<std::string>(), true);
      else throw std::runtime_error(where + ": Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
      s.behavior = parse_behavior(n.value("behavior", std::string("Isolated")), where);
      s.invert = n.value("invert", false);
      pt.steps_.push_back(std::move(s));
    } else if (type == "ByteLevel") {
      Step s;
      s.add_prefix_space = n.value("add_prefix_space", false);
      if (n.value("use_regex", true)) s.re = std::make_shared<Regex>(kGpt2Pattern);
      pt.steps_.push_back(std::move(s));
      byte_level = true;
    } else if (type == "Digits") {
      Step s;
      s.re = std::make_shared<Regex>(R"(\p{N})");
      s.behavior = n.value("individual_digits", false) ? SplitBehavior::isolated : SplitBehavior::contiguous;
      pt.steps_.push_back(std::move(s));
    } else {
      throw std::runtime_error(fmt::format(
          "{}: unsupported pre_tokenizer type \"{}\" (supported: Sequence, Split, ByteLevel, Digits)", where,
          type));
    }
  };
  if (j.is_null())
    throw std::runtime_error(where + ": pre_tokenizer is null; only byte-level BPE is supported");
  add(add, j);
  if (!byte_level)
    throw std::runtime_error(where +
                             ": pre_tokenizer has no ByteLevel step; only byte-level BPE is supported");
  return pt;
}

namespace {
struct Seg {
  size_t b, e;
  bool match;
};

// Applies one Split step to the piece `p` of `text`, appending the results to `out`.
void apply_split(const Regex& re, SplitBehavior behavior, bool invert, std::string_view text, const Piece& p,
                 std::vector<Piece>& out, std::vector<std::pair<size_t, size_t>>& ranges,
                 std::vector<Seg>& segs) {
  std::string_view s = text.substr(p.off, p.len);
  // A ByteLevel prefix space is real text from the regex's point of view.
  std::string tmp;
  size_t shift = 0;
  if (p.prefix_space) {
    tmp.reserve(s.size() + 1);
    tmp.push_back(' ');
    tmp.append(s);
    s = tmp;
    shift = 1;
  }
  ranges.clear();
  re.find_all(s, ranges);
  segs.clear();
  size_t pos = 0;
  for (auto [b, e] : ranges) {
    if (b > pos) segs.push_back({pos, b, invert});
    segs.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < s.size()) segs.push_back({pos, s.size(), invert});

  std::vector<Seg> res;
  res.reserve(segs.size());
  bool prev = false;
  switch (behavior) {
    case SplitBehavior::isolated: res = segs; break;
    case SplitBehavior::removed:
      for (auto& g : segs)
        if (!g.match) res.push_back(g);
      break;
    case SplitBehavior::merged_with_previous:
      for (auto& g : segs) {
        if (g.match && !prev && !res.empty()) res.back().e = g.e;
        else res.push_back(g);
        prev = g.match;
      }
      break;
    case SplitBehavior::merged_with_next:
      for (size_t i = segs.size(); i-- > 0;) {
        auto& g = segs[i];
        if (g.match && !prev && !res.empty()) res.back().b = g.b;
        else res.push_back(g);
        prev = g.match;
      }
      std::reverse(res.begin(), res.end());
      break;
    case SplitBehavior::contiguous:
      for (auto& g : segs) {
        if (g.match == prev && !res.empty()) res.back().e = g.e;
        else res.push_back(g);
        prev = g.match;
      }
      break;
  }
  for (auto& g : res) {
    Piece q;
    if (shift && g.b == 0) {
      q.prefix_space = true;
      q.off = p.off;
      q.len = g.e - 1;
    } else {
      q.off = p.off + g.b - shift;
      q.len = g.e - g.b;
    }
    out.push_back(q);
  }
}
}  // namespace

void PreTokenizer::split(std::string_view text, size_t base, std::vector<Piece>& out) const {
  std::vector<Piece> cur, next;
  std::vector<std::pair<size_t, size_t>> ranges;
  std::vector<Seg> segs;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t n = valid_utf8_prefix(text.substr(pos));
    if (n == 0) {  // one invalid byte: a piece of its own
      out.push_back({base + pos, 1, false});
      ++pos;
      continue;
    }
    std::string_view run = text.substr(pos, n);
    cur.assign(1, Piece{0, run.size(), false});
    for (const auto& st : steps_) {
      next.clear();
      for (const auto& p : cur) {
        Piece q = p;
        if (st.add_prefix_space && !q.prefix_space && (q.len == 0 || run[q.off] != ' '))
          q.prefix_space = true;
        if (st.re) apply_split(*st.re, st.behavior, st.invert, run, q, next, ranges, segs);
        else next.push_back(q);
      }
      cur.swap(next);
    }
    for (auto& p : cur) out.push_back({base + pos + p.off, p.len, p.prefix_space});
    pos += n;
  }
}

}  // namespace rp
