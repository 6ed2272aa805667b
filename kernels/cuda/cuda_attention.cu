// Causal grouped-query attention for the CUDA backend, memory linear in sequence length.
//
// Tensor-core path (head_dim 64, 128 or 256, 16-byte aligned tensors): FlashAttention-2
// style kernels (Dao 2023, "FlashAttention-2", Alg. 1 and 2) on mma.sync m16n8k16 with
// bf16/f16 operands and fp32 accumulation:
//  - forward: one block of W warps (16 query rows each) per (16*W query rows, query
//    head, sequence); K/V tiles of 64 keys stream through shared memory (cp.async,
//    double-buffered); online softmax in registers; writes O and the row logsumexp.
//  - backward: Di = rowsum(dO*O) first; then one block of 8 warps per (64 keys, kv
//    head, sequence) walks the query heads of its group and the query tiles at or below
//    the diagonal, recomputing P from the saved logsumexp; dK and dV stay in registers,
//    dQ is accumulated in fp32 with (float2) atomics and cast at the end.
//  Two configurations, both tested: 2 = W 4 and an unpipelined backward, 3 = W 8 and
//  Q/dO tiles double-buffered in the backward. On the H200 they time within noise of
//  each other (bench/results/cuda_ops.md); 3 is the default.
//  Measured (H200, L=8192, 16/8 heads, D=128): forward ~175 TFLOP/s, backward ~133;
//  the next step for speed is Hopper's wgmma (FlashAttention-3 style) or cuDNN's SDPA.
// Simple path (any even head_dim <= 256, or forced): the row kernels of
// cuda_attention_rows.cu (one warp per row, O(L^2 D) work, no shared memory) without pos,
// window or sinks; used for odd shapes and as a cross-check.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_flash.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

using namespace flash;

// impl: 0 automatic (= kDefaultImpl), 1 simple, 2 flash with 4-warp forward blocks and an
// unpipelined backward, 3 flash with 8-warp forward blocks and a pipelined backward.
constexpr int kDefaultImpl = 3;

void check_shape(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, const char* op) {
  if (n_seq < 0 || L < 0 || nq <= 0 || nkv <= 0 || nq % nkv != 0 || D <= 0 || D % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": bad dimensions");
  if (D > 256) throw std::invalid_argument(std::string(op) + ": head_dim > 256 is not supported on CUDA");
  if (L > (int64_t(1) << 30) || n_seq > 65535 || nq > 65535)
    throw std::invalid_argument(std::string(op) + ": shape too large");
}

}  // namespace

void k_attention_fwd(DType t, const void* q, const void* k, const void* v, void* o, float* lse, int64_t n_seq,
                     int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale, int impl, cudaStream_t st) {
  check_shape(n_seq, L, nq, nkv, D, "attention_fwd");
  if (n_seq * L == 0) return;
  if (!flash::usable(impl, D, {q, k, v, o})) {
    k_attention_rows_fwd_v(t, q, k, v, o, lse, nullptr, nullptr, 0, n_seq, L, L, 0, nq, nkv, D, scale, st);
    return;
  }
  const bool wide = (impl == 0 ? kDefaultImpl : impl) == 3;
  RP_DISPATCH_16(
      "attention_fwd", t, T,
      launch_fwd_dim<T>(int(D), wide, q, k, v, o, lse, int(n_seq), int(L), int(nq), int(nkv), scale, st));
}

void k_attention_bwd(DType t, const void* q, const void* k, const void* v, const void* o, const float* lse,
                     const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t L, int64_t nq,
                     int64_t nkv, int64_t D, float scale, void* scratch, int impl, cudaStream_t st) {
  check_shape(n_seq, L, nq, nkv, D, "attention_bwd");
  if (n_seq * L == 0) return;
  // scratch: dq accumulator [T, nq, D] fp32, then Di [n_seq, nq, L] fp32
  float* dq_acc = static_cast<float*>(scratch);
  float* di = dq_acc + n_seq * L * nq * D;
  const int64_t rows = n_seq * L * nq;
  k_attention_di(t, o, dout, di, n_seq, L, nq, D, st);
  if (!flash::usable(impl, D, {q, k, v, o, dout, dq, dk, dv})) {
    k_attention_rows_bwd_v(t, q, k, v, lse, di, dout, nullptr, dq, dk, dv, 0, n_seq, L, nq, nkv, D, scale, st,
                           /*heads_outer=*/true);
    return;
  }
  RP_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(rows * D) * sizeof(float), st));
  const bool pipe = (impl == 0 ? kDefaultImpl : impl) == 3;
  RP_DISPATCH_16("attention_bwd", t, T,
                 launch_bwd_dim<T>(int(D), pipe, q, k, v, dout, lse, di, dq_acc, dk, dv, int(n_seq), int(L),
                                   int(nq), int(nkv), scale, st));
  k_cast(t, dq, DType::f32, dq_acc, rows * D, st);
}

}  // namespace rp::cuda
