// The adapter half of a LoRA linear (Hu et al. 2021, "LoRA", eq. 3; PEFT's lora.Linear):
//   y = W x + s * B A drop(x),   A [r, in], B [out, r], s = LoraConfig::scaling(),
// drop = inverted dropout with probability p on the adapter's input only (the base linear
// sees x), its mask a pure function of (seed, token row, feature) (Ops::dropout), so the
// backward's recompute draws the forward's mask again. With xd = drop(x), u = s * xd A^T and
// g = s * dy B (both [n, r]):
//   forward : y += u B^T
//   backward: dB += dy^T u,  dA += g^T xd,  dx += drop'(g A)   (drop' = the same mask)
// adapted_linear_fwd / adapted_linear_bwd_input also run the base GEMMs x W^T and dy W (in FP8
// when the call passes an Fp8Linear, model/fp8_linear.hpp); the caller does dW. All tensors are in the
// device's compute dtype but for the gradient accumulators (grad dtype); the [n, r] intermediates and the
// dropped-out input live in the decoder's scratch (model/layer_memory.hpp).
#pragma once
#include <array>
#include <cstdint>
#include <span>

#include "kernels/ops.hpp"
#include "model/fp8_linear.hpp"
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
  void* ax = nullptr;            ///< scratch [n, r]: u, then g in the backward
  void* xbuf = nullptr;          ///< scratch [n, in] for the dropped-out input (dropout > 0)
  /// backward calls: [kLoraModules, u_rows, r], where the recompute's adapted_linear_fwd leaves
  /// each module's u for lora_backward (null: u is computed again in lora_backward)
  void* u_keep = nullptr;
  int64_t u_rows = 0;  ///< rows of one module's slot in u_keep (the call's tokens)
  /// Adapters sharing an input run as one (lora_siblings_fuse; null: never): their stacked A
  /// [G r, in] (compute dtype), its gradient [G r, in] (grad dtype; backward calls), `cat_elems`
  /// elements each; ax then holds [n, G r] (G <= kMaxLoraSiblings, model/layer_memory.hpp).
  void* a_cat = nullptr;
  void* da_cat = nullptr;
  int64_t cat_elems = 0;
};

/// The stream of dropout masks of one layer call: a hash of (the adapter seed, the
/// micro-batch's LayerArgs::dropout_id, the compute layer); each module draws from
/// mix64(seed + module).
uint64_t lora_dropout_seed(uint64_t lora_seed, int64_t dropout_id, int layer);

/// y [n, out] = x W^T + s * B A drop(x) for rows [row0, row0 + n) of the micro-batch (x [n, in],
/// W [out, in] the base weight, all in the compute dtype; row0 only selects the dropout mask's
/// rows); y = x W^T when the module has no adapter. The low-rank product is written into y first
/// and the base GEMM accumulates onto it (Ops::linear_fwd_add): the compute-bound GEMM reads y in
/// its epilogue, where adding u B^T after it would be a memory-bound pass reading and writing y.
/// With c.u_keep, u is left in the module's slot for lora_backward (the backward's recompute).
/// With f8 the base GEMM runs in FP8 (model/fp8_linear.hpp; w is then not read), the adapter's
/// stay in the compute dtype. With `residual` ([n, out], not y): y = residual + the above, the
/// residual read by the first GEMM that writes y (Ops::linear_fwd_residual, gemm_fp8_residual)
/// instead of a separate add pass.
void adapted_linear_fwd(Ops& ops, const LoraCall& c, const LoraLinear& l, const void* x, const void* w,
                        void* y, int64_t n, int64_t in, int64_t out, int64_t row0,
                        const Fp8Linear* f8 = nullptr, const void* residual = nullptr);
/// Given x [n, in] (the base linear's input) and dy [n, out]: dA, dB += (into c.grads) and the
/// adapter's input gradient written into dx [n, in] (added to it when `accumulate`). No-op when
/// the module has no adapter. `reuse_u`: u is the one adapted_linear_fwd left in c.u_keep in this
/// call (the recompute ran for this module and these rows).
void lora_backward(const LoraCall& c, const LoraLinear& l, const void* x, const void* dy, void* dx, int64_t n,
                   int64_t row0, bool accumulate, bool reuse_u);
/// dx [n, in] = dy W (+ dx when `accumulate`) plus the adapter's input gradient, and its dA, dB
/// (lora_backward); W [out, in]. The adapter's term is written first and the base GEMM
/// accumulates onto it, for the same reason as in adapted_linear_fwd. With f8 the base GEMM runs
/// in FP8 (model/fp8_linear.hpp).
void adapted_linear_bwd_input(Ops& ops, const LoraCall& c, const LoraLinear& l, const void* x, const void* dy,
                              const void* w, void* dx, int64_t n, int64_t in, int64_t out, bool accumulate,
                              int64_t row0, bool reuse_u, const Fp8Linear* f8 = nullptr);

// ---- adapters that read one input (q/k/v; gate/up), run as one ----------------------------
// With A = [A_1; ...; A_G] stacked ([G r, in]), u = s xd A^T [n, G r] is one GEMM that reads x
// once instead of G times; u_i = u[:, i r : (i+1) r]. In the backward g = [s dy_1 B_1 ... s dy_G
// B_G] [n, G r], dA = g^T xd in one GEMM (x read once) and dx (+)= g A in one GEMM (dx written
// once instead of G read-modify-writes). Same products as the adapters one by one; the sums of
// dx are rounded in another order.

/// Whether the adapters `ls` (2 to kMaxLoraSiblings modules, consecutive LoraModules that read
/// one input) run as one in call c: each on, with one rank and input width, no dropout in this
/// call (each module draws its own mask), c carries the buffers (a_cat, and in a backward call
/// with gradients da_cat and u_keep) and they are large enough.
bool lora_siblings_fuse(const LoraCall& c, std::span<const LoraLinear* const> ls);

/// One of the linears adapted_siblings_fwd runs: its adapter, base weight W [out, in], output
/// y [n, out] and FP8 set (as adapted_linear_fwd's arguments).
struct SiblingLinear {
  const LoraLinear* lora = nullptr;
  const void* w = nullptr;
  void* y = nullptr;
  int64_t out = 0;
  const Fp8Linear* f8 = nullptr;
};
/// adapted_linear_fwd of each of `s` (all reading x [n, in]), with their adapters run as one
/// when lora_siblings_fuse holds (u of the first module's c.u_keep slot onward, or in c.ax).
void adapted_siblings_fwd(Ops& ops, const LoraCall& c, std::span<const SiblingLinear> s, const void* x,
                          int64_t n, int64_t in, int64_t row0);
/// The adapters' backward of siblings that run as one (lora_siblings_fuse must hold, else
/// std::invalid_argument): dB_i, dA_i += (into c.grads, when set) and the adapters' input
/// gradient g A written into dx [n, in] (added to it when `accumulate`), from x [n, in] and each
/// module's dy_i [n, out_i]. `reuse_u`: u is the one adapted_siblings_fwd left in c.u_keep in this
/// call. The base linears' input gradients are the caller's (accumulating onto dx).
void lora_siblings_backward(const LoraCall& c, std::span<const LoraLinear* const> ls,
                            std::span<const void* const> dy, const void* x, void* dx, int64_t n,
                            bool accumulate, bool reuse_u);

}  // namespace rp
