#include "data/jinja/value.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace rp::jinja {

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

const Value* Args::kwarg(const std::string& name) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

bool truthy(const Value& v) {
  if (v.is_undefined() || v.is_none()) return false;
  if (v.is_bool()) return v.as_bool();
  if (v.is_int()) return v.as_int() != 0;
  if (v.is_float()) return v.as_float() != 0.0;
  if (v.is_string()) return !v.str().empty();
  if (v.is_list()) return !v.list().empty();
  if (v.is_dict()) return !v.dict().items.empty();
  return true;
}

const char* type_name(const Value& v) {
  static const char* names[] = {"undefined", "NoneType", "bool", "int",       "float",
                                "str",       "list",     "dict", "namespace", "function"};
  return names[v.v.index()];
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  std::string s = fmt::format("{}", d);  // shortest round-trip digits, as Python
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::vector<size_t> utf8_offsets(const std::string& s) {
  std::vector<size_t> o;
  o.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) o.push_back(i);
  o.push_back(s.size());
  return o;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) out += std::string("\\") + char(q);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += char(c);
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += char(c);
    }
  }
  out += '"';
}

/// The most bytes and nesting levels repr / str / tojson build: a list holding itself many
/// times over (lists are shared) would otherwise print exponentially long or recurse without end.
constexpr size_t kMaxTextBytes = size_t(64) << 20;
constexpr int kMaxNesting = 512;

void check_text(const std::string& out, const char* what) {
  if (out.size() > kMaxTextBytes)
    throw std::invalid_argument(
        fmt::format("{} makes a string over the size limit ({} MiB)", what, kMaxTextBytes >> 20));
}

void json_into(std::string& out, const Value& v, int indent, bool sort_keys, int depth) {
  if (depth > kMaxNesting) throw std::invalid_argument("tojson: nesting deeper than 512");
  check_text(out, "tojson");
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(indent) * size_t(d), ' ');
  };
  const char* comma = indent < 0 ? ", " : ",";
  if (v.is_none()) out += "null";
  else if (v.is_bool()) out += v.as_bool() ? "true" : "false";
  else if (v.is_int()) out += std::to_string(v.as_int());
  else if (v.is_float()) {
    const double d = v.as_float();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : float_repr(d);
  } else if (v.is_string()) json_string(out, v.str());
  else if (v.is_list()) {
    const List& l = v.list();
    if (l.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) out += comma;
      newline(depth + 1);
      json_into(out, l[i], indent, sort_keys, depth + 1);
    }
    newline(depth);
    out += ']';
  } else if (v.is_dict() || v.is_namespace()) {
    const Dict& d = v.is_dict() ? v.dict() : v.ns().attrs;
    if (d.items.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& kv : d.items) items.push_back(&kv);
    if (sort_keys)
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += comma;
      newline(depth + 1);
      json_string(out, items[i]->first);
      out += ": ";
      json_into(out, items[i]->second, indent, sort_keys, depth + 1);
    }
    newline(depth);
    out += '}';
  } else {
    throw std::invalid_argument(fmt::format("tojson: a {} is not JSON serializable", type_name(v)));
  }
}

}  // namespace

std::string to_json(const Value& v, int indent, bool sort_keys) {
  std::string out;
  json_into(out, v, indent, sort_keys, 0);
  check_text(out, "tojson");
  return out;
}

namespace {

void repr_into(std::string& out, const Value& v, int depth);

void str_into(std::string& out, const Value& v, int depth) {
  switch (v.v.index()) {
    case 0: return;
    case 1: out += "None"; return;
    case 2: out += v.as_bool() ? "True" : "False"; return;
    case 3: out += std::to_string(v.as_int()); return;
    case 4: out += float_repr(v.as_float()); return;
    case 5: out += v.str(); return;
    case 8:
      out += "<Namespace ";
      repr_into(out, Value(v.ns().attrs), depth + 1);
      out += ">";
      return;
    case 9: out += "<function " + v.callable().name + ">"; return;
    default: repr_into(out, v, depth);
  }
}

void repr_into(std::string& out, const Value& v, int depth) {
  if (depth > kMaxNesting) throw std::invalid_argument("printing a value nested deeper than 512");
  check_text(out, "printing a value");
  if (v.is_string()) {
    out += repr_string(v.str());
  } else if (v.is_list()) {
    out += v.tuple ? "(" : "[";
    const List& l = v.list();
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) out += ", ";
      repr_into(out, l[i], depth + 1);
      check_text(out, "printing a value");
    }
    if (v.tuple && l.size() == 1) out += ",";
    out += v.tuple ? ")" : "]";
  } else if (v.is_dict()) {
    out += "{";
    bool first = true;
    for (const auto& [k, x] : v.dict().items) {
      out += (first ? "" : ", ") + repr_string(k) + ": ";
      repr_into(out, x, depth + 1);
      check_text(out, "printing a value");
      first = false;
    }
    out += "}";
  } else {
    str_into(out, v, depth);
  }
}

}  // namespace

std::string repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  check_text(out, "printing a value");
  return out;
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  str_into(out, v, 0);
  check_text(out, "printing a value");
  return out;
}

namespace {

bool equal_at(const Value& a, const Value& b, int depth) {
  if (depth > kMaxNesting) throw std::invalid_argument("comparing values nested deeper than 512");
  const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
  if (an && bn) {
    if (a.is_float() || b.is_float()) return a.as_number() == b.as_number();
    auto as_i = [](const Value& x) { return x.is_bool() ? int64_t(x.as_bool()) : x.as_int(); };
    return as_i(a) == as_i(b);
  }
  if (a.v.index() != b.v.index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.str() == b.str();
  if (a.is_list()) {
    const List &x = a.list(), &y = b.list();
    if (&x == &y) return true;  // one shared list (Python compares its items by identity first too)
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!equal_at(x[i], y[i], depth + 1)) return false;
    return true;
  }
  if (a.is_dict()) {
    const Dict &x = a.dict(), &y = b.dict();
    if (&x == &y) return true;
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* o = y.find(k);
      if (!o || !equal_at(v, *o, depth + 1)) return false;
    }
    return true;
  }
  if (a.is_namespace()) return &a.ns() == &b.ns();
  return &a.callable() == &b.callable();
}

bool less_at(const Value& a, const Value& b, int depth) {
  if (depth > kMaxNesting) throw std::invalid_argument("comparing values nested deeper than 512");
  const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
  if (an && bn) return a.as_number() < b.as_number();
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 byte order = code point order
  if (a.is_list() && b.is_list()) {
    const List &x = a.list(), &y = b.list();
    if (&x == &y) return false;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less_at(x[i], y[i], depth + 1)) return true;
      if (less_at(y[i], x[i], depth + 1)) return false;
    }
    return x.size() < y.size();
  }
  throw std::invalid_argument(
      fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b)));
}

}  // namespace

bool equal(const Value& a, const Value& b) { return equal_at(a, b, 0); }

bool less(const Value& a, const Value& b) { return less_at(a, b, 0); }

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value(None{});
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > uint64_t(INT64_MAX) ? Value(double(u)) : Value(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(from_json(x));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, x] : j.items()) d.set(k, from_json(x));
      return Value(std::move(d));
    }
    default: return Value(None{});
  }
}

}  // namespace rp::jinja
