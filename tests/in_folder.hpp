// A test's working directory and $HOME, set for its lifetime and put back after it (the output
// folder checks refuse both, so their tests move them somewhere harmless).
#pragma once
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace rp::testing {

struct InFolder {
  std::filesystem::path old_cwd = std::filesystem::current_path();
  std::string old_home = getenv("HOME") ? getenv("HOME") : "";
  InFolder(const std::filesystem::path& cwd, const std::filesystem::path& home) {
    std::filesystem::current_path(cwd);
    setenv("HOME", home.c_str(), 1);
  }
  ~InFolder() {
    std::filesystem::current_path(old_cwd);
    setenv("HOME", old_home.c_str(), 1);
  }
  InFolder(const InFolder&) = delete;
  InFolder& operator=(const InFolder&) = delete;
};

}  // namespace rp::testing
