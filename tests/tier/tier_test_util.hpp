// Shared by the tier/ tests: a scratch folder per test in the build tree, a deterministic
// byte pattern for entries, and small file helpers.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "tier/cache_file.hpp"

/// EXPECT that string s contains `part`, printing both when it does not.
#define EXPECT_HAS(s, part) \
  EXPECT_NE(std::string(s).find(part), std::string::npos) << (s) << "\n  should contain: " << (part)

namespace rp::tier::testing {

namespace fs = std::filesystem;

/// A fresh folder "<build>/tier_tests/<pid>_<test>", removed when the test ends.
struct Scratch {
  fs::path dir;
  Scratch() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name();
    std::replace(name.begin(), name.end(), '/',
                 '_');  // parameterised tests: "Engines/ByEngine", ".../io_uring"
    dir = fs::path(RP_BUILD_DIR) / "tier_tests" / name;
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  /// The names in the folder, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

/// Byte i of entry e under pattern `seed`: no two entries or seeds alike, no period of 4096.
inline std::byte pattern(size_t e, uint64_t i, unsigned seed = 1) {
  return std::byte(uint8_t((i * 131u + (i >> 8) * 7u + e * 29u + seed * 101u) & 0xffu));
}

inline CacheFill pattern_fill(unsigned seed = 1) {
  return [seed](size_t e, uint64_t off, std::span<std::byte> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = pattern(e, off + i, seed);
  };
}

/// The index of the first byte of `n` at `p` that differs from the pattern, or n when none.
inline size_t first_mismatch(const std::byte* p, size_t e, uint64_t offset, size_t n, unsigned seed = 1) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != pattern(e, offset + i, seed)) return i;
  return n;
}

/// Entries of odd sizes: within a block, exactly a block, empty, one byte, several blocks.
/// Their offsets (header 4096 bytes): 4096, 12288, 16384, 16384, 20480; the file 36864 bytes.
inline std::vector<CacheEntrySpec> odd_specs() {
  return {{"layers.0.attn", 5000},
          {"layers.0.mlp", 4096},
          {"empty", 0},
          {"layers.1.attn", 1},
          {"lm_head", 12305}};
}

/// Small chunks so that an entry takes several fill calls, and checksum blocks of 8192 bytes
/// (lm_head has two: bytes 0..8192 and 8192..12305).
inline CacheBuildOptions small_chunks() {
  CacheBuildOptions o;
  o.chunk_bytes = 8192;
  o.checksum_block_bytes = 8192;
  return o;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

/// XORs byte `offset` of the file with 0x5a.
inline void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(std::streamoff(offset));
  char c = 0;
  f.get(c);
  f.seekp(std::streamoff(offset));
  f.put(char(c ^ 0x5a));
}

}  // namespace rp::tier::testing
