// The sparse MLP block (model/moe_block.hpp). Reference: transformers' modeling_qwen3_moe.py
// (Qwen3MoeTopKRouter, Qwen3MoeExperts, Qwen3MoeSparseMoeBlock, load_balancing_loss_func) and
// modeling_gpt_oss.py (GptOssTopKRouter, GptOssExperts, GptOssMLP).
#include "model/moe_block.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/lora.hpp"

namespace rp {

namespace {
int64_t tensor_offset(const ParamGroup& g, const std::string& name) {
  const int i = g.find(name);
  if (i < 0)
    throw std::invalid_argument(fmt::format("make_layer: tensor '{}' not in group '{}'", name, g.name));
  return g.tensors[size_t(i)].offset;
}
// Offset of projection `proj` of expert 0, after checking that experts 1..E-1 follow it
// contiguously ([E, rows, cols] stacked).
int64_t stacked(const ParamGroup& g, const std::string& prefix, const char* proj, int64_t E,
                int64_t per_expert, const char* kind = "weight") {
  const int64_t base = tensor_offset(g, fmt::format("{}mlp.experts.0.{}.{}", prefix, proj, kind));
  for (int64_t e = 1; e < E; ++e)
    if (tensor_offset(g, fmt::format("{}mlp.experts.{}.{}.{}", prefix, e, proj, kind)) !=
        base + e * per_expert)
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
    bias_router_ = tensor_offset(g, p + "mlp.router.bias");
    bias_gate_ = stacked(g, p, "gate_proj", E_, Fe_, "bias");
    bias_up_ = stacked(g, p, "up_proj", E_, Fe_, "bias");
    bias_down_ = stacked(g, p, "down_proj", E_, H_, "bias");
    alpha_ = float(c.swiglu_alpha);
    limit_ = float(c.swiglu_limit);
  }
  const int ag = m.adapter_group(layer);
  if (!m.lora || ag < 0) return;
  r_ = m.lora->r;
  scaling_ = float(m.lora->scaling());
  const ParamGroup& lg = m.groups.at(size_t(ag));
  auto adapter = [&](ExpertProj proj, std::initializer_list<int64_t*> offs) {
    if (!lora_targets_experts(*m.lora, proj)) return false;
    const auto specs = expert_lora_tensors(c, layer - 1, proj, r_);
    auto it = offs.begin();
    for (const auto& [name, shape] : specs) {
      const int i = lg.find(name);
      if (i < 0 || lg.tensors[size_t(i)].shape != shape)
        throw std::invalid_argument(fmt::format("make_layer: adapter group '{}' lacks {} [{}]", lg.name, name,
                                                fmt::join(shape, ", ")));
      **it++ = lg.tensors[size_t(i)].offset;
    }
    return true;
  };
  lora_gu_ = adapter(ExpertProj::gate_up, {&a_gu_, &b_gate_, &b_up_});
  lora_down_ = adapter(ExpertProj::down, {&a_down_, &b_down_});
}

void MoeBlock::route(Ops& ops, const void* w, const void* hn, int64_t n, const MoeBufs& b, float* stats,
                     int32_t* off) const {
  ops.linear_fwd(hn, at(ops, w, w_router_), b.logits, n, H_, E_);
  if (gpt_oss_) {  // GPT-OSS: biased router logits
    const int32_t rows[2] = {0, int32_t(n)};
    ops.grouped_bias_fwd(b.logits, at(ops, w, bias_router_), rows, 1, E_);
  }
  ops.moe_route(b.logits, b.probs, b.topk_idx, b.topk_w, stats, n, E_, k_, norm_topk_);
  ops.moe_sort_launch(b.topk_idx, b.offsets, off, b.row, b.token, n, E_, k_);  // experts_forward waits
}

void MoeBlock::experts_forward(Ops& ops, const void* w, const void* hn, int64_t n, const MoeBufs& b,
                               int32_t* off, const MoeAdapterArgs& la, void* ax_gu, void* ax_down) const {
  if (b.padded) {  // the padded layout needs the host offsets before the gather (Ops::moe_pad)
    ops.moe_sort_wait(off, E_);
    ops.moe_pad(b.topk_idx, b.offsets, off, b.row, b.token, n, E_, k_, b.rows);
    ops.gather_rows(hn, b.token, b.xs, int64_t(off[E_]), H_);  // pad rows zero
  } else {
    ops.gather_rows(hn, b.token, b.xs, n * k_, H_);  // needs only the device's sorted rows
    ops.moe_sort_wait(off, E_);                      // the grouped linears need the host offsets
  }
  const int64_t R = int64_t(off[E_]);
  ops.grouped_linear_fwd(b.xs, at(ops, w, w_gate_), b.g, off, E_, H_, Fe_);
  ops.grouped_linear_fwd(b.xs, at(ops, w, w_up_), b.u, off, E_, H_, Fe_);
  if (lora_gu_) {  // a = xs A^T; g += s a Bg^T, u += s a Bu^T, added in by the GEMMs themselves
    ops.grouped_linear_fwd(b.xs, at(ops, la.params, a_gu_), ax_gu, off, E_, H_, r_);
    ops.grouped_linear_fwd_add(ax_gu, at(ops, la.params, b_gate_), b.g, off, E_, r_, Fe_, scaling_);
    ops.grouped_linear_fwd_add(ax_gu, at(ops, la.params, b_up_), b.u, off, E_, r_, Fe_, scaling_);
  }
  if (gpt_oss_) {  // biased experts, clamped SwiGLU
    ops.grouped_bias_fwd(b.g, at(ops, w, bias_gate_), off, E_, Fe_);
    ops.grouped_bias_fwd(b.u, at(ops, w, bias_up_), off, E_, Fe_);
    ops.swiglu_clamped_fwd(b.g, b.u, b.m, R * Fe_, alpha_, limit_);
  } else {
    ops.swiglu_fwd(b.g, b.u, b.m, R * Fe_);
  }
  ops.grouped_linear_fwd(b.m, at(ops, w, w_down_), b.ys, off, E_, Fe_, H_);
  if (gpt_oss_) ops.grouped_bias_fwd(b.ys, at(ops, w, bias_down_), off, E_, H_);
  if (lora_down_) {  // ys += s (m Ad^T) Bd^T
    ops.grouped_linear_fwd(b.m, at(ops, la.params, a_down_), ax_down, off, E_, Fe_, r_);
    ops.grouped_linear_fwd_add(ax_down, at(ops, la.params, b_down_), b.ys, off, E_, r_, H_, scaling_);
  }
}

void MoeBlock::down_adapter_backward(Ops& ops, const MoeAdapterArgs& la, const MoeBufs& b,
                                     const int32_t* off) const {
  const int64_t R = int64_t(off[E_]);
  const DType dt = ops.dtype();
  // s a = s m Ad^T (in ax; a is the recompute's, in g); dBd += dys^T (s a)
  ops.fill(dt, b.lora_ax, R * r_, 0.f);
  ops.add_into(dt, b.lora_ax, dt, b.lora_g, R * r_, scaling_);
  if (void* g = grad_at(ops, la.grads, b_down_))
    ops.grouped_linear_bwd_weight(b.dys, b.lora_ax, g, off, E_, r_, H_);
  // g_a = s dys Bd (in ax); dAd += g_a^T m. The caller adds g_a Ad to dm once m is overwritten.
  ops.grouped_linear_bwd_input(b.dys, at(ops, la.params, b_down_), b.lora_g, off, E_, r_, H_, false);
  ops.fill(dt, b.lora_ax, R * r_, 0.f);
  ops.add_into(dt, b.lora_ax, dt, b.lora_g, R * r_, scaling_);
  if (void* g = grad_at(ops, la.grads, a_down_))
    ops.grouped_linear_bwd_weight(b.lora_ax, b.m, g, off, E_, Fe_, r_);
}

void MoeBlock::gate_up_adapter_backward(Ops& ops, const MoeAdapterArgs& la, const MoeBufs& b,
                                        const int32_t* off) const {
  const int64_t R = int64_t(off[E_]);
  const DType dt = ops.dtype();
  // s a = s xs A^T (in ax; a is the recompute's); dBg += dg^T (s a), dBu += du^T (s a)
  ops.fill(dt, b.lora_ax, R * r_, 0.f);
  ops.add_into(dt, b.lora_ax, dt, b.lora_a_gu, R * r_, scaling_);
  if (void* g = grad_at(ops, la.grads, b_gate_))
    ops.grouped_linear_bwd_weight(b.dg, b.lora_ax, g, off, E_, r_, Fe_);
  if (void* g = grad_at(ops, la.grads, b_up_))
    ops.grouped_linear_bwd_weight(b.du, b.lora_ax, g, off, E_, r_, Fe_);
  // g_a = s (dg Bg + du Bu); dA += g_a^T xs; dxs (in ys) += g_a A
  ops.grouped_linear_bwd_input(b.dg, at(ops, la.params, b_gate_), b.lora_g, off, E_, r_, Fe_, false);
  ops.grouped_linear_bwd_input(b.du, at(ops, la.params, b_up_), b.lora_g, off, E_, r_, Fe_, true);
  ops.fill(dt, b.lora_ax, R * r_, 0.f);
  ops.add_into(dt, b.lora_ax, dt, b.lora_g, R * r_, scaling_);
  if (void* g = grad_at(ops, la.grads, a_gu_))
    ops.grouped_linear_bwd_weight(b.lora_ax, b.xs, g, off, E_, H_, r_);
  ops.grouped_linear_bwd_input(b.lora_ax, at(ops, la.params, a_gu_), b.ys, off, E_, H_, r_, true);
}

void MoeBlock::forward(Ops& ops, const void* w, const void* hn, const void* h1, void* y, int64_t n,
                       const MoeBufs& b, float* stats, const MoeAdapterArgs& la) const {
  if (adapted() && (!la.params || !b.lora_ax))
    throw std::invalid_argument("MoeBlock.forward: expert adapters without their parameters or scratch");
  std::vector<int32_t> off(size_t(E_) + 1);
  route(ops, w, hn, n, b, stats, off.data());
  experts_forward(ops, w, hn, n, b, off.data(), la, b.lora_ax, b.lora_ax);
  ops.copy(ops.dtype(), y, h1, n * H_);
  ops.moe_combine(b.ys, b.topk_w, b.row, y, n, k_, H_, true);
}

void MoeBlock::backward(Ops& ops, const void* w, void* dw, const void* hn, const void* dy, void* dhn,
                        int64_t n, const MoeBufs& b, const float* counts, float aux_coef,
                        const MoeAdapterArgs& la) const {
  if (adapted() && (!la.params || !b.lora_ax || !b.lora_g || !b.lora_a_gu))
    throw std::invalid_argument("MoeBlock.backward: expert adapters without their parameters or scratch");
  std::vector<int32_t> off(size_t(E_) + 1);
  route(ops, w, hn, n, b, nullptr, off.data());  // the recompute gathers no statistics
  experts_forward(ops, w, hn, n, b, off.data(), la, b.lora_a_gu, b.lora_g);
  const int64_t R = int64_t(off[E_]);
  // y = h1 + sum_j w_j ys[row(t, j)]; pad rows of dys zero, so they add nothing below
  ops.moe_combine_bwd(dy, b.ys, b.topk_w, b.row, b.dys, b.dw, n, k_, H_);
  if (b.padded) ops.moe_zero_pad_rows(b.dys, b.token, R, H_);
  // ys = down(m): dW_down from m, then dm into m's buffer
  if (lora_down_) down_adapter_backward(ops, la, b, off.data());
  if (void* g = grad_at(ops, dw, w_down_))
    ops.grouped_linear_bwd_weight(b.dys, b.m, g, off.data(), E_, Fe_, H_);
  if (void* g = gpt_oss_ ? grad_at(ops, dw, bias_down_) : nullptr)
    ops.grouped_bias_bwd(b.dys, g, off.data(), E_, H_);
  ops.grouped_linear_bwd_input(b.dys, at(ops, w, w_down_), b.m, off.data(), E_, Fe_, H_, false);
  if (lora_down_)  // dm += g_a Ad (g_a left in ax by the down adapter's backward)
    ops.grouped_linear_bwd_input(b.lora_ax, at(ops, la.params, a_down_), b.m, off.data(), E_, Fe_, r_, true);
  if (gpt_oss_) ops.swiglu_clamped_bwd(b.g, b.u, b.m, b.dg, b.du, R * Fe_, alpha_, limit_);
  else ops.swiglu_bwd(b.g, b.u, b.m, b.dg, b.du, R * Fe_);
  if (void* g = grad_at(ops, dw, w_gate_))
    ops.grouped_linear_bwd_weight(b.dg, b.xs, g, off.data(), E_, H_, Fe_);
  if (void* g = grad_at(ops, dw, w_up_))
    ops.grouped_linear_bwd_weight(b.du, b.xs, g, off.data(), E_, H_, Fe_);
  if (gpt_oss_ && dw) {
    ops.grouped_bias_bwd(b.dg, grad_at(ops, dw, bias_gate_), off.data(), E_, Fe_);
    ops.grouped_bias_bwd(b.du, grad_at(ops, dw, bias_up_), off.data(), E_, Fe_);
  }
  // the experts' input gradient (in ys, no longer read), summed back onto the tokens
  ops.grouped_linear_bwd_input(b.dg, at(ops, w, w_gate_), b.ys, off.data(), E_, H_, Fe_, false);
  ops.grouped_linear_bwd_input(b.du, at(ops, w, w_up_), b.ys, off.data(), E_, H_, Fe_, true);
  if (lora_gu_) gate_up_adapter_backward(ops, la, b, off.data());
  ops.moe_gather_bwd(b.ys, b.row, dhn, n, k_, H_, false);
  // the router: through the top-k weights (and the load-balancing loss) into the logits
  ops.moe_route_bwd(b.probs, b.topk_idx, b.dw, counts, aux_coef, b.dlogits, n, E_, k_, norm_topk_);
  if (void* g = grad_at(ops, dw, w_router_)) ops.linear_bwd_weight(b.dlogits, hn, g, n, H_, E_);
  if (void* g = gpt_oss_ ? grad_at(ops, dw, bias_router_) : nullptr) {
    const int32_t rows[2] = {0, int32_t(n)};
    ops.grouped_bias_bwd(b.dlogits, g, rows, 1, E_);
  }
  ops.linear_bwd_input(b.dlogits, at(ops, w, w_router_), dhn, n, H_, E_, true);
}

}  // namespace rp
