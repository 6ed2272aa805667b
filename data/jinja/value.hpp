// The values a chat template computes with: Python's None, bool, int, float, str, list and
// dict (insertion-ordered, string keys), Jinja's undefined, namespaces and callables.
// Lists, dicts and namespaces are shared (Python reference semantics: `ns.x = 1` inside a
// loop is seen after it); templates cannot mutate lists or dicts (transformers renders in
// Jinja's immutable sandbox), so sharing is only observable through namespaces.
// Strings are UTF-8 and shared too (immutable, as Python's): copying a value never copies its
// text, so a list of a thousand references to one long string holds it once. Length,
// slicing and indexing count code points, as Python does.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace rp::jinja {

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Namespace;
struct Callable;
using ListPtr = std::shared_ptr<const List>;
using DictPtr = std::shared_ptr<const Dict>;

/// Undefined remembers what was looked up (for the error when it is used).
struct Undefined {
  std::string what;
};
struct None {};

struct Value {
  std::variant<Undefined, None, bool, int64_t, double, std::shared_ptr<const std::string>, ListPtr, DictPtr,
               std::shared_ptr<Namespace>, std::shared_ptr<const Callable>>
      v;
  bool tuple = false;  ///< a list that prints as a Python tuple: (1, 2) (items(), tuple literals)

  Value() : v(Undefined{}) {}
  Value(None n) : v(n) {}
  Value(Undefined u) : v(std::move(u)) {}
  Value(bool b) : v(b) {}
  Value(int64_t i) : v(i) {}
  Value(int i) : v(int64_t(i)) {}
  Value(double d) : v(d) {}
  Value(std::string s) : v(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(List l) : v(ListPtr(std::make_shared<const List>(std::move(l)))) {}
  Value(Dict d);
  Value(std::shared_ptr<Namespace> n) : v(std::move(n)) {}
  Value(std::shared_ptr<const Callable> c) : v(std::move(c)) {}

  bool is_undefined() const { return v.index() == 0; }
  bool is_none() const { return v.index() == 1; }
  bool is_bool() const { return v.index() == 2; }
  bool is_int() const { return v.index() == 3; }
  bool is_float() const { return v.index() == 4; }
  bool is_number() const {
    return is_int() || is_float();
  }  ///< bool excluded (Jinja's `number` test includes it; see tests)
  bool is_string() const { return v.index() == 5; }
  bool is_list() const { return v.index() == 6; }
  bool is_dict() const { return v.index() == 7; }
  bool is_namespace() const { return v.index() == 8; }
  bool is_callable() const { return v.index() == 9; }

  bool as_bool() const { return std::get<bool>(v); }
  int64_t as_int() const { return std::get<int64_t>(v); }
  double as_float() const { return std::get<double>(v); }
  double as_number() const {
    return is_int() ? double(as_int()) : is_bool() ? double(as_bool()) : as_float();
  }
  const std::string& str() const { return *std::get<std::shared_ptr<const std::string>>(v); }
  const List& list() const { return *std::get<ListPtr>(v); }
  const Dict& dict() const { return *std::get<DictPtr>(v); }
  Namespace& ns() const { return *std::get<std::shared_ptr<Namespace>>(v); }
  const Callable& callable() const { return *std::get<std::shared_ptr<const Callable>>(v); }
  const Undefined& undefined() const { return std::get<Undefined>(v); }
};

/// Insertion-ordered string-keyed map (Python dict). Lookup is linear: template dicts are small.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);  ///< replaces in place or appends
};

struct Namespace {
  Dict attrs;
};

/// Arguments of a call: positional, then keyword (in call order).
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(const std::string& name) const;
};

/// Something a template can call: a macro, a builtin global, a bound method.
struct Callable {
  std::string name;
  std::function<Value(const Args&)> fn;
};

inline Value::Value(Dict d) : v(DictPtr(std::make_shared<const Dict>(std::move(d)))) {}

/// A Python tuple of the given items.
inline Value make_tuple(List items) {
  Value v(std::move(items));
  v.tuple = true;
  return v;
}

/// Python truthiness (undefined is false).
bool truthy(const Value& v);
/// Python type name, used in error messages ("str", "list", "dict", "undefined", ...).
const char* type_name(const Value& v);
/// Python str(): None -> "None", True -> "True", 1.0 -> "1.0", lists/dicts as repr; undefined -> "".
std::string to_str(const Value& v);
/// Python repr() (strings quoted as Python quotes them).
std::string repr(const Value& v);
/// Python's json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys) (indent < 0:
/// none, separators ", " and ": "). Throws std::invalid_argument for values JSON cannot hold.
std::string to_json(const Value& v, int indent = -1, bool sort_keys = false);
/// Python ==, with 1 == 1.0 == True.
bool equal(const Value& a, const Value& b);
/// Python <: numbers with numbers, strings by code point, lists lexicographically; throws
/// std::invalid_argument for other pairs.
bool less(const Value& a, const Value& b);
/// From JSON (objects keep their order when given an ordered_json).
Value from_json(const nlohmann::ordered_json& j);
/// Python float repr: shortest round-trip digits, always with a '.', 'e', "inf" or "nan".
std::string float_repr(double d);

/// UTF-8 helpers: code point count, and byte offsets of each code point (plus the end).
size_t utf8_length(const std::string& s);
std::vector<size_t> utf8_offsets(const std::string& s);

}  // namespace rp::jinja
