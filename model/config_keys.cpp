// Readers of single config.json keys (declared and documented in model/config_keys.hpp).
#include "model/config_keys.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace rp {

namespace config_keys {

using nlohmann::json;

std::string describe(const json& v) {
  if (v.is_null()) return "null";
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return fmt::format("{} {}", v.type_name(), s);
}

json val(const json& j, const std::string& key) {
  auto it = j.find(key);
  return it == j.end() ? json() : *it;
}

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& expected,
                      const json& got) {
  throw std::runtime_error(
      fmt::format("{}: key '{}': expected {}, got {}", where, key, expected, describe(got)));
}

/// A required key that is absent (or null).
[[noreturn]] void missing(const std::string& where, const std::string& key, const std::string& expected,
                          const std::string& why) {
  throw std::runtime_error(
      fmt::format("{}: key '{}': expected {}{}, got nothing", where, key, expected, why));
}

/// Reads an optional integer key; `required` keys must be present. Returns `def` when absent/null.
int64_t get_int(const json& j, const std::string& key, const std::string& where, bool required, int64_t def,
                int64_t min_value) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required)
      throw std::runtime_error(
          fmt::format("{}: key '{}': expected an integer >= {}, got nothing", where, key, min_value));
    return def;
  }
  const std::string expected = fmt::format("an integer >= {}", min_value);
  int64_t v = 0;
  if (it->is_number_integer()) {
    v = it->get<int64_t>();
  } else if (it->is_number_float()) {
    double d = it->get<double>();
    if (d != std::floor(d) || std::fabs(d) > 9e15) bad(where, key, expected, *it);
    v = int64_t(d);
  } else {
    bad(where, key, expected, *it);
  }
  if (v < min_value) bad(where, key, expected, *it);
  return v;
}

double get_num(const json& j, const std::string& key, const std::string& where, double def, bool positive) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  const char* expected = positive ? "a positive number" : "a number";
  if (!it->is_number()) bad(where, key, expected, *it);
  double v = it->get<double>();
  if (!std::isfinite(v) || (positive && !(v > 0))) bad(where, key, expected, *it);
  return v;
}

double float32_value(const json& v, const std::string& key, const std::string& where) {
  // what the kernels take as a float32 (RoPE tables, their attention scaling): a value float32
  // cannot hold would overflow to inf or vanish to 0 there
  if (!v.is_number() || !(v.get<double>() >= double(std::numeric_limits<float>::min())) ||
      !(v.get<double>() <= double(std::numeric_limits<float>::max())))
    bad(where, key, "a positive number between 1.2e-38 and 3.4e38 (float32)", v);
  return v.get<double>();
}

double get_float32(const json& j, const std::string& key, const std::string& where, double def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  return float32_value(*it, key, where);
}

bool get_bool(const json& j, const std::string& key, const std::string& where, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) bad(where, key, "true or false", *it);
  return it->get<bool>();
}

/// Token ids may be an integer, null or (eos in Llama 3.1) a list of integers: first one is used.
int64_t get_token_id(const json& j, const std::string& key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return -1;
  const json* v = &*it;
  if (v->is_array()) {
    if (v->empty()) return -1;
    v = &v->front();
  }
  if (!v->is_number_integer() || v->get<int64_t>() < 0)
    bad(where, key, "a token id (integer >= 0, or a list of them)", *it);
  return v->get<int64_t>();
}

const char* largest_size_key(const ModelConfig& c) {
  const std::pair<const char*, double> sizes[] = {
      {"vocab_size", double(c.vocab_size) / double(1 << 20)},
      {"hidden_size", double(c.hidden_size) / double(1 << 16)},
      {"num_hidden_layers", double(c.num_hidden_layers) / double(1 << 10)},
      {"intermediate_size", double(c.intermediate_size) / double(1 << 18)},
      {"moe_intermediate_size", double(c.moe_intermediate_size) / double(1 << 16)},
      {"num_experts", double(c.num_experts) / double(1 << 12)},
      {"num_attention_heads", double(c.num_attention_heads) / double(1 << 10)},
      {"head_dim", double(c.head_dim) / double(1 << 10)}};
  const auto* top = std::max_element(std::begin(sizes), std::end(sizes),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  return top->first;
}

}  // namespace config_keys

}  // namespace rp
