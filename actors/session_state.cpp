// Optimizer state files of rp::Session: save_optimizer_state / load_optimizer_state.
//
// Format (little-endian, version 1):
//   header   "RPOPTST1" (8 bytes), version u32 = 1, flags u32 (bit 0: async / staleness 1,
//            bit 1: fp32 master weights, bit 2: low-precision copy, bit 3: loss scaler),
//            steps closed N i64, low-precision dtype name (u32 length + bytes: "f32",
//            "bf16", "f16"), group count u32, per group its name (u32 length + bytes) and
//            numel i64, loss-scale count u32 + that many f32 (the scales of steps
//            N..N+staleness), FNV-1a 64 of all header bytes after the magic (u64)
//   groups   in layout order: the AdamW state (optimizer/adamw.hpp save_state, with the
//            hyper-parameters and its own checksum; n = 0 for a group never updated),
//            [master: numel f32 + FNV-1a u64], [low-precision copy: numel elements of the
//            dtype + FNV-1a u64]
//   scaler   [LossScaler::save (own magic and checksum)]
//   end      "RPOPTEND"
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "actors/session_impl.hpp"

namespace rp {
namespace {

constexpr char kMagic[8] = {'R', 'P', 'O', 'P', 'T', 'S', 'T', '1'};
constexpr char kEnd[8] = {'R', 'P', 'O', 'P', 'T', 'E', 'N', 'D'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kAsync = 1, kMaster = 2, kLowp = 4, kScaler = 8;
constexpr uint64_t kFnvBasis = 14695981039346656037ull;

uint64_t fnv1a(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/// Raw writes with a running checksum.
struct Writer {
  std::ostream& os;
  uint64_t h = kFnvBasis;
  void bytes(const void* p, size_t n) {
    os.write(static_cast<const char*>(p), std::streamsize(n));
    h = fnv1a(h, p, n);
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
    const uint64_t c = h;
    os.write(reinterpret_cast<const char*>(&c), 8);
    h = kFnvBasis;
  }
};

/// Raw reads with a running checksum; every failure is one line naming the file.
struct Reader {
  std::istream& is;
  const std::string& path;
  uint64_t h = kFnvBasis;
  [[noreturn]] void fail(const std::string& what) const { throw std::runtime_error(path + ": " + what); }
  void bytes(void* p, size_t n, const char* what) {
    if (!is.read(static_cast<char*>(p), std::streamsize(n)))
      fail(fmt::format("truncated optimizer state: the file ends inside {}", what));
    h = fnv1a(h, p, n);
  }
  template <class T>
  T pod(const char* what) {
    T v{};
    bytes(&v, sizeof v, what);
    return v;
  }
  std::string str(const char* what, uint32_t max_len) {
    const auto n = pod<uint32_t>(what);
    if (n > max_len) fail(fmt::format("corrupted optimizer state: {} is {} bytes long (at most {})", what, n, max_len));
    std::string s(n, '\0');
    bytes(s.data(), n, what);
    return s;
  }
  void checksum(const std::string& what) {
    uint64_t c = 0;
    if (!is.read(reinterpret_cast<char*>(&c), 8))
      fail(fmt::format("truncated optimizer state: the file ends inside the checksum of {}", what));
    if (c != h) fail(fmt::format("checksum mismatch in {} (corrupted optimizer state)", what));
    h = kFnvBasis;
  }
};

std::string describe(const AdamWOptions& o) {
  return fmt::format("betas ({}, {}), eps {}, weight_decay {}, {}{}{}", o.beta1, o.beta2, o.eps, o.weight_decay,
                     o.decoupled ? "decoupled (AdamW)" : "L2 (Adam)", o.amsgrad ? ", amsgrad" : "",
                     o.maximize ? ", maximize" : "");
}

bool same_except_lr(const AdamWOptions& a, const AdamWOptions& b) {
  return a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps && a.weight_decay == b.weight_decay &&
         a.decoupled == b.decoupled && a.amsgrad == b.amsgrad && a.maximize == b.maximize;
}

/// Asks `who` (scheduler or shard) and waits for the answer; throws std::runtime_error.
template <class Reply, class Msg>
Reply ask(caf::actor_system& sys, const caf::actor& who, Msg msg, const char* what) {
  caf::scoped_actor self{sys};
  Reply out{};
  std::string err;
  self->request(who, caf::infinite, std::move(msg))
      .receive([&](Reply& r) { out = std::move(r); }, [&](caf::error& e) { err = to_string(e); });
  if (!err.empty()) throw std::runtime_error(fmt::format("{}: the runtime refused it ({})", what, err));
  return out;
}

}  // namespace

void Session::save_optimizer_state(const std::string& path, bool include_master) {
  Impl& I = *impl_;
  I.check_usable("save_optimizer_state");
  if (I.passes_in_step != 0 || I.waited_through != I.current_step - 1)
    throw std::logic_error(
        "save_optimizer_state: steps are in flight; call it between steps, after synchronize() and before the next "
        "forward_backward()");
  const int staleness = I.opt.async ? 1 : 0;
  const int64_t N = I.current_step;
  std::vector<float> scales;
  if (I.scaler) {
    scales = ask<LossScales>(*I.sys, I.scheduler, LossScalesFrom{N}, "save_optimizer_state").scales;
    if (scales.size() != size_t(staleness + 1))
      throw std::logic_error(fmt::format("save_optimizer_state: the loss scales of steps {}..{} are not decided", N,
                                         N + staleness));
  }
  const bool with_lowp = staleness == 1 && N > 0;  // sync: the copy is the master, rounded
  uint32_t flags = (staleness ? kAsync : 0) | (include_master ? kMaster : 0) | (with_lowp ? kLowp : 0) |
                   (I.scaler ? kScaler : 0);
  const DType dt = I.store->dtype;

  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  try {
    std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
    if (!os) throw std::runtime_error(fmt::format("{}: cannot write ({})", tmp, std::strerror(errno)));
    os.write(kMagic, 8);
    Writer w{os};
    w.pod(kVersion);
    w.pod(flags);
    w.pod(N);
    w.str(dtype_name(dt));
    w.pod(uint32_t(I.layout.groups.size()));
    for (const auto& g : I.layout.groups) {
      w.str(g.name);
      w.pod(g.numel);
    }
    w.pod(uint32_t(scales.size()));
    for (float s : scales) w.pod(s);
    w.checksum();
    for (size_t g = 0; g < I.layout.groups.size(); ++g) {
      save_state(os, I.adam[g], &I.opt.adam);
      if (include_master) {
        w.bytes(I.master[g].data(), I.master[g].size() * sizeof(float));
        w.checksum();
      }
      if (with_lowp) {
        w.bytes(I.store->lowp[g].data(), I.store->lowp[g].size());
        w.checksum();
      }
    }
    if (I.scaler) I.scaler->save(os);
    os.write(kEnd, 8);
    os.flush();
    if (!os) throw std::runtime_error(fmt::format("{}: write failed (disk full?)", tmp));
    os.close();
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw std::runtime_error(fmt::format("{}: cannot move into place: {}", path, ec.message()));
  } catch (const std::runtime_error& e) {
    std::remove(tmp.c_str());
    const std::string what = e.what();
    // save_state / LossScaler::save name no file
    if (what.rfind(path, 0) == 0 || what.rfind(tmp, 0) == 0) throw;
    throw std::runtime_error(path + ": " + what);
  }
}

OptimizerStateInfo Session::load_optimizer_state(const std::string& path) {
  Impl& I = *impl_;
  I.check_usable("load_optimizer_state");
  if (I.current_step != 0 || I.passes_in_step != 0 || I.resumed)
    throw std::logic_error("load_optimizer_state: call it once, on a new session, before the first forward_backward()");
  std::ifstream is(path, std::ios::binary);
  if (!is)
    throw std::runtime_error(fmt::format("{}: cannot open the optimizer state ({})", path, std::strerror(errno)));
  Reader r{is, path};
  char magic[8];
  if (!is.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0)
    r.fail("not a RoundPipe optimizer state (expected the magic \"RPOPTST1\" at the start)");

  // ---- header: everything is checked before the session changes -----------------
  const auto version = r.pod<uint32_t>("the header");
  if (version != kVersion) r.fail(fmt::format("optimizer state format version {}, this build reads {}", version, kVersion));
  const auto flags = r.pod<uint32_t>("the header");
  if (flags & ~(kAsync | kMaster | kLowp | kScaler)) r.fail(fmt::format("corrupted optimizer state: unknown flags 0x{:x}", flags));
  const auto N = r.pod<int64_t>("the header");
  if (N < 0) r.fail(fmt::format("corrupted optimizer state: negative step count {}", N));
  const std::string dname = r.str("the dtype name", 16);
  const auto ngroups = r.pod<uint32_t>("the header");
  const size_t G = I.layout.groups.size();
  std::vector<std::pair<std::string, int64_t>> groups;
  if (ngroups > (1u << 20)) r.fail(fmt::format("corrupted optimizer state: {} parameter groups", ngroups));
  for (uint32_t g = 0; g < ngroups; ++g) {
    std::string name = r.str("a group name", 4096);
    groups.emplace_back(std::move(name), r.pod<int64_t>("the group sizes"));
  }
  const auto nscales = r.pod<uint32_t>("the loss scales");
  if (nscales > 2) r.fail(fmt::format("corrupted optimizer state: {} loss scales (at most 2)", nscales));
  std::vector<float> scales(nscales);
  for (auto& x : scales) x = r.pod<float>("the loss scales");
  r.checksum("the header");

  const bool file_async = flags & kAsync, has_master = flags & kMaster, has_lowp = flags & kLowp,
             has_scaler = flags & kScaler;
  if (ngroups != G)
    r.fail(fmt::format("the state has {} parameter groups, the model has {} (saved for another model?)", ngroups, G));
  for (size_t g = 0; g < G; ++g) {
    const auto& want = I.layout.groups[g];
    if (groups[g].first != want.name || groups[g].second != want.numel)
      r.fail(fmt::format("group {} is '{}' with {} parameters in the state, the model expects '{}' with {} (saved for "
                         "another model?)",
                         g, groups[g].first, groups[g].second, want.name, want.numel));
  }
  DType file_dt;
  try {
    file_dt = parse_dtype(dname);
  } catch (const std::exception&) {
    r.fail(fmt::format("corrupted optimizer state: unknown dtype '{}'", dname));
  }
  if (has_scaler != bool(I.scaler))
    r.fail(has_scaler ? "the state holds a loss scaler but this session has no loss scaling (fp16); enable it to resume"
                      : "the state has no loss scaler but this session uses loss scaling; resume without it");
  const int staleness = I.opt.async ? 1 : 0;
  if (has_scaler && scales.size() != size_t((file_async ? 1 : 0) + 1))
    r.fail(fmt::format("corrupted optimizer state: {} loss scales for the {} optimizer", scales.size(),
                       file_async ? "async" : "sync"));
  for (float x : scales)
    if (!(x > 0) || !std::isfinite(x)) r.fail(fmt::format("corrupted optimizer state: loss scale {}", x));

  // ---- payload: written straight into the session; a failure now poisons it -------
  const DType dt = I.store->dtype;
  const size_t es_file = dtype_size(file_dt);
  bool modified = false;
  try {
    std::vector<unsigned char> lowp_tmp;
    for (size_t g = 0; g < G; ++g) {
      const auto& grp = I.layout.groups[g];
      AdamWState st;
      AdamWOptions o;
      bool has_opts = false;
      {
        // the moment count precedes its checksum: check it before load_state sizes buffers by it
        // (0 = a group never updated, else the group's size)
        const auto pos = is.tellg();
        char head[32];  // magic, version, flags, step, n (optimizer/adamw.hpp save_state)
        if (!is.read(head, sizeof head))
          r.fail(fmt::format("truncated optimizer state: the file ends inside the AdamW state of group '{}'", grp.name));
        int64_t n = 0;
        std::memcpy(&n, head + 24, 8);
        if (n != 0 && n != grp.numel)
          r.fail(fmt::format("group '{}': AdamW moments of {} parameters, expected {} (corrupted optimizer state)",
                             grp.name, n, grp.numel));
        is.seekg(pos);
        try {
          load_state(is, st, n, &o, &has_opts);
        } catch (const std::runtime_error& e) {
          r.fail(fmt::format("group '{}': {}", grp.name, e.what()));
        }
      }
      if (!has_opts) r.fail(fmt::format("group '{}': the AdamW state carries no hyper-parameters", grp.name));
      if (!same_except_lr(o, I.opt.adam))
        r.fail(fmt::format("group '{}': saved with {}, this session uses {}; resume with the same optimizer settings",
                           grp.name, describe(o), describe(I.opt.adam)));
      modified = true;
      I.adam[g] = std::move(st);
      if (has_master) {
        r.bytes(I.master[g].data(), size_t(grp.numel) * sizeof(float), "the master weights");
        r.checksum(fmt::format("the master weights of group '{}'", grp.name));
      }
      if (has_lowp) {
        const size_t bytes = size_t(grp.numel) * es_file;
        void* dst = I.store->lowp[g].data();
        if (file_dt != dt) {
          lowp_tmp.resize(bytes);
          dst = lowp_tmp.data();
        }
        r.bytes(dst, bytes, "the low-precision weights");
        r.checksum(fmt::format("the low-precision weights of group '{}'", grp.name));
        if (staleness == 0) {
          // sync: the copy is the master's, recast below
        } else if (file_dt != dt) {  // another backend saved it: convert through fp32
          std::vector<float> f(size_t(grp.numel));
          for (int64_t i = 0; i < grp.numel; ++i) {
            const unsigned char* p = lowp_tmp.data() + size_t(i) * es_file;
            uint16_t h;
            if (file_dt == DType::f32) std::memcpy(&f[size_t(i)], p, 4);
            else std::memcpy(&h, p, 2), f[size_t(i)] = file_dt == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
          }
          cast_f32_to(f.data(), I.store->lowp[g].data(), grp.numel, dt);
        }
      }
      // without a stored copy (sync state, or a sync session) the copy is the master, rounded
      if (!has_lowp || staleness == 0)
        cast_f32_to(I.master[g].data(), I.store->lowp[g].data(), grp.numel, dt);
    }
    if (has_scaler) {
      LossScaler loaded(I.scaler->options());
      try {
        loaded.load(is);
      } catch (const std::runtime_error& e) {
        r.fail(e.what());
      }
      *I.scaler = loaded;
    }
    char end[8];
    if (!is.read(end, 8) || std::memcmp(end, kEnd, 8) != 0)
      r.fail("corrupted optimizer state: the end marker \"RPOPTEND\" is missing");
    if (is.peek() != std::char_traits<char>::eof()) r.fail("corrupted optimizer state: trailing bytes after the end marker");

    // ---- continue at step N -------------------------------------------------------
    std::vector<float> next_scales;
    if (I.scaler) {
      // scales of steps N..N+staleness: the file's, adapted when the mode changed
      next_scales = scales;
      next_scales.resize(size_t(staleness + 1), I.scaler->scale());
      if (staleness == 0) next_scales = {I.scaler->scale()};
    }
    ask<Ack>(*I.sys, I.scheduler, ResumeAt{N, next_scales}, path.c_str());
    for (auto& sh : I.shards) ask<Ack>(*I.sys, sh, ResumeAt{N, {}}, path.c_str());
  } catch (const std::exception& e) {
    if (modified) I.load_failed = e.what();
    throw;
  }
  I.current_step = N;
  I.first_step = N;
  I.waited_through = N - 1;
  I.resumed = true;
  return OptimizerStateInfo{N, has_master, file_async};
}

}  // namespace rp
