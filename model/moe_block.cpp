// The sparse MLP block (model/moe_block.hpp). Reference: transformers' modeling_qwen3_moe.py
// (Qwen3MoeTopKRouter, Qwen3MoeExperts, Qwen3MoeSparseMoeBlock, load_balancing_loss_func) and
// modeling_gpt_oss.py (GptOssTopKRouter, GptOssExperts, GptOssMLP).
#include "model/moe_block.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace rp {

namespace {
int64_t tensor_offset(const ParamGroup& g, const std::string& name) {
  const int i = g.find(name);
  if (i < 0) throw std::invalid_argument(fmt::format("make_layer: tensor '{}' not in group '{}'", name, g.name));
  return g.tensors[size_t(i)].offset;
}
// Offset of projection `proj` of expert 0, after checking that experts 1..E-1 follow it
// contiguously ([E, rows, cols] stacked).
int64_t stacked(const ParamGroup& g, const std::string& prefix, const char* proj, int64_t E, int64_t per_expert,
                const char* kind = "weight") {
  const int64_t base = tensor_offset(g, fmt::format("{}mlp.experts.0.{}.{}", prefix, proj, kind));
  for (int64_t e = 1; e < E; ++e)
    if (tensor_offset(g, fmt::format("{}mlp.experts.{}.{}.{}", prefix, e, proj, kind)) != base + e * per_expert)
      throw std::invalid_argument(
          fmt::format("make_layer: group '{}': the experts' {} are not stacked contiguously", g.name, proj));
  return base;
}
const void* at(const Ops& ops, const void* base, int64_t off) {
  return static_cast<const char*>(base) + off * int64_t(dtype_size(ops.dtype()));
}
void* grad_at(const Ops& ops, void* base, int64_t off) {
  return base ? static_cast<char*>(base) + off * int64_t(dtype_size(ops.grad_dtype())) : nullptr;
}
}  // namespace

MoeBlock::MoeBlock(const ModelLayout& m, int layer) {
  const ModelConfig& c = m.config;
  if (layer < 1 || layer > c.num_hidden_layers || !c.is_moe_layer(layer - 1))
    throw std::invalid_argument(fmt::format("MoeBlock: layer {} is not a sparse decoder layer", layer));
  H_ = c.hidden_size;
  E_ = c.num_experts;
  k_ = c.num_experts_per_tok;
  Fe_ = c.moe_intermediate_size;
  norm_topk_ = c.norm_topk_prob;
  const ParamGroup& g = m.groups.at(size_t(layer));
  const std::string p = fmt::format("model.layers.{}.", layer - 1);
  gpt_oss_ = c.gpt_oss();
  w_router_ = tensor_offset(g, p + (gpt_oss_ ? "mlp.router.weight" : "mlp.gate.weight"));
  w_gate_ = stacked(g, p, "gate_proj", E_, Fe_ * H_);
  w_up_ = stacked(g, p, "up_proj", E_, Fe_ * H_);
  w_down_ = stacked(g, p, "down_proj", E_, H_ * Fe_);
  if (gpt_oss_) {
    b_router_ = tensor_offset(g, p + "mlp.router.bias");
    b_gate_ = stacked(g, p, "gate_proj", E_, Fe_, "bias");
    b_up_ = stacked(g, p, "up_proj", E_, Fe_, "bias");
    b_down_ = stacked(g, p, "down_proj", E_, H_, "bias");
    alpha_ = float(c.swiglu_alpha);
    limit_ = float(c.swiglu_limit);
  }
}

void MoeBlock::route(Ops& ops, const void* w, const void* hn, int64_t n, const MoeBufs& b, float* stats,
                     int32_t* off) const {
  ops.linear_fwd(hn, at(ops, w, w_router_), b.logits, n, H_, E_);
  if (gpt_oss_) {  // GPT-OSS: biased router logits
    const int32_t rows[2] = {0, int32_t(n)};
    ops.grouped_bias_fwd(b.logits, at(ops, w, b_router_), rows, 1, E_);
  }
  ops.moe_route(b.logits, b.probs, b.topk_idx, b.topk_w, stats, n, E_, k_, norm_topk_);
  ops.moe_sort(b.topk_idx, b.offsets, off, b.row, b.token, n, E_, k_);
}

void MoeBlock::experts_forward(Ops& ops, const void* w, const void* hn, int64_t n, const MoeBufs& b,
                               const int32_t* off) const {
  const int64_t R = n * k_;
  ops.gather_rows(hn, b.token, b.xs, R, H_);
  ops.grouped_linear_fwd(b.xs, at(ops, w, w_gate_), b.g, off, E_, H_, Fe_);
  ops.grouped_linear_fwd(b.xs, at(ops, w, w_up_), b.u, off, E_, H_, Fe_);
  if (!gpt_oss_) {
    ops.swiglu_fwd(b.g, b.u, b.m, R * Fe_);
    ops.grouped_linear_fwd(b.m, at(ops, w, w_down_), b.ys, off, E_, Fe_, H_);
    return;
  }
  ops.grouped_bias_fwd(b.g, at(ops, w, b_gate_), off, E_, Fe_);
  ops.grouped_bias_fwd(b.u, at(ops, w, b_up_), off, E_, Fe_);
  ops.swiglu_clamped_fwd(b.g, b.u, b.m, R * Fe_, alpha_, limit_);
  ops.grouped_linear_fwd(b.m, at(ops, w, w_down_), b.ys, off, E_, Fe_, H_);
  ops.grouped_bias_fwd(b.ys, at(ops, w, b_down_), off, E_, H_);
}

void MoeBlock::forward(Ops& ops, const void* w, const void* hn, const void* h1, void* y, int64_t n,
                       const MoeBufs& b, float* stats) const {
  std::vector<int32_t> off(size_t(E_) + 1);
  route(ops, w, hn, n, b, stats, off.data());
  experts_forward(ops, w, hn, n, b, off.data());
  ops.copy(ops.dtype(), y, h1, n * H_);
  ops.moe_combine(b.ys, b.topk_w, b.row, y, n, k_, H_, true);
}

void MoeBlock::backward(Ops& ops, const void* w, void* dw, const void* hn, const void* dy, void* dhn, int64_t n,
                        const MoeBufs& b, const float* counts, float aux_coef) const {
  const int64_t R = n * k_;
  std::vector<int32_t> off(size_t(E_) + 1);
  route(ops, w, hn, n, b, nullptr, off.data());  // the recompute gathers no statistics
  experts_forward(ops, w, hn, n, b, off.data());
  // y = h1 + sum_j w_j ys[row(t, j)]
  ops.moe_combine_bwd(dy, b.ys, b.topk_w, b.row, b.dys, b.dw, n, k_, H_);
  // ys = down(m): dW_down from m, then dm into m's buffer
  if (void* g = grad_at(ops, dw, w_down_)) ops.grouped_linear_bwd_weight(b.dys, b.m, g, off.data(), E_, Fe_, H_);
  if (void* g = gpt_oss_ ? grad_at(ops, dw, b_down_) : nullptr) ops.grouped_bias_bwd(b.dys, g, off.data(), E_, H_);
  ops.grouped_linear_bwd_input(b.dys, at(ops, w, w_down_), b.m, off.data(), E_, Fe_, H_, false);
  if (gpt_oss_)
    ops.swiglu_clamped_bwd(b.g, b.u, b.m, b.dg, b.du, R * Fe_, alpha_, limit_);
  else
    ops.swiglu_bwd(b.g, b.u, b.m, b.dg, b.du, R * Fe_);
  if (void* g = grad_at(ops, dw, w_gate_)) ops.grouped_linear_bwd_weight(b.dg, b.xs, g, off.data(), E_, H_, Fe_);
  if (void* g = grad_at(ops, dw, w_up_)) ops.grouped_linear_bwd_weight(b.du, b.xs, g, off.data(), E_, H_, Fe_);
  if (gpt_oss_ && dw) {
    ops.grouped_bias_bwd(b.dg, grad_at(ops, dw, b_gate_), off.data(), E_, Fe_);
    ops.grouped_bias_bwd(b.du, grad_at(ops, dw, b_up_), off.data(), E_, Fe_);
  }
  // the experts' input gradient (in ys, no longer read), summed back onto the tokens
  ops.grouped_linear_bwd_input(b.dg, at(ops, w, w_gate_), b.ys, off.data(), E_, H_, Fe_, false);
  ops.grouped_linear_bwd_input(b.du, at(ops, w, w_up_), b.ys, off.data(), E_, H_, Fe_, true);
  ops.moe_gather_bwd(b.ys, b.row, dhn, n, k_, H_, false);
  // the router: through the top-k weights (and the load-balancing loss) into the logits
  ops.moe_route_bwd(b.probs, b.topk_idx, b.dw, counts, aux_coef, b.dlogits, n, E_, k_, norm_topk_);
  if (void* g = grad_at(ops, dw, w_router_)) ops.linear_bwd_weight(b.dlogits, hn, g, n, H_, E_);
  if (void* g = gpt_oss_ ? grad_at(ops, dw, b_router_) : nullptr) {
    const int32_t rows[2] = {0, int32_t(n)};
    ops.grouped_bias_bwd(b.dlogits, g, rows, 1, E_);
  }
  ops.linear_bwd_input(b.dlogits, at(ops, w, w_router_), dhn, n, H_, E_, true);
}

}  // namespace rp
