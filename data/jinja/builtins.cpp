// Attribute / item access, operators, tests and Python string / dict methods.
#include "data/jinja/builtins.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "data/jinja/strings.hpp"

namespace rp::jinja {

namespace {

[[noreturn]] void type_error(const std::string& what) { throw std::invalid_argument(what); }

Value arg(const Args& a, size_t i, const char* name,
          const Value& fallback) {  // by value: fallbacks are often temporaries
  if (i < a.pos.size()) return a.pos[i];
  if (const Value* v = a.kwarg(name)) return *v;
  return fallback;
}

const Value kUndef{};
const Value kNone{None{}};

Value method(const Value& self, const std::string& name, std::function<Value(const Value&, const Args&)> f) {
  auto c = std::make_shared<Callable>();
  c->name = name;
  c->fn = [self, f = std::move(f)](const Args& a) { return f(self, a); };
  return Value(std::shared_ptr<const Callable>(std::move(c)));
}

Value dict_method(const Value& d, const std::string& name) {
  if (name == "get")
    return method(d, name, [](const Value& self, const Args& a) {
      const Value key = arg(a, 0, "key", kUndef);
      const Value* v = key.is_string() ? self.dict().find(key.str()) : nullptr;
      return v ? *v : arg(a, 1, "default", kNone);
    });
  if (name == "items")
    return method(d, name, [](const Value& self, const Args&) {
      List out;
      for (const auto& [k, v] : self.dict().items) out.push_back(make_tuple(List{Value(k), v}));
      return Value(std::move(out));
    });
  if (name == "keys")
    return method(d, name, [](const Value& self, const Args&) {
      List out;
      for (const auto& kv : self.dict().items) out.push_back(Value(kv.first));
      return Value(std::move(out));
    });
  if (name == "values")
    return method(d, name, [](const Value& self, const Args&) {
      List out;
      for (const auto& kv : self.dict().items) out.push_back(kv.second);
      return Value(std::move(out));
    });
  return Value(Undefined{});
}

Value string_method(const Value& s, const std::string& name) {
  static const char* names[] = {"startswith", "endswith", "strip",      "lstrip", "rstrip",  "split",
                                "rsplit",     "replace",  "upper",      "lower",  "title",   "capitalize",
                                "find",       "count",    "splitlines", "join",   "isdigit", "isalpha",
                                "isspace",    "isupper",  "islower"};
  if (std::find(std::begin(names), std::end(names), name) == std::end(names)) return Value(Undefined{});
  return method(s, name,
                [name](const Value& self, const Args& a) { return call_string_method(self.str(), name, a); });
}

}  // namespace

void limit_string(size_t bytes, const std::string& construct) {
  if (bytes > kMaxBuiltValue)
    type_error(
        fmt::format("{} makes a string over the size limit ({} MiB)", construct, kMaxBuiltValue >> 20));
}

void limit_items(size_t items, const std::string& construct) {
  if (items > kMaxBuiltItems)
    type_error(fmt::format("{} makes a list over the size limit ({} items)", construct, kMaxBuiltItems));
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined())
    type_error(fmt::format("'{}' is undefined (reading attribute '{}')", obj.undefined().what, name));
  const std::string what = name;
  if (obj.is_dict()) {
    Value m = dict_method(obj, name);
    if (!m.is_undefined()) return m;
    if (const Value* v = obj.dict().find(name)) return *v;
    return Value(Undefined{"." + what});
  }
  if (obj.is_namespace()) {
    if (const Value* v = obj.ns().attrs.find(name)) return *v;
    return Value(Undefined{"." + what});
  }
  if (obj.is_string()) {
    Value m = string_method(obj, name);
    if (!m.is_undefined()) return m;
  }
  return Value(Undefined{"." + what});
}

namespace {
bool index_of(const Value& key, size_t size, size_t& out) {
  if (!key.is_int() && !key.is_bool()) return false;
  int64_t i = key.is_bool() ? int64_t(key.as_bool()) : key.as_int();
  if (i < 0) i += int64_t(size);
  if (i < 0 || i >= int64_t(size)) return false;
  out = size_t(i);
  return true;
}
}  // namespace

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined())
    type_error(fmt::format("'{}' is undefined (reading item {})", obj.undefined().what, repr(key)));
  size_t i = 0;
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict().find(key.str())) return *v;
      Value m = dict_method(obj, key.str());
      if (!m.is_undefined()) return m;
    }
    return Value(Undefined{"[" + repr(key) + "]"});
  }
  if (obj.is_list()) {
    if (index_of(key, obj.list().size(), i)) return obj.list()[i];
    return Value(Undefined{"[" + repr(key) + "]"});
  }
  if (obj.is_string()) {
    const auto off = utf8_offsets(obj.str());
    if (index_of(key, off.size() - 1, i)) return Value(obj.str().substr(off[i], off[i + 1] - off[i]));
    return Value(Undefined{"[" + repr(key) + "]"});
  }
  if (obj.is_namespace() && key.is_string()) return get_attr(obj, key.str());
  return Value(Undefined{"[" + repr(key) + "]"});
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  auto as_opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int())
      type_error(fmt::format("slice {} must be an integer or None, not {}", what, type_name(v)));
    return v.as_int();
  };
  const int64_t st = as_opt(step, "step").value_or(1);
  if (st == 0) type_error("slice step cannot be zero");
  std::vector<size_t> off;
  size_t n = 0;
  if (obj.is_list()) n = obj.list().size();
  else if (obj.is_string()) {
    off = utf8_offsets(obj.str());
    n = off.size() - 1;
  } else if (obj.is_undefined()) {
    type_error(fmt::format("'{}' is undefined (slicing it)", obj.undefined().what));
  } else {
    type_error(fmt::format("'{}' object is not subscriptable", type_name(obj)));
  }
  const int64_t len = int64_t(n);
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + len : *v;
    if (st > 0) return std::clamp<int64_t>(x, 0, len);
    return std::clamp<int64_t>(x, -1, len - 1);
  };
  const int64_t b = clamp(as_opt(start, "start"), st > 0 ? 0 : len - 1);
  const int64_t e = clamp(as_opt(stop, "stop"), st > 0 ? len : -1);
  std::vector<size_t> picks;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) picks.push_back(size_t(k));
  if (obj.is_list()) {
    List out;
    out.reserve(picks.size());
    for (size_t k : picks) out.push_back(obj.list()[k]);
    return Value(std::move(out));
  }
  std::string out;
  for (size_t k : picks) out.append(obj.str(), off[k], off[k + 1] - off[k]);
  return Value(std::move(out));
}

std::vector<Value> iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.list();
  if (v.is_dict()) {
    std::vector<Value> keys;
    for (const auto& kv : v.dict().items) keys.push_back(Value(kv.first));
    return keys;
  }
  if (v.is_string()) {
    limit_items(utf8_length(v.str()), "iterating over a string");
    std::vector<Value> chars;
    const auto off = utf8_offsets(v.str());
    for (size_t i = 0; i + 1 < off.size(); ++i)
      chars.push_back(Value(v.str().substr(off[i], off[i + 1] - off[i])));
    return chars;
  }
  type_error(fmt::format("'{}' object is not iterable", type_name(v)));
}

bool contains(const Value& h, const Value& n) {
  if (h.is_string()) {
    if (!n.is_string())
      type_error(fmt::format("'in <string>' requires string as left operand, not {}", type_name(n)));
    return h.str().find(n.str()) != std::string::npos;
  }
  if (h.is_dict()) return n.is_string() && h.dict().find(n.str()) != nullptr;
  if (h.is_list()) {
    for (const auto& x : h.list())
      if (equal(x, n)) return true;
    return false;
  }
  if (h.is_undefined()) return false;
  type_error(fmt::format("argument of type '{}' is not iterable", type_name(h)));
}

namespace {

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined())
    type_error(
        fmt::format("'{}' is undefined (operand of '{}')", (a.is_undefined() ? a : b).undefined().what, op));
  type_error(
      fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
}

bool numeric(const Value& v) { return v.is_int() || v.is_float() || v.is_bool(); }
int64_t int_of(const Value& v) { return v.is_bool() ? int64_t(v.as_bool()) : v.as_int(); }

Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  const size_t k = size_t(n);
  if (seq.is_string()) {
    if (k > 0 && seq.str().size() > kMaxBuiltValue / k)
      limit_string(kMaxBuiltValue + 1, "string repetition '*'");
    std::string out;
    out.reserve(seq.str().size() * k);
    for (size_t i = 0; i < k; ++i) out += seq.str();
    return Value(std::move(out));
  }
  if (k > 0 && seq.list().size() > kMaxBuiltItems / k) limit_items(kMaxBuiltItems + 1, "list repetition '*'");
  List out;
  out.reserve(seq.list().size() * k);
  for (size_t i = 0; i < k; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value(std::move(out));
}

Value arith(const std::string& op, const Value& a, const Value& b) {
  const bool ints = !a.is_float() && !b.is_float();
  if (op == "/") {
    if (b.as_number() == 0) type_error("division by zero");
    return Value(a.as_number() / b.as_number());
  }
  if (ints) {
    const int64_t x = int_of(a), y = int_of(b);
    int64_t r = 0;
    if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value(r);
    if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value(r);
    if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value(r);
    if (op == "//" || op == "%") {
      if (y == 0) type_error("integer division or modulo by zero");
      // INT64_MIN // -1 is the one quotient past int64 (the division traps: SIGFPE)
      if (x == std::numeric_limits<int64_t>::min() && y == -1) {
        if (op == "%") return Value(int64_t(0));
        type_error(fmt::format("integer overflow in '{}'", op));
      }
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return op == "//" ? Value(q) : Value(m);
    }
    if (op == "**" && y >= 0) {
      int64_t p = 1;
      bool ok = true;
      for (int64_t i = 0; i < y && ok; ++i) ok = !__builtin_mul_overflow(p, x, &p);
      if (ok) return Value(p);
    }
    if (op != "**") type_error(fmt::format("integer overflow in '{}'", op));
  }
  const double x = a.as_number(), y = b.as_number();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") return Value(std::pow(x, y));
  if (y == 0) type_error("float division by zero");
  if (op == "//") return Value(std::floor(x / y));
  double m = std::fmod(x, y);
  if (m != 0 && ((m < 0) != (y < 0))) m += y;
  return Value(m);
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    const std::string x = to_str(a), y = to_str(b);
    limit_string(x.size() + y.size(), "string concatenation '~'");
    return Value(x + y);
  }
  if (numeric(a) && numeric(b)) return arith(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      limit_string(a.str().size() + b.str().size(), "string concatenation '+'");
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list()) {
      limit_items(a.list().size() + b.list().size(), "list concatenation '+'");
      List out;
      out.reserve(a.list().size() + b.list().size());
      out.insert(out.end(), a.list().begin(), a.list().end());
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value(std::move(out));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, int_of(b));
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, int_of(a));
  }
  bad_operands(op, a, b);
}

bool apply_test(const std::string& name, const Value& v, const Args& a) {
  const Value x = arg(a, 0, "other", kUndef);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  // Jinja's Undefined iterates as empty and has a length, so both tests accept it
  if (name == "iterable" || name == "sequence")
    return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "number") return v.is_int() || v.is_float() || v.is_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_callable();
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, x);
  if (name == "ne" || name == "!=") return !equal(v, x);
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, x);
  if (name == "le" || name == "<=") return !less(x, v);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(x, v);
  if (name == "ge" || name == ">=") return !less(v, x);
  if (name == "in") return contains(x, v);
  if (name == "sameas") return v.v.index() == x.v.index() && (v.is_none() || v.is_undefined() || equal(v, x));
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int()) type_error(fmt::format("test '{}' needs an integer, got {}", name, type_name(v)));
    if (name == "odd") return v.as_int() % 2 != 0;
    if (name == "even") return v.as_int() % 2 == 0;
    const Value d = arg(a, 0, "num", kUndef);
    if (!d.is_int() || d.as_int() == 0) type_error("test 'divisibleby' needs a non-zero integer");
    return v.as_int() % d.as_int() == 0;
  }
  if (name == "lower" || name == "upper") return truthy(call_string_method(to_str(v), "is" + name, {}));
  type_error(fmt::format("unsupported test '{}'", name));
}

}  // namespace rp::jinja
