// Tokens of a template, with Jinja's whitespace rules as transformers configures them
// (trim_blocks, lstrip_blocks; a single trailing newline of the template dropped).
#include <algorithm>
#include <cctype>
#include <stdexcept>

#include <fmt/format.h>

#include "data/jinja/ast.hpp"

namespace rp::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) out += char(cp);
  else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name, const LexOptions& o)
      : src_(src), name_(name), o_(o) {
    if (!src_.empty() && src_.back() == '\n') {  // keep_trailing_newline = False
      src_.pop_back();
      if (!src_.empty() && src_.back() == '\r') src_.pop_back();
    }
  }

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, (tag == std::string::npos ? src_.size() : tag) - pos);
      if (tag != std::string::npos) text = strip_before(text, tag, pos);
      if (!text.empty()) out_.push_back({Tok::text, text, line_});
      line_ += int(std::count(src_.begin() + long(pos),
                              src_.begin() + long(tag == std::string::npos ? src_.size() : tag), '\n'));
      if (tag == std::string::npos) break;
      pos = tag_body(tag);
    }
    out_.push_back({Tok::eof, "", line_});
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw std::runtime_error(fmt::format("{}:{}: {}", name_, line, what));
  }

  size_t find_tag(size_t pos) const {
    for (size_t p = src_.find('{', pos); p != std::string::npos; p = src_.find('{', p + 1))
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    return std::string::npos;
  }

  /// The text before a tag at `tag`, after `{%-` / lstrip_blocks (the text began at `pos`).
  std::string strip_before(std::string text, size_t tag, size_t pos) const {
    const char kind = src_[tag + 1];
    const char sign = tag + 2 < src_.size() ? src_[tag + 2] : 0;
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_space(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && kind != '{' && o_.lstrip_blocks) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      const bool line_starting = pos == 0 || src_[pos - 1] == '\n';
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          std::all_of(text.begin() + long(l_pos), text.end(), [](char c) { return c == ' ' || c == '\t'; }))
        text.resize(l_pos);
    }
    return text;
  }

  /// After a closing tag ending at `pos` (one past it): `-` strips all whitespace, else
  /// trim_blocks drops one newline (block and comment tags only, unless `+`).
  size_t after_close(size_t pos, char sign, bool block) {
    const size_t from = pos;
    if (sign == '-') {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
    } else if (block && sign != '+' && o_.trim_blocks) {
      if (pos < src_.size() && src_[pos] == '\n') ++pos;
      else if (pos + 1 < src_.size() && src_[pos] == '\r' && src_[pos + 1] == '\n') pos += 2;
    }
    line_ += int(count_lines(from, pos));
    return pos;
  }

  size_t count_lines(size_t a, size_t b) const {
    return size_t(std::count(src_.begin() + long(a), src_.begin() + long(b), '\n'));
  }

  /// Lexes the tag starting at `tag`; returns the position after it.
  size_t tag_body(size_t tag) {
    const char kind = src_[tag + 1];
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    if (kind == '#') {
      const size_t end = src_.find("#}", p);
      if (end == std::string::npos) fail(line_, "unclosed comment");
      line_ += int(count_lines(tag, end));
      const char sign = end > p && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
      return after_close(end + 2, sign, true);
    }
    if (kind == '%' && is_raw(p)) return raw(tag, p);
    out_.push_back({kind == '{' ? Tok::var_begin : Tok::block_begin, "", line_});
    const char close = kind == '{' ? '}' : '%';
    int depth = 0;
    while (true) {
      while (p < src_.size() && is_space(src_[p])) {
        if (src_[p] == '\n') ++line_;
        ++p;
      }
      if (p >= src_.size()) fail(line_, kind == '{' ? "unclosed '{{'" : "unclosed '{%'");
      // closing: [-+]?%} or [-+]?}} at bracket depth 0
      size_t c = p;
      char sign = 0;
      if ((src_[c] == '-' || src_[c] == '+') && c + 1 < src_.size()) sign = src_[c++];
      if (depth == 0 && c + 1 < src_.size() && src_[c] == close && src_[c + 1] == '}') {
        out_.push_back({kind == '{' ? Tok::var_end : Tok::block_end, "", line_});
        return after_close(c + 2, sign, kind == '%');
      }
      p = token(p, depth);
    }
  }

  bool is_raw(size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    return src_.compare(p, 3, "raw") == 0 && p + 3 < src_.size() &&
           !std::isalnum(static_cast<unsigned char>(src_[p + 3])) && src_[p + 3] != '_';
  }

  size_t raw(size_t tag, size_t p) {
    const size_t open_end = src_.find("%}", p);
    if (open_end == std::string::npos) fail(line_, "unclosed '{%'");
    const char osign = src_[open_end - 1] == '-' ? '-' : 0;
    size_t body = after_close(open_end + 2, osign, true);
    for (size_t q = src_.find("{%", body); q != std::string::npos; q = src_.find("{%", q + 2)) {
      size_t r = q + 2;
      const char sign = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r] : 0;
      if (sign) ++r;
      while (r < src_.size() && is_space(src_[r])) ++r;
      if (src_.compare(r, 6, "endraw") != 0) continue;
      const size_t end = src_.find("%}", r);
      if (end == std::string::npos) break;
      std::string text = src_.substr(body, q - body);
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      }
      if (!text.empty()) out_.push_back({Tok::text, text, line_});
      line_ += int(count_lines(tag, end));
      return after_close(end + 2, src_[end - 1] == '-' ? '-' : 0, true);
    }
    fail(line_, "unclosed '{% raw %}'");
  }

  size_t token(size_t p, int& depth) {
    const char c = src_[p];
    const int line = line_;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = p;
      while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      out_.push_back({Tok::name, src_.substr(p, e - p), line});
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number(p);
    if (c == '\'' || c == '"') return string(p);
    static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* t : two)
      if (src_.compare(p, 2, t) == 0) {
        out_.push_back({Tok::op, t, line});
        return p + 2;
      }
    if (std::string("+-*/%~<>=()[]{},.:|;!").find(c) == std::string::npos)
      fail(line, fmt::format("unexpected character '{}'", c));
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
    out_.push_back({Tok::op, std::string(1, c), line});
    return p + 1;
  }

  size_t number(size_t p) {
    size_t e = p;
    bool real = false;
    auto digits = [&] {
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    };
    digits();
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      real = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t f = e + 1;
      if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
      if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
        real = true;
        e = f;
        digits();
      }
    }
    std::string t = src_.substr(p, e - p);
    t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
    out_.push_back({real ? Tok::real : Tok::integer, t, line_});
    return e;
  }

  size_t string(size_t p) {
    const char q = src_[p];
    std::string v;
    size_t i = p + 1;
    for (; i < src_.size() && src_[i] != q; ++i) {
      char c = src_[i];
      if (c == '\n') ++line_;
      if (c != '\\' || i + 1 >= src_.size()) {
        v += c;
        continue;
      }
      const char e = src_[++i];
      switch (e) {
        case 'n': v += '\n'; break;
        case 't': v += '\t'; break;
        case 'r': v += '\r'; break;
        case '0': v += '\0'; break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case '\n': ++line_; break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + n >= src_.size()) fail(line_, "truncated escape in a string");
          uint32_t cp = uint32_t(std::stoul(src_.substr(i + 1, n), nullptr, 16));
          append_utf8(v, cp);
          i += n;
          break;
        }
        default: v += '\\'; v += e;
      }
    }
    if (i >= src_.size()) fail(line_, "unclosed string literal");
    out_.push_back({Tok::string, v, line_});
    return i + 1;
  }

  std::string src_;
  const std::string& name_;
  LexOptions o_;
  std::vector<Token> out_;
  int line_ = 1;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name, const LexOptions& options) {
  return Lexer(source, name, options).run();
}

}  // namespace rp::jinja
