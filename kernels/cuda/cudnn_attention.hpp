// Causal GQA attention through cuDNN's fused flash-attention graphs (cuDNN >= 9, frontend
// graph API `sdpa` / `sdpa_backward`). Same contract as Ops::attention_fwd/bwd
// (kernels/ops.hpp): q, o, dq [T, nq, D]; k, v, dk, dv [T, nkv, D] with T = n_seq * L,
// i.e. cuDNN's [b = n_seq, h, s = L, d] tensors with BSHD strides; lse [n_seq, nq, L] fp32
// = natural-log softmax statistics of the scaled scores (cuDNN's "Stats").
//
// Built only when the cuDNN library and the cudnn-frontend headers are found
// (RP_HAVE_CUDNN); otherwise available() is false and every call returns false.
// A graph is built once per (direction, dtype, shape, strides, scale) and cached; shapes
// cuDNN does not support, or whose workspace exceeds the caller's scratch, return false so
// the caller falls back to its own kernels (and the refusal is cached too).
//
// Grouped-query backward (r = nq / nkv > 1) runs one of two ways:
//  - native: one sdpa_backward graph with nkv K/V heads (cuDNN sums dK/dV over each group).
//    On the lent H200 (PyTorch wheel's cuDNN 9, frontend 1.32) this returned all-NaN
//    dq/dk/dv for r >= 4 (r = 2 was exact); bench_cudnn_gqa_probe checks it per variant.
//  - expand: in passes over contiguous ranges of query heads, the KV head of each query
//    head of the pass is copied into a per-query-head K and V (k_gqa_expand_kv), cuDNN's
//    multi-head backward (r = 1) runs on those query heads (sub-ranges of q/o/dout/dq through
//    pointer offsets and the full tensors' strides), and the per-query-head dK/dV are summed
//    onto their KV head in fp32 (k_gqa_group_sum). Passes are sized to the scratch
//    (gqa_chunking.hpp): whole KV heads per pass when at least one fits, else parts of one
//    KV head, summed into fp32 accumulators [T, D] and rounded once at its last pass. A pass
//    of hc query heads uses 4 * T*hc*D storage elements (expanded K, V, dK, dV), T*hc fp32
//    packed statistics when the pass is not every head (cuDNN before 9.26 reads only packed
//    Stats), the accumulators when KV heads are split, and cuDNN's workspace for hc heads
//    (about T*hc*(D+1) fp32).
// The default (GqaBackward::automatic) is native for r <= 2 and expand for r > 2.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "kernels/dtype.hpp"

namespace rp::cuda {

class CudnnAttention {
 public:
  /// `device`: the CUDA device index the handle is created on; `stream`: the compute
  /// stream every graph runs on. Throws DeviceError when cudnnCreate fails.
  CudnnAttention(int device, cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  /// True when this build has cuDNN attention at all.
  static bool available();
  /// cuDNN library version of the loaded library (e.g. 91900), 0 when unavailable.
  static long version();

  /// Forward; `lse` may be null (no statistics written). `ws`/`ws_bytes`: device scratch
  /// the graph may use as workspace. Returns false (nothing launched) when cuDNN cannot
  /// run this configuration; throws DeviceError naming the cuDNN call when an execution
  /// it accepted fails.
  /// When false is returned and `why` is not null, *why says what cuDNN refused.
  /// `window` > 0 (and < L): sliding-window attention, query t sees the keys j with
  /// t - window < j <= t (Ops::AttentionVariant::window; cuDNN's diagonal band left bound).
  bool fwd(DType t, const void* q, const void* k, const void* v, void* o, float* lse, int64_t n_seq,
           int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale, void* ws, size_t ws_bytes,
           std::string* why = nullptr, int64_t window = 0);
  /// Backward given o and lse of fwd(): writes dq, dk, dv (overwritten; dk/dv summed over
  /// the query heads of a group). `ws`/`ws_bytes`: device scratch (16-byte aligned) for
  /// cuDNN's workspace and, on the expand path, the expanded tensors; the expand path
  /// runs as few passes as fit ws_bytes and returns false (why: the bytes a pass of one
  /// query head needs) when not even that fits. Same return/throw rules as
  /// fwd(); when false is returned nothing has been written.
  bool bwd(DType t, const void* q, const void* k, const void* v, const void* o, const float* lse,
           const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv,
           int64_t D, float scale, void* ws, size_t ws_bytes, std::string* why = nullptr, int64_t window = 0);

  /// How bwd() treats nq > nkv (see the file comment). automatic: native for
  /// nq <= 2*nkv, expand above; native: always one graph; expand: always expand.
  enum class GqaBackward { automatic = 0, native = 1, expand = 2 };
  void set_gqa_backward(GqaBackward mode);
  GqaBackward gqa_backward() const;
  /// cuDNN's deterministic backward (is_deterministic_algorithm: the dP-workspace kernel on
  /// Hopper, workspace about n_seq*h*L^2*2 bytes); off by default, for comparisons.
  void set_deterministic(bool on);
  /// cuDNN backward executions of the last bwd() that returned true (1: one graph; the
  /// number of passes on the expand path), 0 before any.
  int64_t last_bwd_passes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rp::cuda
