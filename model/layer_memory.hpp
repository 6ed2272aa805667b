// Device scratch of the compute layers, as one set of pure functions shared by the layers
// (model/layers.cpp carves its buffers with them) and by the planner's memory model
// (scheduler/cost_model.cpp), so a plan's predicted bytes and the bytes a worker allocates
// come from the same code. Header-only: it depends on nothing but the op contracts of
// kernels/ops.hpp.
//
// Decoder layer (pre-norm block; T = n_seq * seq_len tokens, H hidden, F ffn, Q = nq * D,
// K = nkv * D, C = MLP chunk rows, es = bytes per element of the compute dtype):
//   forward : xn, h1 [T,H]; q, o [T,Q]; k, v [T,K]; qr [T,Q] and kr [T,K] (Qwen3 q/k norm
//             inputs); attention scratch; one MLP chunk hn [C,H], g, u, m [C,F].
//   backward: the forward's buffers (recompute; the MLP half chunk by chunk) plus lse
//             [n_seq, nq, L] fp32, dout, dq [T,Q], dk, dv [T,K], dhn [C,H], dm, dg, du [C,F].
//   With a saved attention (LayerOptions::save_attention) o and lse are the caller's buffers.
//             dh1 lives in the caller's dx, dxn in h1, the q/k-norm input gradients in dout
//             and v, so nothing of size [T,F] exists and no [T,H] buffer beyond xn and h1.
//   LoRA adapters (DecoderDims::lora_rank r > 0): ax [T,r] (forward and backward) for the adapter
//             intermediates of one linear at a time, u [7,T,r] (backward: each linear's s A x from
//             the recompute, reused by its backward), and with dropout the dropped-out input of one
//             linear, [T, max(H,Q)] or for the MLP [C, max(H,F)]. Without dropout the adapters that
//             share an input (q/k/v, gate/up) run as one: ax is [T,3r], plus their stacked A
//             [3r,H] and (backward) its gradient [3r,H] fp32.
//   Sparse MLP block (DecoderDims::experts E > 0, k experts per token, expert FFN Fe; R = C*k
//             routed rows of a chunk, padded_rows_bound(C*k) with DecoderDims::expert_padded,
//             the sorted row [R] then C*k): instead of g, u, m [C,F]: router logits [C,E], probs
//             [C,E] fp32, top-k experts [C,k] i32 and weights [C,k] fp32, expert offsets
//             [E+1] i32, sorted row / token [R] i32, gathered input xs [R,H], expert outputs ys
//             [R,H], g, u, m [R,Fe]; backward adds dys [R,H], dg, du [R,Fe], dw [C,k] fp32 and
//             dlogits [C,E] (dm lives in m, the experts' input gradient in ys). Expert
//             adapters (DecoderDims::expert_lora) add ax [R,r], forward t [R,H], backward g [R,r].
//   FP8 linears (DecoderDims::fp8): the e4m3 codes of one linear's input or output gradient at
//             a time, [T, max(H,Q)] or [C, max(H,F)] bytes, and its scale; the weights' codes
//             live in the caller's cache (Fp8WeightBufs below). With a frozen base (which
//             may run from its fp8 storage, model/fp8_linear.hpp) the scale is one per token,
//             T fp32.
// Tail: hn, dhn [T,H] plus Ops::lm_head_ce_scratch_bytes.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/moe_buckets.hpp"
#include "kernels/ops.hpp"

namespace rp {

/// Linears of a decoder layer that can carry a LoRA adapter (q, k, v, o, gate, up, down:
/// model/lora.hpp's LoraModule).
constexpr size_t kAdaptedLinears = 7;

/// The most LoRA adapters that read one input and run as one (q, k, v; model/lora_linear.hpp).
constexpr int64_t kMaxLoraSiblings = 3;

/// Alignment of every buffer a layer carves out of its scratch.
constexpr size_t kScratchAlign = 256;

/// Tokens of one MLP chunk when nothing else is set: the [C, ffn] intermediates of a decoder
/// exist for at most this many tokens at a time (a micro-batch of up to C tokens runs its
/// MLP in one piece).
constexpr int64_t kDefaultMlpChunkTokens = 8192;

/// Bump allocator over a layer's scratch. With base == nullptr it only counts bytes.
class ScratchCarver {
 public:
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}
  void* take(size_t bytes) {
    off_ = (off_ + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    void* p = base_ ? base_ + off_ : nullptr;
    off_ += bytes;
    return p;
  }
  size_t used() const { return off_; }

 private:
  char* base_;
  size_t off_ = 0;
};

/// What the decoder's scratch depends on.
struct DecoderDims {
  int64_t hidden = 0, ffn = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool qk_norm = false;
  bool saved_attention = false;  ///< o and lse live outside the scratch (LayerOptions::save_attention)
  int64_t lora_rank = 0;         ///< LoRA adapters on some of the linears (LoraConfig::r), 0: none
  bool lora_dropout = false;     ///< LoraConfig::dropout > 0
  bool frozen_base = false;      ///< the base group is frozen (no weight gradients; no scratch of its own)
  bool expert_lora = false;      ///< the sparse block's experts carry adapters of rank lora_rank
  bool fp8 = false;        ///< dense linears in FP8 (LayerOptions::fp8): activation codes in the scratch
  bool fp8_wgrad = false;  ///< and their weight gradients (LayerOptions::fp8_weight_gradients)
  /// FP8 linears over a frozen base: room for per-token activation scales and per-row weight
  /// scales, used when the base is stored as fp8 and runs from its codes (model/fp8_linear.hpp)
  bool fp8_row_scales() const { return fp8 && frozen_base; }
  /// Sparse MLP block: experts (0: a dense SwiGLU MLP of ffn), experts per token, expert FFN.
  int64_t experts = 0, experts_per_tok = 0, expert_ffn = 0;
  /// The sparse block's sorted rows in the padded layout (Ops::moe_pad; LayerOptions::
  /// expert_padded): its [R, .] buffers hold padded_rows_bound(C*k) rows.
  bool expert_padded = false;
};

/// The sparse MLP block's buffers for one chunk of C tokens (R = C*k rows; in the padded
/// layout the [R, .] buffers and token hold `rows` = padded_rows_bound(C*k) rows, row and the
/// [C, k] ones C*k).
struct MoeBufs {
  int64_t rows = 0;                           // rows of xs, ys, g, ..., token
  bool padded = false;                        // MoeBlock lays the sorted rows out padded (Ops::moe_pad)
  void* logits = nullptr;                     // [C, E] compute dtype
  float *probs = nullptr, *topk_w = nullptr;  // [C, E], [C, k]
  int32_t *topk_idx = nullptr, *offsets = nullptr, *row = nullptr,
          *token = nullptr;                           // [C,k], [E+1], [R], [R]
  void *xs = nullptr, *ys = nullptr, *dys = nullptr;  // [R, H]
  void *g = nullptr, *u = nullptr, *m = nullptr;      // [R, Fe]
  void *dg = nullptr, *du = nullptr;                  // [R, Fe], backward
  float* dw = nullptr;                                // [C, k], backward
  void* dlogits = nullptr;                            // [C, E], backward
  void *lora_ax = nullptr, *lora_g = nullptr;         // [R, r] expert adapters (lora_g: backward)
  void* lora_a_gu = nullptr;  // [R, r] backward: the recompute's xs A^T, kept for the adapter's backward
};

/// Bytes of the attention output o [T, nq*D] (es per element) and its log-sum-exp
/// [n_seq, nq, L] fp32 that a decoder with a saved attention keeps per micro-batch.
inline size_t attention_output_bytes(const DecoderDims& d, int64_t tokens, size_t es) {
  return size_t(tokens * d.heads * d.head_dim) * es;
}
inline size_t attention_lse_bytes(const DecoderDims& d, int64_t tokens) {
  return size_t(tokens * d.heads) * 4;
}

/// The FP8 scales a decoder's backward keeps from the kernels that produced the tensors
/// (DecoderBufs::fp8_kept), so the FP8 GEMMs that read them do not read the tensors again for
/// their amax: for the weight gradients, the recompute's attention input (its RMSNorm, q/k/v's
/// x), MLP input (its RMSNorm, gate/up's x) and SwiGLU output (down's x); for the weight and the
/// input gradients, SwiGLU's backward outputs (gate's and up's dy).
enum Fp8Kept : int { kKeptAttnIn, kKeptMlpIn, kKeptMlpAct, kKeptDGate, kKeptDUp, kFp8Kept };

/// The decoder's scratch buffers (null where a mode has none; see the file comment).
struct DecoderBufs {
  void *xn = nullptr, *h1 = nullptr;                                  // [T, H]
  void *q = nullptr, *o = nullptr, *qr = nullptr;                     // [T, Q]
  void *k = nullptr, *v = nullptr, *kr = nullptr;                     // [T, K]
  void *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;  // backward
  void *hn = nullptr, *dhn = nullptr;                                 // [C, H]
  void *g = nullptr, *u = nullptr, *m = nullptr;                      // [C, F]
  void *dm = nullptr, *dg = nullptr, *du = nullptr;                   // [C, F], backward
  float* lse = nullptr;                                               // [n_seq, nq, L], backward
  void* lora_ax = nullptr;                                            // [T, r] ([T, 3r] without dropout)
  void* lora_a_cat = nullptr;   // [3r, H] without dropout: the stacked A of adapters sharing an input
  void* lora_da_cat = nullptr;  // [3r, H] fp32, backward: its gradient
  int64_t lora_cat_elems = 0;   // 3r * H
  void* lora_u = nullptr;       // backward: [kAdaptedLinears, T, r], each linear's u from the recompute
  void* lora_x = nullptr;       // dropout input, [T or C, max in]
  void* attn = nullptr;         // Ops::attention_scratch_bytes
  MoeBufs moe;                  // sparse MLP block only
  int64_t chunk = 0;            // C
  // FP8 linears (DecoderDims::fp8): the e4m3 codes of one linear's input (or output gradient)
  // at a time, [T, max(H,Q)] or for the MLP [C, max(H,F)], and their scale
  uint8_t* fp8_codes = nullptr;
  float* fp8_scale = nullptr;
  // FP8 weight gradients (DecoderDims::fp8_wgrad, backward): the codes of dy^T and x^T of one
  // linear at a time, tokens padded to 16 (model/fp8_linear.hpp, Fp8WgradScratch)
  uint8_t *fp8_dyt = nullptr, *fp8_xt = nullptr;
  float *fp8_dyt_scale = nullptr, *fp8_xt_scale = nullptr;
  // and the scales their producers computed (Fp8Kept: kFp8Kept fp32 values, 16 bytes apart)
  float* fp8_kept = nullptr;
};

/// Carves a sparse block's buffers for chunks of C tokens.
inline void carve_moe_scratch(const DecoderDims& d, size_t C, size_t es, bool backward, ScratchCarver& sc,
                              MoeBufs& b) {
  const size_t E = size_t(d.experts), k = size_t(d.experts_per_tok), H = size_t(d.hidden),
               Fe = size_t(d.expert_ffn);
  const size_t R = d.expert_padded ? size_t(padded_rows_bound(int64_t(C * k), kExpertPadFraction)) : C * k;
  b.rows = int64_t(R);
  b.padded = d.expert_padded;
  b.logits = sc.take(C * E * es);
  b.probs = static_cast<float*>(sc.take(C * E * 4));
  b.topk_w = static_cast<float*>(sc.take(C * k * 4));
  b.topk_idx = static_cast<int32_t*>(sc.take(C * k * 4));
  b.offsets = static_cast<int32_t*>(sc.take((E + 1) * 4));
  b.row = static_cast<int32_t*>(sc.take(C * k * 4));
  b.token = static_cast<int32_t*>(sc.take(R * 4));
  b.xs = sc.take(R * H * es);
  b.ys = sc.take(R * H * es);
  b.g = sc.take(R * Fe * es);
  b.u = sc.take(R * Fe * es);
  b.m = sc.take(R * Fe * es);
  if (d.expert_lora) {  // model/moe_block.hpp: the adapter intermediates of one projection at a time
    b.lora_ax = sc.take(R * size_t(d.lora_rank) * es);
    if (backward) b.lora_g = sc.take(R * size_t(d.lora_rank) * es);
    if (backward) b.lora_a_gu = sc.take(R * size_t(d.lora_rank) * es);
  }
  if (!backward) return;
  b.dys = sc.take(R * H * es);
  b.dg = sc.take(R * Fe * es);
  b.du = sc.take(R * Fe * es);
  b.dw = static_cast<float*>(sc.take(C * k * 4));
  b.dlogits = sc.take(C * E * es);
}

/// Rows of one MLP chunk for `tokens` tokens (chunk_tokens <= 0: kDefaultMlpChunkTokens).
inline int64_t mlp_chunk_rows(int64_t tokens, int64_t chunk_tokens) {
  const int64_t c = chunk_tokens > 0 ? chunk_tokens : kDefaultMlpChunkTokens;
  return std::max<int64_t>(1, std::min(tokens, c));
}

/// Carves the decoder's buffers for a micro-batch of n_seq x seq_len tokens out of `sc`.
inline void carve_decoder_scratch(const DecoderDims& d, int64_t n_seq, int64_t seq_len, size_t es,
                                  bool backward, int64_t chunk_tokens, ScratchCarver& sc, DecoderBufs& b) {
  const size_t T = size_t(n_seq * seq_len), H = size_t(d.hidden), F = size_t(d.ffn);
  const size_t Q = size_t(d.heads * d.head_dim), K = size_t(d.kv_heads * d.head_dim);
  b = DecoderBufs{};
  b.chunk = mlp_chunk_rows(int64_t(T), chunk_tokens);
  const size_t C = size_t(b.chunk);
  b.xn = sc.take(T * H * es);
  b.h1 = sc.take(T * H * es);
  b.q = sc.take(T * Q * es);
  if (!d.saved_attention) b.o = sc.take(T * Q * es);
  b.k = sc.take(T * K * es);
  b.v = sc.take(T * K * es);
  if (d.qk_norm) {
    b.qr = sc.take(T * Q * es);
    b.kr = sc.take(T * K * es);
  }
  b.attn = sc.take(Ops::attention_scratch_bytes(n_seq, seq_len, d.heads, d.kv_heads, d.head_dim));
  b.hn = sc.take(C * H * es);
  if (d.experts > 0) {
    carve_moe_scratch(d, C, es, backward, sc, b.moe);
  } else {
    b.g = sc.take(C * F * es);
    b.u = sc.take(C * F * es);
    b.m = sc.take(C * F * es);
  }
  if (d.lora_rank > 0) {  // model/lora_linear.hpp: adapter intermediates, one linear at a time
    const size_t r = size_t(d.lora_rank), G = d.lora_dropout ? 1 : size_t(kMaxLoraSiblings);
    b.lora_ax = sc.take(T * G * r * es);
    if (!d.lora_dropout) {  // or of the adapters sharing an input, run as one
      b.lora_a_cat = sc.take(G * r * H * es);
      if (backward) b.lora_da_cat = sc.take(G * r * H * 4);
      b.lora_cat_elems = int64_t(G * r * H);
    }
    if (backward) b.lora_u = sc.take(kAdaptedLinears * T * size_t(d.lora_rank) * es);
    if (d.lora_dropout) b.lora_x = sc.take(std::max(T * std::max(H, Q), C * std::max(H, F)) * es);
  }
  if (d.fp8) {
    b.fp8_codes = static_cast<uint8_t*>(sc.take(std::max(T * std::max(H, Q), C * std::max(H, F))));
    b.fp8_scale = static_cast<float*>(sc.take((d.fp8_row_scales() ? T : 1) * sizeof(float)));
  }
  if (!backward) return;
  if (d.fp8 && d.fp8_wgrad && !d.frozen_base) {
    const auto pad16 = [](size_t n) { return (n + 15) / 16 * 16; };
    const size_t codes = std::max(pad16(T) * std::max({H, Q, K}), pad16(C) * std::max(H, F));
    b.fp8_dyt = static_cast<uint8_t*>(sc.take(codes));
    b.fp8_xt = static_cast<uint8_t*>(sc.take(codes));
    b.fp8_dyt_scale = static_cast<float*>(sc.take(sizeof(float)));
    b.fp8_xt_scale = static_cast<float*>(sc.take(sizeof(float)));
  }
  if (d.fp8) b.fp8_kept = static_cast<float*>(sc.take(kFp8Kept * 16));
  if (!d.saved_attention) b.lse = static_cast<float*>(sc.take(T * size_t(d.heads) * 4));
  b.dout = sc.take(T * Q * es);
  b.dq = sc.take(T * Q * es);
  b.dk = sc.take(T * K * es);
  b.dv = sc.take(T * K * es);
  b.dhn = sc.take(C * H * es);
  if (d.experts > 0) return;
  b.dm = sc.take(C * F * es);
  b.dg = sc.take(C * F * es);
  b.du = sc.take(C * F * es);
}

/// Scratch bytes of a decoder layer call (forward only, or recompute + backward).
inline size_t decoder_scratch_bytes(const DecoderDims& d, int64_t n_seq, int64_t seq_len, size_t es,
                                    bool backward, int64_t chunk_tokens) {
  ScratchCarver sc(nullptr);
  DecoderBufs b;
  carve_decoder_scratch(d, n_seq, seq_len, es, backward, chunk_tokens, sc, b);
  return sc.used();
}

/// The FP8 weight cache of a decoder (LayerOptions::fp8; model/fp8_linear.hpp): for each of
/// its dense linears (LoraModule order q, k, v, o, gate, up, down; a sparse block's experts
/// stay in the compute dtype, so its gate/up/down have none) the scale of W, the e4m3 codes of
/// W [out, in] and, for calls that run a backward (`transposed`), of W^T [in, out]. One byte
/// per weight (two with W^T) plus the scales; it lives as long as the uploaded weights
/// (LayerArgs::fp8_weights), not in the per-call scratch. Over a frozen base
/// (DecoderDims::fp8_row_scales) also each linear's row scales [out] and a vector of ones as
/// long as the widest input, for a base that runs from its fp8 storage (model/fp8_linear.hpp).
struct Fp8WeightBufs {
  /// Floats between two linears' scales: cuBLASLt's FP8 GEMM refuses (CUBLAS_STATUS_NOT_SUPPORTED)
  /// a scale pointer that is not 16-byte aligned, so each scale gets its own 16 bytes.
  static constexpr size_t kScaleStride = 4;
  float* scale = nullptr;             // [kAdaptedLinears x kScaleStride] fp32; linear i's at i x kScaleStride
  uint8_t* w[kAdaptedLinears] = {};   // W codes, null for a linear without FP8
  uint8_t* wt[kAdaptedLinears] = {};  // W^T codes, null without `transposed`
  int64_t out[kAdaptedLinears] = {}, in[kAdaptedLinears] = {};  // W's shape (0: no FP8)
  float* row_scale[kAdaptedLinears] = {};                       // fp8_row_scales: [out] fp32 each, else null
  float* ones = nullptr;  // fp8_row_scales: [n_ones] fp32 (filled with 1 by the layer)
  int64_t n_ones = 0;
};
inline void carve_fp8_weights(const DecoderDims& d, bool transposed, ScratchCarver& sc, Fp8WeightBufs& b) {
  b = Fp8WeightBufs{};
  if (!d.fp8) return;
  const int64_t H = d.hidden, F = d.ffn, Q = d.heads * d.head_dim, K = d.kv_heads * d.head_dim;
  const int64_t shapes[kAdaptedLinears][2] = {{Q, H}, {K, H}, {K, H}, {H, Q}, {F, H}, {F, H}, {H, F}};
  const size_t linears = d.experts > 0 ? 4 : kAdaptedLinears;  // a sparse block: attention only
  b.scale = static_cast<float*>(sc.take(kAdaptedLinears * Fp8WeightBufs::kScaleStride * sizeof(float)));
  for (size_t i = 0; i < linears; ++i) {
    b.out[i] = shapes[i][0];
    b.in[i] = shapes[i][1];
    b.w[i] = static_cast<uint8_t*>(sc.take(size_t(b.out[i] * b.in[i])));
  }
  if (d.fp8_row_scales()) {
    for (size_t i = 0; i < linears; ++i) b.row_scale[i] = static_cast<float*>(sc.take(size_t(b.out[i]) * 4));
    b.n_ones = std::max({H, Q, F});
    b.ones = static_cast<float*>(sc.take(size_t(b.n_ones) * 4));
  }
  // after every W: a forward-only cache is a prefix of a backward one, so forward and backward
  // calls of one stage (a tail stage's) read the same codes
  if (transposed)
    for (size_t i = 0; i < linears; ++i) b.wt[i] = static_cast<uint8_t*>(sc.take(size_t(b.out[i] * b.in[i])));
}
/// Bytes of a decoder's FP8 weight cache (0 without LayerOptions::fp8).
inline size_t fp8_weight_bytes(const DecoderDims& d, bool transposed) {
  if (!d.fp8) return 0;
  ScratchCarver sc(nullptr);
  Fp8WeightBufs b;
  carve_fp8_weights(d, transposed, sc, b);
  return sc.used();
}

/// The tail's buffers: hn, dhn [T,H] and the chunked LM-head cross-entropy scratch.
struct TailBufs {
  void *hn = nullptr, *dhn = nullptr, *ce = nullptr;
};
inline void carve_tail_scratch(int64_t tokens, int64_t hidden, int64_t vocab, size_t es, ScratchCarver& sc,
                               TailBufs& b) {
  const size_t TH = size_t(tokens * hidden);
  b.hn = sc.take(TH * es);
  b.dhn = sc.take(TH * es);
  b.ce = sc.take(Ops::lm_head_ce_scratch_bytes(tokens, hidden, vocab));
}
inline size_t tail_scratch_bytes(int64_t tokens, int64_t hidden, int64_t vocab, size_t es) {
  ScratchCarver sc(nullptr);
  TailBufs b;
  carve_tail_scratch(tokens, hidden, vocab, es, sc, b);
  return sc.used();
}

}  // namespace rp
