// Tensor-core attention with a sliding window, per-head sink logits, packed positions (GPT-OSS)
// and soft-capped scores (Gemma 2; kernels/ops.hpp "attention variants"): the FlashAttention-2 kernels of
// cuda_flash.cuh instantiated with VAR = true. The forward starts each query block at the key
// tile of its first visible key and each warp skips the tiles before its rows' windows, so a
// window of w keys costs O(L * (w + 64)) instead of O(L^2 / 2); the backward visits, per key
// tile, only the query tiles whose windows reach it. The sink is the running max / sum's
// initial value in the forward (so lse includes it) and enters the backward through lse;
// dsinks is a reduction of its own (cuda_gptoss.cu). Head_dim 64, 128 or 256 and 16-byte aligned
// tensors; anything else returns false and runs on the row kernels.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_flash.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

// impl as cuda_attention.cu: 0 automatic (8-warp forward, pipelined backward), 1 simple
// (the row kernels), 2 4-warp forward and unpipelined backward, 3 as 0; 4 (cuDNN) as 0.

void check_shape(int64_t n_seq, int64_t L, int64_t nq, const char* op) {
  if (L > (int64_t(1) << 30) || n_seq > 65535 || nq > 65535)
    throw std::invalid_argument(std::string(op) + ": shape too large");
}

flash::Variant variant(const int32_t* pos, const void* sinks, int64_t window, float scale, float softcap) {
  flash::Variant v;
  v.pos = pos;
  v.sinks = sinks;
  v.window = int(std::min<int64_t>(window, int64_t(1) << 30));
  if (softcap > 0.f) {
    v.cap = softcap;
    v.cap_in = scale / softcap;
  }
  return v;
}

}  // namespace

bool k_attention_flash_fwd_v(DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                             const int32_t* pos, const void* sinks, int64_t window, int64_t n_seq, int64_t L,
                             int64_t nq, int64_t nkv, int64_t D, float scale, int impl, cudaStream_t st,
                             float softcap) {
  if (!flash::usable(impl, D, {q, k, v, o})) return false;
  check_shape(n_seq, L, nq, "attention_fwd_v");
  const flash::Variant var = variant(pos, sinks, window, scale, softcap);
  const int n = int(n_seq), l = int(L), a = int(nq), b = int(nkv);
  RP_DISPATCH_16(
      "attention_fwd_v", t, T,
      flash::launch_fwd_dim<T, true>(int(D), impl != 2, q, k, v, o, lse, n, l, a, b, scale, st, var));
  return true;
}

bool k_attention_flash_bwd_v(DType t, const void* q, const void* k, const void* v, const float* lse,
                             const float* di, const void* dout, const int32_t* pos, void* dq, void* dk,
                             void* dv, float* dq_acc, int64_t window, int64_t n_seq, int64_t L, int64_t nq,
                             int64_t nkv, int64_t D, float scale, int impl, cudaStream_t st, float softcap) {
  if (!flash::usable(impl, D, {q, k, v, dout, dq, dk, dv})) return false;
  check_shape(n_seq, L, nq, "attention_bwd_v");
  const flash::Variant var = variant(pos, nullptr, window, scale, softcap);
  const int64_t rows = n_seq * L * nq;
  RP_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(rows * D) * sizeof(float), st));
  const int n = int(n_seq), l = int(L), a = int(nq), b = int(nkv);
  RP_DISPATCH_16("attention_bwd_v", t, T,
                 flash::launch_bwd_dim<T, true>(int(D), impl != 2, q, k, v, dout, lse, di, dq_acc, dk, dv, n,
                                                l, a, b, scale, st, var));
  k_cast(t, dq, DType::f32, dq_acc, rows * D, st);
  return true;
}

}  // namespace rp::cuda
