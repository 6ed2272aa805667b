// CudaOps: packed sequences and KV-cache attention (RoPE in cuda_packed.cu, attention on the
// row kernels of cuda_attention_rows.cu without window or sinks). Always our own row kernels:
// cuDNN's padding masks do not express several examples per sequence.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_ops.hpp"

namespace rp::cuda {
namespace {
void require(bool cond, const char* op, const char* what) {
  if (!cond) throw std::invalid_argument(std::string(op) + ": " + what);
}
}  // namespace

void CudaOps::rope_fwd_at(void* x, const int32_t* pos, int64_t T, int64_t heads, int64_t D,
                          const float* inv_freq, float scale, int64_t rotary_dim) {
  require(T >= 0 && heads >= 0, "rope_at", "bad dimensions");
  const int64_t half = rope_half(D, rotary_dim, "rope_at");
  require(T == 0 || pos != nullptr, "rope_at", "pos is null");
  set_device(dev_);
  k_rope_at(dtype_, x, pos, T, heads, D, 2 * half, inv_freq, scale, false, st_);
}

void CudaOps::rope_bwd_at(void* dx, const int32_t* pos, int64_t T, int64_t heads, int64_t D,
                          const float* inv_freq, float scale, int64_t rotary_dim) {
  require(T >= 0 && heads >= 0, "rope_at", "bad dimensions");
  const int64_t half = rope_half(D, rotary_dim, "rope_at");
  require(T == 0 || pos != nullptr, "rope_at", "pos is null");
  set_device(dev_);
  k_rope_at(dtype_, dx, pos, T, heads, D, 2 * half, inv_freq, scale, true, st_);
}

void CudaOps::attention_fwd_packed(const void* q, const void* k, const void* v, void* o, float* lse,
                                   const int32_t* pos, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv,
                                   int64_t D, float scale, void*) {
  require(n_seq * L == 0 || pos != nullptr, "attention_fwd_packed", "pos is null");
  set_device(dev_);
  k_attention_rows_fwd_v(dtype_, q, k, v, o, lse, pos, nullptr, 0, n_seq, L, L, 0, nq, nkv, D, scale, st_);
}

void CudaOps::attention_bwd_packed(const void* q, const void* k, const void* v, const void* o,
                                   const float* lse, const void* dout, const int32_t* pos, void* dq, void* dk,
                                   void* dv, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D,
                                   float scale, void* scratch) {
  require(n_seq * L == 0 || (pos != nullptr && lse != nullptr && scratch != nullptr), "attention_bwd_packed",
          "pos, lse or scratch is null");
  set_device(dev_);
  float* di = static_cast<float*>(scratch);  // [n_seq, nq, L], within the attention scratch contract
  k_attention_di(dtype_, o, dout, di, n_seq, L, nq, D, st_);
  k_attention_rows_bwd_v(dtype_, q, k, v, lse, di, dout, pos, dq, dk, dv, 0, n_seq, L, nq, nkv, D, scale,
                         st_);
}

void CudaOps::attention_decode(const void* q, const void* k_cache, const void* v_cache, void* o, int64_t past,
                               int64_t n, int64_t nq, int64_t nkv, int64_t D, float scale) {
  require(past >= 0 && n >= 0, "attention_decode", "negative past or row count");
  set_device(dev_);
  k_attention_rows_fwd_v(dtype_, q, k_cache, v_cache, o, nullptr, nullptr, nullptr, 0, 1, n, past + n, past,
                         nq, nkv, D, scale, st_);
}

}  // namespace rp::cuda
