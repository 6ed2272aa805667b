// Model FLOPs per trained token: the numerator of MFU (model FLOPs utilisation), the one
// formula the trainer (progress line, metrics.csv, TensorBoard's train/mfu) and
// bench_throughput use.
//
// Source: PaLM (Chowdhery et al. 2022, appendix B): training FLOPs per token = 6 N + 12 L H Q T
// (N matmul parameters, L layers, H heads of Q dimensions, T the sequence length), the same
// count as Megatron-LM's (Narayanan et al. 2021, sec. 5.1): every weight multiplies each token
// once in the forward pass (2 FLOPs: multiply, add) and twice in the backward pass (input
// gradient and weight gradient, 4 FLOPs); activation recomputation is not model FLOPs.
// What we count, term by term:
//   - N: the matmul weights a token is multiplied by: q/k/v/o projections, the dense SwiGLU
//     MLP (gate, up, down), a sparse block's router [E, H] and its num_experts_per_tok experts
//     (never all E), and the LM head [V, H]. Not the embedding lookup (no multiply), norms,
//     biases or attention sinks (not matmuls; well under 0.1% of the FLOPs).
//   - frozen weights (ParamGroup::frozen: a LoRA base) count 4 per parameter, not 6: forward
//     2 and input gradient 2, no weight gradient. A matmul weight is frozen when the group
//     holding it is (a decoder's base group; the LM head's group, i.e. the embedding's when
//     the embeddings are tied). The adapters' own FLOPs (6 r (in + out) per adapted linear,
//     under 1% at r = 16) are left out.
//   - attention: QK^T and PV are 2 matmuls of 2 FLOPs per (query, key) pair and head
//     dimension, x3 for forward and backward: 12 nq D per attended pair. PaLM counts all T
//     keys per query (12 L H Q T); causal attention attends (T + 1) / 2 on average, which we
//     count as T / 2 (as FlashAttention's benchmarks do): 6 nq D T per layer and token. A
//     sliding-window decoder (GPT-OSS) attends attended_pairs(T, W) / T keys per query.
#pragma once
#include <cstdint>

#include "roundpipe/model.hpp"

namespace rp {

/// (query, key) pairs one causal sequence of `seq_len` tokens scores: half the S^2 matrix,
/// S^2 / 2; with a sliding window of `window` keys (0: none; the first W queries see fewer)
/// the band W^2 / 2 + (S - W) W. Shared by the MFU count and the analytic cost model.
double attended_pairs(double seq_len, double window);

/// The terms of model_flops_per_token.
struct ModelFlops {
  double trained_matmul_params = 0;  ///< per token, counted 6 times
  double frozen_matmul_params = 0;   ///< per token, counted 4 times
  double attention = 0;              ///< FLOPs of QK^T and PV, forward and backward, per token
  double per_token() const { return 6 * trained_matmul_params + 4 * frozen_matmul_params + attention; }
};

/// The model FLOPs of training one token of sequences of `seq_len` tokens on layout `m` (its
/// frozen groups as frozen), by the formula in this file's comment. Throws
/// std::invalid_argument for seq_len < 1.
ModelFlops model_flops(const ModelLayout& m, int64_t seq_len);
/// model_flops(m, seq_len).per_token().
double model_flops_per_token(const ModelLayout& m, int64_t seq_len);

}  // namespace rp
