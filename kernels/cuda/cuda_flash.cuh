// FlashAttention-2 style causal GQA attention kernels on mma.sync (Dao 2023, Alg. 1 and 2),
// shared by the plain attention of cuda_attention.cu (VAR = false) and GPT-OSS's variant of
// cuda_attention_variant.cu (VAR = true: a sliding window, per-head sink logits, packed
// positions and Gemma 2's score soft-capping, kernels/ops.hpp "attention variants"). The VAR
// code sits behind `if constexpr`, so the plain instantiations are the kernels as they were.
// Internal to kernels/cuda.
// The kernels: cuda_flash_fwd.cuh and cuda_flash_bwd.cuh, on the building blocks of
// cuda_flash_mma.cuh; here their launches and the choice of configuration.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <initializer_list>

#include "kernels/cuda/cuda_arch.hpp"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_flash_bwd.cuh"
#include "kernels/cuda/cuda_flash_fwd.cuh"
#include "kernels/cuda/cuda_flash_mma.cuh"

namespace rp::cuda::flash {

// ---- launch helpers ----------------------------------------------------------------------------

template <typename T, int D, int W, bool VAR = false>
void launch_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int n_seq, int L, int nq,
                int nkv, float scale, cudaStream_t st, Variant var = {}) {
  constexpr int smem = fwd_smem<T, D, W>();
  // per device (the attribute belongs to the current device's context); cheap
  RP_CUDA_CHECK(cudaFuncSetAttribute(flash_fwd_kernel<T, D, W, VAR>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  dim3 grid(unsigned((L + 16 * W - 1) / (16 * W)), unsigned(nq), unsigned(n_seq));
  flash_fwd_kernel<T, D, W, VAR><<<grid, 32 * W, smem, st>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o), lse,
      L, nq, nkv, scale * kLog2e, var);
  RP_CUDA_LAUNCH_CHECK("flash_fwd");
}

template <typename T, int D, bool PIPE, bool VAR = false>
void launch_bwd(const void* q, const void* k, const void* v, const void* dout, const float* lse,
                const float* di, float* dq_acc, void* dk, void* dv, int n_seq, int L, int nq, int nkv,
                float scale, cudaStream_t st, Variant var = {}) {
  constexpr int smem = bwd_smem<T, D, PIPE, VAR>();
  RP_CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_kernel<T, D, PIPE, VAR>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  dim3 grid(unsigned((L + kB - 1) / kB), unsigned(nkv), unsigned(n_seq));
  flash_bwd_kernel<T, D, PIPE, VAR>
      <<<grid, 256, smem, st>>>(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                static_cast<const T*>(dout), lse, di, dq_acc, static_cast<T*>(dk),
                                static_cast<T*>(dv), L, nq, nkv, scale, scale * kLog2e, var);
  RP_CUDA_LAUNCH_CHECK("flash_bwd");
}

/// Shared memory of head_dim D's narrow configuration (4-warp forward, unpipelined backward):
/// 85 / 87 KiB at D = 128, 165 / 151 KiB at D = 256.
inline int narrow_smem(int64_t D) {
  if (D == 256) return std::max(fwd_smem<bf16, 256, 4>(), bwd_smem<bf16, 256, false, true>());
  if (D == 128) return std::max(fwd_smem<bf16, 128, 4>(), bwd_smem<bf16, 128, false, true>());
  return std::max(fwd_smem<bf16, 64, 4>(), bwd_smem<bf16, 64, false, true>());
}

/// Whether the kernels apply: head_dim 64, 128 or 256 (Gemma's; only in the narrow configuration,
/// which fits a 227 KiB block of Hopper or Blackwell, not a 99 KiB consumer GPU or an A100's 163),
/// every tensor 16-byte aligned (null counts as aligned), impl not 1 (the row kernels forced), and
/// the narrow configuration's shared memory within the device's limit.
inline bool usable(int impl, int64_t D, std::initializer_list<const void*> ptrs) {
  if (impl == 1 || (D != 64 && D != 128 && D != 256)) return false;
  if (narrow_smem(D) > max_dynamic_smem()) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

/// Whether the wide configuration (8-warp forward, pipelined backward) of head_dim D fits the
/// current device's shared memory per block. It does not on GPUs with 99 KiB (RTX 30xx, 40xx,
/// 50xx, L40S) at D = 128 (102 / 121 KiB): they run the narrow one, which the log says once.
inline bool wide_fits(int D) {
  if (D == 256) return false;  // its accumulators fill the registers of a 4-warp block already
  const int wide = D == 128 ? std::max(fwd_smem<bf16, 128, 8>(), bwd_smem<bf16, 128, true, true>())
                            : std::max(fwd_smem<bf16, 64, 8>(), bwd_smem<bf16, 64, true, true>());
  const int limit = max_dynamic_smem();
  if (wide <= limit) return true;
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    std::fprintf(
        stderr,
        "roundpipe: this GPU allows %d KiB of shared memory per block, the 8-warp flash attention blocks "
        "need %d KiB at head_dim %d: using 4-warp forward blocks and the unpipelined backward\n",
        limit >> 10, (wide + 1023) >> 10, D);
  return false;
}

/// launch_fwd for head_dim D (64, 128 or 256) with W = 8 (wide) or 4 warps (256: always 4).
template <typename T, bool VAR = false>
void launch_fwd_dim(int D, bool wide, const void* q, const void* k, const void* v, void* o, float* lse,
                    int n_seq, int L, int nq, int nkv, float scale, cudaStream_t st, Variant var = {}) {
  wide = wide && wide_fits(D);
  if (D == 256) launch_fwd<T, 256, 4, VAR>(q, k, v, o, lse, n_seq, L, nq, nkv, scale, st, var);
  else if (D == 128 && wide) launch_fwd<T, 128, 8, VAR>(q, k, v, o, lse, n_seq, L, nq, nkv, scale, st, var);
  else if (D == 128) launch_fwd<T, 128, 4, VAR>(q, k, v, o, lse, n_seq, L, nq, nkv, scale, st, var);
  else if (wide) launch_fwd<T, 64, 8, VAR>(q, k, v, o, lse, n_seq, L, nq, nkv, scale, st, var);
  else launch_fwd<T, 64, 4, VAR>(q, k, v, o, lse, n_seq, L, nq, nkv, scale, st, var);
}

/// launch_bwd for head_dim D (64, 128 or 256), pipelined (pipe) or not (256: never).
template <typename T, bool VAR = false>
void launch_bwd_dim(int D, bool pipe, const void* q, const void* k, const void* v, const void* dout,
                    const float* lse, const float* di, float* dq_acc, void* dk, void* dv, int n_seq, int L,
                    int nq, int nkv, float scale, cudaStream_t st, Variant var = {}) {
  pipe = pipe && wide_fits(D);
  if (D == 256)
    launch_bwd<T, 256, false, VAR>(q, k, v, dout, lse, di, dq_acc, dk, dv, n_seq, L, nq, nkv, scale, st, var);
  else if (D == 128 && pipe)
    launch_bwd<T, 128, true, VAR>(q, k, v, dout, lse, di, dq_acc, dk, dv, n_seq, L, nq, nkv, scale, st, var);
  else if (D == 128)
    launch_bwd<T, 128, false, VAR>(q, k, v, dout, lse, di, dq_acc, dk, dv, n_seq, L, nq, nkv, scale, st, var);
  else if (pipe)
    launch_bwd<T, 64, true, VAR>(q, k, v, dout, lse, di, dq_acc, dk, dv, n_seq, L, nq, nkv, scale, st, var);
  else
    launch_bwd<T, 64, false, VAR>(q, k, v, dout, lse, di, dq_acc, dk, dv, n_seq, L, nq, nkv, scale, st, var);
}

}  // namespace rp::cuda::flash
