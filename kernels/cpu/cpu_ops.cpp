// CPU ops, part 1: threading, GEMMs, memory helpers, linear, embedding, RMSNorm, SwiGLU.
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/weight_format.hpp"

// GCC 12 reports false -Wmaybe-uninitialized inside Eigen's AVX-512 packet code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rp::cpu {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using CMat = Eigen::Map<const RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;
using MMat = Eigen::Map<RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;
using CVec = Eigen::Map<const Eigen::ArrayXf>;
using MVec = Eigen::Map<Eigen::ArrayXf>;

void require(bool cond, const char* op, const char* what) {
  if (!cond) throw std::invalid_argument(std::string(op) + ": " + what);
}

void parallel_for(int threads, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t parts = std::min<int64_t>(threads, (n + grain - 1) / grain);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(size_t(parts - 1));
  std::exception_ptr err;
  std::mutex mu;
  auto run = [&](int64_t b, int64_t e) {
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!err) err = std::current_exception();
    }
  };
  for (int64_t p = 1; p < parts; ++p) pool.emplace_back(run, n * p / parts, n * (p + 1) / parts);
  run(0, n / parts);
  for (auto& t : pool) t.join();
  if (err) std::rethrow_exception(err);
}

// Splits along the larger output dimension; each part is one Eigen GEMM.
void gemm_nt(int threads, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  auto part = [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    CMat a(A + m0 * lda, m1 - m0, K, Eigen::OuterStride<>(lda));
    CMat b(B + n0 * ldb, n1 - n0, K, Eigen::OuterStride<>(ldb));
    MMat c(C + m0 * ldc + n0, m1 - m0, n1 - n0, Eigen::OuterStride<>(ldc));
    if (accumulate) c.noalias() += a * b.transpose();
    else c.noalias() = a * b.transpose();
  };
  if (M >= N) parallel_for(threads, M, 32, [&](int64_t b, int64_t e) { part(b, e, 0, N); });
  else parallel_for(threads, N, 64, [&](int64_t b, int64_t e) { part(0, M, b, e); });
}

void gemm_nn(int threads, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  auto part = [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    CMat a(A + m0 * lda, m1 - m0, K, Eigen::OuterStride<>(lda));
    CMat b(B + n0, K, n1 - n0, Eigen::OuterStride<>(ldb));
    MMat c(C + m0 * ldc + n0, m1 - m0, n1 - n0, Eigen::OuterStride<>(ldc));
    if (accumulate) c.noalias() += a * b;
    else c.noalias() = a * b;
  };
  if (M >= N) parallel_for(threads, M, 32, [&](int64_t b, int64_t e) { part(b, e, 0, N); });
  else parallel_for(threads, N, 64, [&](int64_t b, int64_t e) { part(0, M, b, e); });
}

void gemm_tn(int threads, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  auto part = [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    CMat a(A + m0, K, m1 - m0, Eigen::OuterStride<>(lda));
    CMat b(B + n0, K, n1 - n0, Eigen::OuterStride<>(ldb));
    MMat c(C + m0 * ldc + n0, m1 - m0, n1 - n0, Eigen::OuterStride<>(ldc));
    if (accumulate) c.noalias() += a.transpose() * b;
    else c.noalias() = a.transpose() * b;
  };
  if (M >= N) parallel_for(threads, M, 32, [&](int64_t b, int64_t e) { part(b, e, 0, N); });
  else parallel_for(threads, N, 64, [&](int64_t b, int64_t e) { part(0, M, b, e); });
}

namespace {

const float* F(const void* p) { return static_cast<const float*>(p); }
float* F(void* p) { return static_cast<float*>(p); }

void check_n(int64_t n, const char* op) { require(n >= 0, op, "negative element count"); }

float load(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::i32: return float(static_cast<const int32_t*>(p)[i]);
  }
  return 0.f;
}

void store(DType t, void* p, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
  }
}

}  // namespace

// ---- memory helpers ------------------------------------------------------------

void CpuOps::fill(DType t, void* x, int64_t n, float value) {
  check_n(n, "fill");
  if (t == DType::f32) {
    std::fill(F(x), F(x) + n, value);
    return;
  }
  for (int64_t i = 0; i < n; ++i) store(t, x, i, value);
}

void CpuOps::copy(DType t, void* dst, const void* src, int64_t n) {
  check_n(n, "copy");
  if (n) std::memcpy(dst, src, size_t(n) * dtype_size(t));
}

void CpuOps::cast(DType dst_t, void* dst, DType src_t, const void* src, int64_t n) {
  check_n(n, "cast");
  if (dst_t == src_t) return copy(dst_t, dst, src, n);
  for (int64_t i = 0; i < n; ++i) store(dst_t, dst, i, load(src_t, src, i));
}

void CpuOps::dequantize(WeightFormat f, const void* src, void* dst, int64_t n, int64_t cols) {
  check_n(n, "dequantize");
  dequantize_weights(f, src, F(dst), n, cols);  // the compute dtype is f32
}

void CpuOps::add_into(DType dst_t, void* dst, DType src_t, const void* src, int64_t n, float alpha) {
  check_n(n, "add_into");
  if (dst_t == DType::f32 && src_t == DType::f32) {
    MVec(F(dst), n) += alpha * CVec(F(src), n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) store(dst_t, dst, i, load(dst_t, dst, i) + alpha * load(src_t, src, i));
}

void CpuOps::add(const void* a, const void* b, void* y, int64_t n) {
  check_n(n, "add");
  const float *pa = F(a), *pb = F(b);
  float* py = F(y);
  for (int64_t i = 0; i < n; ++i) py[i] = pa[i] + pb[i];
}

// ---- linear --------------------------------------------------------------------

void CpuOps::linear_fwd(const void* x, const void* w, void* y, int64_t M, int64_t K, int64_t N, float alpha) {
  require(M >= 0 && K >= 0 && N >= 0, "linear_fwd", "negative dimension");
  if (M == 0 || N == 0) return;
  if (K == 0) return fill(DType::f32, y, M * N, 0.f);
  if (f16_accum_)
    return gemm_f16_accumulate(threads_, M, N, K, F(x), K, F(w), K, true, F(y), N, alpha, false);
  if (alpha != 1.0f) {  // the sum scaled once, as linear_fwd_add computes it onto zeros
    fill(DType::f32, y, M * N, 0.f);
    return linear_fwd_add(x, w, y, M, K, N, alpha);
  }
  gemm_nt(threads_, M, N, K, F(x), K, F(w), K, F(y), N, false);
}

void CpuOps::linear_bwd_input(const void* dy, const void* w, void* dx, int64_t M, int64_t K, int64_t N,
                              bool accumulate, float alpha) {
  require(M >= 0 && K >= 0 && N >= 0, "linear_bwd_input", "negative dimension");
  if (M == 0 || K == 0) return;
  if (N == 0) {
    if (!accumulate) fill(DType::f32, dx, M * K, 0.f);
    return;
  }
  if (f16_accum_)
    return gemm_f16_accumulate(threads_, M, K, N, F(dy), N, F(w), K, false, F(dx), K, alpha, accumulate);
  if (alpha == 1.0f) return gemm_nn(threads_, M, K, N, F(dy), N, F(w), K, F(dx), K, accumulate);
  // the fp32 sum first, then scaled once (and added when accumulating)
  std::vector<float> sum(accumulate ? size_t(M * K) : 0);
  float* into = accumulate ? sum.data() : F(dx);
  gemm_nn(threads_, M, K, N, F(dy), N, F(w), K, into, K, false);
  float* d = F(dx);
  for (int64_t i = 0; i < M * K; ++i) d[i] = accumulate ? d[i] + alpha * into[i] : alpha * into[i];
}

void CpuOps::linear_bwd_weight(const void* dy, const void* x, void* dw, int64_t M, int64_t K, int64_t N) {
  require(M >= 0 && K >= 0 && N >= 0, "linear_bwd_weight", "negative dimension");
  if (M == 0 || N == 0 || K == 0) return;
  gemm_tn(threads_, N, K, M, F(dy), N, F(x), K, F(dw), K, true);
}

// ---- embedding -----------------------------------------------------------------

namespace {
void check_ids(const int32_t* ids, int64_t T, int64_t V, const char* op) {
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= V)
      throw std::out_of_range(std::string(op) + ": token id " + std::to_string(ids[t]) + " at position " +
                              std::to_string(t) + " outside [0, " + std::to_string(V) + ")");
}
}  // namespace

void CpuOps::embedding_fwd(const int32_t* ids, const void* table, void* y, int64_t T, int64_t H, int64_t V) {
  require(T >= 0 && H >= 0 && V >= 0, "embedding_fwd", "negative dimension");
  check_ids(ids, T, V, "embedding_fwd");
  for (int64_t t = 0; t < T; ++t) std::memcpy(F(y) + t * H, F(table) + int64_t(ids[t]) * H, size_t(H) * 4);
}

void CpuOps::embedding_bwd(const int32_t* ids, const void* dy, void* dtable, int64_t T, int64_t H, int64_t V,
                           int64_t padding_idx) {
  require(T >= 0 && H >= 0 && V >= 0, "embedding_bwd", "negative dimension");
  require(padding_idx == -1 || (padding_idx >= 0 && padding_idx < V), "embedding_bwd",
          "padding_idx must be -1 (none) or an id below V");
  check_ids(ids, T, V, "embedding_bwd");
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] != padding_idx) MVec(F(dtable) + int64_t(ids[t]) * H, H) += CVec(F(dy) + t * H, H);
}

// ---- RMSNorm -------------------------------------------------------------------

void CpuOps::rmsnorm_fwd(const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                         float w_offset) {
  require(R >= 0 && n > 0, "rmsnorm_fwd", "need R >= 0 rows of n > 0 columns");
  const Eigen::ArrayXf wv = CVec(F(w), n) + w_offset;  // Gemma: 1 + w
  for (int64_t r = 0; r < R; ++r) {
    CVec xr(F(x) + r * n, n);
    float rs = 1.0f / std::sqrt(xr.square().sum() / float(n) + eps);
    MVec(F(y) + r * n, n) = (xr * rs) * wv;
  }
}

void CpuOps::rmsnorm_bwd(const void* x, const void* w, const void* dy, void* dx, void* dw, int64_t R,
                         int64_t n, float eps, bool accumulate_dx, float w_offset) {
  require(R >= 0 && n > 0, "rmsnorm_bwd", "need R >= 0 rows of n > 0 columns");
  const Eigen::ArrayXf wv = CVec(F(w), n) + w_offset;  // Gemma: 1 + w
  auto rsqrt_row = [&](const CVec& xr) { return 1.0f / std::sqrt(xr.square().sum() / float(n) + eps); };
  for (int64_t r = 0; r < R; ++r) {
    CVec xr(F(x) + r * n, n), dyr(F(dy) + r * n, n);
    const float rs = rsqrt_row(xr);
    // mean(g * xh) with g = dy*w, xh = x*rs
    float c = (dyr * wv * xr).sum() * rs / float(n);
    MVec dxr(F(dx) + r * n, n);
    if (accumulate_dx) dxr += rs * (dyr * wv - xr * (rs * c));
    else dxr = rs * (dyr * wv - xr * (rs * c));
  }
  // dw in its own pass (dw null: a frozen norm, nothing to do), so that dx is computed by the
  // same code, bit for bit, with or without it
  if (!dw) return;
  MVec dwv(F(dw), n);
  for (int64_t r = 0; r < R; ++r) {
    CVec xr(F(x) + r * n, n), dyr(F(dy) + r * n, n);
    dwv += dyr * xr * rsqrt_row(xr);
  }
}

// ---- SwiGLU --------------------------------------------------------------------

void CpuOps::swiglu_fwd(const void* g, const void* u, void* h, int64_t n) {
  check_n(n, "swiglu_fwd");
  CVec gv(F(g), n), uv(F(u), n);
  MVec(F(h), n) = gv / (1.0f + (-gv).exp()) * uv;
}

void CpuOps::swiglu_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n) {
  check_n(n, "swiglu_bwd");
  const float *pg = F(g), *pu = F(u), *pdh = F(dh);
  float *pdg = F(dg), *pdu = F(du);
  constexpr int64_t B = 1024;  // blockwise so Eigen vectorises exp
  float sig[B];
  for (int64_t i0 = 0; i0 < n; i0 += B) {
    int64_t m = std::min(B, n - i0);
    CVec gv(pg + i0, m), uv(pu + i0, m), dhv(pdh + i0, m);
    Eigen::Map<Eigen::ArrayXf> s(sig, m);
    s = 1.0f / (1.0f + (-gv).exp());
    MVec(pdu + i0, m) = dhv * gv * s;
    MVec(pdg + i0, m) = dhv * uv * s * (1.0f + gv * (1.0f - s));
  }
}

// ---- GeGLU ---------------------------------------------------------------------

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
}  // namespace

void CpuOps::geglu_fwd(const void* g, const void* u, void* h, int64_t n) {
  check_n(n, "geglu_fwd");
  CVec gv(F(g), n), uv(F(u), n);
  MVec(F(h), n) = 0.5f * gv * (1.0f + (kGeluK * (gv + kGeluC * gv.cube())).tanh()) * uv;
}

void CpuOps::geglu_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n) {
  check_n(n, "geglu_bwd");
  const float *pg = F(g), *pu = F(u), *pdh = F(dh);
  float *pdg = F(dg), *pdu = F(du);
  constexpr int64_t B = 1024;  // blockwise so Eigen vectorises tanh
  float th[B];
  for (int64_t i0 = 0; i0 < n; i0 += B) {
    int64_t m = std::min(B, n - i0);
    CVec gv(pg + i0, m), uv(pu + i0, m), dhv(pdh + i0, m);
    Eigen::Map<Eigen::ArrayXf> t(th, m);
    t = (kGeluK * (gv + kGeluC * gv.cube())).tanh();
    MVec(pdu + i0, m) = dhv * 0.5f * gv * (1.0f + t);
    MVec(pdg + i0, m) =
        dhv * uv *
        (0.5f * (1.0f + t) + 0.5f * gv * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * gv.square()));
  }
}

}  // namespace rp::cpu

namespace rp {
std::unique_ptr<Ops> make_cpu_ops(int num_threads) { return std::make_unique<cpu::CpuOps>(num_threads); }
}  // namespace rp
