#include "actors/pass_buffers.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace rp {

HostBytes::HostBytes(size_t bytes) : n_(bytes) {
  size_t sz = (std::max<size_t>(bytes, 1) + 4095) & ~size_t(4095);
  p_ = std::aligned_alloc(4096, sz);
  if (!p_) throw std::bad_alloc();
  std::memset(p_, 0, sz);
}
HostBytes::HostBytes(HostBytes&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
}
HostBytes& HostBytes::operator=(HostBytes&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  return *this;
}
HostBytes::~HostBytes() { std::free(p_); }

ParamStore::ParamStore(const ModelLayout& m, DType compute_dtype, bool allocate_frozen)
    : dtype(compute_dtype) {
  for (auto& g : m.groups) {
    numel.push_back(g.numel);
    frozen.push_back(g.frozen ? 1 : 0);
    if (g.frozen) {  // its storage form, uploaded as is; no gradient slot
      lowp.emplace_back(allocate_frozen ? HostBytes(size_t(g.storage_bytes)) : HostBytes());
      grad.emplace_back();
      continue;
    }
    lowp.emplace_back(size_t(g.numel) * dtype_size(dtype));
    grad.emplace_back(size_t(g.numel) * sizeof(float));
  }
}

PassBuffers::PassBuffers(const ModelLayout& m, const IterationPlan& p, int64_t M, const MicroBatchShape& s,
                         DType dtype, std::shared_ptr<PassActivations> shared, bool saved_attention,
                         const std::vector<char>& spilled)
    : micro_batches(M),
      shape(s),
      activations(shared ? std::move(shared) : std::make_shared<PassActivations>()),
      x(activations->x),
      dx(activations->dx) {
  const size_t T = size_t(s.tokens());
  act_bytes = T * size_t(m.config.hidden_size) * dtype_size(dtype);
  for (int64_t i = 0; i < M; ++i) {
    ids.emplace_back(T * 4);
    targets.emplace_back(T * 4);
    positions.emplace_back(T * 4);
  }
  const int L = p.num_layers;
  if (x.empty()) {
    x.resize(L);
    for (int b = 1; b < L; ++b) {
      const bool on_disk = size_t(b) < spilled.size() && spilled[size_t(b)];
      for (int64_t i = 0; i < M; ++i) x[b].emplace_back(on_disk ? HostBytes() : HostBytes(act_bytes));
    }
    if (saved_attention) {
      const auto& c = m.config;
      const size_t o_bytes = T * size_t(c.num_attention_heads * c.head_dim) * dtype_size(dtype);
      const size_t lse_bytes = T * size_t(c.num_attention_heads) * sizeof(float);
      activations->attn_o.resize(L);
      activations->attn_lse.resize(L);
      for (int b = 1; b + 1 < L; ++b)
        for (int64_t i = 0; i < M; ++i) {
          activations->attn_o[b].emplace_back(o_bytes);
          activations->attn_lse[b].emplace_back(lse_bytes);
        }
    }
  }
  ensure_boundaries(p, {});
  loss.assign(size_t(2 * M), 0.f);
  experts = m.config.num_moe_layers() > 0 ? m.config.num_experts : 0;
  moe_stats.assign(size_t(2 * experts * M), 0.f);
  target_tokens.assign(size_t(M), 0.f);
  rope_length.assign(size_t(M), 0);
}

void PassBuffers::ensure_boundaries(const IterationPlan& p, const std::function<void(HostBytes&)>& on_new) {
  // A stage whose lowest layer is a > 0 (tail or backward) hands d loss / d x_a on, into the
  // set of its place in the chain (tail first, then the backward stages as they run).
  int writers = 0;
  for (auto& st : p.stages) writers += st.kind != StageKind::forward && st.first > 0;
  while (dx.size() < size_t(std::min(writers, 2))) {
    dx.emplace_back();
    for (int64_t i = 0; i < micro_batches; ++i) {
      dx.back().emplace_back(act_bytes);
      if (on_new) on_new(dx.back().back());
    }
  }
}

}  // namespace rp
