// Reading config.json from disk (model/config.cpp reads its JSON): the text's JSON errors,
// a number beyond a double's range (1e400) among them, name the file and, where it can be told,
// the key.
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/config.hpp"

namespace rp {

using nlohmann::json;

namespace {

/// config.json's text as JSON. nlohmann::json refuses a number beyond a double (1e400: a
/// json::out_of_range, not a parse_error); that refusal names the key path it was read under.
json parse_config_text(const std::string& text, const std::string& path) {
  std::vector<std::string> keys;  // per open object or list: the key being read ("" in a list)
  const json::parser_callback_t track = [&](int, json::parse_event_t ev, json& v) {
    if (ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start)
      keys.emplace_back();
    if ((ev == json::parse_event_t::object_end || ev == json::parse_event_t::array_end) && !keys.empty())
      keys.pop_back();
    if (ev == json::parse_event_t::key && !keys.empty()) keys.back() = v.get<std::string>();
    return true;
  };
  try {
    return json::parse(text, track);
  } catch (const json::out_of_range& e) {
    std::string key;
    for (const auto& k : keys)
      if (!k.empty()) key += (key.empty() ? "" : ".") + k;
    const std::string what = e.what();
    const auto from = what.find("parsing '"), to = what.rfind('\'');
    if (key.empty() || from == std::string::npos || to <= from + 9)
      throw std::runtime_error(fmt::format("{}: invalid JSON: {}", path, what));
    throw std::runtime_error(
        fmt::format("{}: key '{}': expected a number within a double's range (about "
                    "1.8e308), got {}",
                    path, key, what.substr(from + 9, to - from - 9)));
  } catch (const json::exception& e) {
    throw std::runtime_error(fmt::format("{}: invalid JSON: {}", path, e.what()));
  }
}

}  // namespace

ModelConfig load_config_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(fmt::format("{}: cannot open", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return config_from_json(parse_config_text(ss.str(), path), path);
}

}  // namespace rp
