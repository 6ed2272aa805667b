// Internal to optimizer/: the per-ISA kernels behind adamw_update and sum_of_squares.
// Each ISA's kernels live in their own translation unit (kernels_avx2.cpp,
// kernels_avx512.cpp) compiled with a `#pragma GCC target`, so they exist whatever -march
// the build uses; adamw.cpp / clip.cpp pick one at run time (optimizer/isa.hpp).
//
// Bit-identity across ISAs: every path evaluates exactly the same IEEE operations in the
// same order, with the fused multiply-adds written out explicitly (std::fma /
// _mm*_fmadd_ps) and no multiply whose result feeds an add or subtract otherwise, so
// GCC's -ffp-contract=fast has nothing left to fuse differently per path; sqrt and
// division are correctly rounded everywhere. The per-element formula (t = step):
//   gs_i  = g_i * gs                                  (gs: grad_scale, negated for maximize)
//   L2:    g' = fma(l2, w, gs_i);   d = g' - m        (Adam with L2 penalty)
//   else:  g' = gs_i;               d = fma(g_i, gs, -m)
//   m     = fma(1 - beta1, d, m)
//   v     = fma((1 - beta2) * g', g', beta2 * v)
//   vd    = amsgrad ? (vmax > v ? vmax : v) -> vmax : v
//   denom = sqrt(vd) / sqrt(1 - beta2^t) + eps
//   w     = fma(w, decay, -((lr / (1 - beta1^t)) * m) / denom)     (decay = 1 - lr * wd, or 1)
// NaNs are NaN in every path, but their sign and payload may differ between paths.
#pragma once
#include <cstdint>

#include "optimizer/isa.hpp"

namespace rp::detail {

enum class Out : int { none = 0, f32 = 1, bf16 = 2, f16 = 3 };

/// Scalar constants of one step, computed in double and rounded to float once.
struct StepConsts {
  float gs;        // grad_scale, negated for maximize
  float l2;        // weight_decay when !decoupled, else 0 (unused)
  float decay;     // 1 - lr * weight_decay when decoupled, else 1
  float omb1;      // 1 - beta1
  float b2, omb2;  // beta2, 1 - beta2
  float bc2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float step_size;  // lr / (1 - beta1^t)
};

struct AdamPtrs {
  float* w;
  float* m;
  float* v;
  float* vmax;  // amsgrad only
  const float* g;
  void* out;  // low-precision copy (Out), or null
};

/// Updates elements [lo, hi) (any lo, hi). Streaming (non-temporal) stores may be used for
/// the low-precision copy; the function ends with a store fence.
using AdamRangeFn = void (*)(const AdamPtrs&, int64_t lo, int64_t hi, const StepConsts&);

AdamRangeFn adam_kernel_scalar(bool l2, bool ams, Out o);
AdamRangeFn adam_kernel_avx2(bool l2, bool ams, Out o);    // null when not built (non-x86)
AdamRangeFn adam_kernel_avx512(bool l2, bool ams, Out o);  // null when not built (non-x86)

inline AdamRangeFn adam_kernel(Isa isa, bool l2, bool ams, Out o) {
  switch (isa) {
    case Isa::avx512: return adam_kernel_avx512(l2, ams, o);
    case Isa::avx2: return adam_kernel_avx2(l2, ams, o);
    default: return adam_kernel_scalar(l2, ams, o);
  }
}

/// out[i] = RNE(w[i]) for i in [lo, hi) in the format `o` (f32: a copy), same bits as the copy
/// adamw_update writes. Ends with a store fence (streaming stores).
using CastRangeFn = void (*)(const float* w, void* out, int64_t lo, int64_t hi);
CastRangeFn cast_kernel_scalar(Out o);
CastRangeFn cast_kernel_avx2(Out o);    // null when not built
CastRangeFn cast_kernel_avx512(Out o);  // null when not built

inline CastRangeFn cast_kernel(Isa isa, Out o) {
  switch (isa) {
    case Isa::avx512: return cast_kernel_avx512(o);
    case Isa::avx2: return cast_kernel_avx2(o);
    default: return cast_kernel_scalar(o);
  }
}

/// acc[j] += double(g[i])^2 for every i in [0, n) with i % 16 == j, i ascending
/// (g 16-aligned in index terms: callers pass chunk starts). x^2 of a float is exact in
/// double, so fused or not the result is the same on every path.
using SumsqFn = void (*)(const float* g, int64_t n, double acc[16]);
void sumsq_scalar(const float* g, int64_t n, double acc[16]);
void sumsq_avx2(const float* g, int64_t n, double acc[16]);
void sumsq_avx512(const float* g, int64_t n, double acc[16]);

inline SumsqFn sumsq_kernel(Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::avx512) return &sumsq_avx512;
  if (isa == Isa::avx2) return &sumsq_avx2;
#endif
  (void)isa;
  return &sumsq_scalar;
}

}  // namespace rp::detail
