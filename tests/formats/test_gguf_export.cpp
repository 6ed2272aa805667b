// roundpipe export-gguf (formats/gguf_export.hpp): Hugging Face folder -> GGUF -> folder -> GGUF
// -> folder keeps the weights (exactly once rounded to the type; q8_0 within its block error),
// the config and the tokenizer; the logits of the exported file equal those of the folder it
// reads back as; an independent GGUF written byte by byte comes back byte for byte; the output
// is refused where it would replace what export-gguf did not write; and (when Python's gguf
// package is there) gguf's own reader takes the file and dequantizes it to our reader's values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "formats/gguf_export.hpp"
#include "kernels/weight_format.hpp"
#include "roundpipe/generate.hpp"
#include "test_io_util.hpp"

namespace {

using namespace rp;
using namespace rp::test;
using nlohmann::json;

/// A byte-level BPE tokenizer.json of `n_vocab` tokens: single letters, a few merges, two
/// special added tokens; ids n_vocab..vocab_size-1 of the model stay unused.
json tiny_tokenizer(int64_t n_vocab) {
  json vocab = json::object();
  for (int64_t i = 0; i < n_vocab - 2; ++i) vocab[fmt::format("t{}", i)] = i;
  json added = json::array();
  for (int64_t i : {n_vocab - 2, n_vocab - 1}) {
    const std::string s = i == n_vocab - 2 ? "<|im_start|>" : "<|im_end|>";
    vocab[s] = i;
    added.push_back({{"id", i},
                     {"content", s},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  json pre = {{"type", "Sequence"},
              {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                             {{"type", "ByteLevel"},
                                              {"add_prefix_space", false},
                                              {"trim_offsets", true},
                                              {"use_regex", true}}})}};
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"pre_tokenizer", pre},
      {"post_processor", nullptr},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({json::array({"t1", "t2"}), "t3 t4"})}}}};
}

ModelConfig tiny_config(const std::string& arch, bool tied) {
  ModelConfig c;
  c.architecture = arch;
  c.vocab_size = 72;
  c.hidden_size = 64;
  c.intermediate_size = 80;  // down_proj rows of 80: not whole q8_0 blocks (F16 fallback)
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = arch == "qwen3" ? 32 : 16;  // qwen3: head_dim apart from hidden / heads
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  c.qk_norm = arch == "qwen3";
  c.qkv_bias = arch == "qwen2";
  c.bos_token_id = 1;
  c.eos_token_id = 69;
  if (arch == "llama") {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 8;
    c.rope_scaling.original_max_position_embeddings = 8192;
  }
  return c;
}

/// A random model of `arch` as a Hugging Face folder at `dir`.
void write_tiny_model(const std::string& dir, const std::string& arch, bool tied, uint32_t seed) {
  const ModelLayout layout = make_layout(tiny_config(arch, tied));
  std::vector<std::vector<float>> groups;
  std::vector<const float*> ptrs;
  for (const auto& g : layout.groups) groups.push_back(random_values(size_t(g.numel), seed++, 0.5f));
  for (const auto& g : groups) ptrs.push_back(g.data());
  save_hf_checkpoint(dir, layout, ptrs, tiny_tokenizer(70), "{{ messages }}", DType::f32);
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

struct Case {
  const char* arch;
  bool tied;
  GgufExportType type;
  const char* type_name;
};

class GgufExportRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(GgufExportRoundTrip, KeepsWeightsConfigTokenizerAndLogits) {
  const Case k = GetParam();
  TempDir d("gguf_export");
  write_tiny_model(d / "hf0", k.arch, k.tied, 11);
  ASSERT_GT(export_gguf(d / "hf0", d / "g1.gguf", k.type, false), 0);
  convert_gguf_to_hf(d / "g1.gguf", d / "hf1", DType::f32);
  export_gguf(d / "hf1", d / "g2.gguf", k.type, false);
  convert_gguf_to_hf(d / "g2.gguf", d / "hf2", DType::f32);
  const LoadedModel m0 = load_model(d / "hf0"), m1 = load_model(d / "hf1"), m2 = load_model(d / "hf2");
  // the architecture and its settings come back
  for (const LoadedModel* m : {&m1, &m2}) {
    EXPECT_EQ(m->config.architecture, m0.config.architecture);
    EXPECT_EQ(m->config.head_dim, m0.config.head_dim);
    EXPECT_EQ(m->config.num_key_value_heads, m0.config.num_key_value_heads);
    EXPECT_EQ(m->config.intermediate_size, m0.config.intermediate_size);
    EXPECT_EQ(m->config.tie_word_embeddings, k.tied);
    EXPECT_EQ(m->config.rope_scaling.type, m0.config.rope_scaling.type);
    EXPECT_FLOAT_EQ(float(m->config.rope_scaling.factor), float(m0.config.rope_scaling.factor));
    EXPECT_FLOAT_EQ(float(m->config.rms_norm_eps), float(m0.config.rms_norm_eps));
    EXPECT_EQ(m->config.eos_token_id, 69);
    EXPECT_EQ(m->chat_template, "{{ messages }}");
    EXPECT_EQ(m->tokenizer_json["model"]["merges"], json::parse(R"([["t1","t2"],["t3","t4"]])"));
    EXPECT_EQ(m->tokenizer_json["added_tokens"].size(), 2u);
    EXPECT_EQ(m->tokenizer_json["model"]["vocab"]["<|im_end|>"], 69);
    EXPECT_EQ(m->tokenizer_json["model"]["vocab"]["t5"], 5);
  }
  // weights: once rounded to the type, then exactly kept
  const float tol = k.type == GgufExportType::f16    ? 1.0f / 1024
                    : k.type == GgufExportType::bf16 ? 1.0f / 128
                                                     : 0;
  ASSERT_EQ(m1.tensors.size(), m0.tensors.size());
  for (const auto& [name, t0] : m0.tensors) {
    const HostTensor& t1 = m1.tensors.at(name);
    const HostTensor& t2 = m2.tensors.at(name);
    ASSERT_EQ(t1.shape, t0.shape) << name;
    EXPECT_EQ(t2.data, t1.data) << name << ": a second export changed the values";
    // q8_0: each value within half a step of its block, d = max|x| / 127 (at most the tensor's),
    // plus up to 127 times the f16 rounding of d (2^-11 d): ggml rounds x / d before storing d in f16
    const float step = max_abs(t0.data) / 127.0f;
    const bool q8 = k.type == GgufExportType::q8_0 && t0.shape.size() == 2 && t0.shape[1] % 32 == 0;
    const bool f16_fallback = k.type == GgufExportType::q8_0 && t0.shape.size() == 2 && !q8;
    for (size_t i = 0; i < t0.data.size(); ++i) {
      const float x = t0.data[i], err = std::fabs(t1.data[i] - x);
      if (t0.shape.size() == 1)
        ASSERT_EQ(t1.data[i], x) << name << "[" << i << "]: norms and biases stay f32";
      else if (q8) ASSERT_LE(err, (0.5f + 127.0f / 2048) * step) << name << "[" << i << "]";
      else
        ASSERT_LE(err, (f16_fallback ? 1.0f / 1024 : tol) * std::fabs(x) + 1e-7f) << name << "[" << i << "]";
    }
  }
  // a forward pass: the GGUF gives the logits of the folder it reads back as; the original's
  // within the type's rounding
  const std::vector<int32_t> ids = {1, 5, 9, 33, 2, 68, 40, 11};
  const std::vector<float> lg = Generator(load_model(d / "g1.gguf")).logits(ids);
  EXPECT_EQ(lg, Generator(m1).logits(ids));
  const std::vector<float> l0 = Generator(m0).logits(ids);
  float worst = 0;
  for (size_t i = 0; i < lg.size(); ++i) worst = std::max(worst, std::fabs(lg[i] - l0[i]));
  const float allowed = (k.type == GgufExportType::q8_0   ? 5e-2f
                         : k.type == GgufExportType::bf16 ? 3e-2f
                                                          : 4e-3f) *
                        std::max(1.0f, max_abs(l0));
  EXPECT_LE(worst, allowed) << k.arch << " " << k.type_name;
  EXPECT_GT(worst, 0.0f) << "rounding to " << k.type_name << " changed nothing: the comparison proves little";
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufExportRoundTrip,
                         ::testing::Values(Case{"llama", false, GgufExportType::f16, "f16"},
                                           Case{"llama", true, GgufExportType::q8_0, "q8_0"},
                                           Case{"llama", false, GgufExportType::bf16, "bf16"},
                                           Case{"qwen2", true, GgufExportType::bf16, "bf16"},
                                           Case{"qwen2", false, GgufExportType::q8_0, "q8_0"},
                                           Case{"qwen3", true, GgufExportType::f16, "f16"},
                                           Case{"qwen3", false, GgufExportType::q8_0, "q8_0"}),
                         [](const auto& info) {
                           return std::string(info.param.arch) + "_" + info.param.type_name +
                                  (info.param.tied ? "_tied" : "");
                         });

// An F16 LLaMA GGUF written byte by byte (q/k rows permuted as convert_hf_to_gguf.py does),
// converted to a folder and exported again, gives back every tensor's bytes.
TEST(GgufExport, AnIndependentGgufComesBackByteForByte) {
  TempDir d("gguf_export_bytes");
  GgufBuilder b;
  b.str("general.architecture", "llama");
  b.u32("llama.block_count", 1);
  b.u32("llama.embedding_length", 64);
  b.u32("llama.feed_forward_length", 96);
  b.u32("llama.attention.head_count", 4);
  b.u32("llama.attention.head_count_kv", 2);
  b.f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  b.u32("llama.context_length", 128);
  b.str("tokenizer.ggml.model", "gpt2");
  std::vector<std::string> tokens;
  for (int i = 0; i < 72; ++i) tokens.push_back(fmt::format("t{}", i));
  b.str_array("tokenizer.ggml.tokens", tokens);
  b.str_array("tokenizer.ggml.merges", {"t1 t2"});
  std::map<std::string, std::vector<uint8_t>> want;
  uint32_t seed = 3;
  auto add = [&](const std::string& name, std::vector<uint64_t> ne, bool f16) {
    std::vector<float> v = random_values(size_t(ne[0] * (ne.size() > 1 ? ne[1] : 1)), seed++, 0.5f);
    std::vector<uint8_t> bytes(v.size() * (f16 ? 2 : 4));
    quantize_weights(f16 ? WeightFormat::f16 : WeightFormat::f32, v.data(), bytes.data(), int64_t(v.size()));
    b.tensor(name, ne, f16 ? 1 : 0, bytes);
    want[name] = bytes;
  };
  add("token_embd.weight", {64, 72}, true);
  add("output_norm.weight", {64}, false);
  add("output.weight", {64, 72}, true);
  add("blk.0.attn_norm.weight", {64}, false);
  add("blk.0.attn_q.weight", {64, 64}, true);  // already in llama.cpp's row order
  add("blk.0.attn_k.weight", {64, 32}, true);
  add("blk.0.attn_v.weight", {64, 32}, true);
  add("blk.0.attn_output.weight", {64, 64}, true);
  add("blk.0.ffn_norm.weight", {64}, false);
  add("blk.0.ffn_gate.weight", {64, 96}, true);
  add("blk.0.ffn_up.weight", {64, 96}, true);
  add("blk.0.ffn_down.weight", {96, 64}, true);
  write_bytes(d / "in.gguf", b.build());
  convert_gguf_to_hf(d / "in.gguf", d / "hf", DType::f32);
  export_gguf(d / "hf", d / "out.gguf", GgufExportType::f16, false);
  const GgufFile out(d / "out.gguf");
  EXPECT_EQ(out.get_string("general.architecture"), "llama");
  EXPECT_EQ(out.get_int("general.file_type"), 1);
  EXPECT_EQ(out.tensors().size(), want.size());
  for (const auto& [name, bytes] : want) {
    const GgufTensorInfo* t = out.find(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(t->nbytes, bytes.size()) << name;
    EXPECT_EQ(out.tensor_bytes(*t), bytes) << name;
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(GgufExport, RefusesWhatItWouldReplaceAtALoss) {
  TempDir d("gguf_export_refuse");
  write_tiny_model(d / "hf", "qwen3", true, 5);
  const std::string out = d / "m.gguf";
  // a user's file is never replaced, --force or not
  { std::ofstream(out) << "my notes"; }
  EXPECT_NE(
      error_of([&] { export_gguf(d / "hf", out, GgufExportType::f16, false); }).find("exists; pass --force"),
      std::string::npos);
  const std::string e = error_of([&] { export_gguf(d / "hf", out, GgufExportType::f16, true); });
  EXPECT_NE(e.find("was not written by roundpipe export-gguf"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  const std::vector<uint8_t> kept = read_bytes(out);
  EXPECT_EQ(std::string(kept.begin(), kept.end()), "my notes");
  // its own file: only with --force
  fs::remove(out);
  export_gguf(d / "hf", out, GgufExportType::f16, false);
  EXPECT_NE(error_of([&] { export_gguf(d / "hf", out, GgufExportType::q8_0, false); }).find("--force"),
            std::string::npos);
  export_gguf(d / "hf", out, GgufExportType::q8_0, true);
  EXPECT_EQ(GgufFile(out).get_int("general.file_type"), 7);
  // never inside the input; other models refused with one line; nothing left behind
  EXPECT_NE(error_of([&] {
              export_gguf(d / "hf", d / "hf/m.gguf", GgufExportType::f16, false);
            }).find("inside the input"),
            std::string::npos);
  const std::string moe = std::string(RP_FIXTURES_DIR) + "/hf_moe/tiny_qwen3_moe";
  const std::string moe_error =
      error_of([&] { export_gguf(moe, d / "moe.gguf", GgufExportType::f16, false); });
  EXPECT_NE(moe_error.find("mixture-of-experts"), std::string::npos) << moe_error;
  EXPECT_FALSE(fs::exists(d / "moe.gguf"));
  // LongRoPE: llama.cpp's rope_factors_long / rope_factors_short tensors are not written
  write_tiny_model(d / "longrope", "llama", false, 6);
  nlohmann::json cj = nlohmann::json::parse(std::ifstream(d / "longrope/config.json"));
  const std::vector<double> ones(size_t(cj["head_dim"].get<int64_t>() / 2), 1.0);
  cj["rope_scaling"] = {{"rope_type", "longrope"}, {"short_factor", ones}, {"long_factor", ones}};
  std::ofstream(d / "longrope/config.json") << cj.dump();
  const std::string lr_error =
      error_of([&] { export_gguf(d / "longrope", d / "longrope.gguf", GgufExportType::f16, false); });
  EXPECT_NE(lr_error.find("LongRoPE scaling"), std::string::npos) << lr_error;
  EXPECT_EQ(lr_error.find('\n'), std::string::npos) << lr_error;
  EXPECT_FALSE(fs::exists(d / "longrope.gguf"));
  EXPECT_FALSE(fs::exists(d / "hf/m.gguf"));
  for (const auto& e2 : fs::directory_iterator(d.path))
    EXPECT_EQ(e2.path().filename().string().find(".tmp-"), std::string::npos) << e2.path();
}

/// The first of $RP_GGUF_PYTHON, $RP_PYTHON and python3 that imports Python's gguf package, else "".
// A weight the chosen type would write as infinity (f16 beyond 65504; q8_0 when a block's f16
// scale, its largest |x| / 127, overflows) is refused naming the tensor, nothing written; a type
// that holds it exports.
TEST(GgufExport, RefusesWeightsItsTypeWouldWriteAsInfinity) {
  TempDir d("gguf_export_range");
  write_tiny_model(d / "hf", "qwen3", true, 5);
  LoadedModel m = load_model(d / "hf");
  const ModelLayout layout = make_layout(m.config);
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  m.tensors.at(name).data[3] = 5e6f;  // f16 overflows; q8_0's scale 5e6 / 127 does not
  std::vector<std::vector<float>> groups;
  fill_groups(m, layout, groups);
  std::vector<const float*> ptrs;
  for (const auto& g : groups) ptrs.push_back(g.data());
  save_hf_checkpoint(d / "big", layout, ptrs, m.tokenizer_json, m.chat_template, DType::f32);
  const std::string e = error_of([&] { export_gguf(d / "big", d / "h.gguf", GgufExportType::f16, false); });
  EXPECT_NE(e.find("tensor '" + name + "': 1 value is beyond f16's range (the first, 5000000, at element 3)"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(d / "h.gguf"));
  export_gguf(d / "big", d / "q.gguf", GgufExportType::q8_0, false);
  export_gguf(d / "big", d / "b.gguf", GgufExportType::bf16, false);
  m.tensors.at(name).data[3] = 1e9f;  // q8_0's scale overflows too
  fill_groups(m, layout, groups);
  save_hf_checkpoint(d / "big", layout, ptrs, m.tokenizer_json, m.chat_template, DType::f32);
  const std::string q = error_of([&] { export_gguf(d / "big", d / "q2.gguf", GgufExportType::q8_0, false); });
  EXPECT_NE(q.find("beyond q8_0's range"), std::string::npos) << q;
  EXPECT_FALSE(fs::exists(d / "q2.gguf"));
  export_gguf(d / "big", d / "b2.gguf", GgufExportType::bf16, false);
}

std::string gguf_python() {
  for (const char* var : {"RP_GGUF_PYTHON", "RP_PYTHON", ""}) {
    const char* env = *var ? std::getenv(var) : nullptr;
    const std::string py = env && *env ? env : *var ? "" : "python3";
    if (!py.empty() && std::system((py + " -c 'import gguf' >/dev/null 2>&1").c_str()) == 0) return py;
  }
  return "";
}

// llama.cpp's own Python reader (the gguf package) takes the file: architecture, hyperparameters,
// tokenizer, tensor names, shapes and types as llama.cpp expects, and its dequantization of every
// tensor equals ours.
TEST(GgufExport, TheGgufPackageReadsItAsOurReaderDoes) {
  const std::string py = gguf_python();
  if (py.empty())
    GTEST_SKIP()
        << "Python's gguf package is not installed (scripts/setup.sh installs it; or set RP_GGUF_PYTHON to a "
           "Python that has it): llama.cpp's reader is not run; our own reader's round trips still are";
  TempDir d("gguf_export_py");
  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    write_tiny_model(d / arch, arch, std::string(arch) == "qwen3", 21);
    for (const char* type : {"f16", "bf16", "q8_0"}) {
      const std::string g = d / (std::string(arch) + "." + type + ".gguf");
      export_gguf(d / arch, g, parse_gguf_export_type(type), false);
      // our reader's values of every tensor, in GGUF order, for the script to compare
      const GgufFile f(g);
      const std::string dump = g + ".f32";
      std::ofstream o(dump, std::ios::binary);
      for (const auto& t : f.tensors()) {
        const std::vector<float> v = f.dequantize(t);
        o.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
      }
      o.close();
      const std::string cmd = py + " " + RP_FIXTURES_DIR + "/gguf_export/check_gguf.py " + g + " " + dump +
                              " " + arch + " " + type + " 2>&1";
      FILE* p = popen(cmd.c_str(), "r");
      ASSERT_NE(p, nullptr);
      std::string text;
      char buf[4096];
      while (size_t n = fread(buf, 1, sizeof buf, p)) text.append(buf, n);
      EXPECT_EQ(pclose(p), 0) << arch << " " << type << ": " << text;
      EXPECT_NE(text.find("ok"), std::string::npos) << text;
    }
  }
}

}  // namespace
