// The adapter half of a LoRA linear (Hu et al. 2021, "LoRA", eq. 3; PEFT's lora.Linear):
//   y = W x + s * B A drop(x),   A [r, in], B [out, r], s = LoraConfig::scaling(),
// drop = inverted dropout with probability p on the adapter's input only (the base linear
// sees x), its mask a pure function of (seed, token row, feature) (Ops::dropout), so the
// backward's recompute draws the forward's mask again. With xd = drop(x), u = s * xd A^T and
// g = s * dy B (both [n, r]):
//   forward : y += u B^T
//   backward: dB += dy^T u,  dA += g^T xd,  dx += drop'(g A)   (drop' = the same mask)
// The caller does W x, W^T dy and (trainable base only) dW. All tensors are in the device's
// compute dtype but for the gradient accumulators (grad dtype); the [n, r] intermediates and
// the dropped-out input live in the decoder's scratch (model/layer_memory.hpp).
#pragma once
#include <array>
#include <cstdint>

#include "kernels/ops.hpp"
#include "model/lora.hpp"

namespace rp {

/// One adapted linear of a decoder layer: its dimensions and where lora_A / lora_B start
/// (elements) in the layer's adapter group; a_off < 0 when the module carries no adapter.
struct LoraLinear {
  int module = 0;  ///< LoraModule
  int64_t in = 0, out = 0, r = 0;
  int64_t a_off = -1, b_off = -1;
  bool on() const { return a_off >= 0; }
};

/// The adapted linears of compute layer `layer` (a decoder, 1..L) of m, indexed by LoraModule
/// (all off when m has no LoRA). Throws std::invalid_argument when the adapter group lacks a
/// tensor m.lora targets.
std::array<LoraLinear, kLoraModules> lora_linears(const ModelLayout& m, int layer);

/// What the adapter calls of one layer call share.
struct LoraCall {
  Ops* ops = nullptr;
  const void* params = nullptr;  ///< the adapter group's device copy (compute dtype)
  void* grads = nullptr;         ///< its gradient accumulator (grad dtype); null: no dA, dB
  float scaling = 1.0f;          ///< s
  float dropout = 0.0f;          ///< p; 0 also when dropout is off for this call (evaluation)
  uint64_t seed = 0;             ///< lora_dropout_seed of this call
  void* ax = nullptr;            ///< scratch [n, r]
  void* g = nullptr;             ///< scratch [n, r], backward
  void* xbuf = nullptr;          ///< scratch [n, in] for the dropped-out input (dropout > 0)
};

/// The stream of dropout masks of one layer call: a hash of (the adapter seed, the
/// micro-batch's LayerArgs::dropout_id, the compute layer); each module draws from
/// mix64(seed + module).
uint64_t lora_dropout_seed(uint64_t lora_seed, int64_t dropout_id, int layer);

/// y [n, out] += s * B A drop(x) for rows [row0, row0 + n) of the micro-batch (x [n, in]; row0
/// only selects the dropout mask's rows). No-op when the module has no adapter.
void lora_forward(const LoraCall& c, const LoraLinear& l, const void* x, void* y, int64_t n, int64_t row0);
/// Given x [n, in] (the base linear's input) and dy [n, out]: dA, dB += (into c.grads) and
/// dx [n, in] += the adapter's input gradient. No-op when the module has no adapter.
void lora_backward(const LoraCall& c, const LoraLinear& l, const void* x, const void* dy, void* dx, int64_t n,
                   int64_t row0);

}  // namespace rp
