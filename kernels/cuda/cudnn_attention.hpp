// Causal GQA attention through cuDNN's fused flash-attention graphs (cuDNN >= 9, frontend
// graph API `sdpa` / `sdpa_backward`). Same contract as Ops::attention_fwd/bwd
// (kernels/ops.hpp): q, o, dq [T, nq, D]; k, v, dk, dv [T, nkv, D] with T = n_seq * L,
// i.e. cuDNN's [b = n_seq, h, s = L, d] tensors with BSHD strides; lse [n_seq, nq, L] fp32
// = natural-log softmax statistics of the scaled scores (cuDNN's "Stats").
//
// Built only when the cuDNN library and the cudnn-frontend headers are found
// (RP_HAVE_CUDNN); otherwise available() is false and every call returns false.
// A graph is built once per (direction, dtype, shape, scale) and cached; shapes cuDNN
// does not support, or whose workspace exceeds the caller's scratch, return false so the
// caller falls back to its own kernels (and the refusal is cached too).
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
  bool fwd(DType t, const void* q, const void* k, const void* v, void* o, float* lse,
           int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale, void* ws,
           size_t ws_bytes, std::string* why = nullptr);
  /// Backward given o and lse of fwd(): writes dq, dk, dv (overwritten; dk/dv summed over
  /// the query heads of a group). Same return/throw rules as fwd().
  bool bwd(DType t, const void* q, const void* k, const void* v, const void* o, const float* lse,
           const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t L, int64_t nq,
           int64_t nkv, int64_t D, float scale, void* ws, size_t ws_bytes,
           std::string* why = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rp::cuda
