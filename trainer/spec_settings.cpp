// Experiment specs read from a file with command-line settings (roundpipe/spec.hpp load_spec,
// `--set KEY=VALUE`): the settings applied to the file's JSON before it is checked, and an
// error of a key a setting wrote named by that setting instead of the file.
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "base/error_text.hpp"
#include "base/input_file.hpp"
#include "base/json_fields.hpp"
#include "base/json_text.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

namespace {

/// The spec file's JSON; an error names the file, the line and the column or key (parse_json_text).
nlohmann::json read_spec_json(const std::string& path) {
  if (path.empty()) throw std::invalid_argument("the spec file name is empty (expected a JSON spec file)");
  // an open error gives its reason: a typo (No such file or directory) is not a permission problem
  const std::string text = read_input_file(path, "a JSON file", " the spec file");
  JsonTextOptions opt;
  opt.unique_keys = true;  // the last of two would win silently
  return parse_json_text(text, path, opt);
}

/// How an error quotes the dotted key `k`: its last part shortened as excerpt shortens a long
/// one ("kkk... (81 bytes)"), the parts before it whole.
std::string key_as_quoted(const std::string& k) {
  const size_t dot = k.rfind('.'), from = dot == std::string::npos ? 0 : dot + 1;
  return k.substr(0, from) + excerpt(k.substr(from));
}

/// The setting an error of the merged spec comes from: the last one whose key (or a key
/// inside it, or the object holding it) the message quotes, whole or as a long key is quoted
/// shortened; null when the file's own keys are at fault. The key an unknown key's error
/// suggests ("; did you mean 'workers'?") is no key at fault: a --set of it does not count.
const SpecSetting* setting_named_by(const std::string& message, const std::vector<SpecSetting>& settings) {
  const std::string msg = message.substr(0, message.find("; did you mean '"));
  const auto quotes = [&](const std::string& k, const char* end) {
    return msg.find("'" + k + end) != std::string::npos ||
           msg.find("'" + key_as_quoted(k) + end) != std::string::npos;
  };
  for (auto it = settings.rbegin(); it != settings.rend(); ++it) {
    const std::string& k = it->key;
    // a list entry's key counts too ("key 'data[1].weight'" after --set data=[...])
    if (quotes(k, "'") || msg.find("'" + k + ".") != std::string::npos ||
        msg.find("'" + k + "[") != std::string::npos)
      return &*it;
    // a value set inside an object the file gave another type ("key 'lora': expected an object")
    for (size_t dot = k.find('.'); dot != std::string::npos; dot = k.find('.', dot + 1))
      if (quotes(k.substr(0, dot), "'")) return &*it;
  }
  return nullptr;
}

/// The objects on the way to the dotted `key` that `spec` does not have yet ("frozen_tier" for
/// frozen_tier.ring_gib in a spec without frozen_tier), outermost first.
std::vector<std::string> absent_objects(const nlohmann::json& spec, const std::string& key) {
  std::vector<std::string> out;
  const nlohmann::json* at = &spec;
  size_t from = 0;
  for (size_t dot = key.find('.'); dot != std::string::npos; from = dot + 1, dot = key.find('.', from)) {
    const std::string part = key.substr(from, dot - from);
    if (at && at->is_object() && at->contains(part)) {
      at = &at->at(part);
    } else {
      at = nullptr;
      out.push_back(key.substr(0, dot));
    }
  }
  return out;
}

/// Throws when the dotted `key` has an empty part ("steps.", ".steps", "lora..r"): such a key
/// would set a key named "" or walk into the value before the dot as if it were an object.
void check_key_path(const std::string& origin, const std::string& key) {
  if (!key.empty() && key.front() != '.' && key.back() != '.' && key.find("..") == std::string::npos) return;
  throw std::invalid_argument(
      fmt::format("{}: key '{}' has an empty part (a dot at its start or end, or two in a row); expected a "
                  "key like seq_len or lora.r",
                  origin, excerpt(key)));
}

}  // namespace

SpecSetting parse_set_option(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw std::invalid_argument(fmt::format(
        "--set {}: expected KEY=VALUE (a spec key, nested keys with dots: lora.r=8)", excerpt(text)));
  SpecSetting s;
  s.key = text.substr(0, eq);
  s.value = text.substr(eq + 1);
  s.origin = "--set " + excerpt(text);  // errors quote a long value shortened
  check_key_path(s.origin, s.key);
  return s;
}

void apply_spec_settings(nlohmann::json& spec, const std::vector<SpecSetting>& settings) {
  for (const SpecSetting& s : settings) {
    check_key_path(s.origin, s.key);
    nlohmann::json value = s.value;  // a string unless it parses as JSON
    if (!s.as_string) {
      // a number JSON cannot hold (1e400) or a key given twice names the key path inside the value
      JsonTextOptions opt;
      opt.unique_keys = true;
      opt.key_prefix = s.key;
      opt.lines = false;
      if (auto parsed = parse_json_value(s.value, s.origin, opt)) value = std::move(*parsed);
    }
    if (!spec.is_object()) return;  // spec_from_json names the file's top level
    nlohmann::json* at = &spec;
    size_t from = 0;
    for (;;) {
      const size_t dot = s.key.find('.', from);
      const std::string part = s.key.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
      if (dot == std::string::npos) {
        if (value.is_null()) at->erase(part);  // KEY=null: the key as if the spec had not given it
        else (*at)[part] = value;
        break;
      }
      if (value.is_null() && (!at->contains(part) || !(*at)[part].is_object())) break;  // nothing to remove
      nlohmann::json& next = (*at)[part];  // an absent object is created
      if (next.is_null()) next = nlohmann::json::object();
      if (!next.is_object())
        throw std::invalid_argument(fmt::format("{}: key '{}' holds {}, not an object with keys", s.origin,
                                                s.key.substr(0, dot), excerpt(json_text_of(next))));
      at = &next;
      from = dot + 1;
    }
  }
}

TrainSpec spec_from_json(nlohmann::json j, const std::string& where,
                         const std::vector<SpecSetting>& settings) {
  std::vector<std::pair<std::string, const SpecSetting*>> made;  // the objects the settings made
  for (const SpecSetting& s : settings) {
    for (const std::string& o : absent_objects(j, s.key)) made.emplace_back(o, &s);
    apply_spec_settings(j, {s});
  }
  try {
    TrainSpec spec = spec_from_json(j, where);
    spec.settings = settings;
    return spec;
  } catch (const std::invalid_argument& e) {
    // "<where>: key 'lora.r': ..." -> "--set lora.r=0: key 'lora.r': ..." when a setting wrote it
    const std::string msg = e.what(), head = where + ": ";
    const SpecSetting* s = setting_named_by(msg, settings);
    // a key missing from an object a setting made ("--set frozen_tier.ring_gib=2" without a path)
    for (const auto& [o, by] : made)
      if (!s && msg.find("'" + o + ".") != std::string::npos) s = by;
    if (!s || msg.rfind(head, 0) != 0) throw;
    throw std::invalid_argument(s->origin + ": " + msg.substr(head.size()));
  }
}

TrainSpec load_spec(const std::string& path, const std::vector<SpecSetting>& settings) {
  return spec_from_json(read_spec_json(path), path, settings);
}

TrainSpec load_spec(const std::string& path) { return load_spec(path, {}); }

}  // namespace rp
