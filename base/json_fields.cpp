#include "base/json_fields.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "base/error_text.hpp"

namespace rp {
namespace {
const nlohmann::json kNull;
}

std::string nearest_key(const std::string& key, const std::set<std::string>& known) {
  constexpr size_t kMost = 2;
  // a key of kilobytes (a corrupted file) is no typo of a known one
  if (key.empty() || key.size() > 256) return "";
  std::string best;
  size_t best_d = kMost + 1;
  bool tied = false;
  for (const std::string& k : known) {
    if (k.size() + kMost < key.size() || key.size() + kMost < k.size()) continue;
    // optimal string alignment distance: Levenshtein with a swap of neighbours counting 1
    const size_t n = key.size(), m = k.size();
    std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
    for (size_t i = 0; i <= n; ++i) d[i][0] = i;
    for (size_t j = 0; j <= m; ++j) d[0][j] = j;
    for (size_t i = 1; i <= n; ++i)
      for (size_t j = 1; j <= m; ++j) {
        d[i][j] =
            std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (key[i - 1] == k[j - 1] ? 0 : 1)});
        if (i > 1 && j > 1 && key[i - 1] == k[j - 2] && key[i - 2] == k[j - 1])
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    const size_t dist = d[n][m];
    // a distance as long as a name is no near miss ('z' for 'w', 'ab' for 'cd')
    if (dist >= n || dist >= m) continue;
    if (dist < best_d) best = k, best_d = dist, tied = false;
    else if (dist == best_d) tied = true;
  }
  return best_d <= kMost && !tied ? best : "";
}

std::string json_text_of(const nlohmann::json& v) {
  try {
    return v.dump();
  } catch (const nlohmann::json::type_error&) {
    if (v.is_string()) return "\"" + v.get<std::string>() + "\"";
    return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}

std::string did_you_mean(const std::string& key, const std::set<std::string>& known,
                         const std::string& prefix) {
  const std::string near = nearest_key(key, known);
  return near.empty() ? std::string() : fmt::format("; did you mean '{}{}'?", prefix, near);
}

JsonFields::JsonFields(const nlohmann::json& obj, std::string where, std::string prefix, Error error)
    : j_(obj), where_(std::move(where)), prefix_(std::move(prefix)), error_(error) {}

JsonFields& JsonFields::with_lines(const JsonKeyLines* lines, std::string file, std::string pointer) {
  lines_ = lines;
  file_ = std::move(file);
  pointer_ = std::move(pointer);
  return *this;
}

std::string JsonFields::where_of(const std::string& key) const {
  if (!lines_ || where_.rfind(file_, 0) != 0) return where_;
  const auto it = lines_->find(json_key_pointer(pointer_, key));
  if (it == lines_->end()) return where_;
  return fmt::format("{}:{}{}", file_, it->second, where_.substr(file_.size()));
}

bool JsonFields::has(const std::string& key) const { return j_.is_object() && j_.contains(key); }

const nlohmann::json& JsonFields::at(const std::string& key) const {
  if (!has(key)) return kNull;
  return j_.find(key).value();
}

void JsonFields::raise(const std::string& msg) const {
  if (error_ == Error::runtime_error) throw std::runtime_error(msg);
  throw std::invalid_argument(msg);
}

void JsonFields::fail(const std::string& key, const std::string& expected) const {
  raise(fmt::format("{}: key '{}{}': expected {}, got {}", where_of(key), prefix_, key, expected,
                    has(key) ? excerpt(json_text_of(at(key))) : std::string("nothing")));
}

void JsonFields::fail(const std::string& key, const std::string& expected, const nlohmann::json& got) const {
  raise(fmt::format("{}: key '{}{}': expected {}, got {}", where_of(key), prefix_, key, expected,
                    excerpt(json_text_of(got))));
}

void JsonFields::fail_with(const std::string& what) const { raise(where_ + ": " + what); }

void JsonFields::allow_only(const std::set<std::string>& known) const { allow_only(known, {}, ""); }

void JsonFields::allow_only(const std::set<std::string>& known,
                            const std::map<std::string, std::string>& aliases,
                            const std::string& source) const {
  if (!j_.is_object()) return;
  for (auto it = j_.begin(); it != j_.end(); ++it)
    if (!known.count(it.key())) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      std::string hint = did_you_mean(it.key(), known, prefix_);
      if (hint.empty() && !aliases.empty()) {
        // the aliases compete with the known keys: one only where no known key is as near
        std::set<std::string> names = known;
        for (const auto& [name, key] : aliases) names.insert(name);
        if (const std::string near = nearest_key(it.key(), names); !near.empty() && aliases.count(near))
          hint = fmt::format("; did you mean '{}{}' ({}'s {})?", prefix_, aliases.at(near), source, near);
      }
      raise(fmt::format("{}: unknown key '{}{}'{} (known keys: {})", where_of(it.key()), prefix_,
                        excerpt(it.key()), hint, list));
    }
}

bool JsonFields::optional(const char* key, bool& out) const {
  if (!has(key)) return false;
  out = boolean(key);
  return true;
}

bool JsonFields::optional(const char* key, std::string& out) const {
  if (!has(key)) return false;
  out = string(key);
  return true;
}

bool JsonFields::optional(const char* key, double& out) const {
  if (!has(key)) return false;
  out = number(key);
  return true;
}

bool JsonFields::optional(const char* key, float& out) const {
  if (!has(key)) return false;
  out = float(number(key));
  return true;
}

bool JsonFields::read_signed(const char* key, int64_t& out, int64_t min, int64_t max) const {
  if (!has(key)) return false;
  const auto& v = at(key);
  if (!v.is_number_integer()) fail(key, "an integer");
  if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(max) : v.get<int64_t>() > max)
    fail(key, fmt::format("an integer <= {}", max));
  if (!v.is_number_unsigned() && v.get<int64_t>() < min) fail(key, fmt::format("an integer >= {}", min));
  out = v.get<int64_t>();
  return true;
}

/// An integer >= 0 either way JSON holds it: parsed text holds 3 as unsigned, while a value set
/// in code (json{{"seed", 3}}, j["seed"] = 3) holds it as signed.
static bool non_negative_integer(const nlohmann::json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

bool JsonFields::read_unsigned(const char* key, uint64_t& out, uint64_t max) const {
  if (!has(key)) return false;
  const auto& v = at(key);
  if (!v.is_number_integer()) fail(key, "an integer");
  if (!non_negative_integer(v)) fail(key, "an integer >= 0");
  if (v.get<uint64_t>() > max) fail(key, fmt::format("an integer <= {}", max));
  out = v.get<uint64_t>();
  return true;
}

int64_t JsonFields::integer(const char* key, int64_t min) const {
  const std::string expected = min == std::numeric_limits<int64_t>::min()
                                   ? std::string("an integer")
                                   : fmt::format("an integer >= {}", min);
  const auto& v = at(key);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
      v.get<int64_t>() < min)
    fail(key, expected);
  return v.get<int64_t>();
}

uint64_t JsonFields::unsigned_integer(const char* key) const {
  const auto& v = at(key);
  if (!non_negative_integer(v)) fail(key, "an integer >= 0");
  return v.get<uint64_t>();
}

double JsonFields::number(const char* key) const {
  const auto& v = at(key);
  if (!v.is_number()) fail(key, "a number");
  return v.get<double>();
}

bool JsonFields::boolean(const char* key) const {
  const auto& v = at(key);
  if (!v.is_boolean()) fail(key, "true or false");
  return v.get<bool>();
}

std::string JsonFields::string(const char* key) const {
  const auto& v = at(key);
  if (!v.is_string()) fail(key, "a string");
  return v.get<std::string>();
}

const nlohmann::json& JsonFields::object(const char* key) const {
  const auto& v = at(key);
  if (!v.is_object()) fail(key, "an object");
  return v;
}

const nlohmann::json& JsonFields::array(const char* key) const {
  const auto& v = at(key);
  if (!v.is_array()) fail(key, "an array");
  return v;
}

void JsonFields::require_value(const char* key, const nlohmann::json& value) const {
  if (!has(key) || at(key) != value) fail(key, json_text_of(value));
}

JsonFields JsonFields::nested(const char* key) const {
  JsonFields f(object(key), where_, prefix_ + key + ".", error_);
  if (lines_) f.with_lines(lines_, file_, json_key_pointer(pointer_, key));
  return f;
}

}  // namespace rp
