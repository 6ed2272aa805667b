// CUDA ops, host side: argument checks (same as the CPU twin, before anything is
// enqueued), cuBLASLt GEMMs, the chunked LM head + cross-entropy, and the launches of
// the kernels in cuda_elementwise.cu, cuda_rowwise.cu and cuda_attention.cu.
#include "kernels/cuda/cuda_ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/weight_format.hpp"

namespace rp::cuda {

namespace {

void require(bool cond, const char* op, const char* what) {
  if (!cond) throw std::invalid_argument(std::string(op) + ": " + what);
}
void check_n(int64_t n, const char* op) { require(n >= 0, op, "negative element count"); }

unsigned alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  unsigned a = 256;
  while (a > 1 && (u % a) != 0) a >>= 1;
  return a;
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt workspace (Hopper: 32 MiB)

}  // namespace

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: break;
  }
  throw std::invalid_argument(std::string("gemm: unsupported dtype ") + dtype_name(t));
}

CudaOps::CudaOps(int device, cudaStream_t stream, DType dtype, unsigned* err)
    : dev_(device), st_(stream), dtype_(dtype), err_(err) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    throw std::invalid_argument(
        fmt::format("CUDA ops: compute dtype must be bf16 or f16, not {}", dtype_name(dtype)));
  // the variables first: a bad value throws before anything is allocated (no destructor runs then)
  attn_impl_ = parse_attention_impl(std::getenv("RP_CUDA_ATTENTION"));
  attn_gqa_ = parse_attention_gqa(std::getenv("RP_CUDA_ATTENTION_GQA"));
  grouped_mode_ = parse_grouped_gemm(std::getenv("RP_CUDA_GROUPED_GEMM"));
  lt_batched_ok_ = parse_bucketed_lt(std::getenv("RP_CUDA_BUCKETED_LT"));
  bucketed_streams_ = parse_bucketed_streams(std::getenv("RP_CUDA_BUCKETED_STREAMS"));
  qk_rope_fused_ = parse_qk_norm_rope(std::getenv("RP_CUDA_QK_NORM_ROPE"));
  set_device(dev_);
  RP_CUBLAS_CHECK(cublasLtCreate(&lt_));
  RP_CUDA_CHECK(cudaMalloc(&ws_, kWorkspaceBytes));
  ws_bytes_ = kWorkspaceBytes;
}

CudaOps::~CudaOps() {
  cudaSetDevice(dev_);
  release_moe();
  for (auto& [k, p] : plans_) destroy_plan(p);
  if (ws_) cudaFree(ws_);
  if (lt_) cublasLtDestroy(lt_);
}

// ---- GEMM ----------------------------------------------------------------------------

void CudaOps::destroy_plan(Plan& p) {
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  p = Plan{};
}

CudaOps::Plan& CudaOps::plan_for(const Key& key, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                 int64_t lda, int64_t ldb, int64_t ldc, DType c_t, unsigned align_a,
                                 unsigned align_b, unsigned align_c, const Fp8Operands* fp8,
                                 bool f16_compute) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan p;
  const cudaDataType_t ct = cuda_type(c_t);
  const cudaDataType_t at = fp8 ? fp8->a_type : cuda_type(dtype_), bt = fp8 ? fp8->b_type : cuda_type(dtype_);
  if (f16_compute)  // GeForce tensor cores: twice the rate of fp32 accumulation
    RP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_16F, CUDA_R_16F));
  else RP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  RP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  RP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (fp8) set_fp8_attributes(p.op, *fp8);
  RP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, at, uint64_t(ta ? k : m), uint64_t(ta ? m : k), lda));
  RP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, bt, uint64_t(tb ? n : k), uint64_t(tb ? k : n), ldb));
  RP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, ct, uint64_t(m), uint64_t(n), ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  RP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = ws_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  uint32_t aa = align_a, ab_ = align_b, ac = align_c;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab_, sizeof(ab_));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    destroy_plan(p);
    throw DeviceError(fmt::format(
        "cuBLASLt: no algorithm for {}{} GEMM m={} n={} k={} lda={} ldb={} ldc={} ({} -> {}{}): {}",
        ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, lda, ldb, ldc, fp8 ? "fp8" : dtype_name(dtype_),
        dtype_name(c_t), f16_compute ? ", fp16 accumulation" : "",
        s == CUBLAS_STATUS_SUCCESS ? "none found" : cublasLtGetStatusString(s)));
  }
  p.algo = res.algo;
  return plans_.emplace(key, p).first->second;
}

void CudaOps::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda,
                   const void* B, int64_t ldb, void* C, DType c_t, int64_t ldc, float beta, float alpha,
                   bool f16_compute, const void* c_in) {
  gemm_on(st_, ws_, ta, tb, m, n, k, A, lda, B, ldb, C, c_t, ldc, beta, alpha, f16_compute, c_in);
}

void CudaOps::gemm_on(cudaStream_t st, void* ws, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                      const void* A, int64_t lda, const void* B, int64_t ldb, void* C, DType c_t, int64_t ldc,
                      float beta, float alpha, bool f16_compute, const void* c_in) {
  if (f16_compute && (dtype_ != DType::f16 || c_t != DType::f16))
    throw std::invalid_argument("gemm: fp16 accumulation needs f16 operands and output");
  set_device(dev_);
  const void* c_read = c_in ? c_in : C;  // the beta term's source
  const unsigned aa = alignment_of(A), ab = alignment_of(B),
                 ac = std::min(alignment_of(C), alignment_of(c_read));
  const Key key{ta,
                tb,
                m,
                n,
                k,
                lda,
                ldb,
                ldc,
                int64_t(c_t),
                int64_t(aa),
                int64_t(ab),
                int64_t(ac),
                beta != 0.f,
                int64_t(dtype_),
                0,
                0,
                f16_compute};  // 0, 0: not FP8
  std::lock_guard lk(mu_);
  Plan& p = plan_for(key, ta, tb, m, n, k, lda, ldb, ldc, c_t, aa, ab, ac, nullptr, f16_compute);
  // alpha is read from host memory at the call (CUBLASLT_POINTER_MODE_HOST, the default);
  // the algorithm choice does not depend on its value, so it is not part of the plan key.
  // With fp16 compute the scale type is fp16: alpha and beta are passed as halves.
  const uint16_t alpha16 = f32_to_f16(alpha), beta16 = f32_to_f16(beta);
  const void* pa = f16_compute ? static_cast<const void*>(&alpha16) : &alpha;
  const void* pb = f16_compute ? static_cast<const void*>(&beta16) : &beta;
  RP_CUBLAS_CHECK(
      cublasLtMatmul(lt_, p.op, pa, A, p.a, B, p.b, pb, c_read, p.c, C, p.c, &p.algo, ws, ws_bytes_, st));
}

// ---- memory helpers ---------------------------------------------------------------------

void CudaOps::fill(DType t, void* x, int64_t n, float value) {
  check_n(n, "fill");
  set_device(dev_);
  k_fill(t, x, n, value, st_);
}

void CudaOps::copy(DType t, void* dst, const void* src, int64_t n) {
  check_n(n, "copy");
  if (n == 0) return;
  set_device(dev_);
  RP_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * dtype_size(t), cudaMemcpyDeviceToDevice, st_));
}

void CudaOps::dequantize(WeightFormat f, const void* src, void* dst, int64_t n, int64_t cols) {
  dequantize_to(f, dtype_, src, dst, n, cols);
}

// dequantize_to's argument checks; false when there is nothing to do (n == 0).
bool CudaOps::check_dequantize(WeightFormat f, DType out_t, const void* src, const void* dst, int64_t n,
                               int64_t cols) const {
  check_n(n, "dequantize");
  require(
      int(f) <= int(WeightFormat::fp8), "dequantize",
      fmt::format("unknown weight format {} (expected f32, bf16, f16, q8_0, q4_0, nf4, mxfp4 or fp8)", int(f))
          .c_str());
  require(out_t == DType::f32 || out_t == DType::bf16 || out_t == DType::f16, "dequantize",
          fmt::format("output dtype {} (expected f32, bf16 or f16)", dtype_name(out_t)).c_str());
  weight_format_bytes(f, n, cols);  // throws std::invalid_argument unless n is a multiple of the block
  if (n == 0) return false;
  require(src != nullptr && dst != nullptr, "dequantize", "null source or destination");
  return true;
}

void CudaOps::dequantize_to(WeightFormat f, DType out_t, const void* src, void* dst, int64_t n,
                            int64_t cols) {
  if (!check_dequantize(f, out_t, src, dst, n, cols)) return;
  set_device(dev_);
  k_dequantize(f, out_t, src, dst, n, cols, st_);
}

void CudaOps::dequantize_many(const DequantPart* parts, int64_t count) {
  require(count >= 0 && (count == 0 || parts != nullptr), "dequantize_many", "null parts or negative count");
  for (int64_t i = 0; i < count; ++i)
    check_dequantize(parts[i].format, dtype_, parts[i].src, parts[i].dst, parts[i].n, parts[i].cols);
  set_device(dev_);
  k_dequantize_many(dtype_, parts, count, st_);
}

void CudaOps::cast(DType dst_t, void* dst, DType src_t, const void* src, int64_t n) {
  check_n(n, "cast");
  if (dst_t == src_t) return copy(dst_t, dst, src, n);
  set_device(dev_);
  k_cast(dst_t, dst, src_t, src, n, st_);
}

void CudaOps::add_into(DType dst_t, void* dst, DType src_t, const void* src, int64_t n, float alpha) {
  check_n(n, "add_into");
  set_device(dev_);
  k_add_into(dst_t, dst, src_t, src, n, alpha, st_);
}

void CudaOps::add(const void* a, const void* b, void* y, int64_t n) {
  check_n(n, "add");
  set_device(dev_);
  k_add(dtype_, a, b, y, n, st_);
}

// ---- linear: row-major y = x W^T is column-major y^T = W x^T ---------------------------

void CudaOps::linear_fwd(const void* x, const void* w, void* y, int64_t M, int64_t K, int64_t N,
                         float alpha) {
  require(M >= 0 && K >= 0 && N >= 0, "linear_fwd", "negative dimension");
  if (M == 0 || N == 0) return;
  if (K == 0) return fill(dtype_, y, M * N, 0.f);
  gemm(true, false, N, M, K, w, K, x, K, y, dtype_, N, 0.f, alpha, f16_accum_);
}

void CudaOps::linear_fwd_residual(const void* x, const void* w, const void* r, void* y, int64_t M, int64_t K,
                                  int64_t N) {
  require(M >= 0 && K >= 0 && N >= 0, "linear_fwd_residual", "negative dimension");
  require(r != y, "linear_fwd_residual", "r and y are the same tensor");
  if (M == 0 || N == 0) return;
  if (K == 0) return copy(dtype_, y, r, M * N);
  gemm(true, false, N, M, K, w, K, x, K, y, dtype_, N, 1.f, 1.f, f16_accum_, r);
}

void CudaOps::linear_bwd_input(const void* dy, const void* w, void* dx, int64_t M, int64_t K, int64_t N,
                               bool accumulate, float alpha) {
  require(M >= 0 && K >= 0 && N >= 0, "linear_bwd_input", "negative dimension");
  if (M == 0 || K == 0) return;
  if (N == 0) {
    if (!accumulate) fill(dtype_, dx, M * K, 0.f);
    return;
  }
  gemm(false, false, K, M, N, w, K, dy, N, dx, dtype_, K, accumulate ? 1.f : 0.f, alpha, f16_accum_);
}

void CudaOps::linear_bwd_weight(const void* dy, const void* x, void* dw, int64_t M, int64_t K, int64_t N) {
  require(M >= 0 && K >= 0 && N >= 0, "linear_bwd_weight", "negative dimension");
  if (M == 0 || N == 0 || K == 0) return;
  gemm(false, true, K, N, M, x, K, dy, N, dw, DType::f32, K, 1.f);
}

// ---- embedding / norms / rope / swiglu ----------------------------------------------------

void CudaOps::embedding_fwd(const int32_t* ids, const void* table, void* y, int64_t T, int64_t H, int64_t V) {
  require(T >= 0 && H >= 0 && V >= 0, "embedding_fwd", "negative dimension");
  set_device(dev_);
  k_embedding_fwd(dtype_, ids, table, y, T, H, V, err_, st_);
}

void CudaOps::embedding_bwd(const int32_t* ids, const void* dy, void* dtable, int64_t T, int64_t H, int64_t V,
                            int64_t padding_idx) {
  require(T >= 0 && H >= 0 && V >= 0, "embedding_bwd", "negative dimension");
  require(padding_idx == -1 || (padding_idx >= 0 && padding_idx < V), "embedding_bwd",
          "padding_idx must be -1 (none) or an id below V");
  set_device(dev_);
  k_embedding_bwd(dtype_, ids, dy, static_cast<float*>(dtable), T, H, V, padding_idx, err_, st_);
}

void CudaOps::rmsnorm_fwd(const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                          float w_offset) {
  require(R >= 0 && n > 0, "rmsnorm_fwd", "need R >= 0 rows of n > 0 columns");
  set_device(dev_);
  k_rmsnorm_fwd(dtype_, x, w, y, R, n, eps, w_offset, st_);
}

void CudaOps::rmsnorm_bwd(const void* x, const void* w, const void* dy, void* dx, void* dw, int64_t R,
                          int64_t n, float eps, bool accumulate_dx, float w_offset) {
  require(R >= 0 && n > 0, "rmsnorm_bwd", "need R >= 0 rows of n > 0 columns");
  set_device(dev_);
  k_rmsnorm_bwd(dtype_, x, w, dy, dx, static_cast<float*>(dw), R, n, eps, accumulate_dx, w_offset, st_);
}

void CudaOps::rope_fwd(void* x, int64_t n_seq, int64_t L, int64_t heads, int64_t D, const float* inv_freq,
                       float scale, int64_t rotary_dim) {
  require(n_seq >= 0 && L >= 0 && heads >= 0, "rope", "negative dimension");
  const int64_t half = rope_half(D, rotary_dim, "rope");
  set_device(dev_);
  k_rope(dtype_, x, n_seq, L, heads, D, 2 * half, inv_freq, scale, false, st_);
}

void CudaOps::rope_bwd(void* dx, int64_t n_seq, int64_t L, int64_t heads, int64_t D, const float* inv_freq,
                       float scale, int64_t rotary_dim) {
  require(n_seq >= 0 && L >= 0 && heads >= 0, "rope", "negative dimension");
  const int64_t half = rope_half(D, rotary_dim, "rope");
  set_device(dev_);
  k_rope(dtype_, dx, n_seq, L, heads, D, 2 * half, inv_freq, scale, true, st_);
}

void CudaOps::swiglu_fwd(const void* g, const void* u, void* h, int64_t n) {
  check_n(n, "swiglu_fwd");
  set_device(dev_);
  k_swiglu_fwd(dtype_, g, u, h, n, st_);
}

void CudaOps::swiglu_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n) {
  check_n(n, "swiglu_bwd");
  set_device(dev_);
  k_swiglu_bwd(dtype_, g, u, dh, dg, du, n, st_);
}

void CudaOps::geglu_fwd(const void* g, const void* u, void* h, int64_t n) {
  check_n(n, "geglu_fwd");
  set_device(dev_);
  k_geglu_fwd(dtype_, g, u, h, n, st_);
}

void CudaOps::geglu_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n) {
  check_n(n, "geglu_bwd");
  set_device(dev_);
  k_geglu_bwd(dtype_, g, u, dh, dg, du, n, st_);
}

// ---- attention --------------------------------------------------------------------------------

namespace {
void check_attn(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, const void* scratch,
                const char* op) {
  require(n_seq >= 0 && L >= 0 && D > 0, op, "bad dimensions");
  require(nq > 0 && nkv > 0 && nq % nkv == 0, op, "nq must be a positive multiple of nkv");
  require(scratch != nullptr || n_seq * L == 0, op, "scratch is null");
}
}  // namespace

void CudaOps::attention_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int64_t n_seq,
                            int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale, void* scratch) {
  check_attn(n_seq, L, nq, nkv, D, scratch, "attention_fwd");
  set_device(dev_);
  const size_t ws = attention_ws(n_seq, L, nq, nkv, D);
  if (try_cudnn(false, [&](std::string* why) {
        return cudnn_->fwd(dtype_, q, k, v, o, lse, n_seq, L, nq, nkv, D, scale, scratch, ws, why);
      }))
    return;
  k_attention_fwd(dtype_, q, k, v, o, lse, n_seq, L, nq, nkv, D, scale, attn_impl_, st_);
}

void CudaOps::attention_bwd(const void* q, const void* k, const void* v, const void* o, const float* lse,
                            const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t L,
                            int64_t nq, int64_t nkv, int64_t D, float scale, void* scratch) {
  check_attn(n_seq, L, nq, nkv, D, scratch, "attention_bwd");
  require(lse != nullptr, "attention_bwd", "lse is null");
  set_device(dev_);
  const size_t ws = attention_ws(n_seq, L, nq, nkv, D);
  last_bwd_passes_ = 0;
  if (try_cudnn(true, [&](std::string* why) {
        return cudnn_->bwd(dtype_, q, k, v, o, lse, dout, dq, dk, dv, n_seq, L, nq, nkv, D, scale, scratch,
                           ws, why);
      })) {
    last_bwd_passes_ = cudnn_->last_bwd_passes();
    return;
  }
  k_attention_bwd(dtype_, q, k, v, o, lse, dout, dq, dk, dv, n_seq, L, nq, nkv, D, scale, scratch, attn_impl_,
                  st_);
}

size_t CudaOps::attention_ws(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D) const {
  return attn_scratch_bytes_ > 0 ? attn_scratch_bytes_ : Ops::attention_scratch_bytes(n_seq, L, nq, nkv, D);
}

void CudaOps::set_attention_gqa(int mode) {
  attn_gqa_ = mode;
  if (cudnn_) cudnn_->set_gqa_backward(CudnnAttention::GqaBackward(mode));
}

void CudaOps::gqa_expand_kv(const void* k, const void* v, void* ke, void* ve, int64_t T, int64_t nkv,
                            int64_t h0, int64_t hc, int64_t r, int64_t D) {
  set_device(dev_);
  k_gqa_expand_kv(dtype_, k, v, ke, ve, T, nkv, h0, hc, r, D, st_);
}

void CudaOps::gqa_group_sum(DType in_t, const void* in_k, const void* in_v, DType out_t, void* out_k,
                            void* out_v, int64_t out_row, int64_t T, int64_t G, int64_t m, int64_t D,
                            bool accumulate) {
  set_device(dev_);
  k_gqa_group_sum(in_t, in_k, in_v, out_t, out_k, out_v, out_row, T, G, m, D, accumulate, st_);
}

bool CudaOps::try_cudnn(bool backward, const std::function<bool(std::string*)>& call) {
  if ((attn_impl_ != 0 && attn_impl_ != 4) || !CudnnAttention::available()) {
    if (attn_impl_ == 4) throw DeviceError("attention: cuDNN requested but this build has no cuDNN");
    return false;
  }
  if (!cudnn_) {
    cudnn_ = std::make_unique<CudnnAttention>(dev_, st_);
    cudnn_->set_gqa_backward(CudnnAttention::GqaBackward(attn_gqa_));
  }
  std::string why;
  if (call(&why)) return true;
  if (attn_impl_ == 4)
    throw DeviceError(fmt::format("attention {}: cuDNN refused: {}", backward ? "backward" : "forward", why));
  if (!cudnn_refusal_logged_) {  // automatic mode: fall back to our kernels, say so once
    cudnn_refusal_logged_ = true;
    fmt::print(stderr, "roundpipe: cuDNN attention not used ({}); using the built-in kernels\n", why);
  }
  return false;
}

bool CudaOps::try_cudnn_variant(const std::function<bool(std::string*)>& call) {
  if ((attn_impl_ != 0 && attn_impl_ != 4) || !CudnnAttention::available()) return false;
  if (!cudnn_) {
    cudnn_ = std::make_unique<CudnnAttention>(dev_, st_);
    cudnn_->set_gqa_backward(CudnnAttention::GqaBackward(attn_gqa_));
  }
  std::string why;
  return call(&why);
}

// ---- LM head + cross-entropy ----------------------------------------------------------------
// The scratch contract (Ops::lm_head_ce_scratch_bytes) holds kCeChunk rows of fp32 logits;
// here logits are stored in the compute dtype (as transformers' bf16 lm_head produces
// them; softmax and logsumexp are computed in fp32), so a chunk holds about twice as many
// tokens. Chunks are fixed ranges of token positions (no gather, so no host sync):
// ignored tokens get zero loss and zero dlogits rows, which gives the same dh / dW.
// Loss scaling: the dlogits stay unscaled in 16-bit storage (|softmax - onehot| <= 1 cannot
// overflow); loss_scale is the fp32 alpha of the dh and dW GEMMs, so a scale too large
// overflows where fp16 training must see it: in the fp16 dh rounded from the fp32 product.

void CudaOps::lm_head_cross_entropy(const void* h, const void* w, const int32_t* targets, int64_t T,
                                    int64_t H, int64_t V, float* loss, void* dh, void* dw, void* scratch,
                                    float loss_scale, float softcap) {
  Ops::check_lm_head_ce_args(T, H, V, loss, scratch, loss_scale, softcap);
  set_device(dev_);
  const size_t avail = Ops::lm_head_ce_scratch_bytes(T, H, V);
  const size_t es = dtype_size(dtype_);
  auto need = [&](int64_t c) {
    return (size_t(c) * size_t(V) * es + 255) / 256 * 256 + size_t(c) * sizeof(float);
  };
  int64_t chunk = int64_t(avail / (size_t(V) * es + sizeof(float)));
  if (chunk >= 16) chunk = chunk / 16 * 16;
  while (chunk > 1 && need(chunk) > avail) chunk -= chunk > 16 ? 16 : 1;
  chunk = std::max<int64_t>(chunk, 1);
  void* Z = scratch;
  float* row_loss = reinterpret_cast<float*>(static_cast<char*>(scratch) + (need(chunk) - size_t(chunk) * 4));
  RP_CUDA_CHECK(cudaMemsetAsync(loss, 0, 2 * sizeof(float), st_));
  const bool grad = dh != nullptr || dw != nullptr;
  const char* hp = static_cast<const char*>(h);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    const void* hc = hp + size_t(t0 * H) * es;
    gemm(true, false, V, n, H, w, H, hc, H, Z, dtype_, V, 0.f);  // logits [n, V]
    k_ce_rows(dtype_, Z, targets + t0, n, V, row_loss, grad, err_, st_, softcap);
    k_ce_reduce(row_loss, targets + t0, n, V, loss, st_);
    if (dh)
      gemm(false, false, H, n, V, w, H, Z, V, static_cast<char*>(dh) + size_t(t0 * H) * es, dtype_, H, 0.f,
           loss_scale);
    if (dw) gemm(false, true, H, V, n, hc, H, Z, V, dw, DType::f32, H, 1.f, loss_scale);
  }
}

// ---- knobs --------------------------------------------------------------------------------------

bool cudnn_attention_available() { return CudnnAttention::available(); }

int parse_attention_impl(const char* text) {
  if (!text || !*text) return 0;
  const std::string t = text;
  if (t == "auto") return 0;
  if (t == "simple") return 1;
  if (t == "flash") return 2;
  if (t == "flash8") return 3;
  if (t == "cudnn") return 4;
  throw std::invalid_argument(
      fmt::format("RP_CUDA_ATTENTION='{}': expected auto, simple, flash, flash8 or cudnn", t));
}

int parse_attention_gqa(const char* text) {
  if (!text || !*text) return 0;
  const std::string t = text;
  if (t == "auto") return 0;
  if (t == "native") return 1;
  if (t == "expand") return 2;
  throw std::invalid_argument(fmt::format("RP_CUDA_ATTENTION_GQA='{}': expected auto, native or expand", t));
}

int parse_grouped_gemm(const char* text) {
  if (!text || !*text) return 1;
  const std::string t = text;
  if (t == "loop") return 0;
  if (t == "grouped") return 1;
  if (t == "streams") return 2;
  throw std::invalid_argument(fmt::format("RP_CUDA_GROUPED_GEMM='{}': expected grouped, streams or loop", t));
}

bool parse_bucketed_lt(const char* text) {
  if (!text || !*text) return true;
  const std::string t = text;
  if (t == "1") return true;
  if (t == "0") return false;
  throw std::invalid_argument(
      fmt::format("RP_CUDA_BUCKETED_LT='{}': expected 1 (cuBLASLt's batches) or 0", t));
}

int parse_bucketed_streams(const char* text) {
  if (!text || !*text) return 4;  // measured fastest (Qwen3-30B-A3B LoRA on an H200: 1.13x grouped)
  const std::string t = text;
  if (t.size() == 1 && t[0] >= '1' && t[0] <= '4') return t[0] - '0';
  throw std::invalid_argument(fmt::format("RP_CUDA_BUCKETED_STREAMS='{}': expected 1, 2, 3 or 4", t));
}

CudaOps& cuda_ops(Ops& ops, const char* fn) {
  auto* c = dynamic_cast<CudaOps*>(&ops);
  if (!c) throw std::invalid_argument(std::string(fn) + ": not a CUDA device's ops");
  return *c;
}

void set_attention_impl(Ops& ops, int impl) {
  CudaOps& c = cuda_ops(ops, "set_attention_impl");
  if (impl < 0 || impl > 4) throw std::invalid_argument("set_attention_impl: impl must be 0..4");
  c.set_attention_impl(impl);
}

void set_attention_gqa(Ops& ops, int mode) {
  CudaOps& c = cuda_ops(ops, "set_attention_gqa");
  if (mode < 0 || mode > 2) throw std::invalid_argument("set_attention_gqa: mode must be 0..2");
  c.set_attention_gqa(mode);
}

void set_grouped_gemm(Ops& ops, int mode) {
  CudaOps& c = cuda_ops(ops, "set_grouped_gemm");
  if (mode < 0 || mode > 2) throw std::invalid_argument("set_grouped_gemm: mode must be 0, 1 or 2");
  c.set_grouped_gemm(mode);
}

int grouped_gemm(Ops& ops) { return cuda_ops(ops, "grouped_gemm").grouped_gemm(); }

void set_bucketed_lt(Ops& ops, bool on) { cuda_ops(ops, "set_bucketed_lt").set_bucketed_lt(on); }

void set_bucketed_streams(Ops& ops, int n) {
  CudaOps& c = cuda_ops(ops, "set_bucketed_streams");
  if (n < 1 || n > 4) throw std::invalid_argument("set_bucketed_streams: n must be 1..4");
  c.set_bucketed_streams(n);
}

std::pair<int64_t, int64_t> bucketed_batches(Ops& ops) {
  return cuda_ops(ops, "bucketed_batches").bucketed_batches();
}

void set_grouped_lowrank_kernel(Ops& ops, bool on) {
  cuda_ops(ops, "set_grouped_lowrank_kernel").set_grouped_lowrank_kernel(on);
}

void set_grouped_wgrad_kernel_max(Ops& ops, int64_t side) {
  CudaOps& c = cuda_ops(ops, "set_grouped_wgrad_kernel_max");
  if (side < 0) throw std::invalid_argument("set_grouped_wgrad_kernel_max: side must be >= 0");
  c.set_grouped_wgrad_kernel_max(side);
}

void set_attention_scratch_bytes(Ops& ops, size_t bytes) {
  cuda_ops(ops, "set_attention_scratch_bytes").set_attention_scratch_bytes(bytes);
}

int64_t attention_bwd_passes(Ops& ops) {
  return cuda_ops(ops, "attention_bwd_passes").last_attention_bwd_passes();
}

void dequantize_to(Ops& ops, WeightFormat f, DType out_t, const void* src, void* dst, int64_t n,
                   int64_t cols) {
  cuda_ops(ops, "dequantize_to").dequantize_to(f, out_t, src, dst, n, cols);
}

void gqa_expand_kv(Ops& ops, const void* k, const void* v, void* ke, void* ve, int64_t T, int64_t nkv,
                   int64_t h0, int64_t hc, int64_t r, int64_t D) {
  cuda_ops(ops, "gqa_expand_kv").gqa_expand_kv(k, v, ke, ve, T, nkv, h0, hc, r, D);
}

void gqa_group_sum(Ops& ops, DType in_t, const void* in_k, const void* in_v, DType out_t, void* out_k,
                   void* out_v, int64_t out_row, int64_t T, int64_t G, int64_t m, int64_t D,
                   bool accumulate) {
  cuda_ops(ops, "gqa_group_sum")
      .gqa_group_sum(in_t, in_k, in_v, out_t, out_k, out_v, out_row, T, G, m, D, accumulate);
}

}  // namespace rp::cuda
