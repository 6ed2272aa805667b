// What the layer classes (model/layers.cpp, model/layers_ends.cpp) share: finding their tensors
// in a parameter group and checking and reading their LayerArgs. Internal to model/.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "kernels/ops.hpp"
#include "model/layer.hpp"

namespace rp::layer_args {

inline int64_t offset_of(const ParamGroup& g, const std::string& name) {
  int i = g.find(name);
  if (i < 0)
    throw std::invalid_argument(fmt::format("make_layer: tensor '{}' not in group '{}'", name, g.name));
  return g.tensors[size_t(i)].offset;
}

// Checks shared by all layers; returns the ops.
inline Ops& check_args(const LayerArgs& a, size_t n_groups, size_t need_scratch, const char* who,
                       bool backward) {
  if (!a.ops) throw std::invalid_argument(fmt::format("{}: args.ops is null", who));
  if (a.params.size() != n_groups || (backward && a.grads.size() != n_groups))
    throw std::invalid_argument(fmt::format("{}: expected {} parameter/gradient groups, got {}/{}", who,
                                            n_groups, a.params.size(), a.grads.size()));
  if (a.shape.n_seq < 1 || a.shape.seq_len < 1)
    throw std::invalid_argument(
        fmt::format("{}: empty micro-batch shape {}x{}", who, a.shape.n_seq, a.shape.seq_len));
  if (a.scratch_bytes < need_scratch || (need_scratch && !a.scratch))
    throw std::invalid_argument(
        fmt::format("{}: scratch of {} bytes, need {}", who, a.scratch_bytes, need_scratch));
  return *a.ops;
}

inline const void* param(const LayerArgs& a, size_t g, int64_t off) {
  return static_cast<const char*>(a.params[g]) + off * int64_t(dtype_size(a.ops->dtype()));
}
// Null for a frozen group (LayerArgs::grads[g] == nullptr): no weight gradient is computed
// for it (weight_grad skips the GEMM, rmsnorm_bwd and lm_head_cross_entropy take a null dw).
inline void* grad(const LayerArgs& a, size_t g, int64_t off) {
  if (!a.grads[g]) return nullptr;
  return static_cast<char*>(a.grads[g]) + off * int64_t(dtype_size(a.ops->grad_dtype()));
}
// Offset of `name` in g when `present`, else -1.
inline int64_t offset_if(const ParamGroup& g, const std::string& name, bool present) {
  return present ? offset_of(g, name) : -1;
}

}  // namespace rp::layer_args

namespace rp {

/// The embedding layer (compute layer 0) and the tail (L + 1) of `m` (model/layers_ends.cpp).
std::unique_ptr<Layer> make_embedding_layer(const ModelLayout& m);
std::unique_ptr<Layer> make_tail_layer(const ModelLayout& m);

}  // namespace rp
