// AdamW / Adam kernel (see adamw.hpp for the formulas) and state (de)serialisation.
//
// The hot loop is plain C++ that GCC auto-vectorises at -O2 -march=native: the option
// flags are template parameters (resolved once per call, outside the loop), pointers are
// __restrict, the range is walked in fixed 64-element blocks (a constant trip count, so
// GCC's -O2 "very cheap" vectoriser accepts it without an epilogue) plus a scalar tail,
// and the low-precision conversions are branch-free integer code.
#include "optimizer/adamw.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace rp {
namespace {

static_assert(std::endian::native == std::endian::little, "state files are little-endian");

constexpr int64_t kBlock = 64;  // elements per vectorised block (multiple of 16 lanes)

enum class Out { none, f32, bf16, f16 };

/// Scalar constants of one step, computed in double and rounded to float once.
struct StepConsts {
  float gs;           // grad_scale, negated for maximize
  float l2;           // weight_decay when !decoupled, else 0 (unused)
  float decay;        // 1 - lr * weight_decay when decoupled, else 1
  float omb1;         // 1 - beta1
  float b2, omb2;     // beta2, 1 - beta2
  float bc2_sqrt;     // sqrt(1 - beta2^t)
  float eps;
  float step_size;    // lr / (1 - beta1^t)
};

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

template <bool L2, bool Ams, Out O>
inline void step_range(float* __restrict w, float* __restrict m, float* __restrict v,
                       float* __restrict vmax, const float* __restrict g_in,
                       void* __restrict out_v, int64_t lo, int64_t hi, const StepConsts& c) {
  const float gs = c.gs, l2 = c.l2, decay = c.decay, omb1 = c.omb1, b2 = c.b2,
              omb2 = c.omb2, bc2s = c.bc2_sqrt, eps = c.eps, ss = c.step_size;
  float* __restrict of = static_cast<float*>(out_v);
  uint16_t* __restrict oh = static_cast<uint16_t*>(out_v);
  auto body = [&](int64_t i) __attribute__((always_inline)) {
    float wi = w[i];
    float g = g_in[i] * gs;
    if constexpr (L2) g = g + l2 * wi;
    wi = wi * decay;
    float mi = m[i];
    mi = mi + omb1 * (g - mi);
    float vi = b2 * v[i] + (omb2 * g) * g;
    m[i] = mi;
    v[i] = vi;
    float vd = vi;
    if constexpr (Ams) {
      const float vm = vmax[i];
      vd = vm > vi ? vm : vi;  // NaN in v propagates, as torch.maximum
      vmax[i] = vd;
    }
    float denom = std::sqrt(vd) / bc2s + eps;
    wi = wi - (ss * mi) / denom;
    w[i] = wi;
    if constexpr (O == Out::f32) of[i] = wi;
    if constexpr (O == Out::bf16) oh[i] = to_bf16(wi);
    if constexpr (O == Out::f16) oh[i] = to_f16(wi);
  };
  int64_t i = lo;
  for (; i + kBlock <= hi; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j) body(i + j);
  for (; i < hi; ++i) body(i);
}

using RangeFn = void (*)(float*, float*, float*, float*, const float*, void*, int64_t, int64_t,
                         const StepConsts&);

template <bool L2, bool Ams>
RangeFn pick_out(Out o) {
  switch (o) {
    case Out::none: return &step_range<L2, Ams, Out::none>;
    case Out::f32: return &step_range<L2, Ams, Out::f32>;
    case Out::bf16: return &step_range<L2, Ams, Out::bf16>;
    case Out::f16: return &step_range<L2, Ams, Out::f16>;
  }
  return nullptr;
}

RangeFn pick(bool l2, bool ams, Out o) {
  if (l2) return ams ? pick_out<true, true>(o) : pick_out<true, false>(o);
  return ams ? pick_out<false, true>(o) : pick_out<false, false>(o);
}

void check_state_vec(std::vector<float>& vec, int64_t n, const char* name) {
  if (vec.empty() && n > 0) return;  // sized by the caller once all checks passed
  if (int64_t(vec.size()) != n)
    throw std::invalid_argument(fmt::format(
        "adamw_update: state.{} has {} elements, parameter group has {}", name, vec.size(), n));
}

// ---- serialisation -------------------------------------------------------------------
constexpr char kMagic[8] = {'R', 'P', 'A', 'D', 'A', 'M', 'W', '1'};
constexpr uint32_t kVersion = 1;

uint64_t fnv1a(uint64_t h, const std::vector<float>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0, e = v.size() * sizeof(float); i < e; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
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
void get_floats(std::istream& is, std::vector<float>& v, int64_t n, const char* what) {
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

void adamw_update(float* w, AdamWState& st, const float* grad, int64_t n, float grad_scale,
                  const AdamWOptions& o, double lr, void* lowp_out, DType lowp_dtype,
                  int threads) {
  validate(o);
  if (n < 0) throw std::invalid_argument(fmt::format("adamw_update: n = {} is negative", n));
  if (n > 0 && (!w || !grad))
    throw std::invalid_argument("adamw_update: null weight or gradient pointer with n > 0");
  if (!(lr >= 0) || !std::isfinite(lr))
    throw std::invalid_argument(fmt::format("adamw_update: lr = {} (need finite, >= 0)", lr));
  if (!std::isfinite(grad_scale))
    throw std::invalid_argument(fmt::format("adamw_update: grad_scale = {} is not finite",
                                            grad_scale));
  if (threads < 1)
    throw std::invalid_argument(fmt::format("adamw_update: threads = {} (need >= 1)", threads));
  Out out = Out::none;
  if (lowp_out) {
    switch (lowp_dtype) {
      case DType::f32: out = Out::f32; break;
      case DType::bf16: out = Out::bf16; break;
      case DType::f16: out = Out::f16; break;
      default:
        throw std::invalid_argument(fmt::format(
            "adamw_update: low-precision copy dtype #{} unsupported (f32, bf16 or f16)",
            int(lowp_dtype)));
    }
  }
  check_state_vec(st.m, n, "m");
  check_state_vec(st.v, n, "v");
  if (o.amsgrad) check_state_vec(st.vmax, n, "vmax");
  // all checks passed: from here on the call cannot fail
  if (st.m.empty()) st.m.assign(size_t(n), 0.f);
  if (st.v.empty()) st.v.assign(size_t(n), 0.f);
  if (o.amsgrad && st.vmax.empty()) st.vmax.assign(size_t(n), 0.f);
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
  RangeFn fn = pick(l2, o.amsgrad, out);
  float* vmax = o.amsgrad ? st.vmax.data() : nullptr;

  // split into `threads` contiguous pieces, boundaries on kBlock multiples
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const int64_t parts = std::min<int64_t>(threads, blocks);
  auto piece = [&](int64_t p) {
    int64_t lo = std::min(n, blocks * p / parts * kBlock);
    int64_t hi = std::min(n, blocks * (p + 1) / parts * kBlock);
    fn(w, st.m.data(), st.v.data(), vmax, grad, lowp_out, lo, hi, c);
  };
  if (parts <= 1) {
    piece(0);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(size_t(parts - 1));
  for (int64_t p = 1; p < parts; ++p) pool.emplace_back(piece, p);
  piece(0);
  for (auto& th : pool) th.join();
}

void save_state(std::ostream& os, const AdamWState& st) {
  const int64_t n = int64_t(st.m.size());
  if (st.v.size() != st.m.size() || (!st.vmax.empty() && st.vmax.size() != st.m.size()))
    throw std::runtime_error(fmt::format("save_state: inconsistent state (m {}, v {}, vmax {})",
                                         st.m.size(), st.v.size(), st.vmax.size()));
  os.write(kMagic, sizeof kMagic);
  put(os, kVersion);
  put(os, uint32_t(st.vmax.empty() ? 0u : 1u));
  put(os, st.step);
  put(os, n);
  uint64_t h = 14695981039346656037ull;
  for (const auto* vec : {&st.m, &st.v, &st.vmax}) {
    if (vec->empty()) continue;
    os.write(reinterpret_cast<const char*>(vec->data()), std::streamsize(n * 4));
    h = fnv1a(h, *vec);
  }
  put(os, h);
  if (!os) throw std::runtime_error("save_state: write to the output stream failed");
}

void load_state(std::istream& is, AdamWState& st, int64_t expected_n) {
  char magic[sizeof kMagic];
  if (!is.read(magic, sizeof magic))
    throw std::runtime_error("load_state: truncated stream while reading the magic");
  if (!std::equal(magic, magic + sizeof magic, kMagic))
    throw std::runtime_error("load_state: not an AdamW state (bad magic, expected \"RPADAMW1\")");
  const auto version = get<uint32_t>(is, "the version");
  if (version != kVersion)
    throw std::runtime_error(
        fmt::format("load_state: unsupported version {} (this build reads {})", version, kVersion));
  const auto flags = get<uint32_t>(is, "the flags");
  if (flags & ~1u)
    throw std::runtime_error(fmt::format("load_state: unknown flags 0x{:x}", flags));
  const auto step = get<int64_t>(is, "the step");
  const auto n = get<int64_t>(is, "the parameter count");
  if (step < 0) throw std::runtime_error(fmt::format("load_state: negative step {}", step));
  if (n < 0) throw std::runtime_error(fmt::format("load_state: negative parameter count {}", n));
  if (expected_n >= 0 && n != expected_n)
    throw std::runtime_error(fmt::format(
        "load_state: size mismatch: expected {} parameters, file has {}", expected_n, n));
  AdamWState s;
  s.step = step;
  get_floats(is, s.m, n, "m");
  get_floats(is, s.v, n, "v");
  if (flags & 1u) get_floats(is, s.vmax, n, "vmax");
  uint64_t h = 14695981039346656037ull;
  for (const auto* vec : {&s.m, &s.v, &s.vmax})
    if (!vec->empty()) h = fnv1a(h, *vec);
  if (get<uint64_t>(is, "the checksum") != h)
    throw std::runtime_error("load_state: checksum mismatch (corrupted state)");
  if (n == 0) s.m.clear(), s.v.clear(), s.vmax.clear();
  st = std::move(s);
}

}  // namespace rp
