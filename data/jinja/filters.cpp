// Jinja's filters, as Jinja 3.1 defines them, with transformers' tojson (no HTML escaping,
// indent / sort_keys / ensure_ascii=False).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include "data/jinja/builtins.hpp"
#include "data/jinja/strings.hpp"

namespace rp::jinja {

namespace {

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument(what); }

const Value kUndef{};
const Value kNone{None{}};

Value arg(const Args& a, size_t i, const char* name,
          const Value& fallback) {  // by value: fallbacks are often temporaries
  if (i < a.pos.size()) return a.pos[i];
  if (const Value* v = a.kwarg(name)) return *v;
  return fallback;
}

const std::string& need_string(const Value& v, const char* filter) {
  if (!v.is_string()) fail(fmt::format("filter '{}' needs a string, got {}", filter, type_name(v)));
  return v.str();
}

int64_t need_int(const Value& v, const char* what) {
  if (v.is_bool()) return v.as_bool();
  if (!v.is_int()) fail(fmt::format("{} must be an integer, got {}", what, type_name(v)));
  return v.as_int();
}

/// Jinja's attribute getter: "a.b.0" reads item by item, digits as indices.
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('.', i);
    if (j == std::string::npos) j = path.size();
    const std::string part = path.substr(i, j - i);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? get_item(cur, Value(index_of_digits(part))) : get_item(cur, Value(part));
    if (cur.is_undefined() && !digits) cur = Value(Undefined{"." + part});
    i = j + 1;
  }
  return cur;
}

List as_list(const Value& v) {
  List out;
  for (auto& x : iterate(v)) out.push_back(std::move(x));
  return out;
}

/// select / reject / selectattr / rejectattr.
Value select(const Value& seq, const Args& a, bool by_attr, bool keep) {
  size_t i = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty() || !a.pos[0].is_string()) fail("selectattr/rejectattr need an attribute name");
    attr = a.pos[0].str();
    i = 1;
  }
  std::string test;
  if (i < a.pos.size()) {
    if (!a.pos[i].is_string()) fail("select: the test must be named by a string");
    test = a.pos[i++].str();
  }
  Args targs;
  targs.pos.assign(a.pos.begin() + long(std::min(i, a.pos.size())), a.pos.end());
  List out;
  for (const auto& x : iterate(seq)) {
    const Value subject = by_attr ? attr_path(x, attr) : x;
    const bool pass = test.empty() ? truthy(subject) : apply_test(test, subject, targs);
    if (pass == keep) out.push_back(x);
  }
  return Value(std::move(out));
}

Value map_filter(const Value& seq, const Args& a) {
  List out;
  if (const Value* attr = a.kwarg("attribute")) {
    if (!attr->is_string()) fail("map(attribute=) needs a string");
    const Value* dflt = a.kwarg("default");
    for (const auto& x : iterate(seq)) {
      Value v = attr_path(x, attr->str());
      out.push_back(v.is_undefined() && dflt ? *dflt : v);
    }
    return Value(std::move(out));
  }
  if (a.pos.empty() || !a.pos[0].is_string()) fail("map needs a filter name or attribute=");
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const auto& x : iterate(seq)) out.push_back(apply_filter(a.pos[0].str(), x, rest));
  return Value(std::move(out));
}

/// The key `sort` / `unique` compare by: strings lower-cased unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive, const std::string& attribute) {
  Value k = attribute.empty() ? v : attr_path(v, attribute);
  if (!case_sensitive && k.is_string()) return Value(py_lower(k.str()));
  return k;
}

Value sort_filter(const Value& seq, const Args& a) {
  const bool reverse = truthy(arg(a, 0, "reverse", kUndef));
  const bool cs = truthy(arg(a, 1, "case_sensitive", kUndef));
  const Value attr = arg(a, 2, "attribute", kNone);
  const std::string at = attr.is_string() ? attr.str() : "";
  List items = as_list(seq);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(sort_key(items[i], cs, at), i);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? less(y.first, x.first) : less(x.first, y.first);
  });
  List out;
  for (const auto& [k, i] : keyed) out.push_back(items[i]);
  return Value(std::move(out));
}

Value unique_filter(const Value& seq, const Args& a) {
  const bool cs = truthy(arg(a, 0, "case_sensitive", kUndef));
  const Value attr = arg(a, 1, "attribute", kNone);
  const std::string at = attr.is_string() ? attr.str() : "";
  List out, seen;
  for (const auto& x : iterate(seq)) {
    Value k = sort_key(x, cs, at);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); })) continue;
    seen.push_back(k);
    out.push_back(x);
  }
  return Value(std::move(out));
}

Value indent_filter(const Value& v, const Args& a) {
  std::string s = to_str(v);
  const Value w = arg(a, 0, "width", Value(int64_t(4)));
  const int64_t width = w.is_string() ? 0 : std::max<int64_t>(0, need_int(w, "indent width"));
  limit_string(size_t(width), "filter 'indent'");
  const std::string ind = w.is_string() ? w.str() : std::string(size_t(width), ' ');
  const bool first = truthy(arg(a, 1, "first", kUndef)), blank = truthy(arg(a, 2, "blank", kUndef));
  s += "\n";
  const size_t breaks =
      size_t(std::count(s.begin(), s.end(), '\n')) + size_t(std::count(s.begin(), s.end(), '\r'));
  if (!ind.empty() && breaks + 1 > (kMaxBuiltValue - std::min(s.size(), kMaxBuiltValue)) / ind.size())
    limit_string(kMaxBuiltValue + 1, "filter 'indent'");
  std::vector<std::string> lines;
  const Value split = call_string_method(s, "splitlines", {});
  for (const auto& l : split.list()) lines.push_back(l.str());
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) rv += "\n" + ((blank || !lines[i].empty()) ? ind : std::string());
    rv += lines[i];
  }
  return Value(first ? ind + rv : rv);
}

Value round_filter(const Value& v, const Args& a) {
  const int64_t prec = need_int(arg(a, 0, "precision", Value(int64_t(0))), "round precision");
  const Value m = arg(a, 1, "method", Value("common"));
  if (!v.is_int() && !v.is_float() && !v.is_bool())
    fail(fmt::format("filter 'round' needs a number, got {}", type_name(v)));
  const double scale = std::pow(10.0, double(prec));
  const double x = v.as_number() * scale;
  double r;
  if (m.is_string() && m.str() == "ceil") r = std::ceil(x);
  else if (m.is_string() && m.str() == "floor") r = std::floor(x);
  else if (m.is_string() && m.str() == "common") r = std::nearbyint(x);  // Python's round: half to even
  else fail("round method must be 'common', 'ceil' or 'floor'");
  return Value(r / scale);
}

Value number_filter(const Value& v, const Args& a, bool to_int) {
  const Value dflt = arg(a, 0, "default", to_int ? Value(int64_t(0)) : Value(0.0));
  if (v.is_int()) return to_int ? v : Value(double(v.as_int()));
  if (v.is_bool()) return to_int ? Value(int64_t(v.as_bool())) : Value(double(v.as_bool()));
  // a float past int64 (or inf, NaN) has no int here: the default, where Python's int() raises
  const auto as_int = [&](double d) { return std::fabs(d) < 0x1p63 ? Value(int64_t(std::trunc(d))) : dflt; };
  if (v.is_float()) return to_int ? as_int(v.as_float()) : v;
  if (v.is_string()) {
    const std::string t = py_strip(v.str(), kNone, true, true);
    try {
      size_t used = 0;
      if (to_int) {
        const int64_t i = std::stoll(t, &used, 10);
        if (used == t.size()) return Value(i);
      }
      // strtod, not stod: "1e999" is inf as Python's float() reads it (stod threw out_of_range)
      char* end = nullptr;
      const double d = t.empty() ? 0 : std::strtod(t.c_str(), &end);
      if (!t.empty() && end == t.c_str() + t.size() && !std::isspace(static_cast<unsigned char>(t[0])))
        return to_int ? as_int(d) : Value(d);
    } catch (const std::exception&) {}
  }
  return dflt;
}

Value escape_filter(const Value& v) {
  std::string out;
  const std::string in = to_str(v);
  limit_string(
      in.size() + 4 * size_t(std::count_if(
                          in.begin(), in.end(),
                          [](char c) { return c == '&' || c == '<' || c == '>' || c == '"' || c == '\''; })),
      "filter 'escape'");
  for (char c : in) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value(std::move(out));
}

Value tojson_filter(const Value& v, const Args& a) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  if (truthy(arg(a, 0, "ensure_ascii", kUndef))) fail("tojson(ensure_ascii=true) is not supported");
  const Value indent = arg(a, 1, "indent", kNone);
  if (!arg(a, 2, "separators", kNone).is_none()) fail("tojson(separators=...) is not supported");
  const bool sort_keys = truthy(arg(a, 3, "sort_keys", kUndef));
  return Value(
      to_json(v, indent.is_none() ? -1 : int(std::clamp<int64_t>(need_int(indent, "tojson indent"), 0, 64)),
              sort_keys));
}

Value length_of(const Value& v) {
  if (v.is_string()) return Value(int64_t(utf8_length(v.str())));
  if (v.is_list()) return Value(int64_t(v.list().size()));
  if (v.is_dict()) return Value(int64_t(v.dict().items.size()));
  if (v.is_namespace()) return Value(int64_t(v.ns().attrs.items.size()));
  if (v.is_undefined()) return Value(int64_t(0));
  fail(fmt::format("object of type '{}' has no len()", type_name(v)));
}

Value join_filter(const Value& v, const Args& a) {
  const Value d = arg(a, 0, "d", Value(""));
  const Value attr = arg(a, 1, "attribute", kNone);
  std::string out;
  bool first = true;
  for (const auto& x : iterate(v)) {
    const std::string part =
        (first ? "" : to_str(d)) + to_str(attr.is_string() ? attr_path(x, attr.str()) : x);
    limit_string(out.size() + part.size(), "filter 'join'");
    out += part;
    first = false;
  }
  return Value(std::move(out));
}

Value minmax(const Value& v, const Args& a, bool max) {
  const bool cs = truthy(arg(a, 0, "case_sensitive", kUndef));
  const Value attr = arg(a, 1, "attribute", kNone);
  const std::string at = attr.is_string() ? attr.str() : "";
  const List items = as_list(v);
  if (items.empty()) return Value(Undefined{"min/max of an empty sequence"});
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const Value a1 = sort_key(items[i], cs, at), b1 = sort_key(items[best], cs, at);
    if (max ? less(b1, a1) : less(a1, b1)) best = i;
  }
  return items[best];
}

Value sum_filter(const Value& v, const Args& a) {
  const Value attr = arg(a, 0, "attribute", kNone);
  Value total = arg(a, 1, "start", Value(int64_t(0)));
  for (const auto& x : iterate(v))
    total = binary_op("+", total, attr.is_string() ? attr_path(x, attr.str()) : x);
  return total;
}

Value items_filter(const Value& v) {
  if (v.is_undefined()) return Value(List{});
  if (!v.is_dict()) fail(fmt::format("filter 'items' needs a mapping, got {}", type_name(v)));
  List out;
  for (const auto& [k, x] : v.dict().items) out.push_back(make_tuple(List{Value(k), x}));
  return Value(std::move(out));
}

Value dictsort_filter(const Value& v, const Args& a) {
  const bool cs = truthy(arg(a, 0, "case_sensitive", kUndef));
  const Value by = arg(a, 1, "by", Value("key"));
  const bool reverse = truthy(arg(a, 2, "reverse", kUndef));
  const size_t pos = by.is_string() && by.str() == "value" ? 1 : 0;
  List items = items_filter(v).list();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(x.list()[pos], cs, ""), ky = sort_key(y.list()[pos], cs, "");
    return reverse ? less(ky, kx) : less(kx, ky);
  });
  return Value(std::move(items));
}

Value reverse_filter(const Value& v) {
  if (v.is_string()) return get_slice(v, kNone, kNone, Value(int64_t(-1)));
  List l = as_list(v);
  std::reverse(l.begin(), l.end());
  return Value(std::move(l));
}

Value wordcount(const Value& v) {
  int64_t n = 0;
  bool in_word = false;
  for (unsigned char c : to_str(v)) {
    const bool w = std::isalnum(c) || c == '_' || c >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

using FilterFn = Value (*)(const Value&, const Args&);

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> f = {
      {"trim",
       [](const Value& v, const Args& a) {
         return Value(py_strip(to_str(v), arg(a, 0, "chars", kNone), true, true));
       }},
      {"upper", [](const Value& v, const Args&) { return Value(py_upper(to_str(v))); }},
      {"lower", [](const Value& v, const Args&) { return Value(py_lower(to_str(v))); }},
      {"title", [](const Value& v, const Args&) { return Value(py_title(to_str(v))); }},
      {"capitalize", [](const Value& v, const Args&) { return Value(py_capitalize(to_str(v))); }},
      {"length", [](const Value& v, const Args&) { return length_of(v); }},
      {"count", [](const Value& v, const Args&) { return length_of(v); }},
      {"first",
       [](const Value& v, const Args&) {
         List l = as_list(v);
         return l.empty() ? Value(Undefined{"first of an empty sequence"}) : l.front();
       }},
      {"last",
       [](const Value& v, const Args&) {
         List l = as_list(v);
         return l.empty() ? Value(Undefined{"last of an empty sequence"}) : l.back();
       }},
      {"join", join_filter},
      {"replace",
       [](const Value& v, const Args& a) {
         return Value(py_replace(to_str(v), need_string(arg(a, 0, "old", kUndef), "replace"),
                                 to_str(arg(a, 1, "new", kUndef)),
                                 need_int(arg(a, 2, "count", Value(int64_t(-1))), "count")));
       }},
      {"tojson", tojson_filter},
      {"string", [](const Value& v, const Args&) { return Value(to_str(v)); }},
      {"int", [](const Value& v, const Args& a) { return number_filter(v, a, true); }},
      {"float", [](const Value& v, const Args& a) { return number_filter(v, a, false); }},
      {"default",
       [](const Value& v, const Args& a) {
         const bool boolean = truthy(arg(a, 1, "boolean", kUndef));
         return (v.is_undefined() || (boolean && !truthy(v))) ? arg(a, 0, "default_value", Value("")) : v;
       }},
      {"items", [](const Value& v, const Args&) { return items_filter(v); }},
      {"dictsort", dictsort_filter},
      {"list", [](const Value& v, const Args&) { return Value(as_list(v)); }},
      {"map", map_filter},
      {"select", [](const Value& v, const Args& a) { return select(v, a, false, true); }},
      {"reject", [](const Value& v, const Args& a) { return select(v, a, false, false); }},
      {"selectattr", [](const Value& v, const Args& a) { return select(v, a, true, true); }},
      {"rejectattr", [](const Value& v, const Args& a) { return select(v, a, true, false); }},
      {"unique", unique_filter},
      {"safe", [](const Value& v, const Args&) { return v; }},
      {"escape", [](const Value& v, const Args&) { return escape_filter(v); }},
      {"indent", indent_filter},
      {"reverse", [](const Value& v, const Args&) { return reverse_filter(v); }},
      {"sort", sort_filter},
      {"round", round_filter},
      {"abs",
       [](const Value& v, const Args&) {
         if (v.is_int()) {
           if (v.as_int() == std::numeric_limits<int64_t>::min()) fail("integer overflow in abs()");
           return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
         }
         if (v.is_float()) return Value(std::fabs(v.as_float()));
         fail(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
       }},
      {"wordcount", [](const Value& v, const Args&) { return wordcount(v); }},
      {"min", [](const Value& v, const Args& a) { return minmax(v, a, false); }},
      {"max", [](const Value& v, const Args& a) { return minmax(v, a, true); }},
      {"sum", sum_filter},
      {"attr", [](const Value& v,
                  const Args& a) { return get_attr(v, need_string(arg(a, 0, "name", kUndef), "attr")); }},
  };
  return f;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& subject, const Args& args) {
  const std::string n = name == "d" ? "default" : name == "e" ? "escape" : name;
  const auto& f = filters();
  auto it = f.find(n);
  if (it == f.end()) fail(fmt::format("unsupported filter '{}'", name));
  // like Jinja, an undefined subject reads as "" / empty; what cannot take it (tojson, abs) says so
  return it->second(subject, args);
}

}  // namespace rp::jinja
