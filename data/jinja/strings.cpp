#include "data/jinja/strings.hpp"

#include <string_view>

#include "data/jinja/builtins.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <utf8proc.h>

namespace rp::jinja {

namespace {
bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  const auto off = utf8_offsets(s);
  for (size_t i = 0; i + 1 < off.size(); ++i) out.push_back(s.substr(off[i], off[i + 1] - off[i]));
  return out;
}

const std::string& str_arg(const Args& a, size_t i, const char* method) {
  if (i >= a.pos.size() || !a.pos[i].is_string())
    throw std::invalid_argument(fmt::format("str.{}() needs a string argument {}", method, i + 1));
  return a.pos[i].str();
}

int64_t int_arg(const Args& a, size_t i, int64_t fallback) {
  if (i >= a.pos.size() || a.pos[i].is_none()) return fallback;
  if (!a.pos[i].is_int()) throw std::invalid_argument("expected an integer argument");
  return a.pos[i].as_int();
}

bool affix(const std::string& s, const Value& what, bool start) {
  auto one = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  if (what.is_string()) return one(what.str());
  if (what.is_list()) {
    for (const auto& p : what.list()) {
      if (!p.is_string()) throw std::invalid_argument("startswith/endswith takes strings");
      if (one(p.str())) return true;
    }
    return false;
  }
  throw std::invalid_argument(fmt::format("startswith/endswith takes a string, not {}", type_name(what)));
}
}  // namespace

namespace {
/// Maps every code point of `s` with `f` (invalid UTF-8 bytes are kept as they are).
template <typename F>
std::string map_code_points(const std::string& s, F&& f) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    utf8proc_ssize_t(s.size() - i), &cp);
    if (n <= 0) {
      out += s[i++];
      continue;
    }
    utf8proc_uint8_t buf[4];
    const auto m = utf8proc_encode_char(f(cp), buf);
    out.append(reinterpret_cast<const char*>(buf), size_t(m));
    i += size_t(n);
  }
  return out;
}

bool is_letter(utf8proc_int32_t cp) {
  const auto c = utf8proc_category(cp);
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}
}  // namespace

std::string ascii_lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string ascii_upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string py_lower(const std::string& s) {
  return map_code_points(s, [](utf8proc_int32_t c) { return utf8proc_tolower(c); });
}

std::string py_upper(const std::string& s) {
  return map_code_points(s, [](utf8proc_int32_t c) { return utf8proc_toupper(c); });
}

std::string py_title(const std::string& s) {
  bool prev_letter = false;
  return map_code_points(s, [&](utf8proc_int32_t c) {
    const bool letter = is_letter(c);
    const utf8proc_int32_t r = letter ? (prev_letter ? utf8proc_tolower(c) : utf8proc_totitle(c)) : c;
    prev_letter = letter;
    return r;
  });
}

std::string py_capitalize(const std::string& s) {
  bool first = true;
  return map_code_points(s, [&](utf8proc_int32_t c) {
    const utf8proc_int32_t r = first ? utf8proc_totitle(c) : utf8proc_tolower(c);
    first = false;
    return r;
  });
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  if (!chars.is_string()) {
    if (!chars.is_none() && !chars.is_undefined())
      throw std::invalid_argument("strip chars must be a string or None");
    size_t b = 0, e = s.size();
    while (left && b < e && ws(s[b])) ++b;
    while (right && e > b && ws(s[e - 1])) --e;
    return s.substr(b, e - b);
  }
  const auto set = code_points(chars.str());
  auto in = [&](size_t from, size_t to) {
    return std::find(set.begin(), set.end(), std::string_view(s).substr(from, to - from)) != set.end();
  };
  auto cp_end = [&](size_t i) {  // the end of the code point starting at i
    do ++i;
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
    return i;
  };
  auto cp_start = [&](size_t e) {  // the start of the code point ending at e
    size_t i = e - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    return i;
  };
  size_t b = 0, e = s.size();
  while (left && b < e && in(b, cp_end(b))) b = cp_end(b);
  while (right && e > b && in(cp_start(e), e)) e = cp_start(e);
  return s.substr(b, e - b);
}

std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep.is_none() || sep.is_undefined()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && ws(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        out.push_back(s.substr(i));  // Python keeps the rest's trailing whitespace
        break;
      }
      size_t j = i;
      while (j < s.size() && !ws(s[j])) ++j;
      limit_items(out.size() + 1, "str.split()");
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  if (!sep.is_string()) throw std::invalid_argument("split separator must be a string or None");
  const std::string& d = sep.str();
  if (d.empty()) throw std::invalid_argument("empty separator");
  size_t i = 0;
  for (size_t j; (maxsplit < 0 || int64_t(out.size()) < maxsplit) && (j = s.find(d, i)) != std::string::npos;
       i = j + d.size()) {
    limit_items(out.size() + 2, "str.split()");
    out.push_back(s.substr(i, j - i));
  }
  out.push_back(s.substr(i));
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` before every code point and at the end
    const size_t n = utf8_length(s) + 1;
    const size_t inserts = count < 0 ? n : std::min<size_t>(n, size_t(count));
    if (!to.empty() && inserts > (kMaxBuiltValue - std::min(s.size(), kMaxBuiltValue)) / to.size())
      limit_string(kMaxBuiltValue + 1, "replace");
    size_t done = 0;
    for (size_t i = 0; i < s.size();) {
      if (done < inserts) out += to, ++done;
      size_t j = i + 1;
      while (j < s.size() && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) ++j;
      out.append(s, i, j - i);
      i = j;
    }
    if (done < inserts) out += to;
    return out;
  }
  size_t hits = 0;  // the result's size is known before it is built
  for (size_t p = s.find(from); p != std::string::npos && (count < 0 || hits < size_t(count));
       p = s.find(from, p + from.size()))
    ++hits;
  if (to.size() > from.size() && hits > 0 &&
      (to.size() - from.size()) > (kMaxBuiltValue - std::min(s.size(), kMaxBuiltValue)) / hits)
    limit_string(kMaxBuiltValue + 1, "replace");
  size_t i = 0;
  int64_t n = 0;
  for (size_t j; (count < 0 || n < count) && (j = s.find(from, i)) != std::string::npos;
       i = j + from.size(), ++n) {
    out.append(s, i, j - i);
    out += to;
  }
  out.append(s, i, std::string::npos);
  return out;
}

Value call_string_method(const std::string& s, const std::string& name, const Args& a) {
  const Value none{None{}};
  const Value& a0 = a.pos.empty() ? none : a.pos[0];
  if (name == "startswith" || name == "endswith") return Value(affix(s, a0, name == "startswith"));
  if (name == "strip") return Value(py_strip(s, a0, true, true));
  if (name == "lstrip") return Value(py_strip(s, a0, true, false));
  if (name == "rstrip") return Value(py_strip(s, a0, false, true));
  if (name == "split" || name == "rsplit") {
    const Value* sep = a.kwarg("sep");
    const Value* ms = a.kwarg("maxsplit");
    int64_t maxsplit = ms && ms->is_int() ? ms->as_int() : int_arg(a, 1, -1);
    if (name == "rsplit" && maxsplit >= 0)
      throw std::invalid_argument("str.rsplit() with maxsplit is not supported");
    List out;
    std::vector<std::string> parts = py_split(s, sep ? *sep : a0, maxsplit);
    limit_items(parts.size(), "str." + name + "()");
    for (auto& p : parts) out.push_back(Value(std::move(p)));
    return Value(std::move(out));
  }
  if (name == "replace")
    return Value(py_replace(s, str_arg(a, 0, "replace"), str_arg(a, 1, "replace"), int_arg(a, 2, -1)));
  if (name == "upper") return Value(py_upper(s));
  if (name == "lower") return Value(py_lower(s));
  if (name == "title") return Value(py_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "find") {
    const size_t p = s.find(str_arg(a, 0, "find"));
    return p == std::string::npos ? Value(int64_t(-1)) : Value(int64_t(utf8_length(s.substr(0, p))));
  }
  if (name == "count") {
    const std::string& n = str_arg(a, 0, "count");
    if (n.empty()) return Value(int64_t(utf8_length(s) + 1));
    int64_t c = 0;
    for (size_t p = s.find(n); p != std::string::npos; p = s.find(n, p + n.size())) ++c;
    return Value(c);
  }
  if (name == "splitlines") {
    List out;
    size_t i = 0;
    while (i < s.size()) {
      limit_items(out.size() + 1, "str.splitlines()");
      size_t j = s.find_first_of("\r\n", i);
      if (j == std::string::npos) {
        out.push_back(Value(s.substr(i)));
        break;
      }
      out.push_back(Value(s.substr(i, j - i)));
      i = j + (s[j] == '\r' && j + 1 < s.size() && s[j + 1] == '\n' ? 2 : 1);
    }
    return Value(std::move(out));
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const auto& x : a0.is_list() ? a0.list() : List{}) {
      if (!x.is_string()) throw std::invalid_argument("str.join() takes strings");
      limit_string(out.size() + (first ? 0 : s.size()) + x.str().size(), "str.join()");
      out += (first ? "" : s) + x.str();
      first = false;
    }
    return Value(std::move(out));
  }
  auto all = [&](int (*pred)(int)) {
    return Value(!s.empty() && std::all_of(s.begin(), s.end(),
                                           [&](char c) { return pred(static_cast<unsigned char>(c)) != 0; }));
  };
  if (name == "isdigit") return all(&isdigit);
  if (name == "isalpha") return all(&isalpha);
  if (name == "isspace") return all(&isspace);
  if (name == "isupper") return Value(py_upper(s) == s && py_lower(s) != s);
  if (name == "islower") return Value(py_lower(s) == s && py_upper(s) != s);
  throw std::invalid_argument(fmt::format("unsupported string method '{}'", name));
}

double py_float(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

int64_t index_of_digits(const std::string& s) {
  int64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return r.ec == std::errc::result_out_of_range ? std::numeric_limits<int64_t>::max() : v;
}

}  // namespace rp::jinja
