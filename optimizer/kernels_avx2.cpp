// AVX2 (+FMA, F16C) versions of the optimizer kernels; see kernels.hpp for the formula
// every path evaluates. 8 fp32 lanes; the tail (< 8 elements) is copied into a zero-padded
// stack block, run through the same vector code and copied back.
#include "optimizer/kernels.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")

namespace rp::detail {
namespace {

struct C8 {
  __m256 gs, l2, decay, omb1, b2, omb2, bc2s, eps, ss;
};

// 8 u32 lanes (each <= 0xffff) -> 8 u16 in order
inline __attribute__((always_inline)) __m128i narrow16(__m256i r) {
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

inline __attribute__((always_inline)) __m128i to_bf16_8(__m256 w) {
  const __m256i u = _mm256_castps_si256(w);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(w, w, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  return narrow16(r);
}

inline __attribute__((always_inline)) __m128i to_f16_8(__m256 w) {
  const __m128i h = _mm256_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT);
  // NaN: sign | 0x7e00 (the hardware keeps the payload; the scalar path does not)
  const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(w, w, _CMP_UNORD_Q));
  const __m256i q32 = _mm256_or_si256(
      _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(w), 16), _mm256_set1_epi32(0x8000)),
      _mm256_set1_epi32(0x7e00));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
  return _mm_blendv_epi8(h, narrow16(q32), nan16);
}

template <bool L2, bool Ams, Out O, bool Stream>
inline __attribute__((always_inline)) void body(float* __restrict w_, float* __restrict m_,
                                                float* __restrict v_, float* __restrict vmax_,
                                                const float* __restrict g_, void* __restrict out, int64_t i,
                                                const C8& c) {
  const __m256 w = _mm256_loadu_ps(w_ + i), g = _mm256_loadu_ps(g_ + i), m = _mm256_loadu_ps(m_ + i),
               v = _mm256_loadu_ps(v_ + i);
  const __m256 gsi = _mm256_mul_ps(g, c.gs);
  __m256 gg, d;
  if constexpr (L2) {
    gg = _mm256_fmadd_ps(c.l2, w, gsi);
    d = _mm256_sub_ps(gg, m);
  } else {
    gg = gsi;
    d = _mm256_fmsub_ps(g, c.gs, m);
  }
  const __m256 mn = _mm256_fmadd_ps(c.omb1, d, m);
  const __m256 vn = _mm256_fmadd_ps(_mm256_mul_ps(c.omb2, gg), gg, _mm256_mul_ps(c.b2, v));
  _mm256_storeu_ps(m_ + i, mn);
  _mm256_storeu_ps(v_ + i, vn);
  __m256 vd = vn;
  if constexpr (Ams) {
    vd = _mm256_max_ps(_mm256_loadu_ps(vmax_ + i), vn);  // (vmax > v ? vmax : v)
    _mm256_storeu_ps(vmax_ + i, vd);
  }
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vd), c.bc2s), c.eps);
  const __m256 upd = _mm256_div_ps(_mm256_mul_ps(c.ss, mn), denom);
  const __m256 wn = _mm256_fmsub_ps(w, c.decay, upd);
  _mm256_storeu_ps(w_ + i, wn);
  if constexpr (O == Out::f32) {
    float* o = static_cast<float*>(out) + i;
    if constexpr (Stream) _mm256_stream_ps(o, wn);
    else _mm256_storeu_ps(o, wn);
  } else if constexpr (O == Out::bf16 || O == Out::f16) {
    __m128i h;
    if constexpr (O == Out::bf16) h = to_bf16_8(wn);
    else h = to_f16_8(wn);
    auto* o = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i);
    if constexpr (Stream) _mm_stream_si128(o, h);
    else _mm_storeu_si128(o, h);
  }
}

template <bool L2, bool Ams, Out O>
void run_block(const AdamPtrs& p, int64_t i, int64_t n, const C8& c) {  // n < 8 elements
  constexpr size_t es = O == Out::f32 ? 4 : 2;
  alignas(32) float w[8] = {}, m[8] = {}, v[8] = {}, vm[8] = {}, g[8] = {};
  alignas(32) uint16_t oh[8];
  alignas(32) float of[8];
  const size_t b = size_t(n) * 4;
  std::memcpy(w, p.w + i, b);
  std::memcpy(m, p.m + i, b);
  std::memcpy(v, p.v + i, b);
  std::memcpy(g, p.g + i, b);
  if constexpr (Ams) std::memcpy(vm, p.vmax + i, b);
  void* out = O == Out::f32 ? static_cast<void*>(of) : static_cast<void*>(oh);
  body<L2, Ams, O, false>(w, m, v, vm, g, out, 0, c);
  std::memcpy(p.w + i, w, b);
  std::memcpy(p.m + i, m, b);
  std::memcpy(p.v + i, v, b);
  if constexpr (Ams) std::memcpy(p.vmax + i, vm, b);
  if constexpr (O != Out::none) std::memcpy(static_cast<char*>(p.out) + size_t(i) * es, out, size_t(n) * es);
}

template <bool L2, bool Ams, Out O>
void range(const AdamPtrs& p, int64_t lo, int64_t hi, const StepConsts& s) {
  const C8 c{_mm256_set1_ps(s.gs),       _mm256_set1_ps(s.l2),  _mm256_set1_ps(s.decay),
             _mm256_set1_ps(s.omb1),     _mm256_set1_ps(s.b2),  _mm256_set1_ps(s.omb2),
             _mm256_set1_ps(s.bc2_sqrt), _mm256_set1_ps(s.eps), _mm256_set1_ps(s.step_size)};
  int64_t i = lo;
  bool stream = false;
  if constexpr (O != Out::none) {
    constexpr int64_t es = O == Out::f32 ? 4 : 2, align = 8 * es;
    const auto addr = reinterpret_cast<uintptr_t>(p.out) + uintptr_t(lo * es);
    if (addr % es == 0 && hi - lo >= 64) {
      const int64_t peel = int64_t((align - addr % align) % align) / es;
      if (peel > 0) run_block<L2, Ams, O>(p, i, peel, c);
      i += peel;
      stream = true;
    }
  }
  if (stream) {
    for (; i + 8 <= hi; i += 8) body<L2, Ams, O, true>(p.w, p.m, p.v, p.vmax, p.g, p.out, i, c);
  } else {
    for (; i + 8 <= hi; i += 8) body<L2, Ams, O, false>(p.w, p.m, p.v, p.vmax, p.g, p.out, i, c);
  }
  if (i < hi) run_block<L2, Ams, O>(p, i, hi - i, c);
  if (stream) _mm_sfence();
}

template <bool L2, bool Ams>
AdamRangeFn pick_out(Out o) {
  switch (o) {
    case Out::none: return &range<L2, Ams, Out::none>;
    case Out::f32: return &range<L2, Ams, Out::f32>;
    case Out::bf16: return &range<L2, Ams, Out::bf16>;
    case Out::f16: return &range<L2, Ams, Out::f16>;
  }
  return nullptr;
}

template <Out O, bool Stream>
inline __attribute__((always_inline)) void cast8(const float* w, void* out, int64_t i) {
  const __m256 x = _mm256_loadu_ps(w + i);
  if constexpr (O == Out::f32) {
    float* o = static_cast<float*>(out) + i;
    if constexpr (Stream) _mm256_stream_ps(o, x);
    else _mm256_storeu_ps(o, x);
  } else {
    const __m128i h = O == Out::bf16 ? to_bf16_8(x) : to_f16_8(x);
    auto* o = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i);
    if constexpr (Stream) _mm_stream_si128(o, h);
    else _mm_storeu_si128(o, h);
  }
}

template <Out O>
void cast_tail(const float* w, void* out, int64_t i, int64_t n) {  // n < 8
  constexpr size_t es = O == Out::f32 ? 4 : 2;
  alignas(32) float x[8] = {};
  alignas(32) unsigned char o[32];
  std::memcpy(x, w + i, size_t(n) * 4);
  cast8<O, false>(x, o, 0);
  std::memcpy(static_cast<char*>(out) + size_t(i) * es, o, size_t(n) * es);
}

template <Out O>
void cast_range(const float* w, void* out, int64_t lo, int64_t hi) {
  constexpr int64_t es = O == Out::f32 ? 4 : 2, align = 8 * es;
  int64_t i = lo;
  const auto addr = reinterpret_cast<uintptr_t>(out) + uintptr_t(lo * es);
  const bool stream = addr % es == 0 && hi - lo >= 64;
  if (stream) {
    const int64_t peel = int64_t((align - addr % align) % align) / es;
    if (peel > 0) cast_tail<O>(w, out, i, peel);
    i += peel;
    for (; i + 8 <= hi; i += 8) cast8<O, true>(w, out, i);
  } else {
    for (; i + 8 <= hi; i += 8) cast8<O, false>(w, out, i);
  }
  if (i < hi) cast_tail<O>(w, out, i, hi - i);
  if (stream) _mm_sfence();
}

}  // namespace

CastRangeFn cast_kernel_avx2(Out o) {
  switch (o) {
    case Out::f32: return &cast_range<Out::f32>;
    case Out::bf16: return &cast_range<Out::bf16>;
    case Out::f16: return &cast_range<Out::f16>;
    default: return nullptr;
  }
}

AdamRangeFn adam_kernel_avx2(bool l2, bool ams, Out o) {
  if (l2) return ams ? pick_out<true, true>(o) : pick_out<true, false>(o);
  return ams ? pick_out<false, true>(o) : pick_out<false, false>(o);
}

void sumsq_avx2(const float* g, int64_t n, double acc[16]) {
  __m256d a[4];
  for (int k = 0; k < 4; ++k) a[k] = _mm256_loadu_pd(acc + 4 * k);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 4; ++k) {
      const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(g + i + 4 * k));
      a[k] = _mm256_fmadd_pd(x, x, a[k]);
    }
  for (int k = 0; k < 4; ++k) _mm256_storeu_pd(acc + 4 * k, a[k]);
  for (int j = 0; i < n; ++i, ++j) {
    const double x = g[i];
    acc[j] = std::fma(x, x, acc[j]);
  }
}

}  // namespace rp::detail

#pragma GCC pop_options

#else  // not x86-64: no AVX2 path
namespace rp::detail {
AdamRangeFn adam_kernel_avx2(bool, bool, Out) { return nullptr; }
CastRangeFn cast_kernel_avx2(Out) { return nullptr; }
void sumsq_avx2(const float* g, int64_t n, double acc[16]) { sumsq_scalar(g, n, acc); }
}  // namespace rp::detail
#endif
