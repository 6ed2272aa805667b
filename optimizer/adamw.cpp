// AdamW / Adam step (see adamw.hpp for the formulas, kernels.hpp for the rounding), the
// portable scalar kernel, the dispatch over ISA paths and thread pools, and state
// (de)serialisation.
#include "optimizer/adamw.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "base/checksum.hpp"
#include "optimizer/kernels.hpp"

namespace rp {
namespace detail {
namespace {

constexpr int64_t kBlock = 64;  // elements per block of the scalar loop

/// fp32 -> bf16 bits, round-to-nearest-even, NaN -> quiet NaN (same as rp::f32_to_bf16,
/// written branch-free so the loop vectorises).
inline uint16_t to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t q = (u >> 16) | 0x40u;
  return uint16_t(((u & 0x7fffffffu) > 0x7f800000u) ? q : r);
}

/// fp32 -> IEEE half bits, round-to-nearest-even; overflow -> inf, NaN -> sign|0x7e00
/// (same results as rp::f32_to_f16), branch-free.
inline uint16_t to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t a = u & 0x7fffffffu;
  // normal half: rebias the exponent, round the 13 dropped bits to nearest-even
  uint32_t r = a - 0x38000000u;
  uint32_t normal = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  // subnormal half (|f| < 2^-14): adding 0.5f lines the half's ulp (2^-24) up with the
  // float's last mantissa bit, so the FPU's own round-to-nearest-even does the rounding.
  float s = std::bit_cast<float>(a) + 0.5f;
  uint32_t sub = std::bit_cast<uint32_t>(s) - 0x3f000000u;
  // a mask, not ?:, here: GCC 12 refuses to vectorise that select (mixed conversions)
  uint32_t is_sub = 0u - uint32_t(a < 0x38800000u);
  uint32_t o = (sub & is_sub) | (normal & ~is_sub);
  o = a >= 0x477ff000u ? 0x7c00u : o;  // rounds past 65504: inf
  o = a > 0x7f800000u ? 0x7e00u : o;   // NaN
  return uint16_t(o | ((u >> 16) & 0x8000u));
}

// The scalar path: the formula of kernels.hpp with std::fma. Compiled for the build's
// baseline ISA (GCC may auto-vectorise it under -march=native; the fused operations are
// explicit, so the result is the same).
template <bool L2, bool Ams, Out O>
void scalar_range(const AdamPtrs& p, int64_t lo, int64_t hi, const StepConsts& c) {
  float* __restrict w = p.w;
  float* __restrict m = p.m;
  float* __restrict v = p.v;
  float* __restrict vmax = p.vmax;
  const float* __restrict g = p.g;
  float* __restrict of = static_cast<float*>(p.out);
  uint16_t* __restrict oh = static_cast<uint16_t*>(p.out);
  const float gs = c.gs, l2 = c.l2, decay = c.decay, omb1 = c.omb1, b2 = c.b2, omb2 = c.omb2,
              bc2s = c.bc2_sqrt, eps = c.eps, ss = c.step_size;
  auto body = [&](int64_t i) __attribute__((always_inline)) {
    const float wi = w[i], gi = g[i], mi = m[i];
    const float gsi = gi * gs;
    float gg, d;
    if constexpr (L2) {
      gg = std::fma(l2, wi, gsi);
      d = gg - mi;
    } else {
      gg = gsi;
      d = std::fma(gi, gs, -mi);
    }
    const float mn = std::fma(omb1, d, mi);
    const float vn = std::fma(omb2 * gg, gg, b2 * v[i]);
    m[i] = mn;
    v[i] = vn;
    float vd = vn;
    if constexpr (Ams) {
      const float vm = vmax[i];
      vd = vm > vn ? vm : vn;  // NaN in v propagates, as torch.maximum
      vmax[i] = vd;
    }
    const float denom = std::sqrt(vd) / bc2s + eps;
    const float wn = std::fma(wi, decay, -((ss * mn) / denom));
    w[i] = wn;
    if constexpr (O == Out::f32) of[i] = wn;
    if constexpr (O == Out::bf16) oh[i] = to_bf16(wn);
    if constexpr (O == Out::f16) oh[i] = to_f16(wn);
  };
  int64_t i = lo;
  for (; i + kBlock <= hi; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j) body(i + j);
  for (; i < hi; ++i) body(i);
}

template <bool L2, bool Ams>
AdamRangeFn pick_out(Out o) {
  switch (o) {
    case Out::none: return &scalar_range<L2, Ams, Out::none>;
    case Out::f32: return &scalar_range<L2, Ams, Out::f32>;
    case Out::bf16: return &scalar_range<L2, Ams, Out::bf16>;
    case Out::f16: return &scalar_range<L2, Ams, Out::f16>;
  }
  return nullptr;
}

template <Out O>
void scalar_cast(const float* __restrict w, void* __restrict out, int64_t lo, int64_t hi) {
  float* __restrict of = static_cast<float*>(out);
  uint16_t* __restrict oh = static_cast<uint16_t*>(out);
  for (int64_t i = lo; i < hi; ++i) {
    if constexpr (O == Out::f32) of[i] = w[i];
    if constexpr (O == Out::bf16) oh[i] = to_bf16(w[i]);
    if constexpr (O == Out::f16) oh[i] = to_f16(w[i]);
  }
}

}  // namespace

CastRangeFn cast_kernel_scalar(Out o) {
  switch (o) {
    case Out::f32: return &scalar_cast<Out::f32>;
    case Out::bf16: return &scalar_cast<Out::bf16>;
    case Out::f16: return &scalar_cast<Out::f16>;
    default: return nullptr;
  }
}

AdamRangeFn adam_kernel_scalar(bool l2, bool ams, Out o) {
  if (l2) return ams ? pick_out<true, true>(o) : pick_out<true, false>(o);
  return ams ? pick_out<false, true>(o) : pick_out<false, false>(o);
}

}  // namespace detail

namespace {

using detail::Out;
using detail::StepConsts;

static_assert(std::endian::native == std::endian::little, "state files are little-endian");

constexpr int64_t kGrain = 1024;  // piece boundaries: 4 KiB of fp32 (a page)

void check_state_vec(const FloatVec& vec, int64_t n, const char* name) {
  if (vec.empty() && n > 0) return;  // sized by the caller once all checks passed
  if (int64_t(vec.size()) != n)
    throw std::invalid_argument(
        fmt::format("adamw_update: state.{} has {} elements, parameter group has {}", name, vec.size(), n));
}

// ---- serialisation -------------------------------------------------------------------
constexpr char kMagic[8] = {'R', 'P', 'A', 'D', 'A', 'M', 'W', '1'};
// 1: FNV-1a checksum (refused); 2: the checksum left out flags, step and n (read); 3: it covers them
constexpr uint32_t kVersion = 3;

/// The bytes of flags, step and n as written, for the checksum of a version-3 state.
void add_head(Checksum& c, uint32_t flags, int64_t step, int64_t n) {
  unsigned char b[20];
  std::memcpy(b, &flags, 4);
  std::memcpy(b + 4, &step, 8);
  std::memcpy(b + 12, &n, 8);
  c.update(b, sizeof b);
}

void add(Checksum& c, const FloatVec& v) { c.update(v.data(), v.size() * sizeof(float)); }

// hyper-parameter block of the state file
constexpr size_t kOptsBytes = 5 * 8 + 4;
void pack_opts(const AdamWOptions& o, unsigned char* out) {
  const double d[5] = {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  std::memcpy(out, d, 40);
  const uint32_t bits = uint32_t(o.decoupled) | uint32_t(o.amsgrad) << 1 | uint32_t(o.maximize) << 2;
  std::memcpy(out + 40, &bits, 4);
}
AdamWOptions unpack_opts(const unsigned char* in) {
  double d[5];
  std::memcpy(d, in, 40);
  uint32_t bits;
  std::memcpy(&bits, in + 40, 4);
  if (bits & ~7u) throw std::runtime_error(fmt::format("load_state: unknown option bits 0x{:x}", bits));
  AdamWOptions o;
  o.lr = d[0];
  o.beta1 = d[1];
  o.beta2 = d[2];
  o.eps = d[3];
  o.weight_decay = d[4];
  o.decoupled = bits & 1u;
  o.amsgrad = bits & 2u;
  o.maximize = bits & 4u;
  return o;
}

template <class T>
void put(std::ostream& os, const T& x) {
  os.write(reinterpret_cast<const char*>(&x), sizeof(T));
}
template <class T>
T get(std::istream& is, const char* what) {
  T x{};
  if (!is.read(reinterpret_cast<char*>(&x), sizeof(T)))
    throw std::runtime_error(fmt::format("load_state: truncated stream while reading {}", what));
  return x;
}
void get_floats(std::istream& is, FloatVec& v, int64_t n, const char* what) {
  v.resize(size_t(n));
  if (n > 0 && !is.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4)))
    throw std::runtime_error(
        fmt::format("load_state: truncated stream while reading {} ({} floats expected)", what, n));
}

}  // namespace

void validate(const AdamWOptions& o) {
  auto bad = [](const char* f, double x, const char* want) {
    throw std::invalid_argument(fmt::format("AdamWOptions.{} = {} is invalid ({})", f, x, want));
  };
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) bad("lr", o.lr, "need a finite value >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) bad("beta1", o.beta1, "need 0 <= beta1 < 1");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) bad("beta2", o.beta2, "need 0 <= beta2 < 1");
  if (!(o.eps >= 0) || !std::isfinite(o.eps)) bad("eps", o.eps, "need a finite value >= 0");
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay))
    bad("weight_decay", o.weight_decay, "need a finite value >= 0");
}

namespace {

void adamw_impl(float* w, AdamWState& st, const float* grad, int64_t n, float grad_scale,
                const AdamWOptions& o, double lr, void* lowp_out, DType lowp_dtype, ThreadPool* pool,
                int max_parts) {
  validate(o);
  if (n < 0) throw std::invalid_argument(fmt::format("adamw_update: n = {} is negative", n));
  if (n > 0 && (!w || !grad))
    throw std::invalid_argument("adamw_update: null weight or gradient pointer with n > 0");
  if (!(lr >= 0) || !std::isfinite(lr))
    throw std::invalid_argument(fmt::format("adamw_update: lr = {} (need finite, >= 0)", lr));
  if (!std::isfinite(grad_scale))
    throw std::invalid_argument(fmt::format("adamw_update: grad_scale = {} is not finite", grad_scale));
  if (max_parts < 1)
    throw std::invalid_argument(fmt::format("adamw_update: threads = {} (need >= 1)", max_parts));
  Out out = Out::none;
  if (lowp_out) {
    switch (lowp_dtype) {
      case DType::f32: out = Out::f32; break;
      case DType::bf16: out = Out::bf16; break;
      case DType::f16: out = Out::f16; break;
      default:
        throw std::invalid_argument(fmt::format(
            "adamw_update: low-precision copy dtype #{} unsupported (f32, bf16 or f16)", int(lowp_dtype)));
    }
  }
  check_state_vec(st.m, n, "m");
  check_state_vec(st.v, n, "v");
  if (o.amsgrad) check_state_vec(st.vmax, n, "vmax");
  // all checks passed: from here on the call cannot fail. New state vectors are sized
  // without writing; the workers zero their own pieces below (first touch).
  const bool zero_m = st.m.empty() && n > 0, zero_v = st.v.empty() && n > 0,
             zero_vmax = o.amsgrad && st.vmax.empty() && n > 0;
  if (zero_m) st.m.resize(size_t(n));
  if (zero_v) st.v.resize(size_t(n));
  if (zero_vmax) st.vmax.resize(size_t(n));
  const int64_t t = ++st.step;
  if (n == 0) return;

  StepConsts c;
  c.gs = o.maximize ? -grad_scale : grad_scale;  // exact: (-s) * g == -(s * g)
  c.l2 = o.decoupled ? 0.f : float(o.weight_decay);
  c.decay = o.decoupled ? float(1.0 - lr * o.weight_decay) : 1.f;
  c.omb1 = float(1.0 - o.beta1);
  c.b2 = float(o.beta2);
  c.omb2 = float(1.0 - o.beta2);
  c.bc2_sqrt = float(std::sqrt(1.0 - std::pow(o.beta2, double(t))));
  c.eps = float(o.eps);
  c.step_size = float(lr / (1.0 - std::pow(o.beta1, double(t))));
  const bool l2 = !o.decoupled && o.weight_decay != 0.0;
  const detail::AdamRangeFn fn = detail::adam_kernel(adamw_isa(), l2, o.amsgrad, out);
  const detail::AdamPtrs ptrs{w,    st.m.data(), st.v.data(), o.amsgrad ? st.vmax.data() : nullptr,
                              grad, lowp_out};

  int parts = 1;
  if (pool) {
    const int64_t by_size = (n + kMinElemsPerThread - 1) / kMinElemsPerThread;
    parts = int(std::min<int64_t>({int64_t(max_parts), int64_t(pool->size()), by_size}));
  }
  auto piece = [&](int p) {
    int64_t lo, hi;
    split_range(n, parts, kGrain, p, lo, hi);
    if (lo >= hi) return;
    const size_t bytes = size_t(hi - lo) * sizeof(float);
    if (zero_m) std::memset(ptrs.m + lo, 0, bytes);
    if (zero_v) std::memset(ptrs.v + lo, 0, bytes);
    if (zero_vmax) std::memset(ptrs.vmax + lo, 0, bytes);
    fn(ptrs, lo, hi, c);
  };
  if (parts <= 1) {
    piece(0);
    return;
  }
  pool->run(parts, piece);
}

}  // namespace

void adamw_update(float* w, AdamWState& st, const float* grad, int64_t n, float grad_scale,
                  const AdamWOptions& o, double lr, void* lowp_out, DType lowp_dtype, int threads) {
  ThreadPool* pool = threads > 1 && n >= 2 * kMinElemsPerThread ? &shared_pool(threads) : nullptr;
  adamw_impl(w, st, grad, n, grad_scale, o, lr, lowp_out, lowp_dtype, pool, threads);
}

void adamw_update(float* w, AdamWState& st, const float* grad, int64_t n, float grad_scale,
                  const AdamWOptions& o, double lr, void* lowp_out, DType lowp_dtype, ThreadPool& pool) {
  adamw_impl(w, st, grad, n, grad_scale, o, lr, lowp_out, lowp_dtype, &pool, pool.size());
}

void write_lowp_copy(const float* w, void* out, int64_t n, DType dt, ThreadPool* pool) {
  if (n < 0) throw std::invalid_argument(fmt::format("write_lowp_copy: n = {} is negative", n));
  if (n > 0 && (!w || !out)) throw std::invalid_argument("write_lowp_copy: null pointer with n > 0");
  Out o;
  switch (dt) {
    case DType::f32: o = Out::f32; break;
    case DType::bf16: o = Out::bf16; break;
    case DType::f16: o = Out::f16; break;
    default:
      throw std::invalid_argument(
          fmt::format("write_lowp_copy: dtype #{} unsupported (f32, bf16 or f16)", int(dt)));
  }
  if (n == 0) return;
  const detail::CastRangeFn fn = detail::cast_kernel(adamw_isa(), o);
  int parts = 1;
  if (pool) parts = int(std::min<int64_t>(pool->size(), (n + kMinElemsPerThread - 1) / kMinElemsPerThread));
  auto piece = [&](int p) {
    int64_t lo, hi;
    split_range(n, parts, kGrain, p, lo, hi);
    if (lo < hi) fn(w, out, lo, hi);
  };
  if (parts <= 1) return piece(0);
  pool->run(parts, piece);
}

int64_t saved_state_bytes(uint32_t flags, int64_t n) {
  return 32 + ((flags & 2u) ? int64_t(kOptsBytes) : 0) + n * 4 * ((flags & 1u) ? 3 : 2) + 8;
}

void save_state(std::ostream& os, const AdamWState& st, const AdamWOptions* opts) {
  const int64_t n = int64_t(st.m.size());
  if (st.v.size() != st.m.size() || (!st.vmax.empty() && st.vmax.size() != st.m.size()))
    throw std::runtime_error(fmt::format("save_state: inconsistent state (m {}, v {}, vmax {})", st.m.size(),
                                         st.v.size(), st.vmax.size()));
  os.write(kMagic, sizeof kMagic);
  put(os, kVersion);
  const uint32_t flags = uint32_t(st.vmax.empty() ? 0u : 1u) | uint32_t(opts ? 2u : 0u);
  put(os, flags);
  put(os, st.step);
  put(os, n);
  Checksum sum;
  add_head(sum, flags, st.step, n);
  if (opts) {
    unsigned char b[kOptsBytes];
    pack_opts(*opts, b);
    os.write(reinterpret_cast<const char*>(b), kOptsBytes);
    sum.update(b, kOptsBytes);
  }
  for (const auto* vec : {&st.m, &st.v, &st.vmax}) {
    if (vec->empty()) continue;
    os.write(reinterpret_cast<const char*>(vec->data()), std::streamsize(n * 4));
    add(sum, *vec);
  }
  put(os, sum.digest());
  if (!os) throw std::runtime_error("save_state: write to the output stream failed");
}

void load_state(std::istream& is, AdamWState& st, int64_t expected_n, AdamWOptions* opts, bool* has_opts) {
  char magic[sizeof kMagic];
  if (!is.read(magic, sizeof magic))
    throw std::runtime_error("load_state: truncated stream while reading the magic");
  if (!std::equal(magic, magic + sizeof magic, kMagic))
    throw std::runtime_error("load_state: not an AdamW state (bad magic, expected \"RPADAMW1\")");
  const auto version = get<uint32_t>(is, "the version");
  if (version != 2 && version != kVersion)
    throw std::runtime_error(
        fmt::format("load_state: unsupported version {} (this build reads 2 and {}; corrupted state?)",
                    version, kVersion));
  const auto flags = get<uint32_t>(is, "the flags");
  if (flags & ~3u) throw std::runtime_error(fmt::format("load_state: unknown flags 0x{:x}", flags));
  const auto step = get<int64_t>(is, "the step");
  const auto n = get<int64_t>(is, "the parameter count");
  if (step < 0) throw std::runtime_error(fmt::format("load_state: negative step {}", step));
  if (n < 0) throw std::runtime_error(fmt::format("load_state: negative parameter count {}", n));
  if (expected_n >= 0 && n != expected_n)
    throw std::runtime_error(
        fmt::format("load_state: size mismatch: expected {} parameters, file has {}", expected_n, n));
  Checksum sum;
  if (version >= 3) add_head(sum, flags, step, n);  // a damaged step or count shows
  unsigned char ob[kOptsBytes];
  if (flags & 2u) {
    if (!is.read(reinterpret_cast<char*>(ob), kOptsBytes))
      throw std::runtime_error("load_state: truncated stream while reading the hyper-parameters");
    sum.update(ob, kOptsBytes);
  }
  AdamWState s;
  s.step = step;
  get_floats(is, s.m, n, "m");
  get_floats(is, s.v, n, "v");
  if (flags & 1u) get_floats(is, s.vmax, n, "vmax");
  for (const auto* vec : {&s.m, &s.v, &s.vmax})
    if (!vec->empty()) add(sum, *vec);
  if (get<uint64_t>(is, "the checksum") != sum.digest())
    throw std::runtime_error("load_state: checksum mismatch (corrupted state)");
  if (n == 0) s.m.clear(), s.v.clear(), s.vmax.clear();
  AdamWOptions o;
  if (flags & 2u) o = unpack_opts(ob);  // may throw: before anything is replaced
  st = std::move(s);
  if (has_opts) *has_opts = flags & 2u;
  if (opts && (flags & 2u)) *opts = o;
}

}  // namespace rp
