// `roundpipe plan`'s inputs read from text: byte sizes ("24GiB") and a model's shape from a
// folder, its config.json or a .gguf's metadata (cli/plan.hpp).
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/plan.hpp"
#include "formats/gguf.hpp"
#include "model/config.hpp"

namespace fs = std::filesystem;

namespace rp {

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    throw UsageError(fmt::format("{}: '{}' is not a byte size (e.g. 24GiB)", what, text));
  }
  std::string unit = s.substr(used);
  for (auto& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  double mul = 0;
  const char* prefixes = "kmgt";
  if (unit.empty() || unit == "b") {
    mul = 1;
  } else if (const char* p = std::strchr(prefixes, unit[0]); p && *p) {
    const int e = int(p - prefixes) + 1;
    const std::string rest = unit.substr(1);
    if (rest == "ib" || rest.empty()) mul = std::pow(1024.0, e);
    else if (rest == "b") mul = std::pow(1000.0, e);
  }
  if (mul == 0 || !(v >= 0) || !std::isfinite(v * mul) || v * mul > 9e18)
    throw UsageError(fmt::format("{}: '{}' is not a byte size (e.g. 24GiB, 512MB, 1e10)", what, text));
  return int64_t(std::llround(v * mul));
}

ModelShape load_model_shape(const std::string& path, std::string* description) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "config.json").string();
  if (!fs::exists(file, ec)) throw std::runtime_error(file + ": no such file");
  // the model's one description (ModelConfig), read by its own parsers; the shape is a view of it
  ModelConfig c;
  std::string kind;
  if (fs::path(file).extension() == ".gguf") {
    GgufFile g(file);
    c = config_from_gguf(g);
    kind = "gguf " + g.get_string("general.architecture");
  } else {
    try {
      c = load_config_file(file);  // dense, Qwen3-MoE ("qwen3_moe"), GPT-OSS, ...
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(e.what());
    }
    kind = c.architecture;
  }
  ModelShape m = model_shape_from_config(c);
  m.validate(file);
  // The partitioner searches every contiguous range of layers (O(L^2) candidates, each
  // memoised): 1024 decoder layers is 8x the deepest released dense model (126).
  if (m.num_layers > kMaxPlanLayers)
    throw std::runtime_error(
        fmt::format("{}: num_hidden_layers {} exceeds the {} decoder layers the planner "
                    "handles",
                    file, m.num_layers, kMaxPlanLayers));
  if (description) {
    const double total = double(c.num_parameters()), active = double(c.num_active_parameters());
    *description = fmt::format(
        "{} ({}): {} layers, hidden {}, {} q / {} kv heads x {}, {}vocab {}, "
        "{:.2f} B parameters",
        path, kind, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim,
        m.num_experts > 0 ? fmt::format("{} experts top-{} x FFN {} in {} sparse layers, ", m.num_experts,
                                        m.experts_per_token, m.moe_intermediate_size, m.num_moe_layers())
                          : fmt::format("FFN {}, ", m.intermediate_size),
        m.vocab_size, total / 1e9);
    if (m.num_experts > 0) *description += fmt::format(" in total, {:.2f} B active per token", active / 1e9);
  }
  return m;
}

}  // namespace rp
