#include "formats/safetensors.hpp"

#include "base/atomic_file.hpp"
#include "base/input_file.hpp"
#include "base/json_text.hpp"
#include "formats/parallel_quantize.hpp"
#include "model/error_text.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace {

/// Bytes per element of a safetensors dtype, 0 when unknown.
uint64_t st_dtype_size(const std::string& d) {
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(one_line(fmt::format("{}: {}", path_, what)));
  };
  // O_NONBLOCK: a named pipe's open returns at once (without it, one that no program writes to
  // waited forever) and is refused below; a regular file is read at offsets either way
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(S_ISDIR(st.st_mode) ? "is a folder, expected a safetensors file"
                             : "not a regular file (a device, FIFO or socket)");
  }
  size_ = uint64_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail(fmt::format("truncated file: {} bytes, a safetensors header needs at least 8", size_));
  }
  file_ = PositionalFile(fd, size_, path_);  // kept open: tensors are read when asked for
  uint64_t n;
  file_.read(0, 8, &n, "header length");
  if (n > size_ - 8)
    fail(fmt::format("truncated file: header of {} bytes does not fit in {} bytes", n, size_));
  if (n > (uint64_t(100) << 20)) fail(fmt::format("header of {} bytes is too large", n));
  std::string text(size_t(n), '\0');
  file_.read(8, n, text.data(), "header");
  data_start_ = 8 + n;
  const uint64_t data_size = size_ - data_start_;
  json h;
  try {
    h = json::parse(text);
  } catch (const json::exception& e) {
    fail(fmt::format("corrupt header: invalid JSON ({})", json_error_reason(e)));
  }
  if (!h.is_object()) fail("corrupt header: not a JSON object");
  metadata_ = json::object();
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("corrupt header: __metadata__ is not an object");
      metadata_ = v;
      continue;
    }
    auto bad = [&](const std::string& what) { fail(fmt::format("tensor '{}': {}", excerpt(name), what)); };
    if (!v.is_object()) bad("header entry is not an object");
    SafetensorsEntry e;
    e.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) bad("missing dtype");
    e.dtype = dt->get<std::string>();
    const uint64_t es = st_dtype_size(e.dtype);
    if (es == 0) bad(fmt::format("unknown dtype '{}'", excerpt(e.dtype)));
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) bad("missing shape");
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40))
        bad(fmt::format("invalid shape {}", excerpt(sh->dump())));
      e.shape.push_back(d.get<int64_t>());
      if (d.get<uint64_t>() != 0 && numel > (uint64_t(1) << 50) / d.get<uint64_t>())
        bad(fmt::format("shape {} is too large", excerpt(sh->dump())));
      numel *= d.get<uint64_t>();
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      bad("missing or invalid data_offsets");
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.begin > e.end) bad(fmt::format("data_offsets [{}, {}] are reversed", e.begin, e.end));
    if (e.end - e.begin != numel * es)
      bad(fmt::format("data_offsets [{}, {}] hold {} bytes, shape {} of {} needs {}", e.begin, e.end,
                      e.end - e.begin, excerpt(sh->dump()), e.dtype, numel * es));
    if (e.end > data_size)
      fail(fmt::format("truncated file: tensor '{}' ends at data offset {}, only {} data bytes",
                       excerpt(name), e.end, data_size));
    entries_.push_back(std::move(e));
  }
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  for (size_t i = 1; i < entries_.size(); ++i)
    if (entries_[i].begin < entries_[i - 1].end)
      fail(fmt::format("corrupt header: tensors '{}' and '{}' overlap", excerpt(entries_[i - 1].name),
                       excerpt(entries_[i].name)));
}

SafetensorsFile::~SafetensorsFile() = default;

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

void SafetensorsFile::read_bytes(const SafetensorsEntry& e, uint64_t at, uint64_t n, void* dst) const {
  if (at > e.end - e.begin || n > e.end - e.begin - at)
    throw std::logic_error(
        fmt::format("{}: tensor '{}': bytes {}+{} outside its {}", path_, e.name, at, n, e.end - e.begin));
  file_.read(data_start_ + e.begin + at, n, dst, fmt::format("tensor '{}'", e.name));
}

void SafetensorsFile::check_float_dtype(const SafetensorsEntry& e) const {
  SafetensorsEntry empty = e;  // read_f32's dtype dispatch on no elements: its error, or nothing
  empty.shape = {0};
  read_f32(empty);
}

HostTensor SafetensorsFile::read_f32(const SafetensorsEntry& e) const {
  HostTensor t;
  t.shape = e.shape;
  t.data = read_f32_range(e, 0, e.numel());
  return t;
}

std::vector<float> SafetensorsFile::read_f32_range(const SafetensorsEntry& e, int64_t first,
                                                   int64_t n) const {
  const bool f32 = e.dtype == "F32", half = e.dtype == "BF16" || e.dtype == "F16", u8 = e.dtype == "U8";
  if (!f32 && !half && !u8)
    throw std::runtime_error(
        fmt::format("{}: tensor '{}': dtype {} cannot be read as floats (F32, "
                    "F16, BF16, U8 only)",
                    path_, e.name, e.dtype));
  if (first < 0 || n < 0 || first > e.numel() || n > e.numel() - first)
    throw std::logic_error(
        fmt::format("{}: tensor '{}': elements {}+{} outside its {}", path_, e.name, first, n, e.numel()));
  std::vector<float> out(static_cast<size_t>(n));
  const uint64_t es = f32 ? 4 : half ? 2 : 1;
  if (f32) {
    if (n > 0) read_bytes(e, uint64_t(first) * 4, uint64_t(n) * 4, out.data());
    return out;
  }
  const bool bf = e.dtype == "BF16";
  file_.read_chunks(data_start_ + e.begin + uint64_t(first) * es, uint64_t(n) * es, es,
                    fmt::format("tensor '{}'", e.name), [&](const uint8_t* p, uint64_t at, uint64_t k) {
                      float* y = out.data() + at;
                      if (u8) {  // MXFP4 blocks and scales (formats/gpt_oss_hf.hpp): bytes, exact in fp32
                        for (uint64_t i = 0; i < k; ++i) y[i] = float(p[i]);
                        return;
                      }
                      for_ranges_parallel(int64_t(k), 1, [&](int64_t lo, int64_t hi) {
                        for (int64_t i = lo; i < hi; ++i) {
                          uint16_t h;
                          std::memcpy(&h, p + 2 * i, 2);
                          y[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
                        }
                      });
                    });
  return out;
}

namespace {

void open_index(const std::string& index_path, SafetensorsSet& out) {
  // a named pipe, a folder or a device is refused in one line (read_json_file), and a syntax
  // error names the line and column, not the JSON library's text
  const json idx = parse_json_text(read_json_file(index_path), index_path);
  auto wm = idx.is_object() ? idx.find("weight_map") : idx.end();
  if (!idx.is_object() || wm == idx.end() || !wm->is_object())
    throw std::runtime_error(fmt::format("{}: key 'weight_map': expected an object", index_path));
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string())
      throw std::runtime_error(
          fmt::format("{}: key 'weight_map.{}': expected a file name", index_path, excerpt(it.key())));
    const std::string shard = it->get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "..")
      throw std::runtime_error(fmt::format("{}: key 'weight_map.{}': bad shard name '{}'", index_path,
                                           excerpt(it.key()), excerpt(shard)));
    by_shard[shard].push_back(it.key());
  }
  const fs::path base = fs::path(index_path).parent_path();
  for (const auto& [shard, names] : by_shard) {
    out.files.push_back(std::make_unique<SafetensorsFile>((base / shard).string()));
    const SafetensorsFile& f = *out.files.back();
    for (const auto& name : names) {
      const SafetensorsEntry* e = f.find(name);
      if (!e)
        throw std::runtime_error(
            fmt::format("{}: tensor '{}' (listed in {}) is missing", f.path(), excerpt(name), index_path));
      f.check_float_dtype(*e);
      out.tensors[name] = {&f, e};
    }
  }
}

}  // namespace

SafetensorsSet open_safetensors(const std::string& path) {
  SafetensorsSet out;
  std::error_code ec;
  std::string p = path;
  if (fs::is_directory(p, ec)) {
    const fs::path d(p);
    if (fs::exists(d / "model.safetensors.index.json", ec)) {
      p = (d / "model.safetensors.index.json").string();
    } else if (fs::exists(d / "model.safetensors", ec)) {
      p = (d / "model.safetensors").string();
    } else {
      throw std::runtime_error(fmt::format("{}: no model.safetensors or model.safetensors.index.json", path));
    }
  }
  if (p.size() >= 5 && p.compare(p.size() - 5, 5, ".json") == 0) {
    open_index(p, out);
    return out;
  }
  out.files.push_back(std::make_unique<SafetensorsFile>(p));
  const SafetensorsFile& f = *out.files.back();
  for (const auto& e : f.entries()) {
    f.check_float_dtype(e);
    out.tensors[e.name] = {&f, &e};
  }
  return out;
}

std::map<std::string, HostTensor> load_safetensors(const std::string& path) {
  const SafetensorsSet set = open_safetensors(path);
  std::map<std::string, HostTensor> out;
  for (const auto& [name, w] : set.tensors) out[name] = w.file->read_f32(*w.entry);
  return out;
}

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

}  // namespace

void save_safetensors(const std::string& path, const std::vector<TensorRef>& tensors, DType dtype,
                      const nlohmann::json& metadata) {
  if (dtype == DType::i32) throw std::invalid_argument("save_safetensors: dtype i32 is not supported");
  auto fail = [&](const std::string& what) { throw std::runtime_error(fmt::format("{}: {}", path, what)); };
  const char* st_dtype = dtype == DType::f32 ? "F32" : dtype == DType::bf16 ? "BF16" : "F16";
  const uint64_t es = dtype_size(dtype);
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  if (metadata.is_object())
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      if (!it->is_string()) fail(fmt::format("metadata '{}' is not a string", it.key()));
      meta[it.key()] = it->get<std::string>();
    }
  if (!meta.contains("format")) meta["format"] = "pt";
  h["__metadata__"] = meta;
  uint64_t off = 0;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (!names.insert(t.name).second) fail(fmt::format("duplicate tensor '{}'", t.name));
    if (t.name == "__metadata__") fail("a tensor may not be named __metadata__");
    uint64_t n = 1;
    for (auto d : t.shape) {
      if (d < 0) fail(fmt::format("tensor '{}': negative dimension", t.name));
      n *= uint64_t(d);
    }
    h[t.name] = {{"dtype", st_dtype}, {"shape", t.shape}, {"data_offsets", {off, off + n * es}}};
    off += n * es;
  }
  std::string header = h.dump();
  while (header.size() % 8 != 0) header.push_back(' ');

  replace_file(path, [&](const std::string& tmp) {
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
    if (!f) fail(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
    auto put = [&](const void* p, size_t n) {
      if (n && std::fwrite(p, 1, n, f.get()) != n)
        fail(fmt::format("write failed: {}", std::strerror(errno)));
    };
    const uint64_t hn = header.size();
    put(&hn, 8);
    put(header.data(), header.size());
    std::vector<uint16_t> buf;
    for (const auto& t : tensors) {
      uint64_t n = 1;
      for (auto d : t.shape) n *= uint64_t(d);
      const float* data = t.data ? t.data : n && t.read ? t.read() : nullptr;
      if (n && !data) fail(fmt::format("tensor '{}': null data", t.name));
      if (const Overflows o = narrowing_overflows(data, int64_t(n), dtype); o.count)
        fail(
            fmt::format("tensor '{}': {} value{} beyond {}'s range (the first, {}, at element {}) would be "
                        "written as infinity; save in {} instead",
                        t.name, o.count, o.count == 1 ? " is" : "s are", dtype_name(dtype), data[o.first],
                        o.first, dtype == DType::f16 ? "bf16 or f32" : "f32"));
      if (dtype == DType::f32) {
        put(data, size_t(n) * 4);
        continue;
      }
      const uint64_t chunk = 1 << 20;
      for (uint64_t b = 0; b < n; b += chunk) {
        const uint64_t m = std::min(chunk, n - b);
        buf.resize(size_t(m));
        for (uint64_t i = 0; i < m; ++i)
          buf[i] = dtype == DType::bf16 ? f32_to_bf16(data[b + i]) : f32_to_f16(data[b + i]);
        put(buf.data(), size_t(m) * 2);
      }
    }
    if (std::fflush(f.get()) != 0) fail(fmt::format("write failed: {}", std::strerror(errno)));
    if (std::fclose(f.release()) != 0) fail(fmt::format("close failed: {}", std::strerror(errno)));
  });
}

std::vector<std::string> save_safetensors_sharded(const std::string& dir,
                                                  const std::vector<TensorRef>& tensors, DType dtype,
                                                  uint64_t max_shard_bytes) {
  const uint64_t es = dtype_size(dtype);
  std::vector<std::vector<TensorRef>> shards(1);
  uint64_t cur = 0, total = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (auto d : t.shape) n *= uint64_t(std::max<int64_t>(d, 0));
    const uint64_t b = n * es;
    if (!shards.back().empty() && cur + b > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += b;
    total += b;
  }
  std::vector<std::string> files;
  if (shards.size() == 1) {
    save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, dtype);
    files.push_back("model.safetensors");
    return files;
  }
  json wm = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    save_safetensors((fs::path(dir) / name).string(), shards[i], dtype);
    for (const auto& t : shards[i]) wm[t.name] = name;
    files.push_back(name);
  }
  json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
  const std::string ip = (fs::path(dir) / "model.safetensors.index.json").string();
  std::ofstream o(ip, std::ios::binary);
  o << idx.dump(2) << "\n";
  o.close();
  if (!o) throw std::runtime_error(fmt::format("{}: write failed", ip));
  files.push_back("model.safetensors.index.json");
  return files;
}

}  // namespace rp
