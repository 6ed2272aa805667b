// AVX-512 (F, BW, VL, DQ + FMA, F16C) versions of the optimizer kernels; see kernels.hpp for
// the formula every path evaluates. 16 fp32 lanes; tails and the alignment peel use masked
// loads and stores, so every element goes through the same vector code.
#include "optimizer/kernels.hpp"

#if defined(__x86_64__)
// GCC 12's masked-load intrinsics start from an "undefined" vector it then warns about
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2,bmi,bmi2")

namespace rp::detail {
namespace {

struct C16 {
  __m512 gs, l2, decay, omb1, b2, omb2, bc2s, eps, ss;
};

inline __attribute__((always_inline)) __m256i to_bf16_16(__m512 w) {
  const __m512i u = _mm512_castps_si512(w);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

inline __attribute__((always_inline)) __m256i to_f16_16(__m512 w) {
  __m256i h = _mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT);
  // NaN: sign | 0x7e00 (the hardware keeps the payload; the scalar path does not)
  const __mmask16 nan = _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q);
  const __m512i sgn =
      _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(w), 16), _mm512_set1_epi32(0x8000));
  const __m256i q = _mm512_cvtepi32_epi16(_mm512_or_si512(sgn, _mm512_set1_epi32(0x7e00)));
  return _mm256_mask_blend_epi16(nan, h, q);
}

// One vector of 16 elements at index i; `k` masks the lanes (all ones unless Masked).
template <bool L2, bool Ams, Out O, bool Masked, bool Stream>
inline __attribute__((always_inline)) void body(const AdamPtrs& p, int64_t i, __mmask16 k, const C16& c) {
  auto ld = [k](const float* q) __attribute__((always_inline)) {
    if constexpr (Masked) return _mm512_maskz_loadu_ps(k, q);
    else return _mm512_loadu_ps(q);
  };
  auto st = [k](float* q, __m512 x) __attribute__((always_inline)) {
    if constexpr (Masked) _mm512_mask_storeu_ps(q, k, x);
    else _mm512_storeu_ps(q, x);
  };
  const __m512 w = ld(p.w + i), g = ld(p.g + i), m = ld(p.m + i), v = ld(p.v + i);
  const __m512 gsi = _mm512_mul_ps(g, c.gs);
  __m512 gg, d;
  if constexpr (L2) {
    gg = _mm512_fmadd_ps(c.l2, w, gsi);
    d = _mm512_sub_ps(gg, m);
  } else {
    gg = gsi;
    d = _mm512_fmsub_ps(g, c.gs, m);
  }
  const __m512 mn = _mm512_fmadd_ps(c.omb1, d, m);
  const __m512 vn = _mm512_fmadd_ps(_mm512_mul_ps(c.omb2, gg), gg, _mm512_mul_ps(c.b2, v));
  st(p.m + i, mn);
  st(p.v + i, vn);
  __m512 vd = vn;
  if constexpr (Ams) {
    vd = _mm512_max_ps(ld(p.vmax + i), vn);  // (vmax > v ? vmax : v): NaN in either gives v
    st(p.vmax + i, vd);
  }
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vd), c.bc2s), c.eps);
  const __m512 upd = _mm512_div_ps(_mm512_mul_ps(c.ss, mn), denom);
  const __m512 wn = _mm512_fmsub_ps(w, c.decay, upd);
  st(p.w + i, wn);
  if constexpr (O == Out::f32) {
    float* o = static_cast<float*>(p.out) + i;
    if constexpr (Masked) _mm512_mask_storeu_ps(o, k, wn);
    else if constexpr (Stream) _mm512_stream_ps(o, wn);
    else _mm512_storeu_ps(o, wn);
  } else if constexpr (O == Out::bf16 || O == Out::f16) {
    __m256i h;
    if constexpr (O == Out::bf16) h = to_bf16_16(wn);
    else h = to_f16_16(wn);
    auto* o = static_cast<uint16_t*>(p.out) + i;
    if constexpr (Masked) _mm256_mask_storeu_epi16(o, k, h);
    else if constexpr (Stream) _mm256_stream_si256(reinterpret_cast<__m256i*>(o), h);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), h);
  }
}

inline __mmask16 first_lanes(int64_t r) { return __mmask16((1u << r) - 1u); }

template <bool L2, bool Ams, Out O>
void range(const AdamPtrs& p, int64_t lo, int64_t hi, const StepConsts& s) {
  const C16 c{_mm512_set1_ps(s.gs),       _mm512_set1_ps(s.l2),  _mm512_set1_ps(s.decay),
              _mm512_set1_ps(s.omb1),     _mm512_set1_ps(s.b2),  _mm512_set1_ps(s.omb2),
              _mm512_set1_ps(s.bc2_sqrt), _mm512_set1_ps(s.eps), _mm512_set1_ps(s.step_size)};
  int64_t i = lo;
  bool stream = false;
  if constexpr (O != Out::none) {
    // The low-precision copy is written, not read: stream it (no read-for-ownership of the
    // destination lines) once its address is aligned to a whole vector store.
    constexpr int64_t es = O == Out::f32 ? 4 : 2, align = 16 * es;
    const auto addr = reinterpret_cast<uintptr_t>(p.out) + uintptr_t(lo * es);
    if (addr % es == 0 && hi - lo >= 64) {
      const int64_t peel = int64_t((align - addr % align) % align) / es;
      if (peel > 0) body<L2, Ams, O, true, false>(p, i, first_lanes(peel), c);
      i += peel;
      stream = true;
    }
  }
  if (stream) {
    for (; i + 16 <= hi; i += 16) body<L2, Ams, O, false, true>(p, i, 0xffff, c);
  } else {
    for (; i + 16 <= hi; i += 16) body<L2, Ams, O, false, false>(p, i, 0xffff, c);
  }
  if (i < hi) body<L2, Ams, O, true, false>(p, i, first_lanes(hi - i), c);
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

template <Out O>
void cast_range(const float* w, void* out, int64_t lo, int64_t hi) {
  auto one = [&](int64_t i, __mmask16 k, bool masked, bool stream) __attribute__((always_inline)) {
    const __m512 x = masked ? _mm512_maskz_loadu_ps(k, w + i) : _mm512_loadu_ps(w + i);
    if constexpr (O == Out::f32) {
      float* o = static_cast<float*>(out) + i;
      if (masked) _mm512_mask_storeu_ps(o, k, x);
      else if (stream) _mm512_stream_ps(o, x);
      else _mm512_storeu_ps(o, x);
    } else {
      const __m256i h = O == Out::bf16 ? to_bf16_16(x) : to_f16_16(x);
      auto* o = static_cast<uint16_t*>(out) + i;
      if (masked) _mm256_mask_storeu_epi16(o, k, h);
      else if (stream) _mm256_stream_si256(reinterpret_cast<__m256i*>(o), h);
      else _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), h);
    }
  };
  constexpr int64_t es = O == Out::f32 ? 4 : 2, align = 16 * es;
  int64_t i = lo;
  const auto addr = reinterpret_cast<uintptr_t>(out) + uintptr_t(lo * es);
  const bool stream = addr % es == 0 && hi - lo >= 64;
  if (stream) {
    const int64_t peel = int64_t((align - addr % align) % align) / es;
    if (peel > 0) one(i, first_lanes(peel), true, false);
    i += peel;
    for (; i + 16 <= hi; i += 16) one(i, 0xffff, false, true);
  } else {
    for (; i + 16 <= hi; i += 16) one(i, 0xffff, false, false);
  }
  if (i < hi) one(i, first_lanes(hi - i), true, false);
  if (stream) _mm_sfence();
}

}  // namespace

CastRangeFn cast_kernel_avx512(Out o) {
  switch (o) {
    case Out::f32: return &cast_range<Out::f32>;
    case Out::bf16: return &cast_range<Out::bf16>;
    case Out::f16: return &cast_range<Out::f16>;
    default: return nullptr;
  }
}

AdamRangeFn adam_kernel_avx512(bool l2, bool ams, Out o) {
  if (l2) return ams ? pick_out<true, true>(o) : pick_out<true, false>(o);
  return ams ? pick_out<false, true>(o) : pick_out<false, false>(o);
}

void sumsq_avx512(const float* g, int64_t n, double acc[16]) {
  __m512d a0 = _mm512_loadu_pd(acc), a1 = _mm512_loadu_pd(acc + 8);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  if (i < n) {
    const __mmask16 k = __mmask16((1u << (n - i)) - 1u);
    const __m512 x = _mm512_maskz_loadu_ps(k, g + i);  // zeros add +0: acc unchanged
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    a0 = _mm512_mask3_fmadd_pd(lo, lo, a0, __mmask8(k & 0xff));
    a1 = _mm512_mask3_fmadd_pd(hi, hi, a1, __mmask8(k >> 8));
  }
  _mm512_storeu_pd(acc, a0);
  _mm512_storeu_pd(acc + 8, a1);
}

}  // namespace rp::detail

#pragma GCC pop_options

#else  // not x86-64: no AVX-512 path
namespace rp::detail {
AdamRangeFn adam_kernel_avx512(bool, bool, Out) { return nullptr; }
CastRangeFn cast_kernel_avx512(Out) { return nullptr; }
void sumsq_avx512(const float* g, int64_t n, double acc[16]) { sumsq_scalar(g, n, acc); }
}  // namespace rp::detail
#endif
