#include "formats/gguf.hpp"
#include "model/error_text.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include <fmt/format.h>

#include "base/input_file.hpp"
#include "formats/parallel_quantize.hpp"
#include "kernels/dtype.hpp"
#include "kernels/weight_format.hpp"

namespace rp {

// ---------------------------------------------------------------------------------------
// ggml types and dequantization (block layouts of ggml-common.h / ggml-quants.c)

namespace {

struct TypeInfo {
  GgmlType type;
  const char* name;
  int64_t block_elems, block_bytes;
};

constexpr TypeInfo kTypes[] = {
    {GgmlType::F32, "F32", 1, 4},       {GgmlType::F16, "F16", 1, 2},
    {GgmlType::BF16, "BF16", 1, 2},     {GgmlType::Q4_0, "Q4_0", 32, 18},
    {GgmlType::Q4_1, "Q4_1", 32, 20},   {GgmlType::Q5_0, "Q5_0", 32, 22},
    {GgmlType::Q5_1, "Q5_1", 32, 24},   {GgmlType::Q8_0, "Q8_0", 32, 34},
    {GgmlType::Q8_1, "Q8_1", 32, 36},   {GgmlType::Q2_K, "Q2_K", 256, 84},
    {GgmlType::Q3_K, "Q3_K", 256, 110}, {GgmlType::Q4_K, "Q4_K", 256, 144},
    {GgmlType::Q5_K, "Q5_K", 256, 176}, {GgmlType::Q6_K, "Q6_K", 256, 210},
    {GgmlType::Q8_K, "Q8_K", 256, 292}, {GgmlType::I8, "I8", 1, 1},
    {GgmlType::I16, "I16", 1, 2},       {GgmlType::I32, "I32", 1, 4},
    {GgmlType::I64, "I64", 1, 8},       {GgmlType::F64, "F64", 1, 8},
    {GgmlType::MXFP4, "MXFP4", 32, 17},
};

const TypeInfo* type_info(uint32_t type) {
  for (const auto& t : kTypes)
    if (uint32_t(t.type) == type) return &t;
  return nullptr;
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  const TypeInfo* t = type_info(type);
  return t ? t->name : fmt::format("type{}", type);
}

bool ggml_type_block(uint32_t type, int64_t& be, int64_t& bb) {
  const TypeInfo* t = type_info(type);
  if (!t) return false;
  be = t->block_elems;
  bb = t->block_bytes;
  return true;
}

bool ggml_can_dequantize(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::MXFP4: return true;
    default: return false;
  }
}

namespace {

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

inline uint32_t u32le(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q4_K / Q5_K 6-bit scale and min number j of the 12-byte scales array.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace

void dequantize_ggml(uint32_t type, const void* src_v, float* y, int64_t n) {
  int64_t be = 0, bb = 0;
  if (!ggml_can_dequantize(type) || !ggml_type_block(type, be, bb))
    throw std::invalid_argument(
        fmt::format("dequantize_ggml: type {} is not supported", ggml_type_name(type)));
  if (n < 0 || n % be != 0)
    throw std::invalid_argument(
        fmt::format("dequantize_ggml: {} elements is not a multiple of "
                    "the {} block size {}",
                    n, ggml_type_name(type), be));
  const uint8_t* s = static_cast<const uint8_t*>(src_v);
  const int64_t nb = n / be;
  switch (GgmlType(type)) {
    case GgmlType::F32: std::memcpy(y, s, size_t(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) y[i] = half(s + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        y[i] = bf16_to_f32(h);
      }
      return;
    case GgmlType::Q4_0:  // {f16 d; u8 qs[16]}: x = (q - 8) * d, low nibbles first
      for (int64_t b = 0; b < nb; ++b, s += bb, y += 32) {
        const float d = half(s);
        const uint8_t* qs = s + 2;
        for (int j = 0; j < 16; ++j) {
          y[j] = float((qs[j] & 0x0F) - 8) * d;
          y[j + 16] = float((qs[j] >> 4) - 8) * d;
        }
      }
      return;
    case GgmlType::Q4_1:  // {f16 d; f16 m; u8 qs[16]}: x = q * d + m
      for (int64_t b = 0; b < nb; ++b, s += bb, y += 32) {
        const float d = half(s), m = half(s + 2);
        const uint8_t* qs = s + 4;
        for (int j = 0; j < 16; ++j) {
          y[j] = float(qs[j] & 0x0F) * d + m;
          y[j + 16] = float(qs[j] >> 4) * d + m;
        }
      }
      return;
    case GgmlType::Q5_0:  // {f16 d; u8 qh[4]; u8 qs[16]}: x = (q5 - 16) * d
      for (int64_t b = 0; b < nb; ++b, s += bb, y += 32) {
        const float d = half(s);
        const uint32_t qh = u32le(s + 2);
        const uint8_t* qs = s + 6;
        for (int j = 0; j < 16; ++j) {
          const uint8_t h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
          y[j] = float(int((qs[j] & 0x0F) | h0) - 16) * d;
          y[j + 16] = float(int((qs[j] >> 4) | h1) - 16) * d;
        }
      }
      return;
    case GgmlType::Q5_1:  // {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: x = q5 * d + m
      for (int64_t b = 0; b < nb; ++b, s += bb, y += 32) {
        const float d = half(s), m = half(s + 2);
        const uint32_t qh = u32le(s + 4);
        const uint8_t* qs = s + 8;
        for (int j = 0; j < 16; ++j) {
          const uint8_t h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
          y[j] = float((qs[j] & 0x0F) | h0) * d + m;
          y[j + 16] = float((qs[j] >> 4) | h1) * d + m;
        }
      }
      return;
    case GgmlType::Q8_0:  // {f16 d; i8 qs[32]}: x = q * d
      for (int64_t b = 0; b < nb; ++b, s += bb, y += 32) {
        const float d = half(s);
        for (int j = 0; j < 32; ++j) y[j] = float(int8_t(s[2 + j])) * d;
      }
      return;
    case GgmlType::Q4_K:  // {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}
    case GgmlType::Q5_K:  // {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
    {
      const bool five = GgmlType(type) == GgmlType::Q5_K;
      for (int64_t b = 0; b < nb; ++b, s += bb) {
        const float d = half(s), dmin = half(s + 2);
        const uint8_t* sc = s + 4;
        const uint8_t* qh = s + 16;
        const uint8_t* q = five ? s + 48 : s + 16;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
          uint8_t scv, mv;
          scale_min_k4(is, sc, scv, mv);
          const float d1 = d * scv, m1 = dmin * mv;
          scale_min_k4(is + 1, sc, scv, mv);
          const float d2 = d * scv, m2 = dmin * mv;
          for (int l = 0; l < 32; ++l) *y++ = d1 * float((q[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
          for (int l = 0; l < 32; ++l) *y++ = d2 * float((q[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
          u1 <<= 2;
          u2 <<= 2;
        }
      }
      return;
    }
    case GgmlType::Q6_K:  // {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
      for (int64_t b = 0; b < nb; ++b, s += bb) {
        const float d = half(s + 208);
        const uint8_t* ql = s;
        const uint8_t* qh = s + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(s + 192);
        for (int n0 = 0; n0 < 256; n0 += 128, y += 128, ql += 64, qh += 32, sc += 8) {
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l + 0] = d * float(sc[is + 0]) * float(q1);
            y[l + 32] = d * float(sc[is + 2]) * float(q2);
            y[l + 64] = d * float(sc[is + 4]) * float(q3);
            y[l + 96] = d * float(sc[is + 6]) * float(q4);
          }
        }
      }
      return;
    case GgmlType::MXFP4:  // ggml's block_mxfp4 is WeightFormat::mxfp4 (kernels/weight_format.hpp)
      dequantize_weights(WeightFormat::mxfp4, s, y, n);
      return;
    default: break;
  }
}

// ---------------------------------------------------------------------------------------
// GGUF container

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (auto d : ne) n *= d;
  return n;
}

std::vector<int64_t> GgufTensorInfo::shape() const { return {ne.rbegin(), ne.rend()}; }

namespace {

enum GgufValueType : uint32_t {
  T_U8 = 0,
  T_I8 = 1,
  T_U16 = 2,
  T_I16 = 3,
  T_U32 = 4,
  T_I32 = 5,
  T_F32 = 6,
  T_BOOL = 7,
  T_STRING = 8,
  T_ARRAY = 9,
  T_U64 = 10,
  T_I64 = 11,
  T_F64 = 12,
};

/// Bounds-checked little-endian cursor over the file's header, read from the file a window
/// (at least 1 MiB) at a time.
struct Reader {
  const PositionalFile& file;
  uint64_t size, pos = 0;
  const std::string& path;
  uint32_t version;
  std::vector<uint8_t> window;  ///< bytes [base, base + window.size()) of the file
  uint64_t base = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(one_line(fmt::format("{}: {}", path, what)));
  }
  void need(uint64_t n, const char* what) {
    if (n > size - pos)
      fail(fmt::format("truncated file: {} needs {} bytes at offset {}, file has {}", excerpt(what), n, pos,
                       size));
    if (pos >= base && pos + n <= base + window.size()) return;
    base = pos;
    window.resize(size_t(std::min(size - pos, std::max<uint64_t>(n, uint64_t(1) << 20))));
    file.read(base, window.size(), window.data(), "header");
  }
  /// The bytes at pos (need() them first).
  const uint8_t* at() const { return window.data() + (pos - base); }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, at(), sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    uint64_t n = get<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(at()), size_t(n));
    pos += n;
    return s;
  }
  nlohmann::json value(uint32_t type, const std::string& key, int depth) {
    using nlohmann::json;
    switch (type) {
      case T_U8: return get<uint8_t>(key.c_str());
      case T_I8: return get<int8_t>(key.c_str());
      case T_U16: return get<uint16_t>(key.c_str());
      case T_I16: return get<int16_t>(key.c_str());
      case T_U32: return get<uint32_t>(key.c_str());
      case T_I32: return get<int32_t>(key.c_str());
      case T_F32: {  // shortest decimal of the float, so 1e-5f reads back as 1e-5
        char buf[32];
        auto res = std::to_chars(buf, buf + sizeof buf, get<float>(key.c_str()));
        return std::strtod(std::string(buf, res.ptr).c_str(), nullptr);
      }
      case T_BOOL: {
        uint8_t b = get<uint8_t>(key.c_str());
        if (b > 1) fail(fmt::format("metadata '{}': invalid bool byte {}", excerpt(key), b));
        return b != 0;
      }
      case T_STRING: return str(key.c_str());
      case T_U64: return get<uint64_t>(key.c_str());
      case T_I64: return get<int64_t>(key.c_str());
      case T_F64: return get<double>(key.c_str());
      case T_ARRAY: {
        if (depth > 4) fail(fmt::format("metadata '{}': arrays nested too deeply", excerpt(key)));
        uint32_t et = get<uint32_t>(key.c_str());
        uint64_t n = get<uint64_t>(key.c_str());
        uint64_t min_elem = et == T_U8 || et == T_I8 || et == T_BOOL    ? 1
                            : et == T_U16 || et == T_I16                ? 2
                            : et == T_U32 || et == T_I32 || et == T_F32 ? 4
                                                                        : 8;  // strings: length
        if (et > T_F64) fail(fmt::format("metadata '{}': unknown array element type {}", excerpt(key), et));
        if (n > (size - pos) / min_elem)
          fail(fmt::format("truncated file: metadata '{}' array of {} elements does not fit", excerpt(key),
                           n));
        json a = json::array();
        a.get_ref<json::array_t&>().reserve(size_t(n));
        for (uint64_t i = 0; i < n; ++i) a.push_back(value(et, key, depth + 1));
        return a;
      }
      default: fail(fmt::format("metadata '{}': unknown value type {}", excerpt(key), type));
    }
  }
};

}  // namespace

GgufFile::GgufFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: a named pipe's open returns at once (without it, one that no program writes to
  // waited forever) and is refused below; a regular file is read at offsets either way
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(fmt::format("{}: not a regular file (a device, FIFO or socket)", path));
  }
  size_ = uint64_t(st.st_size);
  if (size_ < 24) {
    ::close(fd);
    throw std::runtime_error(
        fmt::format("{}: truncated file: {} bytes is too small for a GGUF header", path, size_));
  }
  file_ = PositionalFile(fd, size_, path_);  // kept open: tensors are read when asked for
  {  // the reader's window over the header is freed at the end of this block
    Reader r{file_, size_, 0, path_, 0, {}, 0};
    r.need(4, "magic");
    if (std::memcmp(r.at(), "GGUF", 4) != 0) r.fail("not a GGUF file (bad magic)");
    r.pos = 4;
    version_ = r.get<uint32_t>("version");
    if (version_ != 2 && version_ != 3)
      r.fail(fmt::format("unsupported GGUF version {} (2 and 3 are supported)", version_));
    const uint64_t n_tensors = r.get<uint64_t>("tensor count");
    const uint64_t n_kv = r.get<uint64_t>("metadata count");
    // Each KV needs >= 8 (key length) + 4 (type) + 1 bytes; each tensor info >= 8+4+8+4+8.
    // a file cut short says so: its counts are right, the bytes they promise are missing
    if (n_kv > size_ / 13)
      r.fail(fmt::format(
          "truncated or corrupt header: {} metadata entries need at least {} bytes, the file has {}", n_kv,
          n_kv > UINT64_MAX / 13 ? UINT64_MAX : n_kv * 13, size_));
    if (n_tensors > size_ / 32)
      r.fail(fmt::format(
          "truncated or corrupt header: {} tensors need at least {} bytes of tensor info, the file "
          "has {}",
          n_tensors, n_tensors > UINT64_MAX / 32 ? UINT64_MAX : n_tensors * 32, size_));
    meta_ = nlohmann::json::object();
    for (uint64_t i = 0; i < n_kv; ++i) {
      std::string key = r.str("metadata key");
      uint32_t type = r.get<uint32_t>("metadata type");
      if (meta_.contains(key)) r.fail(fmt::format("duplicate metadata key '{}'", excerpt(key)));
      meta_[key] = r.value(type, key, 0);
    }
    if (auto it = meta_.find("general.alignment"); it != meta_.end()) {
      if (!it->is_number_unsigned() || it->get<uint64_t>() == 0 ||
          (it->get<uint64_t>() & (it->get<uint64_t>() - 1)) != 0 || it->get<uint64_t>() > (1u << 20))
        r.fail(fmt::format("general.alignment must be a power of two, got {}", excerpt(it->dump())));
      alignment_ = it->get<uint64_t>();
    }
    std::unordered_set<std::string> names;
    tensors_.reserve(size_t(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensorInfo t;
      t.name = r.str("tensor name");
      uint32_t nd = r.get<uint32_t>("tensor dims");
      if (nd < 1 || nd > 4)
        r.fail(fmt::format("tensor '{}': {} dimensions (1..4 allowed)", excerpt(t.name), nd));
      int64_t numel = 1;
      for (uint32_t d = 0; d < nd; ++d) {
        uint64_t v = r.get<uint64_t>("tensor dim");
        if (v == 0 || v > (uint64_t(1) << 40) || numel > (int64_t(1) << 48) / int64_t(v))
          r.fail(fmt::format("tensor '{}': invalid dimension {} = {}", excerpt(t.name), d, v));
        t.ne.push_back(int64_t(v));
        numel *= int64_t(v);
      }
      t.type = r.get<uint32_t>("tensor type");
      int64_t be, bb;
      if (!ggml_type_block(t.type, be, bb))
        r.fail(fmt::format("tensor '{}': unknown ggml type {}", excerpt(t.name), t.type));
      if (t.ne[0] % be != 0)
        r.fail(fmt::format("tensor '{}': ne[0]={} is not a multiple of the {} block size {}", excerpt(t.name),
                           t.ne[0], ggml_type_name(t.type), be));
      t.nbytes = uint64_t(numel / be) * uint64_t(bb);
      t.offset = r.get<uint64_t>("tensor offset");
      if (t.offset % alignment_ != 0)
        r.fail(fmt::format("tensor '{}': offset {} is not aligned to {}", excerpt(t.name), t.offset,
                           alignment_));
      if (!names.insert(t.name).second) r.fail(fmt::format("duplicate tensor '{}'", excerpt(t.name)));
      tensors_.push_back(std::move(t));
    }
    data_offset_ = (r.pos + alignment_ - 1) / alignment_ * alignment_;
    if (data_offset_ > size_ && !tensors_.empty())
      r.fail(fmt::format("truncated file: tensor data would start at {}, file has {} bytes", data_offset_,
                         size_));
    const uint64_t avail = size_ > data_offset_ ? size_ - data_offset_ : 0;
    for (const auto& t : tensors_)
      if (t.offset > avail || t.nbytes > avail - t.offset)
        r.fail(
            fmt::format("truncated file: tensor '{}' ({} bytes at data offset {}) extends past "
                        "the end of the file ({} bytes)",
                        excerpt(t.name), t.nbytes, t.offset, size_));
    // two tensors sharing bytes would read each other's data as weights
    std::vector<const GgufTensorInfo*> by_offset;
    for (const auto& t : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i)
      if (by_offset[i - 1]->offset + by_offset[i - 1]->nbytes > by_offset[i]->offset)
        r.fail(fmt::format("corrupt header: tensors '{}' (bytes {}-{}) and '{}' (from byte {}) overlap",
                           excerpt(by_offset[i - 1]->name), by_offset[i - 1]->offset,
                           by_offset[i - 1]->offset + by_offset[i - 1]->nbytes, excerpt(by_offset[i]->name),
                           by_offset[i]->offset));
  }
}

GgufFile::~GgufFile() = default;

const nlohmann::json& GgufFile::get(const std::string& key) const {
  auto it = meta_.find(key);
  if (it == meta_.end()) throw std::runtime_error(fmt::format("{}: missing metadata key '{}'", path_, key));
  return *it;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const auto& v = get(key);
  if (!v.is_number_integer())
    throw std::runtime_error(
        fmt::format("{}: metadata '{}': expected an integer, got {}", path_, key, v.type_name()));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    throw std::runtime_error(fmt::format("{}: metadata '{}': value too large", path_, key));
  return v.get<int64_t>();
}

double GgufFile::get_float(const std::string& key) const {
  const auto& v = get(key);
  if (!v.is_number())
    throw std::runtime_error(
        fmt::format("{}: metadata '{}': expected a number, got {}", path_, key, v.type_name()));
  return v.get<double>();
}

std::string GgufFile::get_string(const std::string& key) const {
  const auto& v = get(key);
  if (!v.is_string())
    throw std::runtime_error(
        fmt::format("{}: metadata '{}': expected a string, got {}", path_, key, v.type_name()));
  return v.get<std::string>();
}

const GgufTensorInfo* GgufFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

void GgufFile::read_tensor_bytes(const GgufTensorInfo& t, uint64_t at, uint64_t n, void* dst) const {
  if (at > t.nbytes || n > t.nbytes - at)
    throw std::logic_error(
        fmt::format("{}: tensor '{}': bytes {}+{} outside its {}", path_, t.name, at, n, t.nbytes));
  file_.read(data_offset_ + t.offset + at, n, dst, fmt::format("tensor '{}'", t.name));
}

std::vector<uint8_t> GgufFile::tensor_bytes(const GgufTensorInfo& t) const {
  std::vector<uint8_t> b(size_t(t.nbytes));
  read_tensor_bytes(t, 0, t.nbytes, b.data());
  return b;
}

void GgufFile::dequantize_blocks(const GgufTensorInfo& t, int64_t first, int64_t n, float* out) const {
  check_dequantizable(t);
  int64_t be = 0, bb = 0;
  ggml_type_block(t.type, be, bb);
  if (first < 0 || n < 0 || first % be != 0 || n % be != 0 || first > t.numel() || n > t.numel() - first)
    throw std::logic_error(fmt::format("{}: tensor '{}': elements {}+{} are not whole blocks of its {}",
                                       path_, t.name, first, n, t.numel()));
  file_.read_chunks(data_offset_ + t.offset + uint64_t(first / be) * uint64_t(bb),
                    uint64_t(n / be) * uint64_t(bb), uint64_t(bb), fmt::format("tensor '{}'", t.name),
                    [&](const uint8_t* p, uint64_t block, uint64_t blocks) {
                      for_ranges_parallel(int64_t(blocks), 256, [&](int64_t lo, int64_t hi) {
                        dequantize_ggml(t.type, p + lo * bb, out + (int64_t(block) + lo) * be,
                                        (hi - lo) * be);
                      });
                    });
}

void GgufFile::check_dequantizable(const GgufTensorInfo& t) const {
  if (!ggml_can_dequantize(t.type))
    throw std::runtime_error(one_line(
        fmt::format("{}: tensor '{}': cannot dequantize type {}", path_, t.name, ggml_type_name(t.type))));
}

std::vector<float> GgufFile::dequantize(const GgufTensorInfo& t) const {
  check_dequantizable(t);
  std::vector<float> out(size_t(t.numel()));
  dequantize_blocks(t, 0, t.numel(), out.data());
  return out;
}

}  // namespace rp
