// Typed fields of a JSON object, read with the one error format of every file reader:
//   "<where>: key '<prefix><key>': expected <what>, got <value>"
// where <value> is the JSON text of the value found, or "nothing" when the key is absent,
// and for unknown keys
//   "<where>: unknown key '<prefix><key>' (known keys: a, b, c)",
// with "; did you mean '<prefix><near>'?" after the key when one known key is a near miss
// (nearest_key).
// <where> names the file (or the flag) the object came from; <prefix> is the path of a
// nested object ("optimizer."). Used by the experiment spec, the trainer state and the
// profile readers. A reader told where the keys stand (with_lines) names the key's line too:
// "<file>:<line><rest of where>: key ...".
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "base/json_text.hpp"

namespace rp {

/// The known key that `key` most likely misspells: the one nearest by edit distance (insertions,
/// deletions, substitutions and swaps of two neighbours each count 1), when that distance is at
/// most 2, smaller than both names' lengths, and no other known key is as near; else "".
std::string nearest_key(const std::string& key, const std::set<std::string>& known);

/// "; did you mean '<prefix><near>'?" for nearest_key(key, known), "" when none (how every
/// unknown-key error of a JSON reader suggests it, right after the key it quotes).
std::string did_you_mean(const std::string& key, const std::set<std::string>& known,
                         const std::string& prefix = "");

/// `v` as JSON text for an error message to quote (through excerpt, which escapes what is not
/// UTF-8): a string holding bytes that are not UTF-8 (a --set value: raw command-line bytes) is
/// quoted as it is, where nlohmann's dump() throws a type_error naming no key.
std::string json_text_of(const nlohmann::json& v);

class JsonFields {
 public:
  /// The exception type the reader throws (both carry the same one-line message).
  enum class Error { invalid_argument, runtime_error };

  /// Reads `obj` (which must outlive the reader; a non-object reads as having no keys).
  JsonFields(const nlohmann::json& obj, std::string where, std::string prefix = "",
             Error error = Error::invalid_argument);

  /// Errors about a key name its line, "<file>:<line><rest>" for a `where` of "<file><rest>",
  /// where `lines` (parse_json_text's key_lines, which must outlive the reader; null: none)
  /// holds the key under `pointer`, this object's JSON pointer ("" at the top).
  JsonFields& with_lines(const JsonKeyLines* lines, std::string file, std::string pointer);
  /// `where`, with the line of `key` when with_lines knows it.
  std::string where_of(const std::string& key) const;

  const nlohmann::json& json() const { return j_; }
  const std::string& where() const { return where_; }
  bool has(const std::string& key) const;
  /// The value of `key` (null when absent).
  const nlohmann::json& at(const std::string& key) const;

  /// Throws "<where>: key '<prefix><key>': expected <expected>, got <the value, or nothing>".
  [[noreturn]] void fail(const std::string& key, const std::string& expected) const;
  /// The same with an explicit `got` (a value checked after it was read).
  [[noreturn]] void fail(const std::string& key, const std::string& expected,
                         const nlohmann::json& got) const;
  /// Throws "<where>: <what>".
  [[noreturn]] void fail_with(const std::string& what) const;
  /// Throws the unknown-key error for the first key of the object not in `known`.
  void allow_only(const std::set<std::string>& known) const;
  /// The same, where `aliases` maps names another program gives keys (`source`'s names:
  /// "learning_rate" in "Hugging Face") to the key path they stand for here ("optimizer.lr"): a
  /// key that is, or nearly is, one of them suggests that path ("; did you mean 'optimizer.lr'
  /// (Hugging Face's learning_rate)?") unless a known key is nearer.
  void allow_only(const std::set<std::string>& known, const std::map<std::string, std::string>& aliases,
                  const std::string& source) const;

  // ---- optional fields: absent -> `out` unchanged and false; present -> checked ----
  /// true or false ("expected true or false").
  bool optional(const char* key, bool& out) const;
  /// A JSON string ("expected a string").
  bool optional(const char* key, std::string& out) const;
  /// Any JSON number ("expected a number").
  bool optional(const char* key, double& out) const;
  bool optional(const char* key, float& out) const;
  /// A JSON integer in T's range ("expected an integer", "an integer <= <max>", "an integer
  /// >= <min>"; unsigned T: "an integer >= 0").
  template <class T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) bool optional(const char* key, T& out) const {
    if constexpr (std::is_signed_v<T>) {
      int64_t v = 0;
      if (!read_signed(key, v, std::numeric_limits<T>::min(), std::numeric_limits<T>::max())) return false;
      out = T(v);
    } else {
      uint64_t v = 0;
      if (!read_unsigned(key, v, std::numeric_limits<T>::max())) return false;
      out = T(v);
    }
    return true;
  }

  // ---- required fields: absent -> "got nothing" ----
  /// An integer >= min ("expected an integer >= <min>"; "an integer" with the default min).
  int64_t integer(const char* key, int64_t min = std::numeric_limits<int64_t>::min()) const;
  /// An integer >= 0 read as unsigned ("expected an integer >= 0").
  uint64_t unsigned_integer(const char* key) const;
  double number(const char* key) const;
  bool boolean(const char* key) const;
  std::string string(const char* key) const;
  /// An object / an array ("expected an object" / "expected an array").
  const nlohmann::json& object(const char* key) const;
  const nlohmann::json& array(const char* key) const;
  /// The key must hold exactly `value` ("expected <value as JSON>").
  void require_value(const char* key, const nlohmann::json& value) const;
  /// A reader of the nested object `key` (prefix "<prefix><key>."); not an object ->
  /// "expected an object".
  JsonFields nested(const char* key) const;

 private:
  bool read_signed(const char* key, int64_t& out, int64_t min, int64_t max) const;
  bool read_unsigned(const char* key, uint64_t& out, uint64_t max) const;
  [[noreturn]] void raise(const std::string& msg) const;

  const nlohmann::json& j_;
  std::string where_, prefix_;
  Error error_;
  const JsonKeyLines* lines_ = nullptr;
  std::string file_, pointer_;
};

}  // namespace rp
