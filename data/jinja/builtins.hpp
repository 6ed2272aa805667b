// Jinja's filters and tests, Python's string and dict methods, attribute and item access,
// as chat templates use them. Pure functions of values: errors are thrown as
// std::invalid_argument holding what went wrong, which the renderer prefixes with
// "<template>:<line>: ". Internal to data/jinja.
#pragma once
#include <string>
#include <vector>

#include "data/jinja/value.hpp"

namespace rp::jinja {

/// The most bytes one string or list a builtin builds may hold ("ab" * n, range(n), ...).
inline constexpr size_t kMaxBuiltValue = size_t(64) << 20;

/// `subject | name(args)`. Throws "unsupported filter 'name'" for a filter not listed in
/// docs/spec.md.
Value apply_filter(const std::string& name, const Value& subject, const Args& args);

/// `subject is name(args)`. Throws "unsupported test 'name'".
bool apply_test(const std::string& name, const Value& subject, const Args& args);

/// `obj.name`: a dict's methods (get, items, keys, values) first, then its key; a string's
/// methods; a namespace's attribute; undefined when missing. Throws for an undefined obj.
Value get_attr(const Value& obj, const std::string& name);

/// `obj[key]`: dict key, list / string index (negative from the end); undefined when missing.
Value get_item(const Value& obj, const Value& key);

/// `obj[start:stop:step]` on a list or string (code points), Python's rules.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

/// What `for x in v` visits: a list's items, a dict's keys, a string's characters; nothing for
/// undefined. Throws "'T' object is not iterable" for other types.
std::vector<Value> iterate(const Value& v);

/// Python `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);

/// Binary operator `op` (+ - * / // % ** ~). Throws Python's TypeError text for bad operands.
Value binary_op(const std::string& op, const Value& a, const Value& b);

}  // namespace rp::jinja
