// CPU ops for FP8 compute (kernels/ops.hpp, "FP8 compute"): scales from the largest
// magnitude, quantization and the FP8 GEMM, through the scalar code the CUDA kernels share
// (kernels/fp8.hpp), so scales and codes equal the GPU's bit for bit.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/fp8.hpp"

namespace rp::cpu {
namespace {

const float* F(const void* p) { return static_cast<const float*>(p); }

// max |x[i]| over n values, NaN when any is NaN (std::max would drop it).
float amax_of(const float* x, int64_t n) {
  float m = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a)) return a;
    m = a > m ? a : m;
  }
  return m;
}

// n codes of format f decoded to fp32 (exact).
std::vector<float> decoded(const uint8_t* q, int64_t n, Fp8Format f) {
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = fp8::decode(f, uint8_t(c));
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = table[q[i]];
  return out;
}

}  // namespace

void CpuOps::fp8_scale(const void* x, int64_t n, Fp8Format f, float* scale) {
  require(n >= 0, "fp8_scale", "negative element count");
  require(scale != nullptr && (n == 0 || x != nullptr), "fp8_scale", "null input or scale");
  scale[0] = fp8::scale_from_amax(amax_of(F(x), n), f);
}

void CpuOps::fp8_scale_rows(const void* x, int64_t rows, int64_t cols, Fp8Format f, float* scale) {
  require(rows >= 0 && cols >= 0, "fp8_scale_rows", "negative dimension");
  for (int64_t r = 0; r < rows; ++r) scale[r] = fp8::scale_from_amax(amax_of(F(x) + r * cols, cols), f);
}

void CpuOps::fp8_quantize(const void* x, const float* scale, uint8_t* q, int64_t n, Fp8Format f) {
  require(n >= 0, "fp8_quantize", "negative element count");
  if (n == 0) return;
  const float s = scale[0];
  for (int64_t i = 0; i < n; ++i) q[i] = fp8::quantize(f, F(x)[i], s);
}

void CpuOps::fp8_quantize_rows(const void* x, const float* scale, uint8_t* q, int64_t rows, int64_t cols,
                               Fp8Format f) {
  require(rows >= 0 && cols >= 0, "fp8_quantize_rows", "negative dimension");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = fp8::quantize(f, F(x)[r * cols + c], scale[r]);
}

void CpuOps::fp8_quantize_transposed(const void* x, const float* scale, uint8_t* q, int64_t rows,
                                     int64_t cols, Fp8Format f) {
  require(rows >= 0 && cols >= 0, "fp8_quantize_transposed", "negative dimension");
  fp8_quantize_transposed_padded(x, scale, q, rows, cols, rows, f);  // no padding
}

void CpuOps::fp8_quantize_transposed_padded(const void* x, const float* scale, uint8_t* q, int64_t rows,
                                            int64_t cols, int64_t ld, Fp8Format f) {
  require(rows >= 0 && cols >= 0 && ld >= rows, "fp8_quantize_transposed_padded",
          "negative dimension or ld < rows");
  if (rows == 0 || cols == 0) return;
  const float s = scale[0];
  for (int64_t r = 0; r < rows; ++r)  // x read in its row-major order
    for (int64_t c = 0; c < cols; ++c) q[c * ld + r] = fp8::quantize(f, F(x)[r * cols + c], s);
  for (int64_t c = 0; c < cols; ++c) std::fill(q + c * ld + rows, q + (c + 1) * ld, uint8_t(0));
}

// Each product of two FP8 values is exact in fp32 (at most 4 x 4 significant bits); Eigen sums
// them in fp32 in its own order, and the scale product multiplies each sum once.
void CpuOps::gemm_fp8(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b, Fp8Format fb,
                      const float* scale_b, void* d, int64_t M, int64_t K, int64_t N, bool accumulate) {
  require(M >= 0 && K >= 0 && N >= 0, "gemm_fp8", "negative dimension");
  require(!(fa == Fp8Format::e5m2 && fb == Fp8Format::e5m2), "gemm_fp8",
          "both operands e5m2 (cuBLASLt has no e5m2 x e5m2 GEMM; quantize one of them to e4m3)");
  if (M == 0 || N == 0) return;
  require(scale_a != nullptr && scale_b != nullptr && d != nullptr, "gemm_fp8", "null scale or output");
  const std::vector<float> af = decoded(a, M * K, fa), bf = decoded(b, N * K, fb);
  std::vector<float> acc(size_t(M * N), 0.f);
  if (K > 0) gemm_nt(threads_, M, N, K, af.data(), K, bf.data(), K, acc.data(), N, false);
  const float s = scale_a[0] * scale_b[0];
  float* y = static_cast<float*>(d);
  for (int64_t i = 0; i < M * N; ++i) y[i] = accumulate ? y[i] + acc[size_t(i)] * s : acc[size_t(i)] * s;
}

// gemm_fp8's sums, each multiplied by its row's and its column's scale product.
void CpuOps::gemm_fp8_rows(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b,
                           Fp8Format fb, const float* scale_b, void* d, int64_t M, int64_t K, int64_t N,
                           bool accumulate) {
  require(M >= 0 && K >= 0 && N >= 0, "gemm_fp8_rows", "negative dimension");
  require(!(fa == Fp8Format::e5m2 && fb == Fp8Format::e5m2), "gemm_fp8_rows",
          "both operands e5m2 (cuBLASLt has no e5m2 x e5m2 GEMM; quantize one of them to e4m3)");
  if (M == 0 || N == 0) return;
  require(scale_a != nullptr && scale_b != nullptr && d != nullptr, "gemm_fp8_rows", "null scale or output");
  const std::vector<float> af = decoded(a, M * K, fa), bf = decoded(b, N * K, fb);
  std::vector<float> acc(size_t(M * N), 0.f);
  if (K > 0) gemm_nt(threads_, M, N, K, af.data(), K, bf.data(), K, acc.data(), N, false);
  float* y = static_cast<float*>(d);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = m * N + n;
      const float v = acc[size_t(i)] * (scale_a[m] * scale_b[n]);
      y[i] = accumulate ? y[i] + v : v;
    }
}

void CpuOps::fp8_quantize_rows_col_scaled(const void* x, const float* col_scale, uint8_t* q, float* scale,
                                          int64_t rows, int64_t cols, Fp8Format f) {
  require(rows >= 0 && cols >= 0, "fp8_quantize_rows_col_scaled", "negative dimension");
  require(rows * cols == 0 || (x && q && scale), "fp8_quantize_rows_col_scaled",
          "null input, codes or row scales");
  std::vector<float> v(size_t(std::max<int64_t>(cols, 0)));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      v[size_t(c)] = col_scale ? F(x)[r * cols + c] * col_scale[c] : F(x)[r * cols + c];
    const float s = fp8::scale_from_amax(amax_of(v.data(), cols), f);
    scale[r] = s;
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = fp8::quantize(f, v[size_t(c)], s);
  }
}

void CpuOps::transpose_bytes(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
  require(rows >= 0 && cols >= 0, "transpose_bytes", "negative dimension");
  require(rows * cols == 0 || (src && dst), "transpose_bytes", "null source or destination");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// The weight gradient's form: the same fp32 sums (d is grad_dtype() = fp32 on the CPU as well).
void CpuOps::gemm_fp8_accumulate_f32(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b,
                                     Fp8Format fb, const float* scale_b, float* d, int64_t M, int64_t K,
                                     int64_t N) {
  gemm_fp8(a, fa, scale_a, b, fb, scale_b, d, M, K, N, true);
}

}  // namespace rp::cpu
