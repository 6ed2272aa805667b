#include "formats/optimizer_state.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "base/atomic_file.hpp"
#include "base/output_folder.hpp"
#include "kernels/dtype.hpp"

namespace rp {
namespace {

constexpr char kMagic[8] = {'R', 'P', 'O', 'P', 'T', 'S', 'T', '1'};
constexpr char kEnd[8] = {'R', 'P', 'O', 'P', 'T', 'E', 'N', 'D'};
constexpr uint32_t kAsync = 1, kMaster = 2, kLowp = 4, kScaler = 8;

/// Raw writes with a running checksum.
struct Writer {
  std::ostream& os;
  Checksum sum;
  void bytes(const void* p, size_t n) {
    os.write(static_cast<const char*>(p), std::streamsize(n));
    sum.update(p, n);
  }
  template <class T>
  void pod(T v) {
    bytes(&v, sizeof v);
  }
  void str(const std::string& s) {
    pod(uint32_t(s.size()));
    bytes(s.data(), s.size());
  }
  void checksum() {
    const uint64_t c = sum.digest();
    os.write(reinterpret_cast<const char*>(&c), 8);
    sum.reset();
  }
};

uint32_t flags_of(const OptimizerStateHeader& h) {
  return (h.async ? kAsync : 0) | (h.has_master ? kMaster : 0) | (h.has_lowp ? kLowp : 0) |
         (h.has_scaler ? kScaler : 0);
}

void write_header(Writer& w, const OptimizerStateHeader& h) {
  w.os.write(kMagic, 8);
  w.pod(kOptimizerStateVersion);
  w.pod(flags_of(h));
  w.pod(h.steps);
  w.str(dtype_name(h.lowp_dtype));
  w.pod(uint32_t(h.groups.size()));
  for (const auto& [name, numel] : h.groups) {
    w.str(name);
    w.pod(numel);
  }
  w.pod(uint32_t(h.loss_scales.size()));
  for (float s : h.loss_scales) w.pod(s);
  w.checksum();
}

}  // namespace

void write_optimizer_state(const std::string& path, const OptimizerStateView& v) {
  OptimizerStateHeader h = v.header;
  h.groups.clear();
  std::vector<size_t> saved;  // frozen groups have no optimizer state: not in the file
  for (size_t g = 0; g < v.layout->groups.size(); ++g)
    if (!v.layout->groups[g].frozen) {
      h.groups.emplace_back(v.layout->groups[g].name, v.layout->groups[g].numel);
      saved.push_back(g);
    }
  try {
    write_file_atomically(path, [&](std::ostream& os) {
      Writer w{os};
      write_header(w, h);
      for (size_t i = 0; i < saved.size(); ++i) {
        const size_t g = saved[i];
        save_state(os, (*v.adam)[g], v.adam_options);
        if (h.has_master) {
          w.bytes((*v.master)[g].data(), (*v.master)[g].size() * sizeof(float));
          w.checksum();
        }
        if (h.has_lowp) {
          w.bytes(v.lowp[g], size_t(h.groups[i].second) * dtype_size(h.lowp_dtype));
          w.checksum();
        }
      }
      if (h.has_scaler) v.scaler->save(os);
      os.write(kEnd, 8);
    });
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    if (what.rfind(path, 0) == 0) throw;  // save_state / LossScaler::save name no file
    throw std::runtime_error(path + ": " + what);
  }
}

// ---- reading ----------------------------------------------------------------------------

OptimizerStateReader::OptimizerStateReader(const std::string& path) : path_(path) {
  if (const std::string why = not_a_file_text(path); !why.empty()) fail(why);
  is_.open(path, std::ios::binary);
  if (!is_) fail(fmt::format("cannot open the optimizer state ({})", std::strerror(errno)));
  read_header();
}

void OptimizerStateReader::fail(const std::string& what) const {
  throw std::runtime_error(path_ + ": " + what);
}

void OptimizerStateReader::bytes(void* p, size_t n, const char* what) {
  if (!is_.read(static_cast<char*>(p), std::streamsize(n)))
    fail(fmt::format("truncated optimizer state: the file ends inside {}", what));
  sum_.update(p, n);
}

std::string OptimizerStateReader::str(const char* what, uint32_t max_len) {
  const auto n = pod<uint32_t>(what);
  if (n > max_len)
    fail(fmt::format("corrupted optimizer state: {} is {} bytes long (at most {})", what, n, max_len));
  std::string s(n, '\0');
  bytes(s.data(), n, what);
  return s;
}

void OptimizerStateReader::checksum(const std::string& what) {
  uint64_t c = 0;
  if (!is_.read(reinterpret_cast<char*>(&c), 8))
    fail(fmt::format("truncated optimizer state: the file ends inside the checksum of {}", what));
  if (c != sum_.digest()) fail(fmt::format("checksum mismatch in {} (corrupted optimizer state)", what));
  sum_.reset();
}

void OptimizerStateReader::read_header() {
  char magic[8];
  if (!is_.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0)
    fail("not a RoundPipe optimizer state (expected the magic \"RPOPTST1\" at the start)");
  const auto version = pod<uint32_t>("the header");
  if (version == 1)
    fail(fmt::format(
        "optimizer state format version 1 (FNV-1a checksums, written by an earlier RoundPipe); this "
        "build reads version {}: resume from a checkpoint written by this build, or start a new run",
        kOptimizerStateVersion));
  if (version != kOptimizerStateVersion)
    fail(fmt::format("optimizer state format version {}, this build reads {}", version,
                     kOptimizerStateVersion));
  const auto flags = pod<uint32_t>("the header");
  if (flags & ~(kAsync | kMaster | kLowp | kScaler))
    fail(fmt::format("corrupted optimizer state: unknown flags 0x{:x}", flags));
  h_.async = flags & kAsync, h_.has_master = flags & kMaster, h_.has_lowp = flags & kLowp,
  h_.has_scaler = flags & kScaler;
  h_.steps = pod<int64_t>("the header");
  if (h_.steps < 0) fail(fmt::format("corrupted optimizer state: negative step count {}", h_.steps));
  const std::string dname = str("the dtype name", 16);
  const auto ngroups = pod<uint32_t>("the header");
  if (ngroups > (1u << 20)) fail(fmt::format("corrupted optimizer state: {} parameter groups", ngroups));
  for (uint32_t g = 0; g < ngroups; ++g) {
    std::string name = str("a group name", 4096);
    h_.groups.emplace_back(std::move(name), pod<int64_t>("the group sizes"));
  }
  const auto nscales = pod<uint32_t>("the loss scales");
  if (nscales > 2) fail(fmt::format("corrupted optimizer state: {} loss scales (at most 2)", nscales));
  h_.loss_scales.resize(nscales);
  for (auto& x : h_.loss_scales) x = pod<float>("the loss scales");
  checksum("the header");
  try {
    h_.lowp_dtype = parse_dtype(dname);
  } catch (const std::exception&) {
    fail(fmt::format("corrupted optimizer state: unknown dtype '{}'", dname));
  }
  if (h_.has_scaler && h_.loss_scales.size() != size_t((h_.async ? 1 : 0) + 1))
    fail(fmt::format("corrupted optimizer state: {} loss scales for the {} optimizer", h_.loss_scales.size(),
                     h_.async ? "async" : "sync"));
  for (float x : h_.loss_scales)
    if (!(x > 0) || !std::isfinite(x)) fail(fmt::format("corrupted optimizer state: loss scale {}", x));
}

void OptimizerStateReader::check_groups(const ModelLayout& layout) const {
  std::vector<const ParamGroup*> trainable;  // the groups the file holds, in layout order
  for (const auto& grp : layout.groups)
    if (!grp.frozen) trainable.push_back(&grp);
  const size_t G = trainable.size();
  if (h_.groups.size() != G)
    fail(fmt::format(
        "the state has {} parameter groups, the model has {} trainable ones (saved for another model, "
        "or with other groups frozen?)",
        h_.groups.size(), G));
  for (size_t g = 0; g < G; ++g) {
    const auto& want = *trainable[g];
    if (h_.groups[g].first != want.name || h_.groups[g].second != want.numel)
      fail(fmt::format(
          "group {} is '{}' with {} parameters in the state, the model expects '{}' with {} (saved for "
          "another model?)",
          g, h_.groups[g].first, h_.groups[g].second, want.name, want.numel));
  }
}

void OptimizerStateReader::read_adam(const ParamGroup& g, AdamWState& st, AdamWOptions& opts) {
  // the moment count precedes its checksum: check it before load_state sizes buffers by it
  // (0 = a group never updated, else the group's size)
  const auto pos = is_.tellg();
  char head[32];  // magic, version, flags, step, n (optimizer/adamw.hpp save_state)
  if (!is_.read(head, sizeof head))
    fail(
        fmt::format("truncated optimizer state: the file ends inside the AdamW state of group '{}'", g.name));
  int64_t n = 0;
  std::memcpy(&n, head + 24, 8);
  if (n != 0 && n != g.numel)
    fail(fmt::format("group '{}': AdamW moments of {} parameters, expected {} (corrupted optimizer state)",
                     g.name, n, g.numel));
  is_.seekg(pos);
  bool has_opts = false;
  try {
    load_state(is_, st, n, &opts, &has_opts);
  } catch (const std::runtime_error& e) {
    fail(fmt::format("group '{}': {}", g.name, e.what()));
  }
  if (!has_opts) fail(fmt::format("group '{}': the AdamW state carries no hyper-parameters", g.name));
}

void OptimizerStateReader::read_master(const ParamGroup& g, float* dst) {
  bytes(dst, size_t(g.numel) * sizeof(float), "the master weights");
  checksum(fmt::format("the master weights of group '{}'", g.name));
}

void OptimizerStateReader::read_lowp(const ParamGroup& g, void* dst, DType dt) {
  const DType file_dt = h_.lowp_dtype;
  const size_t es = dtype_size(file_dt);
  const size_t n = size_t(g.numel) * es;
  const bool direct = dst && file_dt == dt;
  if (!direct) scratch_.resize(n);
  bytes(direct ? dst : scratch_.data(), n, "the low-precision weights");
  checksum(fmt::format("the low-precision weights of group '{}'", g.name));
  if (direct || !dst) return;
  std::vector<float> f(size_t(g.numel));  // another backend saved it: convert through fp32
  for (int64_t i = 0; i < g.numel; ++i) {
    const unsigned char* p = scratch_.data() + size_t(i) * es;
    uint16_t h;
    if (file_dt == DType::f32) std::memcpy(&f[size_t(i)], p, 4);
    else std::memcpy(&h, p, 2), f[size_t(i)] = file_dt == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  cast_f32_to(f.data(), dst, g.numel, dt);
}

void OptimizerStateReader::read_scaler(LossScaler& s) {
  LossScaler loaded(s.options());
  try {
    loaded.load(is_);
  } catch (const std::runtime_error& e) {
    fail(e.what());
  }
  s = loaded;
}

void OptimizerStateReader::check_extent() {
  std::error_code ec;
  const auto size = int64_t(std::filesystem::file_size(path_, ec));
  if (ec) fail(fmt::format("cannot read the optimizer state's size ({})", ec.message()));
  const auto start = is_.tellg();
  const int64_t es = int64_t(dtype_size(h_.lowp_dtype));
  int64_t pos = int64_t(start);
  auto short_by = [&](const std::string& where) {
    fail(fmt::format("truncated optimizer state: the file ends inside {} ({} bytes, at least {} needed)",
                     where, size, pos));
  };
  for (const auto& [name, numel] : h_.groups) {
    const std::string where = fmt::format("the state of group '{}'", name);
    char head[32];  // magic, version, flags, step, n (optimizer/adamw.hpp save_state)
    if (pos + 32 > size) {
      pos += 32;
      short_by(where);
    }
    is_.seekg(pos);
    if (!is_.read(head, sizeof head)) fail(fmt::format("cannot read {}", where));
    uint32_t flags = 0;
    int64_t n = 0;
    std::memcpy(&flags, head + 12, 4);
    std::memcpy(&n, head + 24, 8);
    if (std::memcmp(head, "RPADAMW1", 8) != 0)
      fail(fmt::format("corrupted optimizer state: no AdamW state at byte {}, where group '{}' begins", pos,
                       name));
    if ((flags & ~3u) || (n != 0 && n != numel))
      fail(
          fmt::format("corrupted optimizer state: the AdamW state of group '{}' (flags 0x{:x}, {} moments, "
                      "expected 0 or {})",
                      name, flags, n, numel));
    pos += saved_state_bytes(flags, n) + (h_.has_master ? numel * 4 + 8 : 0) +
           (h_.has_lowp ? numel * es + 8 : 0);
    if (pos > size) short_by(where);
  }
  pos += (h_.has_scaler ? int64_t(LossScaler::saved_bytes()) : 0) + 8;
  if (pos > size) short_by("its loss scaler or end marker");
  if (pos < size)
    fail(fmt::format("corrupted optimizer state: {} trailing bytes after the end marker", size - pos));
  char end[8];
  is_.seekg(pos - 8);
  if (!is_.read(end, 8) || std::memcmp(end, kEnd, 8) != 0)
    fail("corrupted optimizer state: the end marker \"RPOPTEND\" is missing");
  is_.clear();
  is_.seekg(start);
}

void OptimizerStateReader::finish() {
  char end[8];
  if (!is_.read(end, 8) || std::memcmp(end, kEnd, 8) != 0)
    fail("corrupted optimizer state: the end marker \"RPOPTEND\" is missing");
  if (is_.peek() != std::char_traits<char>::eof())
    fail("corrupted optimizer state: trailing bytes after the end marker");
}

}  // namespace rp
