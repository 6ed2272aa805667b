// Host-side launchers of the FP8 kernels (cuda_fp8.cu; CPU twin kernels/cpu/cpu_fp8.cpp),
// internal to kernels/cuda. Each enqueues on `st` and throws rp::DeviceError when a launch
// fails; `t` is the storage type of the input (f32, bf16 or f16).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_backend.hpp"  // Fp8ConversionCheck
#include "kernels/dtype.hpp"
#include "kernels/fp8.hpp"

namespace rp::cuda {

/// Ops::fp8_scale: zeroes scale[0], reduces max |x| into it (as fp32 bits), then replaces it by
/// fp8::scale_from_amax (x: n elements of t).
void k_fp8_scale(DType t, const void* x, int64_t n, Fp8Format f, float* scale, cudaStream_t st);
/// A scale computed inside a producing kernel: k_fp8_amax_begin zeroes scale[0], the producer
/// (k_rmsnorm_fwd / k_swiglu_fwd with an amax word) reduces max |y| into its bits, and
/// k_fp8_amax_end replaces them by fp8::scale_from_amax, as k_fp8_scale does in its own pass.
void k_fp8_amax_begin(float* scale, cudaStream_t st);
void k_fp8_amax_end(float* scale, Fp8Format f, cudaStream_t st);
/// Ops::fp8_scale_rows (one block per row).
void k_fp8_scale_rows(DType t, const void* x, int64_t rows, int64_t cols, Fp8Format f, float* scale,
                      cudaStream_t st);
/// Ops::fp8_quantize (rows false: scale[0]) or fp8_quantize_rows (rows true: scale[i / cols]).
void k_fp8_quantize(DType t, const void* x, const float* scale, uint8_t* q, int64_t n, int64_t cols,
                    bool rows, Fp8Format f, cudaStream_t st);
/// Ops::fp8_quantize_transposed(_padded): q's columns ld codes apart (ld >= rows; the codes
/// past rows set to 0). 64 x 64 tiles through shared memory (16-byte loads and stores) when
/// rows and cols are multiples of 64, ld of 16 and x, q 16-byte aligned, else one element per
/// thread.
void k_fp8_quantize_transposed(DType t, const void* x, const float* scale, uint8_t* q, int64_t rows,
                               int64_t cols, int64_t ld, Fp8Format f, cudaStream_t st);
/// Ops::fp8_quantize_both through the tile kernel, which also stores each thread's row codes:
/// false (nothing launched) where the tiles do not fit (rows or cols not multiples of 64, ld not
/// of 16, x, q or qt not 16-byte aligned), and the caller runs the two separate kernels.
bool k_fp8_quantize_both(DType t, const void* x, const float* scale, uint8_t* q, uint8_t* qt, int64_t rows,
                         int64_t cols, int64_t ld, Fp8Format f, cudaStream_t st);
/// Ops::fp8_quantize_rows_col_scaled: one block per row; rows up to 4,096 values on the 8-value
/// grid stay in registers (256 threads, one or two chunks of 8 values each) between the row's
/// amax of x * col_scale and its codes (x read once); wider rows read x twice (without column
/// scales: k_fp8_scale_rows, then k_fp8_quantize's row codes).
void k_fp8_quantize_rows_col_scaled(DType t, const void* x, const float* col_scale, uint8_t* q, float* scale,
                                    int64_t rows, int64_t cols, Fp8Format f, cudaStream_t st);
/// Ops::transpose_bytes: 64 x 64 tiles through shared memory (partial tiles at the edges).
void k_transpose_bytes(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols, cudaStream_t st);
/// cuda_backend.hpp's check_fp8_conversions (waits for st).
Fp8ConversionCheck k_fp8_check_conversions(Fp8Format f, cudaStream_t st);

}  // namespace rp::cuda
