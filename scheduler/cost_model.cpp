#include "scheduler/cost_model.hpp"

#include "model/fp8_linear.hpp"  // fp8_wgrad_width

#include "kernels/moe_buckets.hpp"  // expected_bucket_count
#include "model/config.hpp"         // config_from_json
#include "model/layer_memory.hpp"
#include "model/model_flops.hpp"  // attended_pairs

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

bool ModelShape::is_moe_layer(int64_t i) const {
  if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end()) return false;
  return (i + 1) % decoder_sparse_step == 0;
}

int64_t ModelShape::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_layers; ++i) n += is_moe_layer(i);
  return n;
}

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
    throw std::invalid_argument(
        fmt::format("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where,
                    num_heads, num_kv_heads));
  if (num_experts < 0) pos("num_experts", num_experts);
  if (num_experts > 0) {
    pos("num_experts_per_tok", experts_per_token);
    pos("moe_intermediate_size", moe_intermediate_size);
    pos("decoder_sparse_step", decoder_sparse_step);
    if (experts_per_token > num_experts)
      throw std::invalid_argument(
          fmt::format("{}: num_experts_per_tok: expected at most num_experts = {}, got {}", where,
                      num_experts, experts_per_token));
  }
  if (num_moe_layers() < num_layers) pos("intermediate_size", intermediate_size);  // some decoder is dense
}

ModelShape model_shape_from_config(const ModelConfig& c) {
  ModelShape m;
  m.vocab_size = c.vocab_size;
  m.hidden_size = c.hidden_size;
  m.intermediate_size = c.intermediate_size;
  m.num_layers = c.num_hidden_layers;
  m.num_heads = c.num_attention_heads;
  m.num_kv_heads = c.num_key_value_heads;
  m.head_dim =
      c.head_dim > 0 ? c.head_dim : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
  m.tie_word_embeddings = c.tie_word_embeddings;
  m.qk_norm = c.qk_norm;
  m.qk_norm_whole = c.qk_norm_whole;
  m.sandwich_norms = c.gemma();
  m.qkv_bias = c.has_qkv_bias();
  m.o_proj_bias = c.attention_bias;
  m.num_experts = c.num_experts;
  m.experts_per_token = c.num_experts_per_tok;
  m.moe_intermediate_size = c.moe_intermediate_size;
  m.decoder_sparse_step = c.decoder_sparse_step;
  m.mlp_only_layers = c.mlp_only_layers;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const int64_t w = c.attention_window(i);
    if (w > 0) {
      m.attention_windows.resize(size_t(c.num_hidden_layers), 0);
      m.attention_windows[size_t(i)] = w;
    }
  }
  return m;
}

ModelShape model_shape_from_hf_json(const nlohmann::json& j, const std::string& where) {
  ModelConfig c;
  try {
    c = config_from_json(j, where);  // the model's one config.json reader
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    throw std::invalid_argument(e.what());
  }
  ModelShape m = model_shape_from_config(c);
  m.validate(where);
  return m;
}

int64_t layer_parameters(const ModelShape& m, int layer, bool active) {
  const int64_t H = m.hidden_size, V = m.vocab_size;
  if (layer < 0 || layer > m.num_layers + 1)
    throw std::invalid_argument(
        fmt::format("layer_parameters: layer {} out of range [0, {}]", layer, m.num_layers + 1));
  if (layer == 0) return V * H;
  if (layer == m.num_layers + 1) return V * H + H;
  const int64_t Q = m.num_heads * m.head_dim, K = m.num_kv_heads * m.head_dim;
  int64_t n = (m.sandwich_norms ? 4 : 2) * H + H * Q + 2 * H * K + Q * H +
              (m.qk_norm ? (m.qk_norm_whole ? Q + K : 2 * m.head_dim) : 0) + (m.qkv_bias ? Q + 2 * K : 0) +
              (m.o_proj_bias ? H : 0);
  if (m.is_moe_layer(layer - 1))  // router [E, H] and the experts' gate, up [Fe, H], down [H, Fe]
    n += H * m.num_experts + (active ? m.experts_per_token : m.num_experts) * 3 * H * m.moe_intermediate_size;
  else n += 3 * H * m.intermediate_size;
  return n;
}

int64_t model_parameters(const ModelShape& m, bool active) {
  int64_t n = 0;
  for (int l = 0; l <= m.num_layers; ++l) n += layer_parameters(m, l, active);
  return n + m.hidden_size +
         (m.tie_word_embeddings ? 0 : m.vocab_size * m.hidden_size);  // final norm, LM head
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
  // The grouped GEMMs of a sparse block: `rows` routed rows split over `experts` experts that
  // each multiply theirs by an [n, k] weight (C_e[rows_e, n] = A_e[rows_e, k] W_e[k, n]); reads
  // the weights of the experts that receive rows; `weight_grad`: the experts' dW instead
  // (A_e^T dC_e, accumulated into grad-dtype gradients).
  void grouped(double rows, double n, double k, double experts, bool weight_grad = false) {
    if (rows <= 0 || n <= 0 || k <= 0 || experts <= 0) return;
    const double used = std::min(experts, rows);  // experts with at least one row (balanced routing)
    const double f = 2 * rows * n * k;
    const double w = (weight_grad ? 2.0 * double(d.grad_elem_bytes) : es()) * used * n * k;
    const double b = es() * (rows * k + rows * n) + w;
    add(f, b, d.peak_flops * (weight_grad ? d.grouped_wgrad_efficiency : d.grouped_gemm_efficiency));
    if (d.expert_padded)  // one batched call per bucket, its host set-up after the block's host wait
      seconds += double(expected_bucket_count(rows, int64_t(used))) * d.bucketed_call_seconds;
  }
  // How an FP8 linear gets its input's codes (model/layers.cpp): its own amax and quantize
  // passes (read A twice, write the codes: the attention output before o_proj, every output
  // gradient), a quantize pass after the producing kernel computed the scale (read A once:
  // the norms' outputs before q and gate, SwiGLU's before down), or the previous linear's
  // codes (k and v reuse q's, up reuses gate's: no pass).
  enum class Quant { separate, scaled, reused };
  // A dense decoder linear's forward or input gradient C[m,n] = A[m,k] B[k,n]: with FP8
  // linears (d.fp8_flops > 0) an e4m3 GEMM of 1-byte operands (the weight's codes come from the
  // per-upload cache) after A's quantization (`q`), at fp8_quant_efficiency of the bandwidth.
  void linear(double m, double n, double k, Quant q = Quant::separate) {
    if (!(d.fp8_flops > 0)) return gemm(m, n, k);
    if (m <= 0 || n <= 0 || k <= 0) return;
    if (q != Quant::reused) {
      const double b = (q == Quant::separate ? 2 : 1) * es() * m * k + m * k;
      add(0, b, d.peak_flops, d.fp8_quant_efficiency);
    }
    add(2 * m * n * k, m * k + k * n + es() * m * n, d.fp8_flops);
  }
  // A dense linear's weight gradient dW[k,n] += A^T dC over m rows: with FP8 weight gradients
  // an e4m3 GEMM into the grad-dtype gradient after the amax and transposed quantization of A
  // (none when `a_reused`: the previous linear read the same A) and dC's transposed codes, one
  // byte each, written in the same pass as the row codes of its input gradient (whose amax and
  // read `linear` counts: Ops::fp8_quantize_both); else gemm's accumulating form.
  // The runtime takes some of these amaxes from the producers instead (the recompute's norms
  // and SwiGLU, SwiGLU's backward: model/layers_backward.cpp), but the model keeps charging
  // them: measured on an H100 that gained Qwen3-1.7B 0.6%, where charging them off predicted
  // 2.9%, so fp8_quant_efficiency (calibrated with them in) already covers them.
  void linear_wgrad(double k, double n, double m, bool a_reused) {
    if (!fp8_wgrad(k)) return gemm(k, n, m, true);
    if (m <= 0 || n <= 0 || k <= 0) return;
    add(0, m * n + (a_reused ? 0 : (2 * es() + 1) * m * k), d.peak_flops, d.fp8_quant_efficiency);
    add(2 * m * n * k, m * (k + n) + 2.0 * double(d.grad_elem_bytes) * k * n, d.fp8_flops);
  }
  // whether a linear of input width k takes its weight gradient in FP8 (the runtime's rule:
  // model/fp8_linear.hpp, fp8_wgrad_width)
  bool fp8_wgrad(double k) const {
    return d.fp8_flops > 0 && d.fp8_weight_gradients && fp8_wgrad_width(int64_t(k));
  }
  void elementwise(double b) { add(0, b, d.peak_flops); }
  void attention(double f, double b) { add(f, b, d.peak_flops * d.attention_efficiency); }
  // bandwidth_share: of mem_bandwidth, what the op's kernels reach
  void add(double f, double b, double rate, double bandwidth_share = 1.0) {
    flops += f;
    bytes += b;
    seconds += std::max(f / rate, b / (d.mem_bandwidth * bandwidth_share));
  }
};

struct Dims {
  double T, S, nseq, H, Q, K, F, V, nq, D, E, k, Fe;
  double W = 0;  ///< sliding window of the current decoder (0: full causal attention)
  bool qk_norm, moe;
  bool frozen = false;                      ///< frozen base weights: the backward computes no weight gradient
  double r = 0;                             ///< LoRA rank of the experts' adapters
  bool lora_gu = false, lora_down = false;  ///< which expert projections carry adapters
};

// The experts' adapters (model/moe_block.hpp) over R routed rows: forward a = xs A^T, then
// a Bg^T, a Bu^T added into g, u (gate_up); a = m Ad^T, a Bd^T added into ys (down).
void expert_lora_forward(Acc& a, const Dims& x) {
  const double es = a.es(), R = x.T * x.k;
  if (x.lora_gu) {
    a.grouped(R, x.r, x.H, x.E);
    for (int i = 0; i < 2; ++i) {
      a.grouped(R, x.Fe, x.r, x.E);
      a.elementwise(3 * R * x.Fe * es);
    }
  }
  if (x.lora_down) {
    a.grouped(R, x.r, x.Fe, x.E);
    a.grouped(R, x.H, x.r, x.E);
    a.elementwise(3 * R * x.H * es);
  }
}

// Their backward: a again, dB += dy^T a, g = s dy B, dA += g^T x, dx += g A (the adapters'
// weight gradients are always computed; the base's never are when frozen).
void expert_lora_backward(Acc& a, const Dims& x) {
  const double es = a.es(), R = x.T * x.k;
  auto proj = [&](double in, double outs, int n_b) {
    a.grouped(R, x.r, in, x.E);       // a
    a.elementwise(4 * R * x.r * es);  // scaled copies of a and g
    for (int i = 0; i < n_b; ++i) {
      a.grouped(R, x.r, outs, x.E, true);  // dB
      a.grouped(R, x.r, outs, x.E);        // g += dy B
    }
    a.grouped(R, in, x.r, x.E, true);  // dA
    a.grouped(R, in, x.r, x.E);        // dx += g A
  };
  if (x.lora_down) proj(x.Fe, x.H, 1);
  if (x.lora_gu) proj(x.H, x.Fe, 2);
}

// Forward of a sparse MLP block (model/moe_block.hpp) on the normed input hn [T,H]: router
// GEMM, softmax and top-k, gather of R = T*k routed rows, the experts' grouped gate / up /
// down GEMMs, SwiGLU, weighted combine back into [T,H].
void moe_forward(Acc& a, const Dims& x) {
  const double es = a.es(), R = x.T * x.k;
  a.gemm(x.T, x.E, x.H);                                // router logits
  a.elementwise(x.T * x.E * (es + 4) + x.T * x.k * 8);  // softmax (fp32 probs), top-k index + weight
  a.elementwise(2 * R * x.H * es);                      // gather xs [R,H]
  a.grouped(R, x.Fe, x.H, x.E);                         // gate
  a.grouped(R, x.Fe, x.H, x.E);                         // up
  a.elementwise(3 * R * x.Fe * es);                     // SwiGLU
  a.grouped(R, x.H, x.Fe, x.E);                         // down
  expert_lora_forward(a, x);
  a.elementwise((R + x.T) * x.H * es);  // weighted combine
}

// Backward of a sparse block (after moe_forward's recompute): combine, the experts' input
// gradients (and their weight gradients unless frozen), scatter-add into dhn, the router.
void moe_backward(Acc& a, const Dims& x) {
  const double es = a.es(), R = x.T * x.k;
  a.elementwise((x.T + 3 * R) * x.H * es);            // dys = w * dy, dw = <ys, dy>
  a.grouped(R, x.Fe, x.H, x.E);                       // dm = dys Wd
  if (!x.frozen) a.grouped(R, x.H, x.Fe, x.E, true);  // dWd
  a.elementwise(5 * R * x.Fe * es);                   // SwiGLU backward
  for (int i = 0; i < 2; ++i) {                       // gate, up
    a.grouped(R, x.H, x.Fe, x.E);                     // dxs += dg Wg (du Wu)
    if (!x.frozen) a.grouped(R, x.Fe, x.H, x.E, true);
  }
  expert_lora_backward(a, x);
  a.elementwise((R + x.T) * x.H * es);         // scatter-add dxs into dhn
  a.elementwise(2 * x.T * x.E * (es + 4));     // softmax / top-k backward: dlogits
  a.gemm(x.T, x.H, x.E);                       // dhn += dlogits W_router
  if (!x.frozen) a.gemm(x.E, x.H, x.T, true);  // dW_router
}

// Forward of one decoder layer (optionally followed by its backward: `bwd`); with
// `reuse_attention` (a saved attention) the forward part leaves out the attention itself.
void decoder_pass(Acc& a, const Dims& x, bool bwd, bool reuse_attention = false) {
  const double es = a.es();
  // forward (also the recompute of a backward)
  a.elementwise(2 * x.T * x.H * es);  // input RMSNorm
  using Q = Acc::Quant;
  a.linear(x.T, x.Q, x.H, Q::scaled);  // q_proj (the norm computed the scale)
  a.linear(x.T, x.K, x.H, Q::reused);  // k_proj (q's codes)
  a.linear(x.T, x.K, x.H, Q::reused);  // v_proj
  if (x.qk_norm) a.elementwise(2 * x.T * (x.Q + x.K) * es);
  a.elementwise(2 * x.T * (x.Q + x.K) * es);                                // RoPE
  const double att_f = 4 * x.nseq * x.nq * x.D * attended_pairs(x.S, x.W);  // QK^T and PV: 2 GEMMs
  if (!reuse_attention) a.attention(att_f, (2 * x.T * x.Q + 2 * x.T * x.K) * es);
  a.linear(x.T, x.H, x.Q);            // o_proj
  a.elementwise(3 * x.T * x.H * es);  // residual
  a.elementwise(2 * x.T * x.H * es);  // post-attention RMSNorm
  if (x.moe) {
    moe_forward(a, x);
  } else {
    a.linear(x.T, x.F, x.H, Q::scaled);  // gate (the norm computed the scale)
    a.linear(x.T, x.F, x.H, Q::reused);  // up (gate's codes)
    a.elementwise(3 * x.T * x.F * es);   // SwiGLU (and the scale of its output)
    a.linear(x.T, x.H, x.F, Q::scaled);  // down
  }
  a.elementwise(3 * x.T * x.H * es);  // residual
  if (!bwd) return;
  // backward: each GEMM C=AB costs dA = dC B^T and dB = A^T dC (accumulated into grads)
  // a_reused: the weight gradient's A was quantized by the previous linear's (model/layers_backward.cpp)
  auto gemm_bwd = [&](double m, double n, double k, bool a_reused = false) {
    a.linear(m, k, n);
    if (!x.frozen) a.linear_wgrad(k, n, m, a_reused);
  };
  a.elementwise(2 * 2 * x.T * x.H * es);  // RMSNorm backward x2 (read x, dy; write dx)
  a.elementwise(2 * 3 * x.T * x.H * es);
  gemm_bwd(x.T, x.Q, x.H);
  gemm_bwd(x.T, x.K, x.H, true);
  gemm_bwd(x.T, x.K, x.H, true);
  if (x.qk_norm) a.elementwise(3 * x.T * (x.Q + x.K) * es);
  a.elementwise(2 * x.T * (x.Q + x.K) * es);                       // RoPE backward
  a.attention(2.5 * att_f, (4 * x.T * x.Q + 4 * x.T * x.K) * es);  // FlashAttention-2 backward
  gemm_bwd(x.T, x.H, x.Q);
  if (x.moe) {
    moe_backward(a, x);
  } else {
    gemm_bwd(x.T, x.F, x.H);
    gemm_bwd(x.T, x.F, x.H, true);  // up: gate's input codes
    a.elementwise(5 * x.T * x.F * es);
    gemm_bwd(x.T, x.H, x.F);
  }
}

// Forward of the tail (final norm + LM head + CE); `bwd` adds the fused backward.
void tail_pass(Acc& a, const Dims& x, bool bwd) {
  const double es = a.es();
  a.elementwise(2 * x.T * x.H * es);  // final RMSNorm
  a.gemm(x.T, x.V, x.H);              // logits, fp32 chunks
  a.elementwise(2 * x.T * x.V * 4);   // logsumexp: write + read fp32 logits
  if (!bwd) return;
  a.elementwise(2 * x.T * x.V * 4);   // dlogits = softmax - onehot
  a.gemm(x.T, x.H, x.V);              // dh = dlogits W
  a.gemm(x.V, x.H, x.T, true);        // dW += dlogits^T h
  a.elementwise(4 * x.T * x.H * es);  // RMSNorm backward
}

}  // namespace

namespace {

void check_device_model(const DeviceModel& d) {
  if (!(d.peak_flops > 0) || !(d.mem_bandwidth > 0) || !(d.attention_efficiency > 0) || d.elem_bytes < 1 ||
      d.grad_elem_bytes < 1 || d.scratch_elem_bytes < 1 || d.pcie_bandwidth < 0 ||
      !(d.grouped_gemm_efficiency > 0) || !(d.grouped_wgrad_efficiency > 0) || !(d.fp8_flops >= 0) ||
      !(d.fp8_quant_efficiency > 0) || !(d.bucketed_call_seconds >= 0))
    throw std::invalid_argument(
        "device model: peak_flops, mem_bandwidth, the attention, grouped GEMM and FP8 "
        "quantization efficiencies and element sizes must be positive, pcie_bandwidth, "
        "fp8_flops and bucketed_call_seconds >= 0");
}

/// The dimensions the passes' FLOP and byte counts use, for a micro-batch of n_seq x seq_len.
Dims dims_of(const ModelShape& m, int64_t n_seq, int64_t seq_len, const DeviceModel& d) {
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
  x.E = double(m.num_experts);
  x.k = double(m.experts_per_token);
  x.Fe = double(m.moe_intermediate_size);
  x.qk_norm = m.qk_norm;
  x.frozen = d.frozen_base;
  x.r = double(d.lora_rank);
  x.lora_gu = d.lora_rank > 0 && d.lora_experts_gate_up;
  x.lora_down = d.lora_rank > 0 && d.lora_experts_down;
  return x;
}

/// A decoder's own device buffers (model/layer_memory.hpp) in its cost: saved attention,
/// scratch, FP8 weight copies and router statistics, with the DecoderDims the layer builds
/// (model/layers.cpp): ffn is intermediate_size also in a sparse layer.
void decoder_memory(LayerCost& c, const ModelShape& m, const DeviceModel& d, const Dims& x, int64_t n_seq,
                    int64_t seq_len) {
  const int64_t T = n_seq * seq_len, H = m.hidden_size, se = d.scratch_elem_bytes;
  DecoderDims dd{H,          m.intermediate_size, m.num_heads,      m.num_kv_heads,
                 m.head_dim, m.qk_norm,           d.saved_attention};
  dd.lora_rank = d.lora_rank;
  dd.lora_dropout = d.lora_dropout;
  dd.frozen_base = d.frozen_base;
  dd.fp8 = d.fp8_flops > 0;
  dd.fp8_wgrad = dd.fp8 && d.fp8_weight_gradients;
  if (x.moe) {
    c.router_stats_bytes = 2 * m.num_experts * 4;
    dd.experts = m.num_experts;
    dd.experts_per_tok = m.experts_per_token;
    dd.expert_padded = d.expert_padded;
    dd.expert_ffn = m.moe_intermediate_size;
    dd.expert_lora = x.lora_gu || x.lora_down;
  }
  if (d.saved_attention) {
    c.attn_o_bytes = int64_t(attention_output_bytes(dd, T, size_t(d.elem_bytes)));
    c.attn_lse_bytes = int64_t(attention_lse_bytes(dd, T));
  }
  c.scratch_bytes = int64_t(decoder_scratch_bytes(dd, n_seq, seq_len, size_t(se), true, d.mlp_chunk_tokens));
  c.scratch_fwd_bytes =
      int64_t(decoder_scratch_bytes(dd, n_seq, seq_len, size_t(se), false, d.mlp_chunk_tokens));
  c.fp8_fwd_bytes = int64_t(fp8_weight_bytes(dd, false));
  c.fp8_bwd_bytes = int64_t(fp8_weight_bytes(dd, true));
}

}  // namespace

std::vector<LayerEstimate> estimate_layers(const ModelShape& m, int64_t n_seq, int64_t seq_len,
                                           const DeviceModel& d) {
  m.validate("model");
  if (n_seq < 1 || seq_len < 1)
    throw std::invalid_argument(
        fmt::format("micro-batch shape must be positive, got {} x {}", n_seq, seq_len));
  check_device_model(d);
  Dims x = dims_of(m, n_seq, seq_len, d);
  const int64_t T = n_seq * seq_len, H = m.hidden_size;
  const int64_t act = T * H * d.elem_bytes, ids = T * 4;

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
      f.elementwise(double(ids) + 2.0 * double(act));                                      // gather rows
      b.elementwise(double(ids) + double(act) + 2.0 * double(T * H * d.grad_elem_bytes));  // scatter-add
    } else if (l == n - 1) {
      e.name = "tail";
      c.io_bytes = ids;
      tail_pass(f, x, false);
      tail_pass(b, x, true);
      c.scratch_bytes = int64_t(tail_scratch_bytes(T, H, m.vocab_size, size_t(d.scratch_elem_bytes)));
      c.scratch_fwd_bytes = c.scratch_bytes;
    } else {
      e.name = fmt::format("layer.{}", l - 1);
      x.moe = m.is_moe_layer(l - 1);
      x.W = double(m.attention_window(l - 1));
      decoder_pass(f, x, false);
      decoder_pass(b, x, true, d.saved_attention);
      decoder_memory(c, m, d, x, n_seq, seq_len);
    }
    e.fwd_flops = f.flops;
    e.fwd_bytes = f.bytes;
    e.bwd_flops = b.flops;
    e.bwd_bytes = b.bytes;
    c.fwd = f.seconds;
    c.bwd = b.seconds;
    if (l == n - 1) c.tail = b.seconds;  // fused forward + loss + backward, nothing recomputed
    else c.tail = d.tail_recomputes ? f.seconds + b.seconds : b.seconds;
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
  // the entries of a validated LoraConfig::target_parameters (model/lora.hpp), without its code
  auto names = [&](const char* p) {
    if (!m.lora) return false;
    for (const std::string& t : m.lora->target_parameters)
      if (t == p || t == std::string("mlp.experts.") + p) return true;
    return false;
  };
  d.lora_experts_gate_up = names("gate_up_proj");
  d.lora_experts_down = names("down_proj");
}

void apply_frozen_groups(std::vector<LayerCost>& costs, const ModelLayout& m, DType compute,
                         int64_t grad_elem_bytes) {
  const auto elem_bytes = int64_t(dtype_size(compute));
  if (int(costs.size()) != m.num_layers())
    throw std::invalid_argument(fmt::format("apply_frozen_groups: {} layer costs for a model of {} layers",
                                            costs.size(), m.num_layers()));
  for (int l = 0; l < m.num_layers(); ++l) {
    const std::vector<int> groups = m.groups_of(l);
    if (std::none_of(groups.begin(), groups.end(), [&](int g) { return m.groups[size_t(g)].frozen; }))
      continue;
    LayerCost& c = costs[size_t(l)];
    c.weight_bytes = c.grad_bytes = c.frozen_weight_bytes = c.staging_bytes = 0;
    for (int g : groups) {
      const ParamGroup& grp = m.groups[size_t(g)];
      c.weight_bytes += grp.numel * elem_bytes;
      if (grp.frozen) {  // its direct prefix lands in the weights as it is; the rest is staged
        const int64_t direct = grp.direct_bytes(compute);
        c.frozen_weight_bytes += grp.numel * elem_bytes - direct;
        c.staging_bytes += grp.storage_bytes - direct;
      } else {
        c.grad_bytes += grp.numel * grad_elem_bytes;
      }
    }
  }
}

}  // namespace rp
