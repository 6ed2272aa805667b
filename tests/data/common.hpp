// Shared helpers for the data-layer tests.
#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "data/chat_template.hpp"
#include "data/tokenizer.hpp"

namespace rp::test {

inline std::string fixture(const std::string& rel) { return std::string(RP_FIXTURES_DIR) + "/" + rel; }

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// The Qwen3 tokenizer fixture, loaded once per test program (loading takes ~1 s).
inline const Tokenizer& qwen() {
  static const Tokenizer t = Tokenizer::from_file(fixture("qwen3-tokenizer/tokenizer.json"));
  return t;
}

/// The decoded text of each maximal run of masked tokens (what a chat example trains on).
inline std::vector<std::string> masked_runs(const Tokenizer& t, const RenderedChat& r) {
  std::vector<std::string> runs;
  std::vector<int32_t> cur;
  for (size_t i = 0; i <= r.ids.size(); ++i) {
    if (i < r.ids.size() && r.loss_mask[i]) {
      cur.push_back(r.ids[i]);
    } else if (!cur.empty()) {
      runs.push_back(t.decode(cur));
      cur.clear();
    }
  }
  return runs;
}

/// A fresh temporary directory for one test, removed by the destructor.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("rp_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& content) const {
    auto p = path / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

}  // namespace rp::test
