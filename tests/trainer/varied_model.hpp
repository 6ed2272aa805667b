// A test model folder with tiny_model's tokenizer (tests/cli/cli_util.hpp) and varied weights:
// tiny_model's are all equal, so every activation row is constant across features and quantizes
// exactly (FP8 would change nothing to see). Norm weights 1, the others
// 0.3 sin(0.7 i + 0.3 (offset mod 97)), saved in f32 as a Hugging Face checkpoint.
#pragma once
#include <cmath>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/layout.hpp"
#include "roundpipe/checkpoint.hpp"
#include "tests/cli/cli_util.hpp"

namespace rp::clitest {

/// The model of config `c` (tiny_model's, or a variant of it) with varied weights in d / `name`
/// (made once: an existing folder is returned as it is).
inline fs::path varied_model(const fs::path& d, const rp::ModelConfig& c, const std::string& name) {
  const fs::path base = tiny_model(d), out = d / name;
  if (fs::exists(out)) return out;
  const rp::ModelLayout m = rp::make_layout(c);
  std::vector<std::vector<float>> w;
  std::vector<const float*> ptrs;
  for (const auto& g : m.groups) {
    w.emplace_back(size_t(g.numel));
    for (const auto& t : g.tensors)
      for (int64_t i = 0; i < t.numel(); ++i)
        w.back()[size_t(t.offset + i)] =
            t.shape.size() == 1 ? 1.0f
                                : 0.3f * float(std::sin(0.7 * double(i) + 0.3 * double(t.offset % 97)));
    ptrs.push_back(w.back().data());
  }
  std::ifstream tf(base / "tokenizer.json");
  rp::save_hf_checkpoint(out.string(), m, ptrs, nlohmann::json::parse(tf), "", rp::DType::f32);
  return out;
}

/// tiny_model's config (its architecture, read from its folder in d).
inline rp::ModelConfig tiny_config_of(const fs::path& d) {
  return rp::load_config_file((tiny_model(d) / "config.json").string());
}

}  // namespace rp::clitest
