#include "scheduler/cost_model.hpp"

#include "model/layer_memory.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace rp {

void ModelShape::validate(const std::string& where) const {
  auto pos = [&](const char* k, int64_t v) {
    if (v <= 0) throw std::invalid_argument(fmt::format("{}: {}: expected > 0, got {}", where, k, v));
  };
  pos("vocab_size", vocab_size);
  pos("hidden_size", hidden_size);
  pos("num_hidden_layers", num_layers);
  pos("num_attention_heads", num_heads);
  pos("num_key_value_heads", num_kv_heads);
  pos("head_dim", head_dim);
  if (num_heads % num_kv_heads != 0)
    throw std::invalid_argument(fmt::format("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                                            where, num_heads, num_kv_heads));
  if (num_experts > 0) {
    pos("num_experts_per_tok", experts_per_token);
    pos("moe_intermediate_size", moe_intermediate_size);
    if (experts_per_token > num_experts)
      throw std::invalid_argument(fmt::format("{}: num_experts_per_tok {} exceeds num_experts {}", where,
                                              experts_per_token, num_experts));
  } else {
    pos("intermediate_size", intermediate_size);
  }
}

ModelShape model_shape_from_config(const ModelConfig& c) {
  ModelShape m;
  m.vocab_size = c.vocab_size;
  m.hidden_size = c.hidden_size;
  m.intermediate_size = c.intermediate_size;
  m.num_layers = c.num_hidden_layers;
  m.num_heads = c.num_attention_heads;
  m.num_kv_heads = c.num_key_value_heads;
  m.head_dim = c.head_dim > 0 ? c.head_dim
                              : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
  m.tie_word_embeddings = c.tie_word_embeddings;
  m.qk_norm = c.qk_norm;
  return m;
}

ModelShape model_shape_from_hf_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw std::invalid_argument(where + ": expected a JSON object");
  auto get = [&](const char* k, int64_t dflt, bool required) -> int64_t {
    if (!j.contains(k) || j[k].is_null()) {
      if (required) throw std::invalid_argument(fmt::format("{}: key '{}': missing", where, k));
      return dflt;
    }
    if (!j[k].is_number_integer())
      throw std::invalid_argument(fmt::format("{}: key '{}': expected an integer, got {}", where, k, j[k].dump()));
    return j[k].get<int64_t>();
  };
  ModelShape m;
  m.vocab_size = get("vocab_size", 0, true);
  m.hidden_size = get("hidden_size", 0, true);
  m.num_layers = get("num_hidden_layers", 0, true);
  m.num_heads = get("num_attention_heads", 0, true);
  m.num_kv_heads = get("num_key_value_heads", m.num_heads, false);
  m.head_dim = get("head_dim", m.num_heads > 0 ? m.hidden_size / m.num_heads : 0, false);
  m.num_experts = get("num_experts", 0, false);
  m.experts_per_token = get("num_experts_per_tok", 0, false);
  m.moe_intermediate_size = get("moe_intermediate_size", 0, false);
  m.intermediate_size = get("intermediate_size", 0, m.num_experts == 0);
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean())
    m.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  std::string type = j.value("model_type", std::string());
  m.qk_norm = type.rfind("qwen3", 0) == 0;
  m.validate(where);
  return m;
}

int64_t layer_parameters(const ModelShape& m, int layer) {
  const int64_t H = m.hidden_size, V = m.vocab_size;
  if (layer == 0) return V * H;
  if (layer == m.num_layers + 1) return V * H + H;
  if (layer < 0 || layer > m.num_layers + 1)
    throw std::invalid_argument(fmt::format("layer_parameters: layer {} out of range [0, {}]", layer,
                                            m.num_layers + 1));
  const int64_t Q = m.num_heads * m.head_dim, K = m.num_kv_heads * m.head_dim;
  int64_t n = 2 * H + H * Q + 2 * H * K + Q * H + (m.qk_norm ? 2 * m.head_dim : 0);
  if (m.num_experts > 0)
    n += m.num_experts * 3 * H * m.moe_intermediate_size + H * m.num_experts;
  else
    n += 3 * H * m.intermediate_size;
  return n;
}

namespace {

// Running totals of one pass of one layer: each op adds its roofline time.
struct Acc {
  const DeviceModel& d;
  double flops = 0, bytes = 0, seconds = 0;
  double es() const { return double(d.elem_bytes); }
  // C[m,n] = A[m,k] B[k,n]; optionally accumulating into a grad-dtype output.
  void gemm(double m, double n, double k, bool accumulate_grad = false) {
    if (m <= 0 || n <= 0 || k <= 0) return;
    double f = 2 * m * n * k;
    double b = es() * (m * k + k * n) + (accumulate_grad ? 2.0 * double(d.grad_elem_bytes) : es()) * m * n;
    add(f, b, d.peak_flops);
  }
  void elementwise(double b) { add(0, b, d.peak_flops); }
  void attention(double f, double b) { add(f, b, d.peak_flops * d.attention_efficiency); }
  void add(double f, double b, double rate) {
    flops += f;
    bytes += b;
    seconds += std::max(f / rate, b / d.mem_bandwidth);
  }
};

struct Dims {
  double T, S, nseq, H, Q, K, F, V, nq, D, E, k, Fe;
  bool qk_norm, moe;
  bool frozen = false;  ///< frozen base weights: the backward computes no weight gradient
};

// Forward of one decoder layer (optionally followed by its backward: `bwd`); with
// `reuse_attention` (a saved attention) the forward part leaves out the attention itself.
void decoder_pass(Acc& a, const Dims& x, bool bwd, bool reuse_attention = false) {
  const double es = a.es();
  // forward (also the recompute of a backward)
  a.elementwise(2 * x.T * x.H * es);                  // input RMSNorm
  a.gemm(x.T, x.Q, x.H);                              // q_proj
  a.gemm(x.T, x.K, x.H);                              // k_proj
  a.gemm(x.T, x.K, x.H);                              // v_proj
  if (x.qk_norm) a.elementwise(2 * x.T * (x.Q + x.K) * es);
  a.elementwise(2 * x.T * (x.Q + x.K) * es);          // RoPE
  const double att_f = 2 * x.nseq * x.nq * x.S * x.S * x.D;  // causal: half of 4*n*nq*S^2*D
  if (!reuse_attention) a.attention(att_f, (2 * x.T * x.Q + 2 * x.T * x.K) * es);
  a.gemm(x.T, x.H, x.Q);                              // o_proj
  a.elementwise(3 * x.T * x.H * es);                  // residual
  a.elementwise(2 * x.T * x.H * es);                  // post-attention RMSNorm
  if (x.moe) {
    a.gemm(x.T, x.E, x.H);                            // router
    a.elementwise(2 * x.T * x.k * x.H * es);          // gather / scatter of routed tokens
    const double te = x.T * x.k / x.E;                // tokens per expert (balanced routing)
    for (int i = 0; i < 3; ++i)  // gate, up, down of every expert: all expert weights are read
      a.add(x.E * 2 * te * x.Fe * x.H, x.E * es * (te * x.H + x.H * x.Fe + te * x.Fe), a.d.peak_flops);
    a.elementwise(3 * x.T * x.k * x.Fe * es);         // SwiGLU
  } else {
    a.gemm(x.T, x.F, x.H);                            // gate
    a.gemm(x.T, x.F, x.H);                            // up
    a.elementwise(3 * x.T * x.F * es);                // SwiGLU
    a.gemm(x.T, x.H, x.F);                            // down
  }
  a.elementwise(3 * x.T * x.H * es);                  // residual
  if (!bwd) return;
  // backward: each GEMM C=AB costs dA = dC B^T and dB = A^T dC (accumulated into grads)
  auto gemm_bwd = [&](double m, double n, double k) {
    a.gemm(m, k, n);
    if (!x.frozen) a.gemm(k, n, m, true);
  };
  a.elementwise(2 * 2 * x.T * x.H * es);              // RMSNorm backward x2 (read x, dy; write dx)
  a.elementwise(2 * 3 * x.T * x.H * es);
  gemm_bwd(x.T, x.Q, x.H);
  gemm_bwd(x.T, x.K, x.H);
  gemm_bwd(x.T, x.K, x.H);
  if (x.qk_norm) a.elementwise(3 * x.T * (x.Q + x.K) * es);
  a.elementwise(2 * x.T * (x.Q + x.K) * es);          // RoPE backward
  a.attention(2.5 * att_f, (4 * x.T * x.Q + 4 * x.T * x.K) * es);  // FlashAttention-2 backward
  gemm_bwd(x.T, x.H, x.Q);
  if (x.moe) {
    gemm_bwd(x.T, x.E, x.H);
    a.elementwise(4 * x.T * x.k * x.H * es);
    const double te = x.T * x.k / x.E;
    // per expert and projection: dX (reads the weight) and dW (read-modify-writes its gradient)
    const double gb = 2.0 * double(a.d.grad_elem_bytes);
    for (int i = 0; i < 6; ++i)
      a.add(x.E * 2 * te * x.Fe * x.H, x.E * (es * (te * x.H + te * x.Fe) + (i % 2 ? gb : es) * x.H * x.Fe),
            a.d.peak_flops);
    a.elementwise(5 * x.T * x.k * x.Fe * es);         // SwiGLU backward
  } else {
    gemm_bwd(x.T, x.F, x.H);
    gemm_bwd(x.T, x.F, x.H);
    a.elementwise(5 * x.T * x.F * es);
    gemm_bwd(x.T, x.H, x.F);
  }
}

// Forward of the tail (final norm + LM head + CE); `bwd` adds the fused backward.
void tail_pass(Acc& a, const Dims& x, bool bwd) {
  const double es = a.es();
  a.elementwise(2 * x.T * x.H * es);                  // final RMSNorm
  a.gemm(x.T, x.V, x.H);                              // logits, fp32 chunks
  a.elementwise(2 * x.T * x.V * 4);                   // logsumexp: write + read fp32 logits
  if (!bwd) return;
  a.elementwise(2 * x.T * x.V * 4);                   // dlogits = softmax - onehot
  a.gemm(x.T, x.H, x.V);                              // dh = dlogits W
  a.gemm(x.V, x.H, x.T, true);                        // dW += dlogits^T h
  a.elementwise(4 * x.T * x.H * es);                  // RMSNorm backward
}

}  // namespace

std::vector<LayerEstimate> estimate_layers(const ModelShape& m, int64_t n_seq, int64_t seq_len,
                                           const DeviceModel& d) {
  m.validate("model");
  if (n_seq < 1 || seq_len < 1)
    throw std::invalid_argument(fmt::format("micro-batch shape must be positive, got {} x {}", n_seq, seq_len));
  if (!(d.peak_flops > 0) || !(d.mem_bandwidth > 0) || !(d.attention_efficiency > 0) || d.elem_bytes < 1 ||
      d.grad_elem_bytes < 1 || d.scratch_elem_bytes < 1 || d.pcie_bandwidth < 0)
    throw std::invalid_argument("device model: peak_flops, mem_bandwidth, attention_efficiency and element "
                                "sizes must be positive, pcie_bandwidth >= 0");
  Dims x{};
  x.nseq = double(n_seq);
  x.S = double(seq_len);
  x.T = x.nseq * x.S;
  x.H = double(m.hidden_size);
  x.nq = double(m.num_heads);
  x.D = double(m.head_dim);
  x.Q = x.nq * x.D;
  x.K = double(m.num_kv_heads) * x.D;
  x.F = double(m.intermediate_size);
  x.V = double(m.vocab_size);
  x.moe = m.num_experts > 0;
  x.E = double(m.num_experts);
  x.k = double(m.experts_per_token);
  x.Fe = double(m.moe_intermediate_size);
  x.qk_norm = m.qk_norm;
  x.frozen = d.frozen_base;
  const int64_t T = n_seq * seq_len, H = m.hidden_size;
  const int64_t act = T * H * d.elem_bytes, ids = T * 4;
  const int64_t se = d.scratch_elem_bytes;

  std::vector<LayerEstimate> out;
  const int n = int(m.num_layers) + 2;
  out.reserve(size_t(n));
  for (int l = 0; l < n; ++l) {
    LayerEstimate e;
    LayerCost& c = e.cost;
    const int64_t params = layer_parameters(m, l);
    c.weight_bytes = params * d.elem_bytes;
    c.grad_bytes = params * d.grad_elem_bytes;
    c.act_bytes = act;
    Acc f{d}, b{d};
    if (l == 0) {
      e.name = "embedding";
      c.io_bytes = ids;
      f.elementwise(double(ids) + 2.0 * double(act));  // gather rows
      b.elementwise(double(ids) + double(act) + 2.0 * double(T * H * d.grad_elem_bytes));  // scatter-add
    } else if (l == n - 1) {
      e.name = "tail";
      c.io_bytes = ids;
      tail_pass(f, x, false);
      tail_pass(b, x, true);
      c.scratch_bytes = int64_t(tail_scratch_bytes(T, H, m.vocab_size, size_t(se)));
      c.scratch_fwd_bytes = c.scratch_bytes;
    } else {
      e.name = fmt::format("layer.{}", l - 1);
      decoder_pass(f, x, false);
      decoder_pass(b, x, true, d.saved_attention);
      // the decoder's own buffers (model/layer_memory.hpp); an MoE layer's expert MLP is sized
      // as a dense MLP of top-k expert widths plus the routed copies and router logits
      DecoderDims dd{H, m.intermediate_size, m.num_heads, m.num_kv_heads, m.head_dim, m.qk_norm, d.saved_attention};
      dd.lora_rank = d.lora_rank;
      dd.lora_dropout = d.lora_dropout;
      dd.frozen_base = d.frozen_base;
      if (d.saved_attention) {
        c.attn_o_bytes = int64_t(attention_output_bytes(dd, T, size_t(d.elem_bytes)));
        c.attn_lse_bytes = int64_t(attention_lse_bytes(dd, T));
      }
      int64_t extra = 0;
      if (x.moe) {
        dd.ffn = m.experts_per_token * m.moe_intermediate_size;
        extra = (2 * T * m.experts_per_token * H) * se + T * m.num_experts * 4;
      }
      c.scratch_bytes = int64_t(decoder_scratch_bytes(dd, n_seq, seq_len, size_t(se), true, d.mlp_chunk_tokens)) + extra;
      c.scratch_fwd_bytes =
          int64_t(decoder_scratch_bytes(dd, n_seq, seq_len, size_t(se), false, d.mlp_chunk_tokens)) + extra;
    }
    e.fwd_flops = f.flops;
    e.fwd_bytes = f.bytes;
    e.bwd_flops = b.flops;
    e.bwd_bytes = b.bytes;
    c.fwd = f.seconds;
    c.bwd = b.seconds;
    if (l == n - 1)
      c.tail = b.seconds;  // fused forward + loss + backward, nothing recomputed
    else
      c.tail = d.tail_recomputes ? f.seconds + b.seconds : b.seconds;
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<LayerCost> layer_costs(const std::vector<LayerEstimate>& e) {
  std::vector<LayerCost> c;
  c.reserve(e.size());
  for (auto& x : e) c.push_back(x.cost);
  return c;
}

void lora_device_model(DeviceModel& d, const ModelLayout& m) {
  d.lora_rank = m.lora ? m.lora->r : 0;
  d.lora_dropout = m.lora && m.lora->dropout > 0;
  d.frozen_base = m.config.num_hidden_layers > 0 && m.groups.size() > 1 && m.groups[1].frozen;
}

void apply_frozen_groups(std::vector<LayerCost>& costs, const ModelLayout& m, int64_t elem_bytes,
                         int64_t grad_elem_bytes) {
  if (int(costs.size()) != m.num_layers())
    throw std::invalid_argument(
        fmt::format("apply_frozen_groups: {} layer costs for a model of {} layers", costs.size(), m.num_layers()));
  for (int l = 0; l < m.num_layers(); ++l) {
    const std::vector<int> groups = m.groups_of(l);
    if (std::none_of(groups.begin(), groups.end(), [&](int g) { return m.groups[size_t(g)].frozen; })) continue;
    LayerCost& c = costs[size_t(l)];
    c.weight_bytes = c.grad_bytes = c.frozen_weight_bytes = c.staging_bytes = 0;
    for (int g : groups) {
      const ParamGroup& grp = m.groups[size_t(g)];
      c.weight_bytes += grp.numel * elem_bytes;
      if (grp.frozen) {
        c.frozen_weight_bytes += grp.numel * elem_bytes;
        c.staging_bytes += grp.storage_bytes;
      } else {
        c.grad_bytes += grp.numel * grad_elem_bytes;
      }
    }
  }
}

}  // namespace rp
