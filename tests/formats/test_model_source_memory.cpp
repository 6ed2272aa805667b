// The peak host memory of filling a LoRA run's frozen base from a model file: read tensor by
// tensor (ModelSource + read_base_groups) it grows by about the storage form, loaded eagerly
// (load_model: every tensor in fp32) by more than the fp32 model. The model (54 M parameters,
// 218 MB in fp32) is written as a bf16 safetensors file in small chunks, so the test process
// never holds it; the peak is the kernel's resident-set high-water mark (VmHWM), reset through
// /proc/self/clear_refs before each measurement.
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/gguf_export.hpp"
#include "kernels/weight_format.hpp"
#include "model/config.hpp"
#include "model/layout.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/model_source.hpp"
#include "test_io_util.hpp"

namespace rp {
namespace {

/// A field of /proc/self/status in bytes (kB in the file), -1 when unreadable.
int64_t status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}

/// Resets VmHWM to the current resident set; false when the kernel does not allow it.
bool reset_peak() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

ModelConfig big_config() {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 8192;
  c.hidden_size = 512;
  c.intermediate_size = 2048;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = true;
  return c;
}

/// config.json + model.safetensors (bf16, pseudo-random values of magnitude 2^-7 .. 2^-1),
/// written 1 MB at a time.
void write_bf16_model(const ModelConfig& c, const std::string& dir) {
  {
    std::ofstream o(dir + "/config.json");
    o << config_to_json(c).dump(2);
  }
  const ModelLayout layout = make_layout(c);
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  uint64_t off = 0;
  for (const auto& g : layout.groups)
    for (const auto& t : g.tensors) {
      const uint64_t n = uint64_t(t.numel()) * 2;
      h[t.name] = {{"dtype", "BF16"}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
      off += n;
    }
  std::string header = h.dump();
  while (header.size() % 8) header.push_back(' ');
  std::ofstream o(dir + "/model.safetensors", std::ios::binary);
  const uint64_t hn = header.size();
  o.write(reinterpret_cast<const char*>(&hn), 8);
  o.write(header.data(), std::streamsize(header.size()));
  std::vector<uint16_t> chunk(1 << 19);
  uint32_t x = 12345;
  for (uint64_t done = 0; done < off; done += chunk.size() * 2) {
    const size_t m = size_t(std::min<uint64_t>(chunk.size(), (off - done) / 2));
    for (size_t i = 0; i < m; ++i) {
      x = x * 1664525u + 1013904223u;
      chunk[i] = uint16_t((x >> 16 & 0x8000u) | ((120u + (x >> 8) % 6u) << 7) | (x & 0x7fu));
    }
    o.write(reinterpret_cast<const char*>(chunk.data()), std::streamsize(m * 2));
  }
  ASSERT_TRUE(bool(o));
}

// Bytes of a LoRA run's host groups: frozen ones in their storage form, trainable ones fp32.
double storage_of(const ModelLayout& layout) {
  double storage = 0;
  for (const auto& g : layout.groups) storage += g.frozen ? double(g.storage_bytes) : 4.0 * double(g.numel);
  return storage;
}

// Peak RSS growth while the base groups of `layout` are read tensor by tensor from the model
// in `dir` (ModelSource), and the bytes read_base_groups copied as stored. peak < 0 when the
// peak could not be reset.
struct LazyRead {
  double peak = -1;
  int64_t stored = 0;
};
LazyRead lazy_read(const std::string& dir, const ModelLayout& layout) {
  LazyRead r;
  const int64_t before = status_bytes("VmRSS");
  if (!reset_peak()) return r;
  std::vector<std::vector<float>> tr;
  std::vector<std::vector<uint8_t>> fr;
  const ModelSource src = ModelSource::open(dir);
  r.stored = read_base_groups(src, layout, tr, fr);
  r.peak = double(status_bytes("VmHWM") - before);
  return r;
}

TEST(ModelSourceMemory, FrozenBaseNeedsAboutItsStorageForm) {
  test::TempDir dir("msrc_mem");
  const ModelConfig c = big_config();
  write_bf16_model(c, dir.path.string());
  LoraConfig lora;
  lora.r = 8;
  lora.base_format = WeightFormat::bf16;
  const ModelLayout layout = make_layout(c, lora);
  const double storage = storage_of(layout);
  const double fp32 = 4.0 * double(c.num_parameters());
  ASSERT_GT(fp32, 200e6);

  malloc_trim(0);
  if (!reset_peak() || status_bytes("VmHWM") < 0)
    GTEST_SKIP() << "/proc/self/clear_refs cannot reset VmHWM here";
  double lazy = 0;
  {
    const LazyRead r = lazy_read(dir.path.string(), layout);
    ASSERT_GE(r.peak, 0) << "/proc/self/clear_refs could not reset VmHWM";
    const int64_t stored = r.stored;
    lazy = r.peak;
    EXPECT_GT(stored, 0);
  }
  malloc_trim(0);
  double eager = 0;
  {
    const int64_t before = status_bytes("VmRSS");
    ASSERT_TRUE(reset_peak());
    LoadedModel m = load_model(dir.path.string());
    std::vector<std::vector<uint8_t>> fr(layout.groups.size());
    for (size_t g = 0; g < size_t(layout.num_layers()); ++g) {  // what the eager LoRA setup did
      const ParamGroup& grp = layout.groups[g];
      fr[g].resize(size_t(grp.storage_bytes));
      for (const TensorSpec& t : grp.tensors)
        quantize_weights(t.format, m.tensors.at(t.name).data.data(), fr[g].data() + t.byte_offset, t.numel());
    }
    eager = double(status_bytes("VmHWM") - before);
  }
  std::printf("fp32 model %.0f MB, storage %.0f MB; peak growth: tensor by tensor %.0f MB, eager %.0f MB\n",
              fp32 / 1e6, storage / 1e6, lazy / 1e6, eager / 1e6);
  // the largest tensor (the 8 MB embedding) is the slack: well below the fp32 model
  EXPECT_LT(lazy, storage + 0.2 * fp32);
  EXPECT_LT(lazy, 0.75 * fp32);
  EXPECT_GT(eager, fp32);  // the measurement sees an fp32 copy when there is one
}

// A GPT-OSS checkpoint with MXFP4 experts (U8 _blocks / _scales, the rest bf16), written 1 MB
// at a time: pseudo-random codes, exponents 2^-9 .. 2^-2.
struct StEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
};

void write_gpt_oss_mxfp4(const ModelConfig& c, const std::string& dir) {
  {
    nlohmann::json j = config_to_json(c);
    j["quantization_config"] = {{"quant_method", "mxfp4"}};
    std::ofstream o(dir + "/config.json");
    o << j.dump(2);
  }
  std::vector<StEntry> es;
  for (const auto& g : make_layout(c).groups)
    for (const auto& t : g.tensors)
      if (t.name.find(".mlp.experts.") == std::string::npos) es.push_back({t.name, "BF16", t.shape});
  const int64_t E = c.num_experts, H = c.hidden_size, F = c.moe_intermediate_size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    es.push_back({p + "gate_up_proj_blocks", "U8", {E, 2 * F, H / 32, 16}});
    es.push_back({p + "gate_up_proj_scales", "U8", {E, 2 * F, H / 32}});
    es.push_back({p + "gate_up_proj_bias", "BF16", {E, 2 * F}});
    es.push_back({p + "down_proj_blocks", "U8", {E, H, F / 32, 16}});
    es.push_back({p + "down_proj_scales", "U8", {E, H, F / 32}});
    es.push_back({p + "down_proj_bias", "BF16", {E, H}});
  }
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  uint64_t off = 0;
  std::vector<uint64_t> sizes;
  for (const auto& e : es) {
    uint64_t n = e.dtype == "U8" ? 1 : 2;
    for (auto d : e.shape) n *= uint64_t(d);
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + n}}};
    off += n;
    sizes.push_back(n);
  }
  std::string header = h.dump();
  while (header.size() % 8) header.push_back(' ');
  std::ofstream o(dir + "/model.safetensors", std::ios::binary);
  const uint64_t hn = header.size();
  o.write(reinterpret_cast<const char*>(&hn), 8);
  o.write(header.data(), std::streamsize(header.size()));
  std::vector<uint8_t> chunk(1 << 20);
  uint32_t x = 777;
  for (size_t i = 0; i < es.size(); ++i) {
    const bool scales = es[i].name.find("_scales") != std::string::npos, u8 = es[i].dtype == "U8";
    for (uint64_t done = 0; done < sizes[i]; done += chunk.size()) {
      const size_t m = size_t(std::min<uint64_t>(chunk.size(), sizes[i] - done));
      for (size_t k = 0; k < m; k += u8 ? 1 : 2) {
        x = x * 1664525u + 1013904223u;
        if (u8) {
          chunk[k] = uint8_t(scales ? 118u + (x >> 16) % 8u : x >> 24);
        } else {
          const uint16_t v = uint16_t((x >> 16 & 0x8000u) | ((120u + (x >> 8) % 6u) << 7) | (x & 0x7fu));
          std::memcpy(&chunk[k], &v, 2);
        }
      }
      o.write(reinterpret_cast<const char*>(chunk.data()), std::streamsize(m));
    }
  }
  ASSERT_TRUE(bool(o));
}

// GPT-OSS with MXFP4 experts kept mxfp4: the experts are copied from the checkpoint's blocks
// tensor by tensor, never held in fp32 (they used to be dequantized whole when the model was
// opened, 4 bytes a weight).
TEST(ModelSourceMemory, GptOssMxfp4ExpertsNeedNoFp32Copy) {
  test::TempDir dir("msrc_oss");
  ModelConfig c;
  c.architecture = "gpt_oss";
  c.vocab_size = 256;
  c.hidden_size = 512;
  c.intermediate_size = c.moe_intermediate_size = 512;
  c.num_hidden_layers = 2;
  c.num_attention_heads = c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.max_position_embeddings = 256;
  c.num_experts = 32;
  c.num_experts_per_tok = 4;
  c.norm_topk_prob = true;
  c.attention_bias = c.attention_sinks = true;
  c.sliding_window = 128;
  c.layer_types = {"sliding_attention", "full_attention"};
  c.rope_theta = 150000;
  write_gpt_oss_mxfp4(c, dir.path.string());
  LoraConfig lora;
  lora.base_format = WeightFormat::mxfp4;
  const ModelLayout layout = make_layout(c, lora);
  const double storage = storage_of(layout);
  const double fp32_experts = 4.0 * 3 * double(c.num_experts * c.hidden_size * c.moe_intermediate_size * 2);
  ASSERT_GT(fp32_experts, 200e6);

  malloc_trim(0);
  if (!reset_peak() || status_bytes("VmHWM") < 0)
    GTEST_SKIP() << "/proc/self/clear_refs cannot reset VmHWM here";
  double lazy = 0;
  {
    const LazyRead r = lazy_read(dir.path.string(), layout);
    ASSERT_GE(r.peak, 0) << "/proc/self/clear_refs could not reset VmHWM";
    const int64_t stored = r.stored;
    lazy = r.peak;
    EXPECT_GE(stored, 2 * 3 * 32);  // every expert matrix copied as stored
  }
  malloc_trim(0);
  double eager = 0;
  {
    const int64_t before = status_bytes("VmRSS");
    ASSERT_TRUE(reset_peak());
    const LoadedModel m = load_model(dir.path.string());  // every tensor in fp32
    eager = double(status_bytes("VmHWM") - before);
  }
  std::printf("fp32 experts %.0f MB, storage %.0f MB; peak growth: tensor by tensor %.0f MB, fp32 %.0f MB\n",
              fp32_experts / 1e6, storage / 1e6, lazy / 1e6, eager / 1e6);
  EXPECT_LT(lazy, storage + 0.05 * fp32_experts);
  EXPECT_GT(eager, fp32_experts);  // the measurement sees an fp32 copy when there is one
}

// The GGUF llama.cpp would write for the tied llama model `c` (no output.weight), every
// tensor F16 with pseudo-random values of magnitude 2^-7 .. 2^-1, written 1 MB at a time.
void write_f16_gguf(const ModelConfig& c, const std::string& path) {
  test::GgufBuilder g;
  g.str("general.architecture", "llama");
  g.u32("llama.block_count", uint32_t(c.num_hidden_layers));
  g.u32("llama.embedding_length", uint32_t(c.hidden_size));
  g.u32("llama.feed_forward_length", uint32_t(c.intermediate_size));
  g.u32("llama.attention.head_count", uint32_t(c.num_attention_heads));
  g.u32("llama.attention.head_count_kv", uint32_t(c.num_key_value_heads));
  g.f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  g.f32("llama.rope.freq_base", 10000.0f);
  g.u32("llama.context_length", uint32_t(c.max_position_embeddings));
  g.str("tokenizer.ggml.model", "gpt2");  // a byte-level BPE vocabulary: "t0" .. "t<V-1>", one merge
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < c.vocab_size; ++i) tokens.push_back("t" + std::to_string(i));
  g.str_array("tokenizer.ggml.tokens", tokens);
  g.str_array("tokenizer.ggml.merges", {"t t1"});
  const uint64_t H = uint64_t(c.hidden_size), F = uint64_t(c.intermediate_size), V = uint64_t(c.vocab_size);
  const uint64_t q = uint64_t(c.num_attention_heads * c.head_dim),
                 kv = uint64_t(c.num_key_value_heads * c.head_dim);
  std::vector<std::vector<uint64_t>> ne;  // GGUF order: innermost first
  auto add = [&](const std::string& name, std::vector<uint64_t> n) {
    uint64_t e = 1;
    for (auto d : n) e *= d;
    g.tensor_declared(name, n, 1, e * 2);  // ggml type 1: F16
    ne.push_back(std::move(n));
  };
  add("token_embd.weight", {H, V});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {H});
    add(b + "attn_q.weight", {H, q});
    add(b + "attn_k.weight", {H, kv});
    add(b + "attn_v.weight", {H, kv});
    add(b + "attn_output.weight", {q, H});
    add(b + "ffn_norm.weight", {H});
    add(b + "ffn_gate.weight", {H, F});
    add(b + "ffn_up.weight", {H, F});
    add(b + "ffn_down.weight", {F, H});
  }
  add("output_norm.weight", {H});
  std::vector<uint64_t> offs;
  const std::vector<uint8_t> header = g.build_header(3, 32, offs);
  std::ofstream o(path, std::ios::binary);
  o.write(reinterpret_cast<const char*>(header.data()), std::streamsize(header.size()));
  std::vector<uint16_t> chunk(1 << 19);
  uint32_t x = 777;
  uint64_t at = 0;  // bytes of the data section written
  for (size_t i = 0; i < ne.size(); ++i) {
    for (; at < offs[i]; ++at) o.put(0);
    uint64_t n = 1;
    for (auto d : ne[i]) n *= d;
    for (uint64_t done = 0; done < n; done += chunk.size()) {
      const size_t m = size_t(std::min<uint64_t>(chunk.size(), n - done));
      for (size_t k = 0; k < m; ++k) {
        x = x * 1664525u + 1013904223u;
        chunk[k] = uint16_t((x >> 16 & 0x8000u) | ((8u + (x >> 8) % 7u) << 10) | (x & 0x3ffu));
      }
      o.write(reinterpret_cast<const char*>(chunk.data()), std::streamsize(m * 2));
      at += m * 2;
    }
  }
  ASSERT_TRUE(bool(o));
}

// convert reads one layout group at a time from the GGUF while it writes the folder (its peak
// grows by about two groups); the load-then-write it replaced held the fp32 model twice over
// (load_model, then the groups). The folder holds the model's values exactly (f32), and
// export-gguf, reading it one tensor at a time, writes them back.
TEST(ModelSourceMemory, ConvertAndExportHoldAboutTwoGroupsNotTheModel) {
  test::TempDir dir("convert_mem");
  const ModelConfig c = big_config();  // tied: the GGUF has no output.weight
  const std::string gguf = (dir.path / "m.gguf").string(), out = (dir.path / "hf").string();
  write_f16_gguf(c, gguf);
  const ModelLayout layout = make_layout(c);
  const double fp32 = 4.0 * double(c.num_parameters());
  double largest = 0;
  for (const auto& g : layout.groups) largest = std::max(largest, 4.0 * double(g.numel));
  ASSERT_GT(fp32, 200e6);
  ASSERT_LT(largest, 0.1 * fp32);

  malloc_trim(0);
  if (!reset_peak() || status_bytes("VmHWM") < 0)
    GTEST_SKIP() << "/proc/self/clear_refs cannot reset VmHWM here";
  int64_t before = status_bytes("VmRSS");
  ASSERT_TRUE(reset_peak());
  convert_gguf_to_hf(gguf, out, DType::f32);
  const double streamed = double(status_bytes("VmHWM") - before);

  malloc_trim(0);
  before = status_bytes("VmRSS");
  ASSERT_TRUE(reset_peak());
  LoadedModel m = load_model(gguf);
  {
    std::vector<std::vector<float>> groups;  // what convert did before it streamed
    fill_groups(m, layout, groups);
  }
  const double eager = double(status_bytes("VmHWM") - before);
  std::printf("fp32 model %.0f MB, largest group %.0f MB; peak growth: streamed %.0f MB, eager %.0f MB\n",
              fp32 / 1e6, largest / 1e6, streamed / 1e6, eager / 1e6);
  EXPECT_LT(streamed, 3 * largest + 0.1 * fp32);
  EXPECT_GT(eager, 1.5 * fp32);  // the measurement sees the fp32 copies when there are some

  {
    const LoadedModel back = load_model(out);
    ASSERT_EQ(back.tensors.size(), m.tensors.size());
    for (const auto& [name, t] : m.tensors) {
      ASSERT_TRUE(back.tensors.count(name)) << name;
      EXPECT_TRUE(back.tensors.at(name).data == t.data) << name;
    }
  }

  // export-gguf reads the folder one tensor at a time as it writes; f16 gives back the GGUF's values
  malloc_trim(0);
  before = status_bytes("VmRSS");
  ASSERT_TRUE(reset_peak());
  const std::string again = (dir.path / "again.gguf").string();
  export_gguf(out, again, GgufExportType::f16, false);
  const double exported = double(status_bytes("VmHWM") - before);
  std::printf("export-gguf: peak growth %.0f MB\n", exported / 1e6);
  EXPECT_LT(exported, 3 * largest + 0.1 * fp32);
  const LoadedModel back = load_model(again);
  ASSERT_EQ(back.tensors.size(), m.tensors.size());
  for (const auto& [name, t] : m.tensors) EXPECT_TRUE(back.tensors.at(name).data == t.data) << name;
}

// merge reads the base one group at a time too, folding the adapter into each as the writer
// takes it: its peak grows by about two groups, where loading the base and folding it in
// (load_merged_adapter, what merge did) holds the fp32 model. The folder holds those values.
TEST(ModelSourceMemory, MergeHoldsAboutTwoGroupsNotTheModel) {
  test::TempDir dir("merge_mem");
  const ModelConfig c = big_config();
  const std::string gguf = (dir.path / "m.gguf").string(), out = (dir.path / "merged").string();
  const std::string adapter = (dir.path / "adapter").string();
  write_f16_gguf(c, gguf);
  LoraConfig lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  const ModelLayout lay = make_layout(c, lora);
  std::vector<std::vector<float>> adapters(lay.groups.size());
  std::vector<const float*> ptrs(lay.groups.size(), nullptr);
  for (int l = 1; l <= int(c.num_hidden_layers); ++l) {
    const size_t g = size_t(lay.adapter_group(l));
    adapters[g] = test::random_values(size_t(lay.groups[g].numel), uint32_t(500 + l), 0.05f);
    ptrs[g] = adapters[g].data();
  }
  save_peft_adapter(adapter, lay, ptrs, gguf);
  const ModelLayout layout = make_layout(c);
  const double fp32 = 4.0 * double(c.num_parameters());
  double largest = 0;
  for (const auto& g : layout.groups) largest = std::max(largest, 4.0 * double(g.numel));

  malloc_trim(0);
  if (!reset_peak() || status_bytes("VmHWM") < 0)
    GTEST_SKIP() << "/proc/self/clear_refs cannot reset VmHWM here";
  int64_t before = status_bytes("VmRSS");
  ASSERT_TRUE(reset_peak());
  EXPECT_EQ(merge_peft_folder(adapter, out, gguf, DType::f32), gguf);
  const double streamed = double(status_bytes("VmHWM") - before);

  malloc_trim(0);
  before = status_bytes("VmRSS");
  ASSERT_TRUE(reset_peak());
  const LoadedModel m = load_merged_adapter(adapter, gguf, nullptr);
  const double eager = double(status_bytes("VmHWM") - before);
  std::printf("fp32 model %.0f MB, largest group %.0f MB; peak growth: streamed %.0f MB, eager %.0f MB\n",
              fp32 / 1e6, largest / 1e6, streamed / 1e6, eager / 1e6);
  EXPECT_LT(streamed, 3 * largest + 0.1 * fp32);
  EXPECT_GT(eager, fp32);

  const LoadedModel back = load_model(out);
  ASSERT_EQ(back.tensors.size(), m.tensors.size());
  for (const auto& [name, t] : m.tensors) {
    ASSERT_TRUE(back.tensors.count(name)) << name;
    EXPECT_TRUE(back.tensors.at(name).data == t.data) << name;
  }
  // the adapter is in: a targeted matrix differs from the base's
  const LoadedModel base = load_model(gguf);
  EXPECT_FALSE(base.tensors.at("model.layers.3.mlp.down_proj.weight").data ==
               back.tensors.at("model.layers.3.mlp.down_proj.weight").data);
}

}  // namespace
}  // namespace rp
