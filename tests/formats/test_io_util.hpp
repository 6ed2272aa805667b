// Test helpers for the model I/O tests: a minimal GGUF writer (independent of the reader
// under test), temporary folders and small utilities.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace rp::test {

namespace fs = std::filesystem;

/// A fresh temporary folder, removed with everything in it on destruction.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() /
           ("rp_io_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  o.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// Builds GGUF v2/v3 files byte by byte, following the published format description.
class GgufBuilder {
 public:
  template <class T>
  static void put(std::vector<uint8_t>& b, T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
  }
  static void put_str(std::vector<uint8_t>& b, const std::string& s) {
    put<uint64_t>(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void key(const std::string& k, uint32_t type) {
    put_str(kv_, k);
    put<uint32_t>(kv_, type);
    ++n_kv_;
  }
  void u32(const std::string& k, uint32_t v) { key(k, 4), put(kv_, v); }
  void i32(const std::string& k, int32_t v) { key(k, 5), put(kv_, v); }
  void u64(const std::string& k, uint64_t v) { key(k, 10), put(kv_, v); }
  void f32(const std::string& k, float v) { key(k, 6), put(kv_, v); }
  void f64(const std::string& k, double v) { key(k, 12), put(kv_, v); }
  void boolean(const std::string& k, bool v) { key(k, 7), put<uint8_t>(kv_, v); }
  void str(const std::string& k, const std::string& v) { key(k, 8), put_str(kv_, v); }
  void str_array(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9);
    put<uint32_t>(kv_, 8);
    put<uint64_t>(kv_, v.size());
    for (auto& s : v) put_str(kv_, s);
  }
  void i32_array(const std::string& k, const std::vector<int32_t>& v) {
    key(k, 9);
    put<uint32_t>(kv_, 5);
    put<uint64_t>(kv_, v.size());
    for (auto x : v) put(kv_, x);
  }
  /// Raw bytes appended as a key of given type (for odd values in tests).
  void raw(const std::string& k, uint32_t type, const std::vector<uint8_t>& bytes) {
    key(k, type);
    kv_.insert(kv_.end(), bytes.begin(), bytes.end());
  }
  /// `ne` in GGUF order (ne[0] innermost); `data` already in the type's block layout.
  void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, std::vector<uint8_t> data) {
    const uint64_t bytes = data.size();
    tensors_.push_back({name, std::move(ne), type, std::move(data), bytes});
  }
  /// A tensor of `bytes` bytes whose data the caller writes after build_header's bytes, at the
  /// offset build_header gives it (a large file written in pieces).
  void tensor_declared(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t bytes) {
    tensors_.push_back({name, std::move(ne), type, {}, bytes});
  }
  void tensor_f32(const std::string& name, std::vector<uint64_t> ne, const std::vector<float>& v) {
    std::vector<uint8_t> d(v.size() * 4);
    std::memcpy(d.data(), v.data(), d.size());
    tensor(name, std::move(ne), 0, std::move(d));
  }
  std::vector<uint8_t> build(uint32_t version = 3, uint64_t alignment = 32) const {
    std::vector<uint64_t> offs;
    std::vector<uint8_t> b = build_header(version, alignment, offs);
    const size_t base = b.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      b.resize(base + offs[i], 0);
      b.insert(b.end(), tensors_[i].data.begin(), tensors_[i].data.end());
    }
    return b;
  }
  /// The file up to its data section (padded to `alignment`); `offs`: each tensor's offset in
  /// the data section.
  std::vector<uint8_t> build_header(uint32_t version, uint64_t alignment, std::vector<uint64_t>& offs) const {
    std::vector<uint8_t> b = {'G', 'G', 'U', 'F'};
    put<uint32_t>(b, version);
    put<uint64_t>(b, tensors_.size());
    put<uint64_t>(b, n_kv_);
    b.insert(b.end(), kv_.begin(), kv_.end());
    uint64_t off = 0;
    offs.clear();
    for (const auto& t : tensors_) {
      put_str(b, t.name);
      put<uint32_t>(b, uint32_t(t.ne.size()));
      for (auto d : t.ne) put<uint64_t>(b, d);
      put<uint32_t>(b, t.type);
      put<uint64_t>(b, off);
      offs.push_back(off);
      off += (t.bytes + alignment - 1) / alignment * alignment;
    }
    while (b.size() % alignment) b.push_back(0);
    return b;
  }

 private:
  struct T {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
    uint64_t bytes = 0;
  };
  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

inline std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

/// numpy-style permute of convert_hf_to_gguf.py, written as a generic 4-D transpose:
/// w.reshape(n_head, 2, rows/n_head/2, cols).swapaxes(1, 2).reshape(rows, cols).
inline std::vector<float> llama_permute(const std::vector<float>& w, int64_t rows, int64_t cols,
                                        int64_t n_head) {
  const int64_t dims[4] = {n_head, 2, rows / n_head / 2, cols};
  std::vector<float> out(w.size());
  // out has dims {n_head, rows/n_head/2, 2, cols}; out[a][c][b][d] = in[a][b][c][d]
  int64_t o = 0;
  for (int64_t a = 0; a < dims[0]; ++a)
    for (int64_t c = 0; c < dims[2]; ++c)
      for (int64_t b = 0; b < dims[1]; ++b)
        for (int64_t d = 0; d < dims[3]; ++d)
          out[size_t(o++)] = w[size_t(((a * dims[1] + b) * dims[2] + c) * dims[3] + d)];
  return out;
}

}  // namespace rp::test
