// CPU implementation of rp::Ops (internal header of kernels/cpu; use make_cpu_ops()).
// fp32 storage and compute; GEMMs through Eigen (row-major Maps, -march=native).
#pragma once
#include <atomic>
#include <functional>

#include "kernels/ops.hpp"

namespace rp::cpu {

/// Runs fn(begin, end) over [0, n) split into at most `threads` contiguous parts
/// (parts smaller than `grain` are not split further); inline when threads <= 1.
void parallel_for(int threads, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

/// C[M,N] (+)= A[M,K] * B[N,K]^T   (row-major, leading dims lda/ldb/ldc).
void gemm_nt(int threads, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate);
/// C[M,N] (+)= A[M,K] * B[K,N].
void gemm_nn(int threads, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate);
/// C[M,N] (+)= A[K,M]^T * B[K,N].
void gemm_tn(int threads, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate);

/// C[M,N] (+)= alpha * A[M,K] * op(B) (op(B) = B[N,K]^T when b_transposed, else B[K,N]) with
/// fp16 accumulation emulated (kernels/cpu/cpu_f16_accum.cpp): the CPU twin of the CUDA
/// backend's CUBLAS_COMPUTE_16F GEMMs. Values are fp32 holding fp16-rounded results.
void gemm_f16_accumulate(int threads, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                         const float* B, int64_t ldb, bool b_transposed, float* C, int64_t ldc, float alpha,
                         bool accumulate);

/// Throws std::invalid_argument("<op>: <what>") unless cond.
void require(bool cond, const char* op, const char* what);

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int threads) { set_num_threads(threads); }
  DType dtype() const override { return DType::f32; }
  DType grad_dtype() const override { return DType::f32; }
  void set_num_threads(int n) override { threads_ = n < 1 ? 1 : n; }
  int num_threads() const override { return threads_; }

  void fill(DType t, void* x, int64_t n, float value) override;
  void copy(DType t, void* dst, const void* src, int64_t n) override;
  void cast(DType dst_t, void* dst, DType src_t, const void* src, int64_t n) override;
  void dequantize(WeightFormat f, const void* src, void* dst, int64_t n, int64_t cols = 0) override;
  void add_into(DType dst_t, void* dst, DType src_t, const void* src, int64_t n, float alpha) override;
  void add(const void* a, const void* b, void* y, int64_t n) override;

  void linear_fwd(const void* x, const void* w, void* y, int64_t M, int64_t K, int64_t N,
                  float alpha = 1.0f) override;
  void linear_bwd_input(const void* dy, const void* w, void* dx, int64_t M, int64_t K, int64_t N,
                        bool accumulate, float alpha = 1.0f) override;
  void linear_bwd_weight(const void* dy, const void* x, void* dw, int64_t M, int64_t K, int64_t N) override;
  void linear_fwd_ld(const void* x, int64_t ldx, const void* w, void* y, int64_t M, int64_t K,
                     int64_t N) override;
  void linear_bwd_input_ld(const void* dy, const void* w, void* dx, int64_t lddx, int64_t M, int64_t K,
                           int64_t N, float alpha) override;
  void linear_bwd_weight_ld(const void* dy, const void* x, int64_t ldx, void* dw, int64_t M, int64_t K,
                            int64_t N) override;
  void linear_fwd_add(const void* x, const void* w, void* y, int64_t M, int64_t K, int64_t N,
                      float alpha) override;
  void dropout(const void* x, void* y, int64_t rows, int64_t cols, float p, uint64_t seed,
               int64_t row0) override;

  void embedding_fwd(const int32_t* ids, const void* table, void* y, int64_t T, int64_t H,
                     int64_t V) override;
  void embedding_bwd(const int32_t* ids, const void* dy, void* dtable, int64_t T, int64_t H, int64_t V,
                     int64_t padding_idx) override;

  void rmsnorm_fwd(const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                   float w_offset = 0.0f) override;
  void rmsnorm_bwd(const void* x, const void* w, const void* dy, void* dx, void* dw, int64_t R, int64_t n,
                   float eps, bool accumulate_dx, float w_offset = 0.0f) override;

  void rope_fwd(void* x, int64_t n_seq, int64_t seq_len, int64_t heads, int64_t D, const float* inv_freq,
                float scale, int64_t rotary_dim = 0) override;
  void rope_bwd(void* dx, int64_t n_seq, int64_t seq_len, int64_t heads, int64_t D, const float* inv_freq,
                float scale, int64_t rotary_dim = 0) override;

  void attention_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int64_t n_seq,
                     int64_t seq_len, int64_t nq, int64_t nkv, int64_t D, float scale,
                     void* scratch) override;
  void attention_bwd(const void* q, const void* k, const void* v, const void* o, const float* lse,
                     const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t seq_len,
                     int64_t nq, int64_t nkv, int64_t D, float scale, void* scratch) override;

  void rope_fwd_at(void* x, const int32_t* pos, int64_t T, int64_t heads, int64_t D, const float* inv_freq,
                   float scale, int64_t rotary_dim = 0) override;
  void rope_bwd_at(void* dx, const int32_t* pos, int64_t T, int64_t heads, int64_t D, const float* inv_freq,
                   float scale, int64_t rotary_dim = 0) override;
  void attention_fwd_packed(const void* q, const void* k, const void* v, void* o, float* lse,
                            const int32_t* pos, int64_t n_seq, int64_t seq_len, int64_t nq, int64_t nkv,
                            int64_t D, float scale, void* scratch) override;
  void attention_bwd_packed(const void* q, const void* k, const void* v, const void* o, const float* lse,
                            const void* dout, const int32_t* pos, void* dq, void* dk, void* dv, int64_t n_seq,
                            int64_t seq_len, int64_t nq, int64_t nkv, int64_t D, float scale,
                            void* scratch) override;
  void attention_decode(const void* q, const void* k_cache, const void* v_cache, void* o, int64_t past,
                        int64_t n, int64_t nq, int64_t nkv, int64_t D, float scale) override;

  // GPT-OSS (attention variants, per-expert bias, clamped SwiGLU)
  void attention_fwd_v(const void* q, const void* k, const void* v, void* o, float* lse, int64_t n_seq,
                       int64_t seq_len, int64_t nq, int64_t nkv, int64_t D, float scale,
                       const AttentionVariant& var, void* scratch) override;
  void attention_bwd_v(const void* q, const void* k, const void* v, const void* o, const float* lse,
                       const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t seq_len,
                       int64_t nq, int64_t nkv, int64_t D, float scale, const AttentionVariant& var,
                       void* scratch) override;
  void attention_decode_v(const void* q, const void* k_cache, const void* v_cache, void* o, int64_t past,
                          int64_t n, int64_t nq, int64_t nkv, int64_t D, float scale,
                          const AttentionVariant& var) override;
  void grouped_bias_fwd(void* y, const void* b, const int32_t* offsets_host, int64_t E, int64_t N) override;
  void grouped_bias_bwd(const void* dy, void* db, const int32_t* offsets_host, int64_t E, int64_t N) override;
  void swiglu_clamped_fwd(const void* g, const void* u, void* h, int64_t n, float alpha,
                          float limit) override;
  void swiglu_clamped_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n,
                          float alpha, float limit) override;

  void swiglu_fwd(const void* g, const void* u, void* h, int64_t n) override;
  void swiglu_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n) override;
  void geglu_fwd(const void* g, const void* u, void* h, int64_t n) override;
  void geglu_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n) override;

  void moe_route(const void* logits, float* probs, int32_t* topk_idx, float* topk_w, float* stats, int64_t T,
                 int64_t E, int64_t k, bool norm_topk) override;
  void moe_route_bwd(const float* probs, const int32_t* topk_idx, const float* dw, const float* counts,
                     float aux_coef, void* dlogits, int64_t T, int64_t E, int64_t k, bool norm_topk) override;
  void moe_sort(const int32_t* topk_idx, int32_t* offsets, int32_t* offsets_host, int32_t* row,
                int32_t* token, int64_t T, int64_t E, int64_t k) override;
  void moe_pad_rows(const int32_t* topk_idx, const int32_t* offsets_host, const int32_t* padded_host,
                    int32_t* offsets, int32_t* row, int32_t* token, int64_t T, int64_t E, int64_t k) override;
  void moe_zero_pad_rows(void* x, const int32_t* token, int64_t R, int64_t H) override;
  void gather_rows(const void* x, const int32_t* token, void* xs, int64_t R, int64_t H) override;
  void moe_combine(const void* ys, const float* w, const int32_t* row, void* y, int64_t T, int64_t k,
                   int64_t H, bool accumulate) override;
  void moe_combine_bwd(const void* dy, const void* ys, const float* w, const int32_t* row, void* dys,
                       float* dw, int64_t T, int64_t k, int64_t H) override;
  void moe_gather_bwd(const void* dxs, const int32_t* row, void* dx, int64_t T, int64_t k, int64_t H,
                      bool accumulate) override;
  void grouped_linear_fwd_add(const void* x, const void* w, void* y, const int32_t* offsets_host, int64_t E,
                              int64_t K, int64_t N, float alpha) override;
  void grouped_linear_fwd(const void* x, const void* w, void* y, const int32_t* offsets_host, int64_t E,
                          int64_t K, int64_t N) override;
  void grouped_linear_bwd_input(const void* dy, const void* w, void* dx, const int32_t* offsets_host,
                                int64_t E, int64_t K, int64_t N, bool accumulate) override;
  void grouped_linear_bwd_weight(const void* dy, const void* x, void* dw, const int32_t* offsets_host,
                                 int64_t E, int64_t K, int64_t N) override;

  void lm_head_cross_entropy(const void* h, const void* w, const int32_t* targets, int64_t T, int64_t H,
                             int64_t V, float* loss, void* dh, void* dw, void* scratch,
                             float loss_scale = 1.0f, float softcap = 0.0f) override;

  // FP8 (cpu_fp8.cpp)
  void fp8_scale(const void* x, int64_t n, Fp8Format f, float* scale) override;
  void fp8_scale_rows(const void* x, int64_t rows, int64_t cols, Fp8Format f, float* scale) override;
  void fp8_quantize(const void* x, const float* scale, uint8_t* q, int64_t n, Fp8Format f) override;
  void fp8_quantize_rows(const void* x, const float* scale, uint8_t* q, int64_t rows, int64_t cols,
                         Fp8Format f) override;
  void fp8_quantize_transposed(const void* x, const float* scale, uint8_t* q, int64_t rows, int64_t cols,
                               Fp8Format f) override;
  void fp8_quantize_transposed_padded(const void* x, const float* scale, uint8_t* q, int64_t rows,
                                      int64_t cols, int64_t ld, Fp8Format f) override;
  void gemm_fp8_accumulate_f32(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b,
                               Fp8Format fb, const float* scale_b, float* d, int64_t M, int64_t K,
                               int64_t N) override;
  void gemm_fp8(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b, Fp8Format fb,
                const float* scale_b, void* d, int64_t M, int64_t K, int64_t N, bool accumulate) override;
  void gemm_fp8_rows(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b, Fp8Format fb,
                     const float* scale_b, void* d, int64_t M, int64_t K, int64_t N,
                     bool accumulate) override;
  void fp8_quantize_rows_col_scaled(const void* x, const float* col_scale, uint8_t* q, float* scale,
                                    int64_t rows, int64_t cols, Fp8Format f) override;
  void transpose_bytes(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) override;

  /// Query rows per attention block (scores exist for kAttnBlock x seq_len at a time).
  static constexpr int64_t kAttnBlock = 64;

  /// A teardown with work in flight (CpuDevice::interrupt): the attention ops, the ones whose
  /// time grows with seq_len squared (hours at a few hundred thousand tokens), stop after their
  /// current block, their outputs undefined, so that a stopped run ends within its
  /// stop_timeout_s. Irreversible; any thread.
  void interrupt() { interrupted_.store(true, std::memory_order_relaxed); }

 private:
  bool interrupted() const { return interrupted_.load(std::memory_order_relaxed); }

  int threads_ = 1;
  std::atomic<bool> interrupted_{false};
};

}  // namespace rp::cpu
