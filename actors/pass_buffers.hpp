// Host memory of the runtime: the per-group parameter store and the per-pass
// activation slots. Only handles into this memory travel in messages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/dtype.hpp"
#include "model/layer.hpp"
#include "scheduler/plan.hpp"

namespace rp {

/// Page-aligned host bytes (the CUDA backend pins these; exact sizes, no rounding).
class HostBytes {
 public:
  HostBytes() = default;
  explicit HostBytes(size_t bytes);
  HostBytes(HostBytes&&) noexcept;
  HostBytes& operator=(HostBytes&&) noexcept;
  HostBytes(const HostBytes&) = delete;
  ~HostBytes();
  void* data() const { return p_; }
  size_t size() const { return n_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

/// Host side of the parameter groups (two of a parameter's three copies): the low-precision
/// master every upload reads (compute dtype) and the fp32 gradient slot every
/// gradient download writes. The fp32 optimizer copy lives in the optimizer shards.
///
/// A frozen group (ParamGroup::frozen) has one copy only: `lowp` holds its storage form
/// (ParamGroup::storage_bytes, each tensor in its TensorSpec::format at its byte_offset), which
/// the workers upload as is and dequantize on the device; its `grad` is empty (no gradient).
struct ParamStore {
  DType dtype = DType::f32;
  std::vector<int64_t> numel;   ///< per group
  std::vector<char> frozen;     ///< per group: 1 for a frozen group
  std::vector<HostBytes> lowp;  ///< per group, numel * dtype_size(dtype) bytes (frozen: storage_bytes)
  std::vector<HostBytes> grad;  ///< per group, numel floats (frozen: empty)
  /// `allocate_frozen` false: frozen groups' `lowp` stays empty for the caller to allocate
  /// group by group (the Session does, freeing each source as it copies, so a large frozen base
  /// never exists twice).
  ParamStore(const ModelLayout& m, DType compute_dtype, bool allocate_frozen = true);
};

/// The activations of a pass: the input of every layer (saved by forward stages, read by
/// backward recompute) and the activation gradient at every backward stage boundary.
struct PassActivations {
  /// x[b][m]: input of layer b (b >= 1). A layer whose inputs spill to disk (actors/
  /// activation_spill.hpp) has M empty buffers: its records are in the spill file instead.
  std::vector<std::vector<HostBytes>> x;
  /// Which activation set of the spill file holds this one's spilled records (one per pass slot,
  /// or one for all when they share their activations).
  int spill_set = 0;
  /// The activation gradients at stage boundaries, in two sets: dx[i][m] (i = 0, 1). The tail and
  /// the backward stages hand them on in a chain (the tail writes the gradient of its first
  /// layer's input, each backward stage reads its predecessor's and writes its own), and the j-th
  /// stage of the chain writes set j % 2 (RunStage::chain): the stage writing for micro-batch m
  /// computes m only after the stage before it has computed m, hence uploaded what stage j - 2
  /// wrote for m, so no set is overwritten before it is read. (A set per boundary would hold M
  /// activations per backward stage.) Shared by the passes of one worker, which runs their stages
  /// in the order they were dealt.
  std::vector<std::vector<HostBytes>> dx;
  /// Saved attention (LayerOptions::save_attention), decoder layers b only: the attention
  /// output [T, nq*D] and its log-sum-exp [n_seq, nq, L] fp32 of the forward.
  std::vector<std::vector<HostBytes>> attn_o, attn_lse;
};

/// Host buffers of one pass (M micro-batches) in flight: token ids and targets per
/// micro-batch, its activations (PassActivations), and the tail's per-micro-batch loss
/// {sum, count}.
///
/// Passes in flight may share one PassActivations when a single worker runs every stage:
/// it runs the stages in the order they were dealt, so every read of pass p's activations
/// (backward stages upload a layer's saved input before computing it) comes before the
/// writes of pass p+1 (a forward stage downloads its outputs after computing), while ids,
/// targets and losses, which the host writes when a pass is dealt, stay per pass.
struct PassBuffers {
  /// `shared`: activations to share with another pass slot (null: allocate them);
  /// `saved_attention`: also hold every decoder's attention output and log-sum-exp;
  /// `spilled[b]` non-zero: layer b's inputs spill to disk (x[b] holds empty buffers).
  PassBuffers(const ModelLayout& m, const IterationPlan& p, int64_t micro_batches,
              const MicroBatchShape& shape, DType dtype, std::shared_ptr<PassActivations> shared = nullptr,
              bool saved_attention = false, const std::vector<char>& spilled = {});
  PassBuffers(const PassBuffers&) = delete;
  PassBuffers& operator=(const PassBuffers&) = delete;
  /// Allocates the dx buffers plan `p`'s stage boundaries need and these buffers lack (a
  /// plan changed by re-planning), calling on_new(buffer) for each new one (e.g. to pin
  /// it). Call only while no pass uses these buffers. Throws std::bad_alloc.
  void ensure_boundaries(const IterationPlan& p, const std::function<void(HostBytes&)>& on_new);
  int64_t micro_batches;
  MicroBatchShape shape;
  size_t act_bytes;                     ///< one [T, hidden] activation
  std::vector<HostBytes> ids, targets;  ///< [M] of i32[T]
  std::vector<HostBytes> positions;     ///< [M] of i32[T]: a packed pass's RoPE positions (RunStage::packed)
  /// [M]: a packed pass's largest position + 1 per micro-batch (LayerArgs::rope_length; set when dealt)
  std::vector<int64_t> rope_length;
  std::shared_ptr<PassActivations> activations;
  std::vector<std::vector<HostBytes>>& x;   ///< activations->x
  std::vector<std::vector<HostBytes>>& dx;  ///< activations->dx (the two sets)
  /// The boundary gradient of micro-batch m written by the chain's stage `chain` (RunStage::chain).
  HostBytes& boundary(int chain, int64_t m) { return activations->dx[size_t(chain % 2)][size_t(m)]; }
  std::vector<float> loss;  ///< [2*M]: {sum, count} per micro-batch
  /// Sparse (mixture-of-experts) models: per micro-batch the router statistics [2E] fp32
  /// (LayerArgs::moe_stats) summed over the sparse layers run so far. The scheduler zeroes
  /// them when it deals the pass; each forward stage uploads them, adds its layers' and
  /// downloads them; the tail does the same, after which they hold the whole forward pass's,
  /// which the backward stages upload. Empty for dense models.
  int64_t experts = 0;
  std::vector<float> moe_stats;      ///< [M * 2E]
  std::vector<float> target_tokens;  ///< [M]: targets >= 0 per micro-batch (set when dealt)
};

}  // namespace rp
