// The GPT-OSS keys of a "gpt-oss" GGUF (formats/gguf.hpp, gpt_oss_config_from_gguf). Sources:
// llama.cpp's convert_hf_to_gguf.py (GptOssModel.set_gguf_parameters on top of TextModel's:
// expert_count, expert_used_count, expert_feed_forward_length = intermediate_size,
// attention.sliding_window, rope.scaling.* from rope_parameters) and src/llama-model.cpp
// (LLM_ARCH_OPENAI_MOE: swa pattern 2, i.e. layers 0, 2, 4, ... slide; the clamped SwiGLU with
// alpha 1.702 and limit 7; softmax over the selected logits).
#include "formats/gguf.hpp"
#include "model/error_text.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace rp {

void gpt_oss_config_from_gguf(const GgufFile& f, ModelConfig& c) {
  const std::string p = "gpt-oss.";
  auto fail = [&](const std::string& key, const std::string& what) {
    throw std::runtime_error(one_line(fmt::format("{}: metadata '{}{}': {}", f.path(), p, key, what)));
  };
  gguf_expert_counts(f, p, c);
  // GptOssConfig.intermediate_size is the experts' width; the converter writes it as both keys
  const bool has_exp = f.has(p + "expert_feed_forward_length");
  if (!has_exp && c.intermediate_size <= 0)
    fail("expert_feed_forward_length", "missing (and no feed_forward_length to take it from)");
  c.moe_intermediate_size = has_exp ? f.get_int(p + "expert_feed_forward_length") : c.intermediate_size;
  if (c.moe_intermediate_size < 1)
    fail(has_exp ? "expert_feed_forward_length" : "feed_forward_length",
         fmt::format("expected an integer >= 1, got {}", c.moe_intermediate_size));
  c.intermediate_size = c.moe_intermediate_size;
  c.norm_topk_prob = true;
  c.decoder_sparse_step = 1;
  c.mlp_only_layers.clear();
  c.attention_bias = true;
  c.attention_sinks = true;
  c.qk_norm = false;
  c.swiglu_alpha = 1.702;
  c.swiglu_limit = 7.0;
  c.sliding_window = f.get_int(p + "attention.sliding_window");
  if (c.sliding_window < 1)
    fail("attention.sliding_window", fmt::format("expected an integer >= 1, got {}", c.sliding_window));
  if (c.num_hidden_layers > (int64_t(1) << 20))  // one layer_types entry each, below
    fail("block_count", fmt::format("expected at most 2^20 layers, got {}", c.num_hidden_layers));
  c.layer_types.clear();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    c.layer_types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  // GPT-OSS's YaRN keeps the fractional correction range (transformers' truncate false)
  c.rope_scaling.truncate = false;
  c.router_aux_loss_coef = 0.001;
  c.output_router_logits = false;
}

}  // namespace rp
