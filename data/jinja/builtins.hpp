// Jinja's filters and tests, Python's string and dict methods, attribute and item access,
// as chat templates use them. Pure functions of values: errors are thrown as
// std::invalid_argument holding what went wrong, which the renderer prefixes with
// "<template>:<line>: ". Internal to data/jinja.
#pragma once
#include <string>
#include <vector>

#include "data/jinja/value.hpp"

namespace rp::jinja {

/// The most bytes one string a builtin builds may hold ("ab" * n, "~", join, replace, ...).
inline constexpr size_t kMaxBuiltValue = size_t(64) << 20;
/// The most items one list or dict a builtin builds may hold (l + l, l * n, range(n),
/// a string's characters, split, ...): kMaxBuiltValue bytes of values.
inline constexpr size_t kMaxBuiltItems = kMaxBuiltValue / sizeof(Value);

/// Throws std::invalid_argument("<construct> makes a string over the size limit (64 MiB)")
/// when `bytes` > kMaxBuiltValue: the check every builder of a string makes before it builds.
void limit_string(size_t bytes, const std::string& construct);
/// The same for a list or dict of `items` items (kMaxBuiltItems).
void limit_items(size_t items, const std::string& construct);

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
