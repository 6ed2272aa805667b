// GGUF -> Hugging Face: tensor names, llama.cpp's q/k row permutation and the ModelConfig of
// "llama", "qwen2", "qwen3", "qwen3moe" and "gpt-oss" files (GPT-OSS's own keys:
// formats/gguf_gpt_oss.cpp; the container itself is read by formats/gguf.cpp).
#include "formats/gguf.hpp"
#include "model/error_text.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

namespace {

/// "blk.<i>.<rest>": sets `layer` ("model.layers.<i>.", leading zeros dropped) and `rest`.
bool split_block_name(const std::string& n, std::string& layer, std::string& rest) {
  if (n.rfind("blk.", 0) != 0) return false;
  const size_t dot = n.find('.', 4);
  if (dot == std::string::npos || dot == 4) return false;
  const std::string idx = n.substr(4, dot - 4);
  if (idx.size() > 6 || idx.find_first_not_of("0123456789") != std::string::npos) return false;
  layer = "model.layers." + std::to_string(std::stoll(idx)) + ".";
  rest = n.substr(dot + 1);
  return true;
}

using NamePair = std::pair<const char*, const char*>;  // {GGUF name, Hugging Face name}

constexpr NamePair kTop[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
// inside "blk.<i>." / "model.layers.<i>."
constexpr NamePair kBlock[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},  // the router of a sparse layer
};
// "gpt-oss" and "qwen2" files: the q/k/v projections' biases
constexpr NamePair kQkvBias[] = {
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
};
// "gpt-oss" files: o_proj's bias, sinks, its name of the second norm; GptOssForCausalLM
// calls its router mlp.router (looked up before kBlock)
constexpr NamePair kGptOss[] = {
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_sinks.weight", "self_attn.sinks"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate_inp.weight", "mlp.router.weight"},
    {"ffn_gate_inp.bias", "mlp.router.bias"},
};
// stacked experts: {GGUF name in the block, suffix of the per-expert Hugging Face name}
constexpr NamePair kExperts[] = {
    {"ffn_gate_exps.weight", ".gate_proj.weight"},
    {"ffn_up_exps.weight", ".up_proj.weight"},
    {"ffn_down_exps.weight", ".down_proj.weight"},
    {"ffn_gate_exps.bias", ".gate_proj.bias"},  // GPT-OSS's expert biases, [E, F] / [E, H]
    {"ffn_up_exps.bias", ".up_proj.bias"},
    {"ffn_down_exps.bias", ".down_proj.bias"},
    // llama.cpp's fused gate and up stacks (convert_hf_to_gguf.py --fuse-gate-up-exps):
    // [E, 2F, H] / [E, 2F], each expert's gate rows first, then its up rows
    {"ffn_gate_up_exps.weight", ".gate_up_proj.weight"},
    {"ffn_gate_up_exps.bias", ".gate_up_proj.bias"},
};

}  // namespace

std::string gguf_to_hf_name(const std::string& n, const std::string& arch) {
  for (auto [g, h] : kTop)
    if (n == g) return h;
  std::string layer, rest;
  if (!split_block_name(n, layer, rest)) return "";
  if (arch == "gpt-oss" || arch == "qwen2")
    for (auto [g, h] : kQkvBias)
      if (rest == g) return layer + h;
  if (arch == "gpt-oss")
    for (auto [g, h] : kGptOss)
      if (rest == g) return layer + h;
  for (auto [g, h] : kBlock)
    if (rest == g) return layer + h;
  return "";
}

std::string hf_to_gguf_name(const std::string& hf, const std::string& arch) {
  for (auto [g, h] : kTop)
    if (hf == h) return g;
  const std::string pre = "model.layers.";
  if (hf.rfind(pre, 0) != 0) return "";
  const size_t dot = hf.find('.', pre.size());
  if (dot == std::string::npos) return "";
  const std::string blk = "blk." + hf.substr(pre.size(), dot - pre.size()) + ".";
  const std::string rest = hf.substr(dot + 1);
  const std::string ex = "mlp.experts.";
  if (rest.rfind(ex, 0) == 0) {  // mlp.experts.<e><suffix>
    const size_t d2 = rest.find('.', ex.size());
    if (d2 != std::string::npos)
      for (auto [g, h] : kExperts)
        if (rest.compare(d2, std::string::npos, h) == 0) return blk + g;
    return "";
  }
  if (arch == "gpt-oss" || arch == "qwen2")
    for (auto [g, h] : kQkvBias)
      if (rest == h) return blk + g;
  if (arch == "gpt-oss")
    for (auto [g, h] : kGptOss)
      if (rest == h) return blk + g;
  for (auto [g, h] : kBlock)
    if (rest == h) return blk + g;
  return "";
}

bool gguf_expert_stack_name(const std::string& n, std::string& prefix, std::string& suffix) {
  std::string layer, rest;
  if (!split_block_name(n, layer, rest)) return false;
  for (auto [g, h] : kExperts)
    if (rest == g) {
      prefix = layer + "mlp.experts.";
      suffix = h;
      return true;
    }
  return false;
}

void unpermute_qk_row_bytes(uint8_t* w, int64_t rows, size_t row_bytes, int64_t n_head) {
  if (n_head <= 0 || rows % (2 * n_head) != 0)
    throw std::invalid_argument(
        fmt::format("unpermute_qk_rows: {} rows is not a multiple of 2*n_head ({})", rows, 2 * n_head));
  const int64_t hd = rows / n_head, half_hd = hd / 2;
  std::vector<uint8_t> tmp(size_t(hd) * row_bytes);
  for (int64_t h = 0; h < n_head; ++h) {
    uint8_t* head = w + size_t(h * hd) * row_bytes;
    std::memcpy(tmp.data(), head, tmp.size());
    for (int64_t i = 0; i < half_hd; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(head + size_t(j * half_hd + i) * row_bytes, tmp.data() + size_t(2 * i + j) * row_bytes,
                    row_bytes);
  }
}

void unpermute_qk_rows(float* w, int64_t rows, int64_t cols, int64_t n_head) {
  unpermute_qk_row_bytes(reinterpret_cast<uint8_t*>(w), rows, size_t(cols) * sizeof(float), n_head);
}

void gguf_expert_counts(const GgufFile& f, const std::string& p, ModelConfig& c) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw std::runtime_error(one_line(fmt::format("{}: metadata '{}{}': {}", f.path(), p, key, what)));
  };
  c.num_experts = f.get_int(p + "expert_count");
  if (c.num_experts < 1 || c.num_experts > (int64_t(1) << 20))
    fail("expert_count", fmt::format("expected an integer in [1, 2^20], got {}", c.num_experts));
  c.num_experts_per_tok = f.get_int(p + "expert_used_count");
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts)
    fail("expert_used_count", fmt::format("expected an integer in [1, expert_count = {}], got {}",
                                          c.num_experts, c.num_experts_per_tok));
}

namespace {

/// The sparse-block fields of a "qwen3moe" GGUF (llama.cpp's llama_model_qwen3moe and
/// convert_hf_to_gguf.py's Qwen3MoeModel / Qwen2MoeModel): `p` = "qwen3moe.".
void moe_config_from_gguf(const GgufFile& f, const std::string& p, ModelConfig& c) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw std::runtime_error(one_line(fmt::format("{}: metadata '{}{}': {}", f.path(), p, key, what)));
  };
  gguf_expert_counts(f, p, c);
  if (f.has(p + "expert_feed_forward_length")) {
    c.moe_intermediate_size = f.get_int(p + "expert_feed_forward_length");
  } else if (c.intermediate_size > 0) {  // llama.cpp's fallback for files without the key
    c.moe_intermediate_size = c.intermediate_size / c.num_experts_per_tok;
  } else {
    fail("expert_feed_forward_length", "missing (and no feed_forward_length to derive it from)");
  }
  if (c.moe_intermediate_size < 1)
    fail("expert_feed_forward_length",
         fmt::format("expected an integer >= 1, got {}", c.moe_intermediate_size));
  // llama.cpp's qwen3moe graph calls build_moe_ffn with softmax gating and norm_w = true: the
  // top-k probabilities are always renormalised to sum 1, whatever norm_topk_prob the Hugging
  // Face config had (Qwen3-MoE releases set it true). Keys that would say otherwise are refused.
  c.norm_topk_prob = true;
  if (f.has(p + "expert_weights_norm") && f.get(p + "expert_weights_norm") != true)
    fail("expert_weights_norm", "qwen3moe always renormalises the top-k expert weights; expected true");
  if (f.has(p + "expert_gating_func") && f.get_int(p + "expert_gating_func") != 1)
    fail("expert_gating_func",
         fmt::format("expected 1 (softmax), got {}", f.get_int(p + "expert_gating_func")));
  if (f.has(p + "expert_weights_scale")) {
    const double s = f.get_float(p + "expert_weights_scale");
    if (s != 0.0 && s != 1.0) fail("expert_weights_scale", fmt::format("expected 1 (no scaling), got {}", s));
  }
  if (f.has(p + "expert_shared_count") && f.get_int(p + "expert_shared_count") != 0)
    fail("expert_shared_count", "shared experts are not part of Qwen3-MoE; expected 0");
  c.decoder_sparse_step = 1;  // every layer sparse: llama.cpp's qwen3moe has no dense layers
  c.mlp_only_layers.clear();
  // Training-only settings GGUF does not carry: transformers' Qwen3MoeConfig defaults (the
  // load-balancing loss stays off unless output_router_logits is switched on).
  c.router_aux_loss_coef = 0.001;
  c.output_router_logits = false;
}

}  // namespace

ModelConfig config_from_gguf(const GgufFile& f) {
  auto fail = [&](const std::string& what) -> void {
    throw std::runtime_error(one_line(fmt::format("{}: {}", f.path(), what)));
  };
  ModelConfig c;
  const std::string arch = f.get_string("general.architecture");
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "qwen3moe" && arch != "gpt-oss")
    fail(fmt::format("general.architecture '{}' is not supported (llama, qwen2, qwen3, qwen3moe, gpt-oss)",
                     arch));
  const bool moe = arch == "qwen3moe", oss = arch == "gpt-oss";
  c.architecture = moe ? "qwen3_moe" : oss ? "gpt_oss" : arch;
  const std::string p = arch + ".";
  auto opt_int = [&](const std::string& k, int64_t def) { return f.has(k) ? f.get_int(k) : def; };
  auto opt_float = [&](const std::string& k, double def) { return f.has(k) ? f.get_float(k) : def; };
  c.num_hidden_layers = f.get_int(p + "block_count");
  c.hidden_size = f.get_int(p + "embedding_length");
  // every qwen3moe / gpt-oss layer is sparse: the dense width is unused and may be absent
  c.intermediate_size =
      moe || oss ? opt_int(p + "feed_forward_length", 0) : f.get_int(p + "feed_forward_length");
  if (moe) moe_config_from_gguf(f, p, c);
  c.num_attention_heads = f.get_int(p + "attention.head_count");
  c.num_key_value_heads = opt_int(p + "attention.head_count_kv", c.num_attention_heads);
  if (c.num_attention_heads <= 0) fail(p + "attention.head_count must be > 0");
  c.head_dim = opt_int(p + "attention.key_length", c.hidden_size / c.num_attention_heads);
  if (opt_int(p + "attention.value_length", c.head_dim) != c.head_dim)
    fail(p + "attention.value_length != key_length is not supported");
  c.rms_norm_eps = opt_float(p + "attention.layer_norm_rms_epsilon", oss ? 1e-5 : 1e-6);
  c.rope_theta = opt_float(p + "rope.freq_base", oss ? 150000.0 : 10000.0);
  c.max_position_embeddings = opt_int(p + "context_length", 2048);
  c.qk_norm = arch == "qwen3" || moe;
  c.qkv_bias = arch == "qwen2";  // llama.cpp's qwen2: attn_q/k/v.bias, no attn_output.bias
  const GgufTensorInfo* emb = f.find("token_embd.weight");
  if (!emb) fail("missing tensor 'token_embd.weight'");
  if (emb->ne.size() != 2) fail("tensor 'token_embd.weight' is not 2-D");
  c.vocab_size = opt_int(p + "vocab_size", emb->ne[1]);
  c.tie_word_embeddings = f.find("output.weight") == nullptr;
  c.bos_token_id = opt_int("tokenizer.ggml.bos_token_id", -1);
  c.eos_token_id = opt_int("tokenizer.ggml.eos_token_id", -1);
  c.pad_token_id = opt_int("tokenizer.ggml.padding_token_id", -1);
  if (c.pad_token_id >= c.vocab_size) c.pad_token_id = -1;

  const std::string st = f.has(p + "rope.scaling.type") ? f.get_string(p + "rope.scaling.type") : "none";
  if (st == "linear" || st == "yarn") {
    c.rope_scaling.type = st;
    c.rope_scaling.factor = f.get_float(p + "rope.scaling.factor");
    c.rope_scaling.original_max_position_embeddings = opt_int(p + "rope.scaling.original_context_length", 0);
    if (st == "yarn") {
      c.rope_scaling.beta_fast = opt_float(p + "rope.scaling.yarn_beta_fast", 32.0);
      c.rope_scaling.beta_slow = opt_float(p + "rope.scaling.yarn_beta_slow", 1.0);
      c.rope_scaling.attention_factor = opt_float(p + "rope.scaling.yarn_attn_factor", 0.0);
    }
  } else if (st != "none") {
    fail(fmt::format("{}rope.scaling.type '{}' is not supported (none, linear, yarn)", p, st));
  }
  if (const GgufTensorInfo* rf = f.find("rope_freqs.weight")) {
    // Llama 3.x: llama.cpp stores the llama3 per-frequency divisors instead of the parameters.
    if (rf->type != uint32_t(GgmlType::F32) || rf->numel() != c.head_dim / 2)
      fail("tensor 'rope_freqs.weight': expected F32 [head_dim/2]");
    std::vector<float> v = f.dequantize(*rf);
    RopeScaling rs;
    rs.type = "llama3";
    rs.factor = 0;
    for (float x : v) rs.factor = std::max(rs.factor, double(x));
    rs.low_freq_factor = 1.0;
    rs.high_freq_factor = 4.0;
    rs.original_max_position_embeddings = 8192;
    const double pi = 3.14159265358979323846;
    const double low_wl = rs.original_max_position_embeddings / rs.low_freq_factor;
    const double high_wl = rs.original_max_position_embeddings / rs.high_freq_factor;
    for (int64_t i = 0; i < int64_t(v.size()); ++i) {
      const double freq = 1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.head_dim));
      const double wl = 2 * pi / freq;
      double want = 1.0;
      if (wl > low_wl) {
        want = rs.factor;
      } else if (wl >= high_wl) {
        const double smooth = (rs.original_max_position_embeddings / wl - rs.low_freq_factor) /
                              (rs.high_freq_factor - rs.low_freq_factor);
        want = 1.0 / ((1 - smooth) / rs.factor + smooth);
      }
      if (std::fabs(want - v[size_t(i)]) > 1e-3 * want)
        fail(
            fmt::format("tensor 'rope_freqs.weight' does not match llama3 RoPE scaling with "
                        "factor {} and low/high freq factors 1/4, original context 8192",
                        rs.factor));
    }
    c.rope_scaling = rs;
  }
  if (oss) gpt_oss_config_from_gguf(f, c);
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    fail(fmt::format("inconsistent model metadata: {}", e.what()));
  }
  // Q2_K (84 bytes per 256 weights) is the smallest type this reader takes
  check_weights_fit_files(c, f.file_size(), 84.0 / 256.0, f.path(), p + "block_count");
  return c;
}

}  // namespace rp
