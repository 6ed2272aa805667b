// The building blocks of the flash attention kernels (kernels/cuda/cuda_flash.cuh): the
// variant's arguments and a row's first visible key, the tile constants, the PTX wrappers
// (mma.sync m16n8k16, ldmatrix, cp.async, the sm_90 vector atomic) and the tile loads.
// Internal to kernels/cuda.
#pragma once
#include "kernels/cuda/cuda_common.cuh"

namespace rp::cuda::flash {

/// The variant's arguments (VAR = true). Query row r of sequence s sees keys j with
/// lo(r) <= j <= r, lo(r) = max(r - clamp(pos[s*L + r], 0, r) (0 without pos),
/// r - window + 1 (window > 0)); sinks [nq] in T (or null) join every row's softmax.
/// cap > 0: every score s = q.k * scale becomes cap * tanh(s / cap) (cap_in = scale / cap).
struct Variant {
  const int32_t* pos = nullptr;
  const void* sinks = nullptr;
  int window = 0;
  float cap = 0.f, cap_in = 0.f;
};

/// lo(r) of Variant for a row r < L of sequence sq.
__device__ __forceinline__ int first_key(const Variant& var, int sq, int L, int r) {
  int lo = var.pos ? r - min(max(var.pos[int64_t(sq) * L + r], 0), r) : 0;
  if (var.window > 0) lo = max(lo, r - var.window + 1);
  return lo;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kB = 64;  // rows of every tile (queries and keys)

// ---- PTX wrappers -----------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int n = pred ? 16 : 0;  // 0 source bytes: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// p[0] += a, p[1] += b (p 8-byte aligned); one vector atomic on sm_90.
__device__ __forceinline__ void atomic_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same_v<T, bf16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Rows [row0, row0+ROWS) of a [*, ld] matrix (D columns from g) into a smem tile of
// row stride D+8; rows >= L are zero-filled.
template <int D, int NT, int ROWS = kB, typename T>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t ld, int row0, int L) {
  constexpr int CH = D / 8;
  for (int c = threadIdx.x; c < ROWS * CH; c += NT) {
    const int r = c / CH, cc = c % CH;
    const bool ok = row0 + r < L;
    const T* src = ok ? g + int64_t(row0 + r) * ld + cc * 8 : g;
    cp_async16(s + r * (D + 8) + cc * 8, src, ok);
  }
}

}  // namespace rp::cuda::flash
