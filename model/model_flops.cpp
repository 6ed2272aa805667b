#include "model/model_flops.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace rp {

double attended_pairs(double seq_len, double window) {
  const double S = seq_len, W = window;
  if (W <= 0 || W >= S) return S * S / 2;
  return W * W / 2 + (S - W) * W;
}

ModelFlops model_flops(const ModelLayout& m, int64_t seq_len) {
  if (seq_len < 1)
    throw std::invalid_argument(fmt::format("model_flops: seq_len must be >= 1, got {}", seq_len));
  const ModelConfig& c = m.config;
  const double H = double(c.hidden_size), nq = double(c.num_attention_heads);
  const double D = double(
      c.head_dim > 0 ? c.head_dim : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0));
  const double Q = nq * D, K = double(c.num_key_value_heads) * D, S = double(seq_len);
  const int64_t L = c.num_hidden_layers;
  auto frozen = [&](int64_t g) {
    return g >= 0 && size_t(g) < m.groups.size() && m.groups[size_t(g)].frozen;
  };
  ModelFlops f;
  auto add = [&f](double params, bool is_frozen) {
    (is_frozen ? f.frozen_matmul_params : f.trained_matmul_params) += params;
  };
  for (int64_t i = 0; i < L; ++i) {
    const double attention_params = 2 * H * Q + 2 * H * K;  // q, o; k, v
    const double mlp_params =
        c.is_moe_layer(i) ? H * double(c.num_experts) +  // router, top-k experts
                                double(c.num_experts_per_tok) * 3 * H * double(c.moe_intermediate_size)
                          : 3 * H * double(c.intermediate_size);
    add(attention_params + mlp_params, frozen(i + 1));  // decoder i's base group
    f.attention += 12 * nq * D * attended_pairs(S, double(c.attention_window(i))) / S;
  }
  add(double(c.vocab_size) * H, frozen(c.tie_word_embeddings ? 0 : L + 1));  // the LM head
  return f;
}

double model_flops_per_token(const ModelLayout& m, int64_t seq_len) {
  return model_flops(m, seq_len).per_token();
}

}  // namespace rp
