// Test support: one micro-batch through every layer of a model on any Device (CPU backend
// or CUDA), sequentially, without the actor runtime: forward, fused tail, backward. Used to
// compare both backends with Hugging Face golden data. `dropout_id` names the micro-batch's
// LoRA dropout masks (LayerArgs::dropout_id; -1: no dropout). Sparse (mixture-of-experts)
// models gather their router statistics over the forward pass (LayerArgs::moe_stats) and, when
// the config's load-balancing loss is on, back-propagate it with the weight transformers gives
// it (loss_sum + coef * aux * target tokens, i.e. mean loss + coef * aux). `lo`: the layers'
// options (e.g. LayerOptions::expert_padded with a device whose ops run bucketed expert GEMMs).
#pragma once
#include <vector>

#include "kernels/device.hpp"
#include "kernels/ops.hpp"
#include "model/layer.hpp"
#include "model/layers.hpp"

namespace rp::test {

struct DeviceRun {
  double loss_sum = 0, count = 0;
  std::vector<std::vector<float>> grads;  ///< per parameter group, fp32
  std::vector<float> logits;              ///< [T, vocab]
  std::vector<float> moe_stats;           ///< sparse models: [2E] counts and probability sums over the pass
  double aux_loss = 0;  ///< sparse models: the load-balancing loss (without its coefficient)
};

inline std::vector<float> to_f32(const std::vector<uint8_t>& raw, DType t) {
  std::vector<float> out(raw.size() / dtype_size(t));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&out[i], raw.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return out;
}

inline DeviceRun device_forward_backward(Device& d, const ModelLayout& m,
                                         const std::vector<std::vector<float>>& w,
                                         const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                                         MicroBatchShape s, int64_t dropout_id = -1,
                                         const LayerOptions& lo = {}) {
  const DType dt = d.compute_dtype(), gt = d.ops().grad_dtype();
  const int L = m.num_layers();
  const int64_t T = s.tokens(), H = m.config.hidden_size, V = m.config.vocab_size;
  const size_t act = size_t(T * H) * dtype_size(dt);
  Stream& st = d.stream(StreamKind::compute);
  std::vector<std::vector<uint8_t>> host_lowp;
  std::vector<DeviceBuffer> params, grads;
  for (size_t g = 0; g < w.size(); ++g) {
    host_lowp.emplace_back(w[g].size() * dtype_size(dt));
    cast_f32_to(w[g].data(), host_lowp.back().data(), int64_t(w[g].size()), dt);
    params.emplace_back(d, host_lowp.back().size());
    grads.emplace_back(d, w[g].size() * dtype_size(gt));
    st.copy_h2d(params.back().get(), host_lowp.back().data(), host_lowp.back().size());
  }
  std::vector<std::unique_ptr<Layer>> layers;
  size_t scratch = 0;
  for (int l = 0; l < L; ++l) {
    layers.push_back(make_layer(m, l, lo));
    scratch = std::max(scratch, layers.back()->scratch_bytes(s));
  }
  DeviceBuffer d_ids(d, size_t(T) * 4), d_tg(d, size_t(T) * 4), d_loss(d, 8), d_scr(d, scratch);
  DeviceBuffer d_dy(d, act), d_dx(d, act), d_norm(d, act), d_logits(d, size_t(T * V) * dtype_size(dt));
  const int64_t E = m.config.num_experts;
  DeviceBuffer d_stats(d, size_t(std::max<int64_t>(E, 1)) * 8);
  double n_targets = 0;
  for (int32_t t : targets) n_targets += t >= 0;
  const float aux_scale = float(m.config.aux_loss_coef() * n_targets);
  std::vector<DeviceBuffer> x;
  for (int l = 0; l < L; ++l) x.emplace_back(d, act);
  st.copy_h2d(d_ids.get(), ids.data(), size_t(T) * 4);
  st.copy_h2d(d_tg.get(), targets.data(), size_t(T) * 4);
  const int head = L - 1;
  const void* norm_w = params[head].as<char>() + m.groups[head].tensors[0].offset * dtype_size(dt);
  const void* lm_w = m.config.tie_word_embeddings
                         ? params[0].get()
                         : params[head].as<char>() + m.groups[head].tensors[1].offset * dtype_size(dt);
  st.launch([&] {
    Ops& ops = d.ops();
    for (auto& g : grads) ops.fill(gt, g.get(), int64_t(g.bytes() / dtype_size(gt)), 0.f);
    ops.fill(DType::f32, d_stats.get(), int64_t(d_stats.bytes() / 4), 0.f);
    auto args = [&](int l) {
      LayerArgs a;
      a.ops = &ops;
      a.shape = s;
      for (int g : m.groups_of(l)) {
        a.params.push_back(params[g].get());
        a.grads.push_back(grads[g].get());
      }
      a.scratch = d_scr.get();
      a.scratch_bytes = scratch;
      a.ids = d_ids.as<int32_t>();
      a.dropout_id = dropout_id;  // LoRA dropout masks (-1: none)
      if (E > 0) a.moe_stats = d_stats.as<float>();
      return a;
    };
    for (int l = 0; l < L - 1; ++l) {  // x[l+1] = layer l (x[l])
      LayerArgs a = args(l);
      a.x = l ? x[l].get() : nullptr;
      a.y = x[l + 1].get();
      layers[l]->forward(a);
    }
    ops.rmsnorm_fwd(x[L - 1].get(), norm_w, d_norm.get(), T, H, float(m.config.rms_norm_eps),
                    m.config.norm_weight_offset());  // Gemma: 1 + w
    ops.linear_fwd(d_norm.get(), lm_w, d_logits.get(), T, H, V);
    if (m.config.logits_scaling != 1.0)  // Granite divides its logits
      scale_activation(ops, d_logits.get(), d_logits.get(), T * V, float(1.0 / m.config.logits_scaling));
    LayerArgs ta = args(L - 1);
    ta.x = x[L - 1].get();
    ta.targets = d_tg.as<int32_t>();
    ta.loss = d_loss.as<float>();
    ta.dx = d_dy.get();
    layers[L - 1]->backward(ta);
    for (int l = L - 2; l >= 0; --l) {
      LayerArgs a = args(l);
      a.x = l ? x[l].get() : nullptr;
      a.dy = d_dy.get();
      a.dx = l ? d_dx.get() : nullptr;
      a.moe_aux_scale = aux_scale;
      layers[l]->backward(a);
      std::swap(d_dx, d_dy);
    }
  });
  DeviceRun out;
  std::vector<std::vector<uint8_t>> graw(grads.size());
  for (size_t g = 0; g < grads.size(); ++g) {
    graw[g].resize(grads[g].bytes());
    st.copy_d2h(graw[g].data(), grads[g].get(), grads[g].bytes());
  }
  float loss[2];
  st.copy_d2h(loss, d_loss.get(), 8);
  std::vector<float> stats(d_stats.bytes() / 4);
  st.copy_d2h(stats.data(), d_stats.get(), d_stats.bytes());
  std::vector<uint8_t> lraw(d_logits.bytes());
  st.copy_d2h(lraw.data(), d_logits.get(), lraw.size());
  std::string err;
  st.then([&err](const std::string& e) { err = e; });
  st.synchronize();
  if (!err.empty()) throw DeviceError(err);
  out.loss_sum = loss[0];
  out.count = loss[1];
  for (auto& g : graw) out.grads.push_back(to_f32(g, gt));
  out.logits = to_f32(lraw, dt);
  if (const float cap = float(m.config.final_logit_softcapping); cap > 0)  // Gemma's, as transformers
    for (float& z : out.logits) z = Ops::soft_cap(z, cap);
  if (E > 0) {
    const double rows = double(m.config.num_moe_layers()) * double(T);
    for (int64_t e = 0; e < E; ++e)
      out.aux_loss += double(stats[size_t(e)]) / rows * (double(stats[size_t(E + e)]) / rows);
    out.aux_loss *= double(E);
    out.moe_stats = std::move(stats);
  }
  return out;
}

}  // namespace rp::test
