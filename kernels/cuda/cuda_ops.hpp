// CUDA implementation of rp::Ops (internal to kernels/cuda; use Device::ops()).
// Storage in bf16 (or f16), fp32 accumulation, fp32 parameter-gradient accumulators.
// Every op enqueues on the device's compute stream and returns without waiting.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/ops.hpp"

namespace rp::cuda {

/// cuBLAS's type of f32, bf16 or f16 data; std::invalid_argument for any other dtype.
cudaDataType_t cuda_type(DType t);

struct MoeGroupTable;  // cuda_kernels.hpp

class CudaOps final : public Ops {
 public:
  /// err: device-visible pointer to kErrSlots error words (see cuda_kernels.hpp).
  CudaOps(int device, cudaStream_t stream, DType dtype, unsigned* err);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  DType dtype() const override { return dtype_; }
  DType grad_dtype() const override { return DType::f32; }
  void set_num_threads(int) override {}
  int num_threads() const override { return 1; }

  void fill(DType t, void* x, int64_t n, float value) override;
  void copy(DType t, void* dst, const void* src, int64_t n) override;
  void cast(DType dst_t, void* dst, DType src_t, const void* src, int64_t n) override;
  void dequantize(WeightFormat f, const void* src, void* dst, int64_t n, int64_t cols = 0) override;
  void dequantize_many(const DequantPart* parts, int64_t count) override;
  /// dequantize() into out_t (f32, bf16 or f16) instead of dtype() (cuda_backend.hpp).
  void dequantize_to(WeightFormat f, DType out_t, const void* src, void* dst, int64_t n, int64_t cols = 0);
  /// dequantize_to's argument checks (std::invalid_argument); false when n == 0.
  bool check_dequantize(WeightFormat f, DType out_t, const void* src, const void* dst, int64_t n,
                        int64_t cols) const;
  void add_into(DType dst_t, void* dst, DType src_t, const void* src, int64_t n, float alpha) override;
  void add(const void* a, const void* b, void* y, int64_t n) override;

  void linear_fwd(const void* x, const void* w, void* y, int64_t M, int64_t K, int64_t N,
                  float alpha = 1.0f) override;
  void linear_bwd_input(const void* dy, const void* w, void* dx, int64_t M, int64_t K, int64_t N,
                        bool accumulate, float alpha = 1.0f) override;
  void linear_bwd_weight(const void* dy, const void* x, void* dw, int64_t M, int64_t K, int64_t N) override;
  void linear_fwd_residual(const void* x, const void* w, const void* r, void* y, int64_t M, int64_t K,
                           int64_t N) override;
  void gemm_fp8_residual(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b, Fp8Format fb,
                         const float* scale_b, const void* r, void* d, int64_t M, int64_t K,
                         int64_t N) override;
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
  void qk_norm_rope_fwd(const void* x, const void* w, void* y, const QkNormRope& s) override;
  void qk_norm_rope_bwd(const void* x, const void* w, void* dy, void* dx, void* dw,
                        const QkNormRope& s) override;
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

  // FP8 (cuda_ops_fp8.cpp, kernels in cuda_fp8.cu)
  void fp8_scale(const void* x, int64_t n, Fp8Format f, float* scale) override;
  void fp8_scale_rows(const void* x, int64_t rows, int64_t cols, Fp8Format f, float* scale) override;
  void rmsnorm_fwd_fp8_scale(const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                             Fp8Format f, float* scale, float w_offset = 0.0f) override;
  void rmsnorm_fwd_fp8_rows(const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                            Fp8Format f, uint8_t* q, float* scale, float w_offset = 0.0f) override;
  void swiglu_bwd_fp8_scale(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n,
                            Fp8Format f, float* scale_dg, float* scale_du) override;
  void swiglu_fwd_fp8_scale(const void* g, const void* u, void* h, int64_t n, Fp8Format f,
                            float* scale) override;
  void fp8_quantize(const void* x, const float* scale, uint8_t* q, int64_t n, Fp8Format f) override;
  void fp8_quantize_rows(const void* x, const float* scale, uint8_t* q, int64_t rows, int64_t cols,
                         Fp8Format f) override;
  void fp8_quantize_transposed(const void* x, const float* scale, uint8_t* q, int64_t rows, int64_t cols,
                               Fp8Format f) override;
  void fp8_quantize_transposed_padded(const void* x, const float* scale, uint8_t* q, int64_t rows,
                                      int64_t cols, int64_t ld, Fp8Format f) override;
  void fp8_quantize_both(const void* x, const float* scale, uint8_t* q, uint8_t* qt, int64_t rows,
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
  bool gemm_fp8_rows_supported() override;
  /// cuda_backend.hpp's set_fp8_fast_accum / check_fp8_conversions.
  void set_fp8_fast_accum(bool on) { fp8_fast_accum_ = on; }
  Fp8ConversionCheck check_fp8_conversions(Fp8Format f);

  void lm_head_cross_entropy(const void* h, const void* w, const int32_t* targets, int64_t T, int64_t H,
                             int64_t V, float* loss, void* dh, void* dw, void* scratch,
                             float loss_scale = 1.0f, float softcap = 0.0f) override;

  void moe_route(const void* logits, float* probs, int32_t* topk_idx, float* topk_w, float* stats, int64_t T,
                 int64_t E, int64_t k, bool norm_topk) override;
  void moe_route_bwd(const float* probs, const int32_t* topk_idx, const float* dw, const float* counts,
                     float aux_coef, void* dlogits, int64_t T, int64_t E, int64_t k, bool norm_topk) override;
  void moe_sort(const int32_t* topk_idx, int32_t* offsets, int32_t* offsets_host, int32_t* row,
                int32_t* token, int64_t T, int64_t E, int64_t k) override;
  void moe_sort_launch(const int32_t* topk_idx, int32_t* offsets, int32_t* offsets_host, int32_t* row,
                       int32_t* token, int64_t T, int64_t E, int64_t k) override;
  void moe_sort_wait(int32_t* offsets_host, int64_t E) override;
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

  /// Grouped linears (cuda_backend.hpp, set_grouped_gemm): 0 = one cuBLASLt GEMM per
  /// non-empty expert on the compute stream, 1 = one cublasGemmGroupedBatchedEx call for
  /// all of them, 2 = the per-expert GEMMs spread over kMoeStreams side streams.
  void set_grouped_gemm(int mode) { grouped_mode_ = mode; }
  int grouped_gemm() const { return grouped_mode_; }
  /// cuda_backend.hpp, set_bucketed_lt and bucketed_batches.
  void set_bucketed_lt(bool on) { lt_batched_ok_ = on; }
  void set_bucketed_streams(int n) { bucketed_streams_ = n; }
  /// cuda_backend.hpp's set_qk_norm_rope_fused.
  void set_qk_norm_rope_fused(bool on) { qk_rope_fused_ = on; }
  std::pair<int64_t, int64_t> bucketed_batches() const { return {lt_batches_, legacy_batches_}; }
  /// cuda_backend.hpp's set_grouped_wgrad_kernel_max.
  void set_grouped_wgrad_kernel_max(int64_t side) { wgrad_kernel_max_ = side; }
  /// cuda_backend.hpp's set_grouped_lowrank_kernel.
  void set_grouped_lowrank_kernel(bool on) { lowrank_kernel_ = on; }
  void set_attention_impl(int impl) { attn_impl_ = impl; }
  /// cuda_backend.hpp's set_attention_gqa (0 auto, 1 native, 2 expand).
  void set_attention_gqa(int mode);
  /// cuda_backend.hpp's set_attention_scratch_bytes (0: the contract).
  void set_attention_scratch_bytes(size_t bytes) { attn_scratch_bytes_ = bytes; }
  /// cuDNN backward executions of the last attention_bwd (0: our kernels ran it).
  int64_t last_attention_bwd_passes() const { return last_bwd_passes_; }
  /// Enqueue the expanded-GQA helper kernels (cuda_kernels.hpp) on the compute stream.
  void gqa_expand_kv(const void* k, const void* v, void* ke, void* ve, int64_t T, int64_t nkv, int64_t h0,
                     int64_t hc, int64_t r, int64_t D);
  void gqa_group_sum(DType in_t, const void* in_k, const void* in_v, DType out_t, void* out_k, void* out_v,
                     int64_t out_row, int64_t T, int64_t G, int64_t m, int64_t D, bool accumulate);

  /// C[m,n] (col-major) = alpha op(A) op(B) + beta C through cuBLASLt, A/B in dtype(),
  /// C in c_t (dtype() or f32), fp32 compute; f16_compute: fp16 compute and scale type
  /// (CUBLAS_COMPUTE_16F, dtype() and c_t f16); c_in: the beta term read from c_in (same layout)
  /// instead of C. Public for the benchmark.
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda,
            const void* B, int64_t ldb, void* C, DType c_t, int64_t ldc, float beta, float alpha = 1.0f,
            bool f16_compute = false, const void* c_in = nullptr);

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // gemm_on's fields, then the FP8 operand types (0: none), then fp16 accumulation
  using Key = std::array<int64_t, 17>;
  // FP8 operands of a GEMM (cuda_ops_fp8.cpp): their types, device fp32 scales, fast accumulation.
  // rows: one scale per row of each operand (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F).
  struct Fp8Operands {
    cudaDataType_t a_type, b_type;
    const float *scale_a, *scale_b;
    bool fast_accum;
    bool rows = false;
  };
  static void set_fp8_attributes(cublasLtMatmulDesc_t op, const Fp8Operands& f);
  void gemm_fp8_to(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b, Fp8Format fb,
                   const float* scale_b, void* d, DType d_type, int64_t M, int64_t K, int64_t N,
                   bool accumulate, const char* op, bool rows = false, const void* c_in = nullptr);
  int compute_capability();  // major * 10 + minor, queried once
  bool probe_fp8_rows();     // gemm_fp8_rows_supported's one probe
  // gemm() on stream st with workspace ws (ws_bytes_ bytes, used by no other stream meanwhile).
  void gemm_on(cudaStream_t st, void* ws, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const void* A, int64_t lda, const void* B, int64_t ldb, void* C, DType c_t, int64_t ldc,
               float beta, float alpha = 1.0f, bool f16_compute = false, const void* c_in = nullptr);
  Plan& plan_for(const Key& key, bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                 int64_t ldc, DType c_t, unsigned align_a, unsigned align_b, unsigned align_c,
                 const Fp8Operands* fp8 = nullptr, bool f16_compute = false);

  int dev_;
  cudaStream_t st_;
  DType dtype_;
  unsigned* err_;
  cublasLtHandle_t lt_ = nullptr;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  std::mutex mu_;
  std::map<Key, Plan> plans_;
  int attn_impl_ = 0;
  bool fp8_fast_accum_ = false;    // set_fp8_fast_accum
  int compute_capability_ = -1;    // major * 10 + minor, queried at the first gemm_fp8
  int fp8_rows_ok_ = -1;           // gemm_fp8_rows_supported: -1 not probed yet, 0 no, 1 yes
  int attn_gqa_ = 0;               // RP_CUDA_ATTENTION_GQA
  size_t attn_scratch_bytes_ = 0;  // 0: Ops::attention_scratch_bytes of the shape
  int64_t last_bwd_passes_ = 0;
  // mixture of experts (cuda_moe.cpp): scratch of moe_sort, the cuBLAS handle and pointer
  // arrays of the grouped GEMM; released by release_moe()
  int grouped_mode_ = 1;  // RP_CUDA_GROUPED_GEMM (0 loop, 1 grouped, 2 streams)
  static constexpr int kMoeStreams = 4;
  cudaStream_t moe_streams_[kMoeStreams] = {};  // side streams of mode 2, each with a workspace
  void* moe_ws_[kMoeStreams] = {};
  cudaEvent_t moe_fork_ = nullptr, moe_join_[kMoeStreams] = {};
  void ensure_moe_streams();        // the side streams, their workspaces and events (moe_mu_ held)
  void moe_fork(int used);          // the first `used` side streams wait for the compute stream's work so far
  void moe_join(int used);          // the compute stream waits for theirs
  bool grouped_f32_out_ok_ = true;  // false once cuBLAS refused an f32 output (then: loop)
  int64_t wgrad_kernel_max_ = 64;   // mode 1: weight gradients with min(K, N) up to this run k_grouped_wgrad
  bool lowrank_kernel_ = true;      // mode 1: products with an inner dimension <= 64 run k_grouped_lowrank
  std::mutex moe_mu_;
  void* moe_hist_ = nullptr;
  size_t moe_hist_bytes_ = 0;
  // moe_sort's offsets land here first (mapped pinned memory the scan kernel writes; its
  // device address moe_off_mapped_), then are copied into the caller's vector
  int32_t* moe_off_pinned_ = nullptr;
  int32_t* moe_off_mapped_ = nullptr;
  int64_t moe_off_pinned_n_ = 0;
  cudaEvent_t moe_sort_done_ = nullptr;  ///< recorded after the last moe_sort_launch's scan
  bool moe_sort_empty_ = false;          ///< the last launch had no rows (offsets all zero)
  void* blas_ = nullptr;                 // cublasHandle_t, created at the first grouped call
  void** group_ptrs_ = nullptr;          // device, 3 * kMoeMaxGroups pointers
  // moe_pad_rows (cuda_moe_bucketed.cpp): [delta E][padded offsets E+1] staged in pinned memory,
  // copied to the device; the staging is rewritten only once the last copy is done
  int32_t* moe_pad_pinned_ = nullptr;
  int32_t* moe_pad_dev_ = nullptr;
  int64_t moe_pad_n_ = 0;
  cudaEvent_t moe_pad_done_ = nullptr;
  void release_moe();
  void release_moe_pad();
  // The cuBLAS handle of the grouped and batched calls (created at the first; moe_mu_ held).
  void* blas_handle();
  // One grouped linear on the padded layout (Ops::moe_pad) as one cublasGemmBatchedEx per
  // distinct segment length (cuda_moe_bucketed.cpp); false (nothing enqueued) when cuBLAS
  // refuses the types or there are more than kMoeMaxGroups experts with rows.
  bool bucketed_gemm_call(int which, const void* a, const void* b, void* c, const int32_t* offsets_host,
                          int64_t E, int64_t K, int64_t N, float beta, float alpha);
  bool bucketed_f32_out_ok_ = true;  // false once cuBLAS refused a batched f32 output
  // The bucketed calls through cuBLASLt's pointer-array batches (cuda_moe_bucketed.cpp): one plan
  // per (which, K, N, power-of-two class of the segment length, of the batch count), its
  // algorithm chosen once for the class; each call sets its layouts' lengths and counts. The
  // legacy cublasGemmBatchedEx chose a kernel for every new length (~80 us of host time a call,
  // the lengths changing every micro-batch). moe_mu_ held.
  using BatchedKey = std::array<int64_t, 5>;
  std::map<BatchedKey, Plan> batched_plans_;
  bool lt_batched_ok_ = true;                    // set_bucketed_lt
  int bucketed_streams_ = 4;                     // set_bucketed_streams
  bool qk_rope_fused_ = true;                    // set_qk_norm_rope_fused (RP_CUDA_QK_NORM_ROPE)
  int64_t lt_batches_ = 0, legacy_batches_ = 0;  // bucketed_batches
  Plan* batched_plan(int which, int64_t K, int64_t N, int rows, int count);
  cublasStatus_t lt_batched_gemm(int which, int64_t K, int64_t N, int rows, int count, void* const* ptrs,
                                 int G, float beta, float alpha, cudaStream_t st, void* ws);
  bool bucketed_batch(int which, int64_t K, int64_t N, int s, int count, int rows, int G, float beta,
                      float alpha, cudaStream_t st, void* ws, bool first);
  static void destroy_plan(Plan& p);
  // One grouped linear through cublasGemmGroupedBatchedEx; false (no GEMM enqueued) when
  // cuBLAS refuses the shape or types, so the caller runs the per-expert loop instead.
  static bool group_table(const int32_t* offsets_host, int64_t E, MoeGroupTable& tab);
  bool lowrank_call(int64_t inner, const int32_t* offsets_host, int64_t E, MoeGroupTable& tab) const;
  bool grouped_gemm_call(int which, const void* a, const void* b, void* c, const int32_t* offsets_host,
                         int64_t E, int64_t K, int64_t N, float beta, float alpha = 1.f);
  // The GEMMs of one grouped linear in the current mode (which: 0 forward, 1 input
  // gradient, 2 weight gradient; operands as grouped_gemm_call).
  void grouped_gemms(int which, const void* a, const void* b, void* c, const int32_t* offsets_host, int64_t E,
                     int64_t K, int64_t N, float beta, float alpha = 1.f);
  // Expert e's GEMM (rows r0 .. r0+n-1) of a grouped linear on stream st with workspace ws.
  void expert_gemm(int which, const void* a, const void* b, void* c, int64_t e, int64_t r0, int64_t n,
                   int64_t K, int64_t N, float beta, cudaStream_t st, void* ws, float alpha = 1.f);
  std::unique_ptr<CudnnAttention> cudnn_;  // null when the build has no cuDNN
  bool cudnn_refusal_logged_ = false;
  // Runs attention through cuDNN when impl allows (0: if it accepts, 4: must accept).
  bool try_cudnn(bool backward, const std::function<bool(std::string*)>& call);
  /// cuDNN for an attention variant it can run (a sliding window without sinks or soft-cap):
  /// when the implementation is automatic or cuDNN; a refusal falls back to our kernels
  /// quietly (the plain calls' cuDNN rules are those of try_cudnn).
  bool try_cudnn_variant(const std::function<bool(std::string*)>& call);
  // Scratch bytes the cuDNN paths may use for this shape (the contract unless overridden).
  size_t attention_ws(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D) const;
};

/// ops as CudaOps; throws std::invalid_argument "<fn>: not a CUDA device's ops" otherwise.
CudaOps& cuda_ops(Ops& ops, const char* fn);

}  // namespace rp::cuda
