// GPT-OSS GGUF ("gpt-oss") loading against the Hugging Face checkpoints it was converted from.
// The fixtures (tests/fixtures/gguf_gpt_oss/make_gguf_gpt_oss.py) are the tiny GPT-OSS of
// tests/fixtures/hf_gpt_oss written as llama.cpp's convert_hf_to_gguf.py writes it: BF16
// matrices from the bf16 checkpoint, and the MXFP4 checkpoint's expert blocks repacked as
// ggml MXFP4 with every other tensor F32. Also: the HF MXFP4 experts copied into frozen
// mxfp4 storage directly, equal to the old path through fp32 (gpt_oss_experts_from_hf).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/pretokenizer.hpp"
#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "formats/gpt_oss_hf.hpp"
#include "formats/safetensors.hpp"
#include "formats/tokenizer_export.hpp"
#include "kernels/weight_format.hpp"
#include "roundpipe/model_source.hpp"
#include "test_io_util.hpp"

namespace rp {
namespace {

const std::string kDir = std::string(RP_FIXTURES_DIR) + "/gguf_gpt_oss/";
const std::string kBf16 = kDir + "tiny_gpt_oss.bf16.gguf";
const std::string kMxfp4 = kDir + "tiny_gpt_oss.mxfp4.gguf";
const std::string kFused = kDir + "tiny_gpt_oss.mxfp4_fused.gguf";
const std::string kHf = std::string(RP_FIXTURES_DIR) + "/hf_gpt_oss/tiny_gpt_oss";
const std::string kHfMxfp4 = std::string(RP_FIXTURES_DIR) + "/hf_gpt_oss/tiny_gpt_oss_mxfp4";

void expect_same_config(const ModelConfig& g, const ModelConfig& h) {
  EXPECT_EQ(g.architecture, "gpt_oss");
  EXPECT_EQ(g.architecture, h.architecture);
  for (auto [a, b] : {std::pair{g.num_hidden_layers, h.num_hidden_layers},
                      {g.hidden_size, h.hidden_size},
                      {g.intermediate_size, h.intermediate_size},
                      {g.num_attention_heads, h.num_attention_heads},
                      {g.num_key_value_heads, h.num_key_value_heads},
                      {g.head_dim, h.head_dim},
                      {g.vocab_size, h.vocab_size},
                      {g.max_position_embeddings, h.max_position_embeddings},
                      {g.num_experts, h.num_experts},
                      {g.num_experts_per_tok, h.num_experts_per_tok},
                      {g.moe_intermediate_size, h.moe_intermediate_size},
                      {g.decoder_sparse_step, h.decoder_sparse_step},
                      {g.sliding_window, h.sliding_window},
                      {g.bos_token_id, h.bos_token_id},
                      {g.eos_token_id, h.eos_token_id},
                      {g.pad_token_id, h.pad_token_id}})
    EXPECT_EQ(a, b);
  EXPECT_EQ(g.rope_theta, h.rope_theta);
  EXPECT_EQ(float(g.rms_norm_eps), float(h.rms_norm_eps));  // GGUF stores it as f32
  EXPECT_EQ(g.tie_word_embeddings, h.tie_word_embeddings);
  EXPECT_EQ(g.qk_norm, h.qk_norm);
  EXPECT_EQ(g.attention_bias, h.attention_bias);
  EXPECT_EQ(g.attention_sinks, h.attention_sinks);
  EXPECT_EQ(g.norm_topk_prob, h.norm_topk_prob);
  EXPECT_EQ(g.mlp_only_layers, h.mlp_only_layers);
  EXPECT_EQ(g.layer_types, h.layer_types);
  EXPECT_EQ(g.swiglu_alpha, h.swiglu_alpha);
  EXPECT_EQ(g.swiglu_limit, h.swiglu_limit);
  const RopeScaling &a = g.rope_scaling, &b = h.rope_scaling;
  EXPECT_EQ(a.type, "yarn");
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.factor, b.factor);
  EXPECT_EQ(a.original_max_position_embeddings, b.original_max_position_embeddings);
  EXPECT_EQ(a.beta_fast, b.beta_fast);
  EXPECT_EQ(a.beta_slow, b.beta_slow);
  EXPECT_EQ(a.attention_factor, b.attention_factor);
  EXPECT_EQ(a.truncate, b.truncate);
  EXPECT_EQ(g.num_parameters(), h.num_parameters());
  // training-only settings GGUF does not carry: GptOssConfig's defaults (the HF fixture
  // switches the load-balancing loss on)
  EXPECT_EQ(g.router_aux_loss_coef, 0.001);
  EXPECT_FALSE(g.output_router_logits);
}

void expect_same_tensors(const LoadedModel& g, const LoadedModel& h) {
  ASSERT_EQ(g.tensors.size(), h.tensors.size());
  int experts = 0;
  for (const auto& [n, t] : h.tensors) {
    auto it = g.tensors.find(n);
    ASSERT_NE(it, g.tensors.end()) << n;
    ASSERT_EQ(it->second.shape, t.shape) << n;
    EXPECT_EQ(std::memcmp(it->second.data.data(), t.data.data(), t.data.size() * sizeof(float)), 0) << n;
    experts += n.find(".mlp.experts.") != std::string::npos;
  }
  EXPECT_EQ(experts, 3 * 4 * 6);  // 3 layers, 4 experts, gate/up/down weights and biases
}

TEST(IoGgufGptOss, Bf16FileEqualsTheHfCheckpoint) {
  {
    GgufFile f(kBf16);
    EXPECT_EQ(f.find("blk.0.ffn_gate_exps.weight")->type, uint32_t(GgmlType::BF16));
    EXPECT_EQ(f.find("blk.0.ffn_gate_exps.weight")->shape(), (std::vector<int64_t>{4, 32, 64}));  // [E, F, H]
    EXPECT_EQ(f.find("blk.2.ffn_down_exps.weight")->shape(), (std::vector<int64_t>{4, 64, 32}));  // [E, H, F]
    EXPECT_EQ(f.find("blk.1.ffn_up_exps.bias")->shape(), (std::vector<int64_t>{4, 32}));
  }
  const LoadedModel hf = load_model(kHf), g = load_model(kBf16);
  expect_same_config(g.config, hf.config);
  expect_same_tensors(g, hf);
}

TEST(IoGgufGptOss, Mxfp4FileEqualsTheHfCheckpoints) {
  {
    GgufFile f(kMxfp4);
    const GgufTensorInfo* up = f.find("blk.1.ffn_up_exps.weight");
    ASSERT_NE(up, nullptr);
    EXPECT_EQ(up->type, uint32_t(GgmlType::MXFP4));
    EXPECT_EQ(ggml_type_name(up->type), "MXFP4");
    EXPECT_EQ(up->nbytes, uint64_t(4 * 32 * 2 * 17));
  }
  const LoadedModel hf = load_model(kHfMxfp4), g = load_model(kMxfp4);
  expect_same_config(g.config, hf.config);
  expect_same_tensors(g, hf);
  expect_same_tensors(g, load_model(kHf));  // the bf16 checkpoint holds the same values
}

// `roundpipe convert`: the GGUF written as a Hugging Face folder (stacked, interleaved
// gate_up_proj as transformers saves it) loads to the same model.
TEST(IoGgufGptOss, ConvertsToAnEqualHfFolder) {
  test::TempDir dir("gguf_oss_conv");
  convert_gguf_to_hf(kMxfp4, dir / "hf", DType::f32);
  const LoadedModel hf = load_model(kHf), c = load_model(dir / "hf");
  EXPECT_EQ(c.config.layer_types, hf.config.layer_types);
  EXPECT_EQ(c.config.rope_scaling.truncate, hf.config.rope_scaling.truncate);
  expect_same_tensors(c, hf);
}

/// The frozen storage of every base group of `path` with base format `base`, and how many
/// tensors were copied as stored.
std::vector<std::vector<uint8_t>> frozen_storage(const std::string& path, WeightFormat base, int64_t& stored,
                                                 ModelLayout* layout_out = nullptr) {
  const ModelSource src = ModelSource::open(path);
  LoraConfig lora;
  lora.base_format = base;
  const ModelLayout layout = make_layout(src.config(), lora);
  std::vector<std::vector<float>> tr;
  std::vector<std::vector<uint8_t>> fr;
  stored = read_base_groups(src, layout, tr, fr);
  if (layout_out) *layout_out = layout;
  return fr;
}

// Frozen mxfp4 experts: the GGUF's MXFP4 blocks and the HF checkpoint's _blocks/_scales are
// both copied as stored, to the same bytes (the GGUF's were repacked by the fixture script,
// independently of mxfp4_from_hf).
TEST(IoGgufGptOss, FrozenMxfp4ExpertsAreTheFileBlocks) {
  int64_t from_gguf = 0, from_hf = 0, from_bf16 = 0;
  ModelLayout layout;
  const auto g = frozen_storage(kMxfp4, WeightFormat::mxfp4, from_gguf, &layout);
  const auto h = frozen_storage(kHfMxfp4, WeightFormat::mxfp4, from_hf);
  const auto b = frozen_storage(kBf16, WeightFormat::mxfp4, from_bf16);
  // copied as stored: each expert matrix (3 layers of 4 x 3) and the tensors whose file type
  // is their storage form: the GGUF's F32 1-D tensors (f32: per layer 2 norms, 4 attention
  // biases, sinks, the router bias and 4 x 3 expert biases; the final norm); the HF
  // checkpoint's bf16 matrices kept bf16 (embedding, LM head, per layer q/k/v/o and router)
  EXPECT_EQ(from_gguf, 3 * 4 * 3 + 3 * (8 + 12) + 1);
  EXPECT_EQ(from_hf, 3 * 4 * 3 + 2 + 3 * 5);
  // the BF16 GGUF: its matrices but the F32 routers (kept bf16) and the experts (quantized),
  // its F32 1-D tensors but the BF16 expert biases
  EXPECT_EQ(from_bf16, 2 + 3 * 4 + 3 * 8 + 1);
  GgufFile f(kMxfp4);
  for (int64_t l = 0; l < 3; ++l) {
    const ParamGroup& grp = layout.groups[size_t(l + 1)];
    ASSERT_TRUE(grp.frozen);
    EXPECT_EQ(g[size_t(l + 1)], h[size_t(l + 1)]) << grp.name;
    // expert 3's down_proj is the last quarter of the GGUF stack's bytes
    const TensorSpec& t =
        grp.tensors[size_t(grp.find(fmt::format("model.layers.{}.mlp.experts.3.down_proj.weight", l)))];
    ASSERT_EQ(t.format, WeightFormat::mxfp4);
    const GgufTensorInfo* st = f.find(fmt::format("blk.{}.ffn_down_exps.weight", l));
    const std::vector<uint8_t> stack = f.tensor_bytes(*st);
    const uint8_t* want = stack.data() + st->nbytes / 4 * 3;
    EXPECT_EQ(std::memcmp(g[size_t(l + 1)].data() + t.byte_offset, want, st->nbytes / 4), 0);
    // from BF16 values (quantized again): the same weights
    std::vector<float> x(size_t(grp.numel)), y(size_t(grp.numel));
    for (const TensorSpec& s : grp.tensors) {
      dequantize_weights(s.format, g[size_t(l + 1)].data() + s.byte_offset, x.data() + s.offset, s.numel());
      dequantize_weights(s.format, b[size_t(l + 1)].data() + s.byte_offset, y.data() + s.offset, s.numel());
    }
    EXPECT_EQ(x, y) << grp.name;
  }
}

// llama.cpp's fused gate/up stacks (each expert's gate rows, then its up rows): the same
// model, and the same frozen bytes, as the split stacks.
TEST(IoGgufGptOss, FusedGateUpStacksEqualTheSplitOnes) {
  {
    GgufFile f(kFused);
    const GgufTensorInfo* gu = f.find("blk.2.ffn_gate_up_exps.weight");
    ASSERT_NE(gu, nullptr);
    EXPECT_EQ(gu->shape(), (std::vector<int64_t>{4, 64, 64}));  // [E, 2F, H]
    EXPECT_EQ(f.find("blk.2.ffn_gate_up_exps.bias")->shape(), (std::vector<int64_t>{4, 64}));
    EXPECT_EQ(f.find("blk.2.ffn_gate_exps.weight"), nullptr);
  }
  const LoadedModel hf = load_model(kHf), g = load_model(kFused);
  expect_same_config(g.config, hf.config);
  expect_same_tensors(g, hf);
  int64_t fused = 0, split = 0;
  EXPECT_EQ(frozen_storage(kFused, WeightFormat::mxfp4, fused),
            frozen_storage(kMxfp4, WeightFormat::mxfp4, split));
  EXPECT_EQ(fused, split);
  std::string pre, suf;
  ASSERT_TRUE(gguf_expert_stack_name("blk.2.ffn_gate_up_exps.bias", pre, suf));
  EXPECT_EQ(pre + "0" + suf, "model.layers.2.mlp.experts.0.gate_up_proj.bias");
}

// The HF checkpoint's MXFP4 experts copied into mxfp4 storage directly hold the weights the
// old path (dequantized to fp32 by gpt_oss_experts_from_hf, then quantize_weights) held:
// equal values, bit for bit; the bytes are the checkpoint's codes (mxfp4_from_hf).
TEST(IoGgufGptOss, Mxfp4DirectFromHfEqualsTheFp32Path) {
  int64_t stored = 0;
  ModelLayout layout;
  const auto direct = frozen_storage(kHfMxfp4, WeightFormat::mxfp4, stored, &layout);
  LoadedModel old;
  old.config = layout.config;
  for (auto& [n, t] : load_safetensors(kHfMxfp4 + "/model.safetensors")) old.tensors.emplace(n, std::move(t));
  gpt_oss_experts_from_hf(old, "old");
  SafetensorsFile raw(kHfMxfp4 + "/model.safetensors");
  int experts = 0;
  for (size_t gi = 0; gi < size_t(layout.num_layers()); ++gi) {
    const ParamGroup& grp = layout.groups[gi];
    for (const TensorSpec& t : grp.tensors) {
      std::vector<uint8_t> q(weight_format_bytes(t.format, t.numel()));
      quantize_weights(t.format, old.tensors.at(t.name).data.data(), q.data(), t.numel());
      std::vector<float> a(size_t(t.numel())), b(size_t(t.numel()));
      dequantize_weights(t.format, direct[gi].data() + t.byte_offset, a.data(), t.numel());
      dequantize_weights(t.format, q.data(), b.data(), t.numel());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << t.name;
      if (t.format != WeightFormat::mxfp4) continue;
      ++experts;
      // down_proj of expert e: rows e*H .. of the checkpoint's [E, H, F/32, 16] blocks
      if (t.name.find("down_proj") == std::string::npos) continue;
      const std::string layer = t.name.substr(0, t.name.find(".mlp.experts.") + 13);
      const int64_t e = std::stoll(t.name.substr(layer.size()));
      const auto& bl = *raw.find(layer + "down_proj_blocks");
      const auto& sc = *raw.find(layer + "down_proj_scales");
      std::vector<uint8_t> want(q.size()), blocks(64 * 16), scales(64);
      raw.read_bytes(bl, uint64_t(e) * 64 * 16, blocks.size(), blocks.data());
      raw.read_bytes(sc, uint64_t(e) * 64, scales.size(), scales.data());
      mxfp4_from_hf(blocks.data(), scales.data(), 64, 1, want.data());
      EXPECT_EQ(std::memcmp(direct[gi].data() + t.byte_offset, want.data(), want.size()), 0) << t.name;
    }
  }
  EXPECT_EQ(experts, 3 * 4 * 3);
}

// The MXFP4 fixture rewritten with a tensor dropped or given other dimensions.
std::string rewrite(const test::TempDir& dir, const std::string& name, const std::string& drop,
                    const std::map<std::string, std::vector<uint64_t>>& reshape = {}) {
  GgufFile src(kMxfp4);
  test::GgufBuilder b;
  for (const auto& [k, v] : src.metadata().items()) {
    if (v.is_string()) b.str(k, v.get<std::string>());
    else if (v.is_number_unsigned()) b.u32(k, v.get<uint32_t>());
    else if (v.is_number_float()) b.f32(k, v.get<float>());
  }
  for (const auto& t : src.tensors()) {
    if (t.name == drop) continue;
    auto r = reshape.find(t.name);
    b.tensor(t.name, r != reshape.end() ? r->second : std::vector<uint64_t>(t.ne.begin(), t.ne.end()), t.type,
             src.tensor_bytes(t));
  }
  const std::string path = dir / name;
  test::write_bytes(path, b.build());
  return path;
}

std::string load_error(const std::string& path) {
  try {
    load_model(path);
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  }
  ADD_FAILURE() << "no error for " << path;
  return "";
}

TEST(IoGgufGptOss, MissingOrMisshapenTensorsAreNamedAsStored) {
  test::TempDir dir("gguf_oss");
  EXPECT_EQ(load_model(rewrite(dir, "same.gguf", "")).config.num_experts,
            4);  // the rewriter keeps a loadable file
  for (const char* t :
       {"blk.1.ffn_up_exps.weight", "blk.0.attn_sinks.weight", "blk.2.ffn_gate_inp.bias",
        "blk.0.ffn_down_exps.bias", "blk.1.post_attention_norm.weight", "blk.2.attn_v.bias"}) {
    const std::string m = load_error(rewrite(dir, std::string(t) + ".gguf", t));
    EXPECT_NE(m.find("missing tensor"), std::string::npos) << m;
    EXPECT_NE(m.find(std::string("GGUF tensor '") + t + "'"), std::string::npos) << m;
  }
  // [E, H, F] stored as [E, F, H]: same bytes, the wrong shape
  std::string m = load_error(rewrite(dir, "down.gguf", "", {{"blk.0.ffn_down_exps.weight", {64, 32, 4}}}));
  EXPECT_NE(
      m.find("expected shape [64, 32], got [32, 64] (GGUF tensor 'blk.0.ffn_down_exps.weight' [4, 32, 64], "
             "expert 0)"),
      std::string::npos)
      << m;
  m = load_error(rewrite(dir, "k.gguf", "", {{"blk.2.attn_k.weight", {32, 64}}}));
  EXPECT_NE(m.find("GGUF tensor 'blk.2.attn_k.weight' [64, 32]"), std::string::npos) << m;
  m = load_error(rewrite(dir, "bias.gguf", "", {{"blk.1.ffn_gate_exps.bias", {32, 2, 2}}}));
  EXPECT_NE(m.find("tensor 'blk.1.ffn_gate_exps.bias': expected 2-D [num_experts = 4, n]"), std::string::npos)
      << m;
}

TEST(IoGgufGptOss, ConfigKeysAndErrors) {
  test::TempDir dir("gguf_oss_cfg");
  const ModelConfig c = load_model(kMxfp4).config;
  EXPECT_EQ(c.layer_types,
            (std::vector<std::string>{"sliding_attention", "full_attention", "sliding_attention"}));
  EXPECT_EQ(c.attention_window(0), 3);
  EXPECT_EQ(c.attention_window(1), 0);
  EXPECT_FALSE(c.rope_scaling.truncate);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  // a metadata key dropped
  auto without = [&](const std::string& key) {
    GgufFile src(kMxfp4);
    test::GgufBuilder b;
    for (const auto& [k, v] : src.metadata().items()) {
      if (k == key) continue;
      if (v.is_string()) b.str(k, v.get<std::string>());
      else if (v.is_number_unsigned()) b.u32(k, v.get<uint32_t>());
      else if (v.is_number_float()) b.f32(k, v.get<float>());
    }
    for (const auto& t : src.tensors()) {
      b.tensor(t.name, {t.ne.begin(), t.ne.end()}, t.type, src.tensor_bytes(t));
    }
    const std::string path = dir / (key + ".gguf");
    test::write_bytes(path, b.build());
    return path;
  };
  EXPECT_NE(load_error(without("gpt-oss.attention.sliding_window"))
                .find("missing metadata key 'gpt-oss.attention.sliding_window'"),
            std::string::npos);
  EXPECT_NE(load_error(without("gpt-oss.expert_count")).find("'gpt-oss.expert_count'"), std::string::npos);
  // the experts' width falls back to feed_forward_length, which the converter writes equal
  EXPECT_EQ(load_model(without("gpt-oss.expert_feed_forward_length")).config.moe_intermediate_size, 32);
}

// GPT-OSS's tokenizer in a GGUF (tokenizer.ggml.pre "gpt-4o", o200k): pieces as
// transformers' GGUF tokenizer mapping (_GPT4O_SPLIT, Python's regex module) cuts this text.
TEST(IoGgufGptOss, O200kPreTokenizer) {
  test::TempDir dir("gguf_oss_tok");
  test::GgufBuilder g;
  g.str("tokenizer.ggml.model", "gpt2");
  g.str("tokenizer.ggml.pre", "gpt-4o");
  g.str_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
  g.str_array("tokenizer.ggml.merges", {"a b"});
  test::write_bytes(dir / "t.gguf", g.build());
  const nlohmann::json j = tokenizer_json_from_gguf(GgufFile(dir / "t.gguf"));
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][1]["use_regex"], false);
  const PreTokenizer pt = PreTokenizer::from_json(j["pre_tokenizer"], "t.gguf");
  const std::string text = "HELLOworld'S CamelCase 1234567 don't!!\n\n  x\u00e9t\u00e9 /path/\n";
  std::vector<Piece> pieces;
  pt.split(text, 0, pieces);
  std::vector<std::string> got;
  for (const Piece& p : pieces) got.push_back(text.substr(p.off, p.len));
  EXPECT_EQ(got, (std::vector<std::string>{"HELLOworld'S", " Camel", "Case", " ", "123", "456", "7", " don't",
                                           "!!\n\n", " ", " x\u00e9t\u00e9", " /", "path", "/\n"}));
}

TEST(IoGgufGptOss, NameMapping) {
  EXPECT_EQ(gguf_to_hf_name("blk.2.ffn_gate_inp.weight", "gpt-oss"), "model.layers.2.mlp.router.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.2.ffn_gate_inp.bias", "gpt-oss"), "model.layers.2.mlp.router.bias");
  EXPECT_EQ(gguf_to_hf_name("blk.0.attn_sinks.weight", "gpt-oss"), "model.layers.0.self_attn.sinks");
  EXPECT_EQ(gguf_to_hf_name("blk.0.attn_output.bias", "gpt-oss"), "model.layers.0.self_attn.o_proj.bias");
  EXPECT_EQ(gguf_to_hf_name("blk.0.attn_sinks.weight"), "");
  EXPECT_EQ(gguf_to_hf_name("blk.2.ffn_gate_inp.weight"), "model.layers.2.mlp.gate.weight");
  std::string pre, suf;
  ASSERT_TRUE(gguf_expert_stack_name("blk.1.ffn_up_exps.bias", pre, suf));
  EXPECT_EQ(pre + "3" + suf, "model.layers.1.mlp.experts.3.up_proj.bias");
  EXPECT_EQ(hf_to_gguf_name("model.layers.1.mlp.experts.3.up_proj.bias", "gpt-oss"),
            "blk.1.ffn_up_exps.bias");
  EXPECT_EQ(hf_to_gguf_name("model.layers.4.mlp.router.weight", "gpt-oss"), "blk.4.ffn_gate_inp.weight");
  EXPECT_EQ(hf_to_gguf_name("model.layers.4.mlp.gate.weight", "qwen3moe"), "blk.4.ffn_gate_inp.weight");
  EXPECT_EQ(hf_to_gguf_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(hf_to_gguf_name("model.layers.0.mlp.bias"), "");
}

}  // namespace
}  // namespace rp
