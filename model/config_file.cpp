// Reading config.json from disk (model/config.cpp reads its JSON): the text's JSON errors,
// a number beyond a double's range (1e400) among them, name the file, the line and, where it can
// be told, the key (base/json_text.hpp).
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/json_text.hpp"
#include "model/config.hpp"

namespace rp {

using nlohmann::json;

ModelConfig load_config_file(const std::string& path) {
  json j;
  try {
    j = parse_json_text(read_json_file(path), path);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());  // as the file's other read errors
  }
  return config_from_json(j, path);
}

}  // namespace rp
