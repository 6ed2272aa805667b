// Host-side launchers of the CUDA backend's kernels (internal to kernels/cuda).
// Each enqueues its kernels on `st` and throws rp::DeviceError when a launch fails.
// Storage types: `t` is the compute dtype (bf16 or f16); gradient accumulators of
// parameters are f32; every reduction accumulates in fp32.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.hpp"
#include "kernels/fp8.hpp"

namespace rp {
struct DequantPart;  // kernels/weight_format.hpp
}  // namespace rp

namespace rp::cuda {

/// Slots of the device error words (mapped host memory, kErrSlots unsigned) that kernels
/// set to 1 for bad inputs the CPU backend rejects with an exception (plain idempotent
/// stores, no host-memory atomics); the compute stream's next then() reports and clears
/// them.
enum : int { kErrEmbeddingId = 0, kErrTarget = 1, kErrMoeExpert = 2, kErrSlots = 4 };

// ---- memory helpers ---------------------------------------------------------------
void k_fill(DType t, void* x, int64_t n, float v, cudaStream_t st);
void k_cast(DType dst_t, void* dst, DType src_t, const void* src, int64_t n, cudaStream_t st);
void k_add_into(DType dst_t, void* dst, DType src_t, const void* src, int64_t n, float alpha,
                cudaStream_t st);
void k_add(DType t, const void* a, const void* b, void* y, int64_t n, cudaStream_t st);
/// Ops::dropout: y[r,c] = x[r,c] / (1-p) where dropout_uniform(seed, row0+r, c) >= p, else 0
/// (kernels/dropout_hash.hpp); y may alias x.
void k_dropout(DType t, const void* x, void* y, int64_t rows, int64_t cols, float p, uint64_t seed,
               int64_t row0, cudaStream_t st);
/// dst[i] (dst_t: f32, bf16 or f16) = value i of the n values stored in format f at src
/// (kernels/weight_format.hpp; cuda_dequant.cu): the host twin dequantize_weights()'s fp32
/// value rounded once to dst_t (round-to-nearest-even), so bit-identical to it. src may
/// be at any byte address (a tensor inside a frozen group's storage); n must be a multiple
/// of the format's block (the caller checks). Throws std::invalid_argument for another
/// dst_t or an unknown format.
/// cols: the row length of fp8 storage (ignored by the other formats).
void k_dequantize(WeightFormat f, DType dst_t, const void* src, void* dst, int64_t n, int64_t cols,
                  cudaStream_t st);
/// k_dequantize of each of `count` parts (Ops::dequantize_many; checked by the caller), the
/// consecutive fp8 parts on the 16-byte path, and consecutive parts of one block format with a
/// 16-byte aligned output, in one launch per up to 32 of them; the rest one by one.
void k_dequantize_many(DType dst_t, const DequantPart* parts, int64_t count, cudaStream_t st);

// ---- embedding / RMSNorm / RoPE / SwiGLU -------------------------------------------
void k_embedding_fwd(DType t, const int32_t* ids, const void* table, void* y, int64_t T, int64_t H, int64_t V,
                     unsigned* err, cudaStream_t st);
/// dtable (f32) += scatter(dy), ids equal to padding_idx (-1: none) left out.
void k_embedding_bwd(DType t, const int32_t* ids, const void* dy, float* dtable, int64_t T, int64_t H,
                     int64_t V, int64_t padding_idx, unsigned* err, cudaStream_t st);
/// amax (optional): the fp32 bits of max |y| over the stored (rounded) y are atomically
/// max-ed into *amax (cuda_fp8.hpp's k_fp8_amax_begin / end around the call).
/// w_offset: Ops::rmsnorm_fwd's (Gemma's 1; 0 elsewhere).
void k_rmsnorm_fwd(DType t, const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                   float w_offset, cudaStream_t st, unsigned* amax = nullptr);
/// k_rmsnorm_fwd, and the FP8 codes of the stored y with one scale per row in the same pass
/// (Ops::rmsnorm_fwd_fp8_rows): scale[r] = scale_from_amax(max |y[r,:]|, f), q = encode(y /
/// scale[r]). False (nothing launched) unless the rows fit the register kernel (16-byte aligned
/// x, w, y; n a multiple of 8 in [512, 4096]) and q is 8-byte aligned: the caller then runs the
/// separate ops.
bool k_rmsnorm_fwd_fp8_rows(DType t, const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                            float w_off, Fp8Format f, uint8_t* q, float* scale, cudaStream_t st);
/// dw (f32) += ..., dx (compute dtype) = or += ...
void k_rmsnorm_bwd(DType t, const void* x, const void* w, const void* dy, void* dx, float* dw, int64_t R,
                   int64_t n, float eps, bool accumulate_dx, float w_offset, cudaStream_t st);
/// Rotates the first R (even, <= D) of the D features of each head; inv_freq: host array of
/// R/2 floats (copied into the kernel's parameters). R <= 512.
void k_rope(DType t, void* x, int64_t n_seq, int64_t L, int64_t heads, int64_t D, int64_t R,
            const float* inv_freq, float scale, bool transpose, cudaStream_t st);
/// amax (optional): as k_rmsnorm_fwd's, over the stored h.
void k_swiglu_fwd(DType t, const void* g, const void* u, void* h, int64_t n, cudaStream_t st,
                  unsigned* amax = nullptr);
/// amax_dg, amax_du (both or neither): as k_swiglu_fwd's, over the stored dg and du.
void k_swiglu_bwd(DType t, const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n,
                  cudaStream_t st, unsigned* amax_dg = nullptr, unsigned* amax_du = nullptr);
/// Ops::geglu_fwd / geglu_bwd.
void k_geglu_fwd(DType t, const void* g, const void* u, void* h, int64_t n, cudaStream_t st);
void k_geglu_bwd(DType t, const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n,
                 cudaStream_t st);

// ---- cross-entropy over one chunk of logits -----------------------------------------
/// z: [n, V] logits in dtype t (ld V). For each row r with 0 <= targets[r] < V:
/// row_loss[r] = logsumexp(z_r) - z_r[target]; when grad, z_r is overwritten in place
/// with softmax(z_r) - onehot. Rows with targets < 0 get loss 0 and (grad) zeros;
/// targets >= V set err[kErrTarget] and are treated as ignored. softcap > 0: the loss and
/// softmax are those of soft_cap(z, softcap) and the gradient is chained through the tanh
/// (Ops::lm_head_cross_entropy).
void k_ce_rows(DType t, void* z, const int32_t* targets, int64_t n, int64_t V, float* row_loss, bool grad,
               unsigned* err, cudaStream_t st, float softcap = 0.0f);
/// loss[0] += sum(row_loss[0..n)), loss[1] += #rows with 0 <= target < V (one block,
/// fixed order: deterministic).
void k_ce_reduce(const float* row_loss, const int32_t* targets, int64_t n, int64_t V, float* loss,
                 cudaStream_t st);

// ---- attention ----------------------------------------------------------------------
/// impl: 0 = automatic (tensor-core flash kernels when D is 64 or 128 and pointers are
/// 16-byte aligned, else the simple kernels), 1 = always the simple kernels, 2 / 3 = the
/// two flash configurations (see cuda_attention.cu; 0 picks the faster one).
void k_attention_fwd(DType t, const void* q, const void* k, const void* v, void* o, float* lse, int64_t n_seq,
                     int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale, int impl, cudaStream_t st);
/// scratch: at least n_seq*L*nq*(D+1) floats (dq accumulator + row statistics).
void k_attention_bwd(DType t, const void* q, const void* k, const void* v, const void* o, const float* lse,
                     const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t L, int64_t nq,
                     int64_t nkv, int64_t D, float scale, void* scratch, int impl, cudaStream_t st);

// ---- expanded GQA backward (cudnn_attention.cpp; CPU twins in tests/kernels/ref_ops.hpp) ---
// A pass covers the query heads [h0, h0 + hc) of q [T, nq, D] (T = n_seq * L tokens);
// query head h uses KV head h / r of k, v [T, nkv, D] (r = nq / nkv); the pass's expanded
// tensors are [T, hc, D]. Throw std::invalid_argument for heads outside the tensors or a
// dtype not listed. 16-byte vectors when rows are 16-byte multiples at 16-byte-aligned
// addresses, one element per thread otherwise.
/// ke[t, i, :] = k[t, (h0 + i) / r, :] and ve likewise from v, for i < hc (bit copies of
/// the bf16 / f16 rows).
void k_gqa_expand_kv(DType t, const void* k, const void* v, void* ke, void* ve, int64_t T, int64_t nkv,
                     int64_t h0, int64_t hc, int64_t r, int64_t D, cudaStream_t st);
/// For g < G: out[t, g, :] = sum_{j<m} in[t, g*m + j, :] (+ out[t, g, :] when accumulate),
/// summed in fp32 in order j = 0..m-1 and rounded once to out_t. in: [T, G*m, D] of in_t;
/// out: rows of out_row elements of out_t, pointing at the first head written (dk + g0*D
/// with out_row = nkv*D; other heads are untouched). in_t / out_t: bf16, f16 or f32.
/// out_k/out_v receive the sums of in_k/in_v (dK and dV in one launch).
void k_gqa_group_sum(DType in_t, const void* in_k, const void* in_v, DType out_t, void* out_k, void* out_v,
                     int64_t out_row, int64_t T, int64_t G, int64_t m, int64_t D, bool accumulate,
                     cudaStream_t st);

// ---- Qwen3's per-head q/k norm + RoPE in one pass (cuda_qk_norm_rope.cu) -------------------
/// rmsnorm_fwd over the rows [tokens * heads, D] of x, then RoPE on y at position pos[t]
/// (clamped at 0; null: t % L), with the arithmetic and rounding of k_rmsnorm_fwd + k_rope /
/// k_rope_at (bit for bit). Returns false, launching nothing, unless D is 64, 128 or 256, every
/// feature rotates (R == D) and x, w, y are 16-byte aligned: the caller runs the separate kernels.
bool k_qk_norm_rope_fwd(DType t, const void* x, const void* w, void* y, const int32_t* pos, int64_t tokens,
                        int64_t L, int64_t heads, int64_t D, int64_t R, float eps, float w_off,
                        const float* inv_freq, float scale, cudaStream_t st);
/// The transposed rotation of dy (left unchanged) then rmsnorm_bwd into dx (overwritten) and
/// dw (fp32, +=; null: none): dx as k_rope(transpose) + k_rmsnorm_bwd bit for bit, dw summed
/// in another order. Same shape rule and return value as k_qk_norm_rope_fwd (dy, dx aligned).
bool k_qk_norm_rope_bwd(DType t, const void* x, const void* w, const void* dy, void* dx, float* dw,
                        const int32_t* pos, int64_t tokens, int64_t L, int64_t heads, int64_t D, int64_t R,
                        float eps, float w_off, const float* inv_freq, float scale, cudaStream_t st);

// ---- packed sequences and KV-cache decoding (cuda_packed.cu; CPU twins in cpu_packed.cpp) ---
/// x [T, heads, D] rotated at positions pos[t] (device int32, clamped at 0); the first R
/// features of each head rotate, as k_rope.
void k_rope_at(DType t, void* x, const int32_t* pos, int64_t T, int64_t heads, int64_t D, int64_t R,
               const float* inv_freq, float scale, bool transpose, cudaStream_t st);

// ---- attention on rows (cuda_attention_rows.cu; CPU twins in cpu_attention.cpp, cpu_packed.cpp,
// cpu_gptoss.cpp): the plain attention's simple path, packed sequences, KV-cache decoding and
// GPT-OSS's window / sinks. Any even head_dim <= 256, else std::invalid_argument.
/// Query row r < Lq of sequence s (q, o [n_seq*Lq, nq, D]) attends to the keys
/// [r - pos[s*Lq + r], past + r] of rows s*Lk + j of k, v [*, nkv, D] (pos null: from 0;
/// positions clamped into [0, r]), within a sliding window when window > 0 (keys
/// j > past + r - window only), with per-head sink logits sinks [nq] in t (or null) in the
/// softmax; lse [n_seq, nq, Lq] fp32 (includes the sinks) may be null. Window 0 and null
/// sinks run kernels without either.
void k_attention_rows_fwd_v(DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                            const int32_t* pos, const void* sinks, int64_t window, int64_t n_seq, int64_t Lq,
                            int64_t Lk, int64_t past, int64_t nq, int64_t nkv, int64_t D, float scale,
                            cudaStream_t st, float softcap = 0.0f);
/// di [n_seq, nq, L] fp32 = rowsum(dout * o) per (row, head) (o, dout [n_seq*L, nq, D]; any D).
void k_attention_di(DType t, const void* o, const void* dout, float* di, int64_t n_seq, int64_t L, int64_t nq,
                    int64_t D, cudaStream_t st);
/// Backward of k_attention_rows_fwd_v (Lq = Lk = L, past 0) given di (k_attention_di):
/// dq, dk, dv overwritten. The sinks only enter through lse. heads_outer (pos null and
/// window 0 only) sums a key's dK/dV terms head by head rather than row by row: the same
/// terms in the order of the plain attention's simple path, so its results keep their bits.
/// softcap: Ops::AttentionVariant::softcap (0: none), in the forward as well.
void k_attention_rows_bwd_v(DType t, const void* q, const void* k, const void* v, const float* lse,
                            const float* di, const void* dout, const int32_t* pos, void* dq, void* dk,
                            void* dv, int64_t window, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv,
                            int64_t D, float scale, cudaStream_t st, bool heads_outer = false,
                            float softcap = 0.0f);

// ---- GPT-OSS (cuda_gptoss.cu; CPU twin kernels/cpu/cpu_gptoss.cpp) ---------------------
/// dsinks[h] (fp32) += -sum_{s,t} exp(sinks[h] - lse[s,h,t]) * di[s,h,t] (deterministic).
void k_attention_dsinks(DType t, const void* sinks, const float* lse, const float* di, float* dsinks,
                        int64_t n_seq, int64_t L, int64_t nq, cudaStream_t st);
/// Tensor-core attention with a window / sinks / packed positions (cuda_attention_variant.cu):
/// false (nothing enqueued) when the shape or alignment needs the row kernels (head_dim not
/// 64 or 128, tensors not 16-byte aligned, impl 1 = simple). The backward takes di
/// (k_attention_di) and dq_acc, [n_seq*L, nq, D] fp32 scratch; dsinks are not computed here.
bool k_attention_flash_fwd_v(DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                             const int32_t* pos, const void* sinks, int64_t window, int64_t n_seq, int64_t L,
                             int64_t nq, int64_t nkv, int64_t D, float scale, int impl, cudaStream_t st,
                             float softcap = 0.0f);
bool k_attention_flash_bwd_v(DType t, const void* q, const void* k, const void* v, const float* lse,
                             const float* di, const void* dout, const int32_t* pos, void* dq, void* dk,
                             void* dv, float* dq_acc, int64_t window, int64_t n_seq, int64_t L, int64_t nq,
                             int64_t nkv, int64_t D, float scale, int impl, cudaStream_t st,
                             float softcap = 0.0f);
/// Ops::grouped_bias_fwd / grouped_bias_bwd (db fp32; deterministic column sums).
void k_grouped_bias_fwd(DType t, void* y, const void* b, const int32_t* offsets_host, int64_t E, int64_t N,
                        cudaStream_t st);
void k_grouped_bias_bwd(DType t, const void* dy, float* db, const int32_t* offsets_host, int64_t E, int64_t N,
                        cudaStream_t st);
/// Ops::swiglu_clamped_fwd / swiglu_clamped_bwd.
void k_swiglu_clamped_fwd(DType t, const void* g, const void* u, void* h, int64_t n, float alpha, float limit,
                          cudaStream_t st);
void k_swiglu_clamped_bwd(DType t, const void* g, const void* u, const void* dh, void* dg, void* du,
                          int64_t n, float alpha, float limit, cudaStream_t st);

// ---- mixture of experts (cuda_moe.cu; CPU twin kernels/cpu/cpu_moe.cpp) ----------------
// Shapes and formulas as Ops documents them (kernels/ops.hpp, "mixture of experts"); `t` is
// the storage type of logits / activations (f32, bf16 or f16). Every float sum runs in a
// fixed order (bit-identical reruns). E, k and H fit in int.
/// probs, topk_idx, topk_w of Ops::moe_route (one warp per token; E any size).
void k_moe_route(DType t, const void* logits, float* probs, int32_t* topk_idx, float* topk_w, int64_t T,
                 int64_t E, int64_t k, bool norm, cudaStream_t st);
/// stats[e] += #{a < T*k : topk_idx[a] == e}, stats[E+e] += sum_t probs[t,e] (tokens in a
/// fixed order; counts exact while below 2^24).
void k_moe_route_stats(const float* probs, const int32_t* topk_idx, float* stats, int64_t T, int64_t E,
                       int64_t k, cudaStream_t st);
void k_moe_route_bwd(DType t, const float* probs, const int32_t* topk_idx, const float* dw,
                     const float* counts, float aux_coef, void* dlogits, int64_t T, int64_t E, int64_t k,
                     bool norm, cudaStream_t st);
/// Chunking of moe_sort's R = T*k assignments: `chunks` chunks of `chunk` assignments;
/// the sort needs hist_ints int32 of device scratch.
struct MoeSortPlan {
  int64_t chunk = 0;
  int chunks = 0;
  int64_t hist_ints = 0;
};
MoeSortPlan moe_sort_plan(int64_t R, int64_t E);
/// offsets (device, E+1), row and token of Ops::moe_sort: histogram per chunk, one scan,
/// stable placement per chunk. hist: moe_sort_plan(T*k, E).hist_ints int32. An expert index
/// outside [0, E) sets err[kErrMoeExpert] and is placed as the nearest valid expert.
/// offsets_mapped (may be null): the device address of mapped pinned host memory that gets
/// the same E+1 offsets, written by the scan kernel itself: no copy-engine transfer, which
/// would queue behind the activation and gradient copies in flight.
void k_moe_sort(const int32_t* topk_idx, int32_t* offsets, int32_t* row, int32_t* token, int64_t T, int64_t E,
                int64_t k, int32_t* hist, unsigned* err, cudaStream_t st, int32_t* offsets_mapped = nullptr);
/// xs[r,:] = x[token[r],:] (rows of H elements of t, bit copies; zeros where token[r] < 0).
void k_gather_rows(DType t, const void* x, const int32_t* token, void* xs, int64_t R, int64_t H,
                   cudaStream_t st);
/// Ops::moe_pad_rows on the device (cuda_moe_pad.cu): token[0, Rp) = -1, then for a < R
/// row[a] += shift[topk_idx[a]], token[row[a]] = a / k, and offsets[e] = shift[E + e], e <= E
/// (shift: device [delta E][padded offsets E+1]).
void k_moe_pad_rows(const int32_t* topk_idx, const int32_t* shift, int32_t* offsets, int32_t* row,
                    int32_t* token, int64_t R, int64_t Rp, int64_t E, int64_t k, cudaStream_t st);
/// x[r,:] = 0 (rows of H elements of t) where token[r] < 0, r < R.
void k_moe_zero_pad_rows(DType t, void* x, const int32_t* token, int64_t R, int64_t H, cudaStream_t st);
/// y[t,:] (+)= sum_j w[t,j] ys[row[t*k+j],:], w null meaning all weights 1 (moe_gather_bwd).
void k_moe_combine(DType t, const void* ys, const float* w, const int32_t* row, void* y, int64_t T, int64_t k,
                   int64_t H, bool accumulate, cudaStream_t st);
void k_moe_combine_bwd(DType t, const void* dy, const void* ys, const float* w, const int32_t* row, void* dys,
                       float* dw, int64_t T, int64_t k, int64_t H, cudaStream_t st);
void k_moe_gather_bwd(DType t, const void* dxs, const int32_t* row, void* dx, int64_t T, int64_t k, int64_t H,
                      bool accumulate, cudaStream_t st);
/// The GEMMs of one grouped linear call (group g: expert expert[g], first row row0[g]),
/// passed by value as a kernel parameter (CUDA 12.1+ allows 32 KiB of parameters).
constexpr int kMoeMaxGroups = 1024;
struct MoeGroupTable {
  int32_t n = 0;
  int32_t expert[kMoeMaxGroups];
  int32_t row0[kMoeMaxGroups];
};
/// Operand of group g at base + expert * per_expert + row0 * per_row (bytes).
struct MoeGroupOperand {
  char* base = nullptr;
  int64_t per_expert = 0, per_row = 0;
};
/// ptrs[g], ptrs[n + g], ptrs[2n + g] = the A, B, C operands of group g (device array of
/// 3 * tab.n pointers, for cublasGemmGroupedBatchedEx).
/// The operands of one grouped linear's GEMMs (which: 0 forward, a = W, b = x, c = y; 1 input
/// gradient, a = W, b = dy, c = dx; 2 weight gradient, a = x, b = dy, c = dW in f32), es the
/// bytes of an element of the 16/32-bit inputs, W and dW [E, N, K].
inline void moe_group_operands(int which, const void* a, const void* b, void* c, int64_t K, int64_t N,
                               size_t es, MoeGroupOperand& A, MoeGroupOperand& B, MoeGroupOperand& C) {
  auto operand = [](const void* p, int64_t per_expert, int64_t per_row) {
    return MoeGroupOperand{static_cast<char*>(const_cast<void*>(p)), per_expert, per_row};
  };
  const int64_t s = int64_t(es), wmat = N * K;
  switch (which) {
    case 0: A = operand(a, wmat * s, 0), B = operand(b, 0, K * s), C = operand(c, 0, N * s); break;
    case 1: A = operand(a, wmat * s, 0), B = operand(b, 0, N * s), C = operand(c, 0, K * s); break;
    default: A = operand(a, 0, K * s), B = operand(b, 0, N * s), C = operand(c, wmat * 4, 0); break;
  }
}
void k_moe_group_ptrs(const MoeGroupTable& tab, const MoeGroupOperand& a, const MoeGroupOperand& b,
                      const MoeGroupOperand& c, void** ptrs, cudaStream_t st);
/// Weight gradients of a grouped linear in one launch (cuda_moe_wgrad.cu): for each group g
/// (expert tab.expert[g], rows tab.row0[g] up to the next group's first row, the last group's
/// up to R), dw[expert] ([N, K] row-major, f32) += dy[rows]^T x[rows] with dy [R, N] and
/// x [R, K] row-major bf16 / f16 (t). Tensor cores, fp32 accumulation, rows summed in a
/// fixed order (bit-identical reruns). Groups must list their rows contiguously in order.
void k_grouped_wgrad(DType t, const void* dy, const void* x, float* dw, const MoeGroupTable& tab, int64_t R,
                     int64_t K, int64_t N, cudaStream_t st);
/// Grouped products with a low-rank inner dimension in one launch (cuda_moe_lowrank.cu): for
/// each group g (rows as in k_grouped_wgrad), out[rows] = beta * out[rows] + alpha *
/// a[rows] M_e with a [R, r], out [R, C] row-major bf16 / f16 (t) and M_e the expert's
/// weight, stored as [C, r] when m_cr (a linear's weight [N, K] in its forward) and as
/// [r, C] otherwise (its input gradient); weights of consecutive experts follow each other
/// (C * r elements apart). 1 <= r <= 64; beta 0 does not read out. Tensor cores, fp32
/// accumulation in a fixed order (bit-identical reruns). Throws std::invalid_argument for
/// r > 64 or a dtype other than bf16 / f16.
void k_grouped_lowrank(DType t, const void* a, const void* w, void* out, const MoeGroupTable& tab, int64_t R,
                       int64_t r, int64_t C, bool m_cr, float alpha, float beta, cudaStream_t st);

}  // namespace rp::cuda
