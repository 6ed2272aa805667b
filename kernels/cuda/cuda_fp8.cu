// FP8 quantization kernels (Ops::fp8_scale / fp8_scale_rows / fp8_quantize /
// fp8_quantize_rows): memory-bound, 16-byte loads and stores, every rounding through the
// scalar code the CPU twin uses (kernels/fp8.hpp), so codes and scales are bit-identical.
// Also the check of that code against the GPU's own conversion instructions.
//
// The per-tensor scale takes two passes over nothing but the scale word: a reduction of
// max |x| (the fp32 bits of |x| compared as unsigned integers, so NaN, whose bits exceed
// inf's, wins; atomicMax per block into the scale word, zeroed first) and a one-thread
// kernel turning that amax into the scale in place. RMSNorm and SwiGLU can do the reduction
// inside their own pass (k_fp8_amax_begin / k_fp8_amax_end around them), which saves the
// read of x that k_fp8_scale makes. On sm_89+ the codes come from the hardware's paired
// conversion (cuda_amax.cuh's encode_pair), equal to the shared scalar code.
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/cuda_amax.cuh"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_fp8.hpp"
#include "kernels/fp8.hpp"

namespace rp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;     // elements per load in the reductions (16 bytes of bf16)
constexpr int kQuant = 16;  // elements per thread step when quantizing (16 bytes of codes)

// max |x[i]| over [begin, end) of this thread's share (VEC: begin, end multiples of kVec,
// x 16-byte aligned).
template <bool VEC, typename T>
__device__ unsigned thread_amax(const T* x, int64_t begin, int64_t end, int64_t tid, int64_t stride) {
  unsigned m = 0;
  if constexpr (VEC) {
    for (int64_t i = begin + tid * kVec; i < end; i += stride * kVec) {
      float v[kVec];
      load_n<kVec, true>(x + i, v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) m = max(m, abs_bits(v[j]));
    }
  } else {
    for (int64_t i = begin + tid; i < end; i += stride) m = max(m, abs_bits(to_f(x[i])));
  }
  return m;
}

template <bool VEC, typename T>
__global__ void amax_kernel(const T* x, int64_t n, unsigned* out) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t bulk = VEC ? n / kVec * kVec : n;
  unsigned m = thread_amax<VEC>(x, 0, bulk, tid, stride);
  m = max(m, thread_amax<false>(x, bulk, n, tid, stride));  // the tail (VEC)
  block_amax_into<kThreads>(m, out);
}

// scale word holds amax bits: replace them by the scale.
__global__ void scale_from_amax_kernel(float* scale, Fp8Format f) {
  scale[0] = fp8::scale_from_amax(fp8::float_of(reinterpret_cast<unsigned*>(scale)[0]), f);
}

// One block per row.
template <bool VEC, typename T>
__global__ void amax_rows_kernel(const T* x, int64_t rows, int64_t cols, Fp8Format f, float* scale) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const unsigned m =
        block_max_u<kThreads>(thread_amax<VEC>(x + r * cols, 0, cols, threadIdx.x, blockDim.x));
    if (threadIdx.x == 0) scale[r] = fp8::scale_from_amax(fp8::float_of(m), f);
  }
}

// q = quantize(x / scale); ROWS: scale per row of `cols` elements. VEC: x and q 16-byte
// aligned, groups of kQuant never span two rows (cols a multiple of kQuant).
template <Fp8Format F, bool ROWS, bool VEC, typename T>
__global__ void quantize_kernel(const T* x, const float* scale, uint8_t* q, int64_t n, int64_t cols) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                stride = int64_t(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if constexpr (VEC) {
    const int64_t groups = n / kQuant;
    for (int64_t g = tid; g < groups; g += stride) {
      const int64_t i = g * kQuant;
      float v[kQuant];
      load_n<kQuant, true>(x + i, v);
      const float s = scale[ROWS ? i / cols : 0];
      alignas(16) uint8_t out[kQuant];
#pragma unroll
      for (int j = 0; j < kQuant; j += 2) encode_pair<F>(v[j] / s, v[j + 1] / s, out[j], out[j + 1]);
      *reinterpret_cast<uint4*>(q + i) = *reinterpret_cast<const uint4*>(out);
    }
    done = groups * kQuant;
  }
  for (int64_t i = done + tid; i < n; i += stride)
    q[i] = fp8::encode<F>(to_f(x[i]) / scale[ROWS ? i / cols : 0]);
}

unsigned blocks_for(int64_t items) {
  return unsigned(
      std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, int64_t(num_sms()) * 8)));
}

template <Fp8Format F, bool ROWS, typename T>
void launch_quantize(const T* x, const float* scale, uint8_t* q, int64_t n, int64_t cols, cudaStream_t st) {
  const bool vec = aligned16(x) && aligned16(q) && (!ROWS || cols % kQuant == 0);
  if (vec)
    quantize_kernel<F, ROWS, true><<<blocks_for(n / kQuant + 1), kThreads, 0, st>>>(x, scale, q, n, cols);
  else quantize_kernel<F, ROWS, false><<<blocks_for(n), kThreads, 0, st>>>(x, scale, q, n, cols);
}

// q[c * ld + r] = encode(x[r, c] / scale[0]) for x [rows, cols]: 64 x 64 tiles through shared
// memory, each thread reading 16 consecutive values of a row (two 16-byte loads) and writing
// 16 consecutive codes of a column (one 16-byte store). rows and cols multiples of 64, ld a
// multiple of 16, x and q 16-byte aligned. With qr (fp8_quantize_both) each thread also
// stores its 16 row codes at qr[r * cols + c] (16-byte aligned), the same codes.
constexpr int kTile = 64;
template <Fp8Format F, bool ROWS_TOO, typename T>
__global__ void quantize_transposed_tiles(const T* x, const float* scale, uint8_t* q, int64_t rows,
                                          int64_t cols, int64_t ld, uint8_t* qr) {
  __shared__ __align__(16) uint8_t tile[kTile][kTile + 16];  // tile[c][r]
  const float s = scale[0];
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int lr = threadIdx.x / 4, lc = (threadIdx.x % 4) * 16;  // 256 threads: 64 rows x 4 chunks
  float v[16];
  load_n<16, true>(x + (r0 + lr) * cols + c0 + lc, v);
  alignas(16) uint8_t out[16];
#pragma unroll
  for (int j = 0; j < 16; j += 2) {
    encode_pair<F>(v[j] / s, v[j + 1] / s, out[j], out[j + 1]);
    tile[lc + j][lr] = out[j];
    tile[lc + j + 1][lr] = out[j + 1];
  }
  if constexpr (ROWS_TOO)
    *reinterpret_cast<uint4*>(qr + (r0 + lr) * cols + c0 + lc) = *reinterpret_cast<const uint4*>(out);
  __syncthreads();
  *reinterpret_cast<uint4*>(q + (c0 + lr) * ld + r0 + lc) = *reinterpret_cast<const uint4*>(&tile[lr][lc]);
}

// The same, one element per thread (any shape and alignment).
template <Fp8Format F, typename T>
__global__ void quantize_transposed_scalar(const T* x, const float* scale, uint8_t* q, int64_t rows,
                                           int64_t cols, int64_t ld) {
  const int64_t n = rows * cols, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t c = i / rows, r = i - c * rows;  // consecutive threads write consecutive codes
    q[c * ld + r] = fp8::encode<F>(to_f(x[r * cols + c]) / scale[0]);
  }
}

bool tiles_fit(const void* x, const uint8_t* q, int64_t rows, int64_t cols, int64_t ld) {
  return rows % kTile == 0 && cols % kTile == 0 && ld % 16 == 0 && aligned16(x) && aligned16(q) &&
         rows / kTile <= 65535;
}

template <Fp8Format F, typename T>
void launch_transposed(const T* x, const float* scale, uint8_t* q, int64_t rows, int64_t cols, int64_t ld,
                       cudaStream_t st) {
  if (tiles_fit(x, q, rows, cols, ld))
    quantize_transposed_tiles<F, false>
        <<<dim3(unsigned(cols / kTile), unsigned(rows / kTile)), kThreads, 0, st>>>(x, scale, q, rows, cols,
                                                                                    ld, nullptr);
  else
    quantize_transposed_scalar<F><<<blocks_for(rows * cols), kThreads, 0, st>>>(x, scale, q, rows, cols, ld);
}

// ---- per-row codes of x * col_scale, and the byte transpose --------------------------------

// One block per row: v = x[r,c] * cs[c] in fp32 (v = x[r,c] without cs), scale[r] from max |v|,
// then q = encode(v / s).
// Every thread of the block takes the row's scale after the block-wide maximum (block_max_u
// leaves it in every thread).
template <Fp8Format F, typename T>
__global__ void quantize_rows_col_scaled_kernel(const T* x, const float* cs, uint8_t* q, float* scale,
                                                int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    unsigned m = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      m = max(m, abs_bits(cs ? to_f(xr[c]) * cs[c] : to_f(xr[c])));
    m = block_max_u<kThreads>(m);
    const float s = fp8::scale_from_amax(fp8::float_of(m), F);
    if (threadIdx.x == 0) scale[r] = s;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      q[r * cols + c] = fp8::encode<F>((cs ? to_f(xr[c]) * cs[c] : to_f(xr[c])) / s);
  }
}

// One chunk of 8 values of a row: v = x[ch*8 .. ch*8+8) (times cs's matching values with COLS),
// loaded 16 bytes at a time (x and cs 16-byte aligned).
constexpr int kRowChunk = 8;
template <bool COLS, typename T>
__device__ __forceinline__ void load_row_chunk(const T* xr, const float* cs, int64_t ch,
                                               float (&v)[kRowChunk]) {
  load_n<kRowChunk, true>(xr + ch * kRowChunk, v);
  if constexpr (COLS) {
    const float4 c0 = reinterpret_cast<const float4*>(cs)[2 * ch],
                 c1 = reinterpret_cast<const float4*>(cs)[2 * ch + 1];
    const float c[kRowChunk] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
    for (int j = 0; j < kRowChunk; ++j) v[j] *= c[j];
  }
}

// The codes of one chunk, v / s, stored 8 bytes at a time (qr 8-byte aligned).
template <Fp8Format F>
__device__ __forceinline__ void store_row_chunk(const float (&v)[kRowChunk], float s, uint8_t* qr,
                                                int64_t ch) {
  alignas(8) uint8_t out[kRowChunk];
#pragma unroll
  for (int j = 0; j < kRowChunk; j += 2) encode_pair<F>(v[j] / s, v[j + 1] / s, out[j], out[j + 1]);
  *reinterpret_cast<uint2*>(qr + ch * kRowChunk) = *reinterpret_cast<const uint2*>(out);
}

template <int N>
__device__ __forceinline__ unsigned chunk_amax(unsigned m, const float (&v)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) m = max(m, abs_bits(v[j]));
  return m;
}

// The same, vectorized: one block of THREADS per row, each thread holding up to CPT chunks of 8
// values (16-byte loads of bf16) in registers between the row's amax and its codes, so x is read
// once. x 16-byte aligned, cols a multiple of 8 and at most THREADS * 8 * CPT, cs (COLS: read,
// else null) 16-byte and q 8-byte aligned. Same products, scale and divisions as the scalar
// kernel: the same bits.
template <Fp8Format F, int CPT, int THREADS, bool COLS, typename T>
__global__ void __launch_bounds__(THREADS)
    quantize_rows_col_scaled_vec(const T* x, const float* cs, uint8_t* q, float* scale, int64_t rows,
                                 int64_t cols) {
  const int64_t chunks = cols / kRowChunk;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    float v[CPT][kRowChunk];
    unsigned m = 0;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
      const int64_t ch = threadIdx.x + int64_t(k) * THREADS;
      if (ch >= chunks) continue;
      load_row_chunk<COLS>(xr, cs, ch, v[k]);
      m = chunk_amax(m, v[k]);
    }
    m = block_max_u<THREADS>(m);
    const float s = fp8::scale_from_amax(fp8::float_of(m), F);
    if (threadIdx.x == 0) scale[r] = s;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
      const int64_t ch = threadIdx.x + int64_t(k) * THREADS;
      if (ch < chunks) store_row_chunk<F>(v[k], s, q + r * cols, ch);
    }
  }
}

// Rows too wide for registers: one block per row reads x (and cs) in 16-byte chunks for the
// row's amax, then again (from L1/L2: a row of 14,336 bf16 values is 28 KB) for the codes, written
// 8 bytes at a time. Alignment as quantize_rows_col_scaled_vec's; the same products, scale and
// divisions as the scalar kernel: the same bits.
template <Fp8Format F, bool COLS, typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_rows_col_scaled_wide(const T* x, const float* cs, uint8_t* q, float* scale, int64_t rows,
                                  int64_t cols) {
  const int64_t chunks = cols / kRowChunk;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    unsigned m = 0;
    for (int64_t ch = threadIdx.x; ch < chunks; ch += kThreads) {
      float v[kRowChunk];
      load_row_chunk<COLS>(xr, cs, ch, v);
      m = chunk_amax(m, v);
    }
    m = block_max_u<kThreads>(m);
    const float s = fp8::scale_from_amax(fp8::float_of(m), F);
    if (threadIdx.x == 0) scale[r] = s;
    for (int64_t ch = threadIdx.x; ch < chunks; ch += kThreads) {
      float v[kRowChunk];
      load_row_chunk<COLS>(xr, cs, ch, v);
      store_row_chunk<F>(v, s, q + r * cols, ch);
    }
  }
}

// Whether the vectorized row kernels take rows of `cols` values (x and cs 16-byte, q 8-byte
// aligned, cols on the 8-value grid), and whether a row fits the registers of 256 threads holding
// one or two chunks each (up to 4,096 values). Wider rows go to quantize_rows_col_scaled_wide: on
// an H100 ([8192, 14336], bf16 in) it took 0.18 ms with or without column scales, where the rows
// in registers took 0.27, fp8_scale_rows + fp8_quantize_rows 0.23 and the scalar kernel (column
// scales) 0.42.
bool rows_vectorized(const void* x, const float* cs, const uint8_t* q, int64_t cols) {
  return aligned16(x) && (!cs || aligned16(cs)) && (reinterpret_cast<uintptr_t>(q) & 7u) == 0 &&
         cols % kRowChunk == 0;
}
bool rows_fit_registers(const void* x, const float* cs, const uint8_t* q, int64_t cols) {
  return rows_vectorized(x, cs, q, cols) && cols / kRowChunk <= 2 * kThreads;
}

template <Fp8Format F, bool COLS, typename T>
void launch_rows_vec(const T* x, const float* cs, uint8_t* q, float* scale, int64_t rows, int64_t cols,
                     cudaStream_t st) {
  const unsigned grid = unsigned(std::min<int64_t>(rows, int64_t(1) << 30));
  if (cols / kRowChunk <= kThreads)
    return quantize_rows_col_scaled_vec<F, 1, kThreads, COLS>
        <<<grid, kThreads, 0, st>>>(x, cs, q, scale, rows, cols);
  quantize_rows_col_scaled_vec<F, 2, kThreads, COLS><<<grid, kThreads, 0, st>>>(x, cs, q, scale, rows, cols);
}

template <Fp8Format F, typename T>
void launch_rows_col_scaled(const T* x, const float* cs, uint8_t* q, float* scale, int64_t rows, int64_t cols,
                            cudaStream_t st) {
  const bool regs = rows_fit_registers(x, cs, q, cols);
  if (regs && cs) return launch_rows_vec<F, true>(x, cs, q, scale, rows, cols, st);
  if (regs) return launch_rows_vec<F, false>(x, cs, q, scale, rows, cols, st);
  const unsigned grid = unsigned(std::min<int64_t>(rows, int64_t(1) << 30));
  if (rows_vectorized(x, cs, q, cols)) {
    if (cs)
      return quantize_rows_col_scaled_wide<F, true><<<grid, kThreads, 0, st>>>(x, cs, q, scale, rows, cols);
    return quantize_rows_col_scaled_wide<F, false><<<grid, kThreads, 0, st>>>(x, cs, q, scale, rows, cols);
  }
  quantize_rows_col_scaled_kernel<F><<<grid, kThreads, 0, st>>>(x, cs, q, scale, rows, cols);
}

// dst[c, r] = src[r, c]: a 64 x 64 tile through shared memory, 256 threads, each moving 16 bytes
// of a row in and 16 of a column out (guarded at the edges).
__global__ void transpose_bytes_kernel(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 1];  // tile[r][c]
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int lr = threadIdx.x / 4, lc = (threadIdx.x % 4) * 16;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int64_t r = r0 + lr, c = c0 + lc + j;
    if (r < rows && c < cols) tile[lr][lc + j] = src[r * cols + c];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 16; ++j) {  // thread (lr, lc) writes column c0 + lr, rows r0 + lc + j
    const int64_t c = c0 + lr, r = r0 + lc + j;
    if (r < rows && c < cols) dst[c * rows + r] = tile[lc + j][lr];
  }
}

// ---- the check against the hardware conversion -------------------------------------------

__device__ __forceinline__ bool is_nan_code(Fp8Format f, uint8_t c) {
  return f == Fp8Format::e4m3 ? (c & 0x7f) == 0x7f : (c & 0x7f) > 0x7c;
}

// Every fp32 bit pattern u < 2^32: our encode against __nv_cvt_float_to_fp8 (the
// cvt.rn.satfinite instruction on sm_89+). out[0]: mismatches among non-NaN inputs;
// out[1]: the smallest such u; out[2]: NaN inputs whose codes differ (both must be NaN codes,
// else counted in out[0] too).
template <Fp8Format F>
__global__ void encode_check_kernel(unsigned long long* out) {
  const __nv_fp8_interpretation_t fmt = F == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long bad = 0, nan_diff = 0, first = ~0ull;
  for (uint64_t u = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < (uint64_t(1) << 32); u += stride) {
    const float x = fp8::float_of(uint32_t(u));
    const uint8_t ours = fp8::encode<F>(x);
    const uint8_t hw = uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, fmt));
    if (ours == hw) continue;
    if (x != x && is_nan_code(F, ours) && is_nan_code(F, hw)) {
      ++nan_diff;
      continue;
    }
    ++bad;
    first = min(first, (unsigned long long)u);
  }
  if (bad) {
    atomicAdd(&out[0], bad);
    atomicMin(&out[1], first);
  }
  if (nan_diff) atomicAdd(&out[2], nan_diff);
}

// The 256 codes: our decode against the hardware's fp8 -> f16 conversion (exact), as fp32
// bits (NaN codes: both NaN). out[3] counts the codes that differ.
template <Fp8Format F>
__global__ void decode_check_kernel(unsigned long long* out) {
  const __nv_fp8_interpretation_t fmt = F == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2;
  const uint8_t c = uint8_t(threadIdx.x);
  const float ours = fp8::decode<F>(c);
  const float hw = __half2float(__half(__nv_cvt_fp8_to_halfraw(c, fmt)));
  const bool same = (ours != ours && hw != hw) || fp8::bits_of(ours) == fp8::bits_of(hw);
  if (!same) atomicAdd(&out[3], 1ull);
}

}  // namespace

void k_fp8_scale(DType t, const void* x, int64_t n, Fp8Format f, float* scale, cudaStream_t st) {
  RP_CUDA_CHECK(cudaMemsetAsync(scale, 0, 4, st));
  if (n > 0) {
    RP_DISPATCH_ANY("fp8_scale", t, T, {
      const T* xt = static_cast<const T*>(x);
      if (aligned16(x))
        amax_kernel<true>
            <<<blocks_for(n / kVec + 1), kThreads, 0, st>>>(xt, n, reinterpret_cast<unsigned*>(scale));
      else amax_kernel<false><<<blocks_for(n), kThreads, 0, st>>>(xt, n, reinterpret_cast<unsigned*>(scale));
    });
    RP_CUDA_LAUNCH_CHECK("fp8 amax");
  }
  scale_from_amax_kernel<<<1, 1, 0, st>>>(scale, f);
  RP_CUDA_LAUNCH_CHECK("fp8 scale_from_amax");
}

void k_fp8_amax_begin(float* scale, cudaStream_t st) { RP_CUDA_CHECK(cudaMemsetAsync(scale, 0, 4, st)); }

void k_fp8_amax_end(float* scale, Fp8Format f, cudaStream_t st) {
  scale_from_amax_kernel<<<1, 1, 0, st>>>(scale, f);
  RP_CUDA_LAUNCH_CHECK("fp8 scale_from_amax");
}

void k_fp8_scale_rows(DType t, const void* x, int64_t rows, int64_t cols, Fp8Format f, float* scale,
                      cudaStream_t st) {
  if (rows <= 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(rows, int64_t(1) << 30));
  RP_DISPATCH_ANY("fp8_scale_rows", t, T, {
    const T* xt = static_cast<const T*>(x);
    if (aligned16(x) && cols % kVec == 0)
      amax_rows_kernel<true><<<grid, kThreads, 0, st>>>(xt, rows, cols, f, scale);
    else amax_rows_kernel<false><<<grid, kThreads, 0, st>>>(xt, rows, cols, f, scale);
  });
  RP_CUDA_LAUNCH_CHECK("fp8 amax rows");
}

void k_fp8_quantize(DType t, const void* x, const float* scale, uint8_t* q, int64_t n, int64_t cols,
                    bool rows, Fp8Format f, cudaStream_t st) {
  if (n <= 0) return;
  RP_DISPATCH_ANY("fp8_quantize", t, T, {
    const T* xt = static_cast<const T*>(x);
    if (f == Fp8Format::e4m3)
      rows ? launch_quantize<Fp8Format::e4m3, true>(xt, scale, q, n, cols, st)
           : launch_quantize<Fp8Format::e4m3, false>(xt, scale, q, n, cols, st);
    else
      rows ? launch_quantize<Fp8Format::e5m2, true>(xt, scale, q, n, cols, st)
           : launch_quantize<Fp8Format::e5m2, false>(xt, scale, q, n, cols, st);
  });
  RP_CUDA_LAUNCH_CHECK("fp8 quantize");
}

void k_fp8_quantize_transposed(DType t, const void* x, const float* scale, uint8_t* q, int64_t rows,
                               int64_t cols, int64_t ld, Fp8Format f, cudaStream_t st) {
  if (rows <= 0 || cols <= 0) return;
  if (ld > rows)  // the padding codes (0 = +0 in both formats) of every column
    RP_CUDA_CHECK(cudaMemset2DAsync(q + rows, size_t(ld), 0, size_t(ld - rows), size_t(cols), st));
  RP_DISPATCH_ANY("fp8_quantize_transposed", t, T, {
    const T* xt = static_cast<const T*>(x);
    if (f == Fp8Format::e4m3) launch_transposed<Fp8Format::e4m3>(xt, scale, q, rows, cols, ld, st);
    else launch_transposed<Fp8Format::e5m2>(xt, scale, q, rows, cols, ld, st);
  });
  RP_CUDA_LAUNCH_CHECK("fp8 quantize transposed");
}

bool k_fp8_quantize_both(DType t, const void* x, const float* scale, uint8_t* q, uint8_t* qt, int64_t rows,
                         int64_t cols, int64_t ld, Fp8Format f, cudaStream_t st) {
  if (rows <= 0 || cols <= 0) return true;
  if (!tiles_fit(x, qt, rows, cols, ld) || !aligned16(q)) return false;
  if (ld > rows)
    RP_CUDA_CHECK(cudaMemset2DAsync(qt + rows, size_t(ld), 0, size_t(ld - rows), size_t(cols), st));
  const dim3 grid(unsigned(cols / kTile), unsigned(rows / kTile));
  RP_DISPATCH_ANY("fp8_quantize_both", t, T, {
    const T* xt = static_cast<const T*>(x);
    if (f == Fp8Format::e4m3)
      quantize_transposed_tiles<Fp8Format::e4m3, true>
          <<<grid, kThreads, 0, st>>>(xt, scale, qt, rows, cols, ld, q);
    else
      quantize_transposed_tiles<Fp8Format::e5m2, true>
          <<<grid, kThreads, 0, st>>>(xt, scale, qt, rows, cols, ld, q);
  });
  RP_CUDA_LAUNCH_CHECK("fp8 quantize both");
  return true;
}

void k_fp8_quantize_rows_col_scaled(DType t, const void* x, const float* col_scale, uint8_t* q, float* scale,
                                    int64_t rows, int64_t cols, Fp8Format f, cudaStream_t st) {
  if (rows <= 0) return;
  if (!col_scale && !rows_vectorized(x, col_scale, q, cols)) {  // the two row passes
    k_fp8_scale_rows(t, x, rows, cols, f, scale, st);
    return k_fp8_quantize(t, x, scale, q, rows * cols, cols, true, f, st);
  }
  RP_DISPATCH_ANY("fp8_quantize_rows_col_scaled", t, T, {
    const T* xt = static_cast<const T*>(x);
    if (f == Fp8Format::e4m3)
      launch_rows_col_scaled<Fp8Format::e4m3>(xt, col_scale, q, scale, rows, cols, st);
    else launch_rows_col_scaled<Fp8Format::e5m2>(xt, col_scale, q, scale, rows, cols, st);
  });
  RP_CUDA_LAUNCH_CHECK("fp8 quantize rows col scaled");
}

void k_transpose_bytes(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols, cudaStream_t st) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t gy = (rows + kTile - 1) / kTile, gx = (cols + kTile - 1) / kTile;
  if (gy > 65535) throw DeviceError("transpose_bytes: more than 65535 x 64 rows");
  transpose_bytes_kernel<<<dim3(unsigned(gx), unsigned(gy)), kThreads, 0, st>>>(src, dst, rows, cols);
  RP_CUDA_LAUNCH_CHECK("transpose bytes");
}

Fp8ConversionCheck k_fp8_check_conversions(Fp8Format f, cudaStream_t st) {
  unsigned long long* d = nullptr;
  RP_CUDA_CHECK(cudaMalloc(&d, 4 * sizeof(unsigned long long)));
  const unsigned long long init[4] = {0, ~0ull, 0, 0};
  RP_CUDA_CHECK(cudaMemcpyAsync(d, init, sizeof(init), cudaMemcpyHostToDevice, st));
  const unsigned grid = unsigned(num_sms()) * 16;
  if (f == Fp8Format::e4m3) {
    encode_check_kernel<Fp8Format::e4m3><<<grid, kThreads, 0, st>>>(d);
    decode_check_kernel<Fp8Format::e4m3><<<1, 256, 0, st>>>(d);
  } else {
    encode_check_kernel<Fp8Format::e5m2><<<grid, kThreads, 0, st>>>(d);
    decode_check_kernel<Fp8Format::e5m2><<<1, 256, 0, st>>>(d);
  }
  RP_CUDA_LAUNCH_CHECK("fp8 conversion check");
  unsigned long long h[4];
  RP_CUDA_CHECK(cudaMemcpyAsync(h, d, sizeof(h), cudaMemcpyDeviceToHost, st));
  RP_CUDA_CHECK(cudaStreamSynchronize(st));
  RP_CUDA_CHECK(cudaFree(d));
  Fp8ConversionCheck r;
  r.encode_mismatches = h[0];
  r.first_mismatch_bits = h[0] ? uint32_t(h[1]) : 0;
  r.nan_code_differences = h[2];
  r.decode_mismatches = h[3];
  return r;
}

}  // namespace rp::cuda
