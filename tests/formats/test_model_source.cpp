// ModelSource: a model read tensor by tensor gives exactly what load_model gives, frozen
// storage filled from the file form (bf16 copied, GGUF Q8_0 / Q4_0 blocks copied bit for bit,
// other forms converted as an eager load + quantize_weights would), load_model's one-line
// errors, and a peak host memory of about the storage form.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "kernels/dtype.hpp"
#include "kernels/weight_format.hpp"
#include "roundpipe/model_source.hpp"
#include "test_io_util.hpp"

namespace rp {
namespace {

namespace fs = std::filesystem;
using test::GgufBuilder;
using test::TempDir;

/// hidden 64, 4 heads / 2 kv heads (head_dim 16), ffn 128, vocab 96, 2 layers: every matrix is
/// a whole number of 64-value blocks and every row of 64 values two 32-value ones.
ModelConfig small_config(const std::string& arch, bool tied) {
  ModelConfig c;
  c.architecture = arch;
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  c.qk_norm = arch == "qwen3";
  return c;
}

LoraConfig lora_with(WeightFormat f) {
  LoraConfig l;
  l.r = 4;
  l.target_modules = {"q_proj", "v_proj"};
  l.base_format = f;
  return l;
}

/// The old eager path's frozen base: every tensor of `ref` (fp32, HF names) quantized into its
/// TensorSpec::format, trainable groups copied.
void eager_groups(const std::map<std::string, std::vector<float>>& ref, const ModelLayout& layout,
                  std::vector<std::vector<float>>& tr, std::vector<std::vector<uint8_t>>& fr) {
  tr.assign(layout.groups.size(), {});
  fr.assign(layout.groups.size(), {});
  for (size_t g = 0; g < size_t(layout.num_layers()); ++g) {
    const ParamGroup& grp = layout.groups[g];
    if (grp.frozen) fr[g].resize(size_t(grp.storage_bytes));
    else tr[g].resize(size_t(grp.numel));
    for (const TensorSpec& t : grp.tensors) {
      const std::vector<float>& v = ref.at(t.name);
      if (grp.frozen)
        quantize_weights(t.format, v.data(), fr[g].data() + t.byte_offset, t.numel(),
                         weight_format_cols(t.shape));
      else std::copy(v.begin(), v.end(), tr[g].begin() + t.offset);
    }
  }
}

/// Writes config.json + model.safetensors of random values in `dtype`; returns the fp32 values
/// a reader must see (the values rounded to dtype).
std::map<std::string, std::vector<float>> write_hf(const ModelConfig& c, const std::string& dir, DType dtype,
                                                   uint32_t seed) {
  const ModelLayout layout = make_layout(c);
  std::vector<std::vector<float>> groups;
  std::vector<const float*> ptrs;
  std::map<std::string, std::vector<float>> ref;
  for (const auto& g : layout.groups) groups.push_back(test::random_values(size_t(g.numel), seed++, 0.5f));
  for (size_t g = 0; g < groups.size(); ++g) {
    for (float& x : groups[g])
      x = dtype == DType::bf16  ? bf16_to_f32(f32_to_bf16(x))
          : dtype == DType::f16 ? f16_to_f32(f32_to_f16(x))
                                : x;
    ptrs.push_back(groups[g].data());
    for (const auto& t : layout.groups[g].tensors)
      ref[t.name].assign(groups[g].begin() + t.offset, groups[g].begin() + t.offset + t.numel());
  }
  save_hf_checkpoint(dir, layout, ptrs, nullptr, "", dtype);
  return ref;
}

/// Every tensor of a safetensors model, read lazily, equals the file's values; each LoRA
/// storage form equals the eager path's bytes, copied as stored exactly where the file's dtype
/// is that form.
void check_hf_model(DType dtype, bool tied) {
  TempDir dir("msrc");
  const ModelConfig c = small_config("qwen3", tied);
  const auto ref = write_hf(c, dir / "m", dtype, 7);
  const ModelSource src = ModelSource::open(dir / "m");
  const LoadedModel eager = load_model(dir / "m");
  ASSERT_EQ(eager.tensors.size(), ref.size());
  for (const auto& [name, v] : ref) {
    EXPECT_EQ(src.read_f32(name).data, v) << name;
    EXPECT_EQ(eager.tensors.at(name).data, v) << name;
  }
  for (WeightFormat f : {WeightFormat::bf16, WeightFormat::f16, WeightFormat::f32, WeightFormat::q8_0,
                         WeightFormat::q4_0, WeightFormat::nf4, WeightFormat::fp8}) {
    const ModelLayout layout = make_layout(c, lora_with(f));
    std::vector<std::vector<float>> tr, want_tr;
    std::vector<std::vector<uint8_t>> fr, want_fr;
    const int64_t stored = read_base_groups(src, layout, tr, fr);
    eager_groups(ref, layout, want_tr, want_fr);
    EXPECT_EQ(tr, want_tr) << weight_format_name(f);
    EXPECT_EQ(fr, want_fr) << weight_format_name(f);
    int64_t same_form = 0;  // tensors whose file dtype is their storage form
    for (const auto& g : layout.groups)
      for (const auto& t : g.tensors)
        if (g.frozen && ((dtype == DType::bf16 && t.format == WeightFormat::bf16) ||
                         (dtype == DType::f32 && t.format == WeightFormat::f32)))
          ++same_form;
    EXPECT_EQ(stored, same_form) << weight_format_name(f);
    // later, one frozen group at a time (the disk tier's frozen source): the same bytes
    std::vector<std::vector<float>> lazy_tr;
    std::vector<std::vector<uint8_t>> lazy_fr;
    EXPECT_EQ(read_base_groups(src, layout, lazy_tr, lazy_fr, /*frozen_later=*/true), 0);
    EXPECT_EQ(lazy_tr, want_tr) << weight_format_name(f);
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      EXPECT_TRUE(lazy_fr[g].empty());
      if (!layout.groups[g].frozen) continue;
      std::vector<std::byte> one(size_t(layout.groups[g].storage_bytes));
      read_frozen_group(src, layout, int(g), one);
      EXPECT_EQ(std::memcmp(one.data(), want_fr[g].data(), one.size()), 0) << layout.groups[g].name;
    }
  }
}

// The identity of a model's files changes when one of them does, and not otherwise.
TEST(ModelSource, FilesIdentityFollowsTheFiles) {
  TempDir dir("msid");
  const ModelConfig c = small_config("qwen3", false);
  write_hf(c, dir / "m", DType::bf16, 7);
  const std::string m = dir / "m";
  const std::string a = model_files_identity(m);
  EXPECT_EQ(model_files_identity(m), a);
  EXPECT_NE(a.find("config.json"), std::string::npos) << a;
  { std::ofstream(m + "/config.json", std::ios::app) << " "; }
  EXPECT_NE(model_files_identity(m), a);
}

// Files beside the weights (a disk tier's cache, its lock, a README) leave the identity alone.
TEST(ModelSource, FilesIdentityLeavesOutFilesTheWeightsDoNotComeFrom) {
  TempDir dir("msid_other");
  write_hf(small_config("qwen3", false), dir / "m", DType::bf16, 7);
  const std::string m = dir / "m";
  const std::string a = model_files_identity(m);
  for (const char* f : {"base.tier", "base.tier.lock", "base.tier.tmp-12", "README.md"})
    std::ofstream(m + "/" + f) << "x";
  EXPECT_EQ(model_files_identity(m), a);
  { std::ofstream(m + "/model-2.safetensors") << "x"; }  // a shard is one of them
  EXPECT_NE(model_files_identity(m), a);
}

// A weights file rewritten in place with its size and modification time put back (or copied
// over with cp -p) is a change: its status-change time or inode moves.
TEST(ModelSource, FilesIdentitySeesARewriteThatKeepsSizeAndModificationTime) {
  TempDir dir("msid_rewrite");
  write_hf(small_config("qwen3", false), dir / "m", DType::bf16, 7);
  const std::string w = dir / "m/model.safetensors";
  const std::string a = model_files_identity(dir / "m");
  const auto mtime = fs::last_write_time(w);
  const auto size = fs::file_size(w);
  {
    std::fstream f(w, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(size - 16));
    f.write("\x01\x02\x03\x04", 4);
  }
  fs::last_write_time(w, mtime);
  ASSERT_EQ(fs::file_size(w), size);
  ASSERT_EQ(fs::last_write_time(w), mtime);
  EXPECT_NE(model_files_identity(dir / "m"), a);
  // copied over with the modification time kept: another inode
  const std::string b = model_files_identity(dir / "m");
  fs::copy_file(w, dir / "copy.safetensors");
  fs::last_write_time(dir / "copy.safetensors", mtime);
  fs::rename(dir / "copy.safetensors", w);
  EXPECT_NE(model_files_identity(dir / "m"), b);
}

TEST(ModelSource, SafetensorsBf16MatchesEagerLoad) { check_hf_model(DType::bf16, false); }
TEST(ModelSource, SafetensorsF32TiedMatchesEagerLoad) { check_hf_model(DType::f32, true); }

// An fp8 base needs a finite scale per row: a base whose matrix holds an infinity or a NaN is
// refused in one line naming the tensor (the other forms keep such values as they are).
TEST(ModelSource, Fp8BaseRefusesANonFiniteRowNamingTheTensor) {
  TempDir dir("msrc");
  const ModelConfig c = small_config("llama", false);
  write_hf(c, dir / "m", DType::f32, 3);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    LoadedModel m = load_model(dir / "m");
    m.tensors.at("model.layers.1.mlp.up_proj.weight").data[5] = bad;
    const ModelSource src = ModelSource::from_loaded(std::move(m));
    std::vector<std::vector<float>> tr;
    std::vector<std::vector<uint8_t>> fr;
    EXPECT_NO_THROW(read_base_groups(src, make_layout(c, lora_with(WeightFormat::q8_0)), tr, fr));
    try {
      read_base_groups(src, make_layout(c, lora_with(WeightFormat::fp8)), tr, fr);
      ADD_FAILURE() << "a base with " << bad << " was stored in fp8";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("tensor 'model.layers.1.mlp.up_proj.weight': fp8 weights: row 0 holds a NaN or an "
                          "infinity"),
                std::string::npos)
          << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(ModelSource, ShardedSafetensorsAndUntie) {
  TempDir dir("msrc");
  const ModelConfig c = small_config("llama", true);
  const auto ref = write_hf(c, dir / "m", DType::bf16, 3);
  // the same tensors in small shards with an index
  fs::create_directories(dir / "s");
  fs::copy_file(dir / "m/config.json", dir / "s/config.json");
  const LoadedModel m = load_model(dir / "m");
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : m.tensors) refs.push_back({name, t.shape, t.data.data()});
  const auto files = save_safetensors_sharded(dir / "s", refs, DType::bf16, 20000);
  ASSERT_GT(files.size(), 3u);
  ModelSource src = ModelSource::open(dir / "s");
  for (const auto& [name, v] : ref) EXPECT_EQ(src.read_f32(name).data, v) << name;
  EXPECT_EQ(src.read_all().tensors.size(), ref.size());
  src.untie_embeddings();
  EXPECT_FALSE(src.config().tie_word_embeddings);
  EXPECT_EQ(src.read_f32("lm_head.weight").data, ref.at("model.embed_tokens.weight"));
  const ModelLayout layout = make_layout(src.config(), lora_with(WeightFormat::bf16));
  std::vector<std::vector<float>> tr;
  std::vector<std::vector<uint8_t>> fr;
  read_base_groups(src, layout, tr, fr);
  auto want = ref;
  want["lm_head.weight"] = ref.at("model.embed_tokens.weight");
  std::vector<std::vector<float>> want_tr;
  std::vector<std::vector<uint8_t>> want_fr;
  eager_groups(want, layout, want_tr, want_fr);
  EXPECT_EQ(fr, want_fr);
}

// ---- GGUF ------------------------------------------------------------------------------

uint16_t half_bits(float x) { return f32_to_f16(x); }

/// Random ggml blocks of `type` holding n values (scales small and finite).
std::vector<uint8_t> random_blocks(GgmlType type, int64_t n, std::mt19937& g) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  std::vector<uint8_t> b;
  auto put16 = [&](uint16_t h) { b.push_back(uint8_t(h & 255)), b.push_back(uint8_t(h >> 8)); };
  switch (type) {
    case GgmlType::F32:
      for (int64_t i = 0; i < n; ++i) {
        const float x = scale(g) * 20 - 0.2f;
        uint8_t t[4];
        std::memcpy(t, &x, 4);
        b.insert(b.end(), t, t + 4);
      }
      break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) put16(half_bits(scale(g) * 20 - 0.2f));
      break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) put16(f32_to_bf16(scale(g) * 20 - 0.2f));
      break;
    case GgmlType::Q8_0:
      for (int64_t k = 0; k < n / 32; ++k) {
        put16(half_bits(scale(g)));
        for (int i = 0; i < 32; ++i) b.push_back(uint8_t(byte(g)));
      }
      break;
    case GgmlType::Q4_0:
      for (int64_t k = 0; k < n / 32; ++k) {
        put16(half_bits(scale(g)));
        for (int i = 0; i < 16; ++i) b.push_back(uint8_t(byte(g)));
      }
      break;
    case GgmlType::Q4_1:
      for (int64_t k = 0; k < n / 32; ++k) {
        put16(half_bits(scale(g)));
        put16(half_bits(-scale(g) * 8));
        for (int i = 0; i < 16; ++i) b.push_back(uint8_t(byte(g)));
      }
      break;
    default: ADD_FAILURE() << "no generator for type " << int(type);
  }
  return b;
}

/// Rows of `row_bytes` bytes each permuted as convert_hf_to_gguf.py permutes LLaMA q/k rows.
std::vector<uint8_t> permute_rows(const std::vector<uint8_t>& w, int64_t rows, size_t row_bytes,
                                  int64_t heads) {
  std::vector<float> idx(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) idx[size_t(r)] = float(r);
  const std::vector<float> p = test::llama_permute(idx, rows, 1, heads);  // file row -> HF row
  std::vector<uint8_t> out(w.size());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data() + size_t(r) * row_bytes, w.data() + size_t(p[size_t(r)]) * row_bytes, row_bytes);
  return out;
}

struct GgufModel {
  std::map<std::string, std::vector<uint8_t>> hf_blocks;  ///< HF row order, file type
  std::map<std::string, GgmlType> type;
  std::map<std::string, std::vector<float>> ref;  ///< dequantized, HF order
};

/// A llama (permuted q/k) or qwen3 GGUF whose matrices are of mixed ggml types.
GgufModel write_gguf(const std::string& arch, const std::string& path) {
  const ModelConfig c = small_config(arch, false);
  GgufBuilder b;
  const std::string a = arch + ".";
  b.str("general.architecture", arch);
  b.u32(a + "block_count", uint32_t(c.num_hidden_layers));
  b.u32(a + "embedding_length", uint32_t(c.hidden_size));
  b.u32(a + "feed_forward_length", uint32_t(c.intermediate_size));
  b.u32(a + "attention.head_count", uint32_t(c.num_attention_heads));
  b.u32(a + "attention.head_count_kv", uint32_t(c.num_key_value_heads));
  b.u32(a + "context_length", 128);
  GgufModel m;
  std::mt19937 g(11);
  auto add = [&](const std::string& gname, const std::string& hname, std::vector<int64_t> shape, GgmlType t,
                 int64_t heads = 0) {
    const int64_t n = shape.size() == 2 ? shape[0] * shape[1] : shape[0];
    const std::vector<uint8_t> hf = random_blocks(t, n, g);
    m.hf_blocks[hname] = hf;
    m.type[hname] = t;
    m.ref[hname].resize(size_t(n));
    dequantize_ggml(uint32_t(t), hf.data(), m.ref[hname].data(), n);
    std::vector<uint8_t> file = hf;
    if (heads) file = permute_rows(hf, shape[0], hf.size() / size_t(shape[0]), heads);
    b.tensor(gname, std::vector<uint64_t>(shape.rbegin(), shape.rend()), uint32_t(t), file);
  };
  const int64_t H = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
  const bool llama = arch == "llama";
  add("token_embd.weight", "model.embed_tokens.weight", {c.vocab_size, H}, GgmlType::BF16);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string bl = "blk." + std::to_string(l) + ".", p = "model.layers." + std::to_string(l) + ".";
    add(bl + "attn_norm.weight", p + "input_layernorm.weight", {H}, GgmlType::F32);
    add(bl + "attn_q.weight", p + "self_attn.q_proj.weight", {4 * D, H}, GgmlType::Q8_0, llama ? 4 : 0);
    add(bl + "attn_k.weight", p + "self_attn.k_proj.weight", {2 * D, H}, GgmlType::Q4_0, llama ? 2 : 0);
    add(bl + "attn_v.weight", p + "self_attn.v_proj.weight", {2 * D, H}, GgmlType::Q8_0);
    if (!llama) {
      add(bl + "attn_q_norm.weight", p + "self_attn.q_norm.weight", {D}, GgmlType::F32);
      add(bl + "attn_k_norm.weight", p + "self_attn.k_norm.weight", {D}, GgmlType::F32);
    }
    add(bl + "attn_output.weight", p + "self_attn.o_proj.weight", {H, 4 * D}, GgmlType::Q4_0);
    add(bl + "ffn_norm.weight", p + "post_attention_layernorm.weight", {H}, GgmlType::F32);
    add(bl + "ffn_gate.weight", p + "mlp.gate_proj.weight", {F, H}, GgmlType::Q4_1);
    add(bl + "ffn_up.weight", p + "mlp.up_proj.weight", {F, H}, GgmlType::F16);
    add(bl + "ffn_down.weight", p + "mlp.down_proj.weight", {H, F}, GgmlType::Q8_0);
  }
  add("output_norm.weight", "model.norm.weight", {H}, GgmlType::F32);
  add("output.weight", "lm_head.weight", {c.vocab_size, H}, GgmlType::Q4_1);
  test::write_bytes(path, b.build());
  return m;
}

bool copies(GgmlType t, WeightFormat f) {
  return (t == GgmlType::Q8_0 && f == WeightFormat::q8_0) ||
         (t == GgmlType::Q4_0 && f == WeightFormat::q4_0) || (t == GgmlType::F32 && f == WeightFormat::f32) ||
         (t == GgmlType::F16 && f == WeightFormat::f16) || (t == GgmlType::BF16 && f == WeightFormat::bf16);
}

void check_gguf(const std::string& arch) {
  TempDir dir("msrc");
  const GgufModel m = write_gguf(arch, dir / "m.gguf");
  const ModelSource src = ModelSource::open(dir / "m.gguf");
  const LoadedModel eager = load_model(dir / "m.gguf");
  ASSERT_EQ(eager.tensors.size(), m.ref.size());
  for (const auto& [name, v] : m.ref) {
    EXPECT_EQ(src.read_f32(name).data, v) << name;  // q/k back in HF row order
    EXPECT_EQ(eager.tensors.at(name).data, v) << name;
  }
  for (WeightFormat f :
       {WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::nf4, WeightFormat::bf16, WeightFormat::f16}) {
    const ModelLayout layout = make_layout(src.config(), lora_with(f));
    std::vector<std::vector<float>> tr, want_tr;
    std::vector<std::vector<uint8_t>> fr, want_fr;
    const int64_t stored = read_base_groups(src, layout, tr, fr);
    eager_groups(m.ref, layout, want_tr, want_fr);
    EXPECT_EQ(tr, want_tr) << weight_format_name(f);
    int64_t want_stored = 0;
    for (size_t g = 0; g < size_t(layout.num_layers()); ++g) {
      const ParamGroup& grp = layout.groups[g];
      for (const TensorSpec& t : grp.tensors) {
        if (!grp.frozen) continue;
        const size_t nb = weight_format_bytes(t.format, t.numel());
        const std::vector<uint8_t> got(fr[g].begin() + t.byte_offset,
                                       fr[g].begin() + t.byte_offset + ptrdiff_t(nb));
        const std::vector<uint8_t> conv(want_fr[g].begin() + t.byte_offset,
                                        want_fr[g].begin() + t.byte_offset + ptrdiff_t(nb));
        if (copies(m.type.at(t.name), t.format)) {
          ++want_stored;
          EXPECT_EQ(got, m.hf_blocks.at(t.name))
              << t.name << " " << weight_format_name(f);  // the file's blocks
        } else {
          EXPECT_EQ(got, conv) << t.name << " " << weight_format_name(f);  // eager dequantize + quantize
        }
      }
    }
    EXPECT_EQ(stored, want_stored) << weight_format_name(f);
    EXPECT_GT(want_stored, 0);
  }
}

TEST(ModelSource, LlamaGgufBlocksCopiedWithRowsUnpermuted) { check_gguf("llama"); }
TEST(ModelSource, Qwen3GgufBlocksCopied) { check_gguf("qwen3"); }

TEST(ModelSource, Q8BlockCopyDiffersFromARequantization) {
  // the copy is the file's blocks, not a dequantize/requantize round trip (which changes them)
  TempDir dir("msrc");
  const GgufModel m = write_gguf("qwen3", dir / "m.gguf");
  const ModelSource src = ModelSource::open(dir / "m.gguf");
  const std::string name = "model.layers.0.self_attn.v_proj.weight";
  const auto& ref = m.ref.at(name);
  std::vector<uint8_t> got(weight_format_bytes(WeightFormat::q8_0, int64_t(ref.size())));
  std::vector<uint8_t> requant(got.size());
  EXPECT_TRUE(src.read_as(name, WeightFormat::q8_0, got.data()));
  quantize_weights(WeightFormat::q8_0, ref.data(), requant.data(), int64_t(ref.size()));
  EXPECT_EQ(got, m.hf_blocks.at(name));
  EXPECT_NE(got, requant);
}

TEST(ModelSource, Q8ExpertStacksAreCopiedAsTheirBlocks) {
  // llama.cpp's qwen3moe Q8_0 fixture (tests/fixtures/gguf_moe): each expert of a stacked
  // [E, rows, cols] tensor is a whole run of blocks, copied as it is; its fp32 values are the
  // stack's dequantized slice
  const std::string path = std::string(RP_FIXTURES_DIR) + "/gguf_moe/tiny_qwen3_moe.q8_0.gguf";
  const GgufFile f(path);
  const ModelSource src = ModelSource::open(path);
  const int64_t E = src.config().num_experts;
  int checked = 0;
  for (const auto& t : f.tensors()) {
    std::string prefix, suffix;
    if (!gguf_expert_stack_name(t.name, prefix, suffix)) continue;
    ASSERT_EQ(t.type, uint32_t(GgmlType::Q8_0)) << t.name;
    const std::vector<float> all = f.dequantize(t);
    const size_t per = size_t(t.numel() / E), per_bytes = size_t(t.nbytes / uint64_t(E));
    for (int64_t e = 0; e < E; ++e) {
      const std::string name = prefix + std::to_string(e) + suffix;
      std::vector<uint8_t> got(weight_format_bytes(WeightFormat::q8_0, int64_t(per)));
      EXPECT_TRUE(src.read_as(name, WeightFormat::q8_0, got.data())) << name;
      const std::vector<uint8_t> stack = f.tensor_bytes(t);
      const uint8_t* blocks = stack.data() + size_t(e) * per_bytes;
      EXPECT_EQ(got, std::vector<uint8_t>(blocks, blocks + per_bytes)) << name;
      const std::vector<float> want(all.begin() + ptrdiff_t(size_t(e) * per),
                                    all.begin() + ptrdiff_t(size_t(e + 1) * per));
      EXPECT_EQ(src.read_f32(name).data, want) << name;
      std::vector<uint8_t> nf4(weight_format_bytes(WeightFormat::nf4, int64_t(per))), nf4_want(nf4.size());
      EXPECT_FALSE(src.read_as(name, WeightFormat::nf4, nf4.data())) << name;
      quantize_weights(WeightFormat::nf4, want.data(), nf4_want.data(), int64_t(per));
      EXPECT_EQ(nf4, nf4_want) << name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 3 * 4);  // 2 layers, gate/up/down, 4 experts
}

// ---- errors ----------------------------------------------------------------------------

TEST(ModelSource, BadFilesGiveLoadModelsOneLineErrors) {
  TempDir dir("msrc");
  auto expect_same = [&](const std::string& path, const std::string& want) {
    std::string lazy, eager;
    try {
      ModelSource::open(path);
    } catch (const std::runtime_error& e) {
      lazy = e.what();
    }
    try {
      load_model(path);
    } catch (const std::runtime_error& e) {
      eager = e.what();
    }
    EXPECT_EQ(lazy, eager);
    EXPECT_NE(lazy.find(want), std::string::npos) << lazy;
    EXPECT_EQ(lazy.find('\n'), std::string::npos) << lazy;
  };
  const ModelConfig c = small_config("qwen3", true);
  const auto ref = write_hf(c, dir / "m", DType::bf16, 5);
  const LoadedModel m = load_model(dir / "m");
  auto rewrite = [&](const std::string& sub, const std::function<void(std::vector<TensorRef>&)>& edit,
                     DType dtype = DType::bf16) {
    fs::create_directories(dir / sub);
    fs::copy_file(dir / "m/config.json", dir / (sub + "/config.json"), fs::copy_options::overwrite_existing);
    std::vector<TensorRef> refs;
    for (const auto& [name, t] : m.tensors) refs.push_back({name, t.shape, t.data.data()});
    edit(refs);
    save_safetensors(dir / (sub + "/model.safetensors"), refs, dtype);
    return dir / sub;
  };
  const std::string missing =
      "model.layers.1.post_attention_layernorm.weight";  // small: the files still fit the config
  expect_same(
      rewrite("a", [&](auto& r) { std::erase_if(r, [&](const TensorRef& t) { return t.name == missing; }); }),
      "missing tensor '" + missing + "'");
  const std::vector<float> extra(64, 1.0f);
  expect_same(rewrite("b",
                      [&](auto& r) {
                        r.push_back({"model.layers.0.mlp.bias", {64}, extra.data()});
                      }),
              "unexpected tensor 'model.layers.0.mlp.bias'");
  expect_same(rewrite("c",
                      [&](auto& r) {
                        for (auto& t : r)
                          if (t.name == "model.norm.weight") t.shape = {8, 8};
                      }),
              "tensor 'model.norm.weight': expected shape [64], got [8, 8]");
  const std::vector<float> other(size_t(96 * 64), 0.25f);
  expect_same(rewrite("d",
                      [&](auto& r) {
                        r.push_back({"lm_head.weight", {96, 64}, other.data()});
                      }),
              "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight'");
  // an equal tied head is accepted and dropped
  {
    const auto d = rewrite(
        "e",
        [&](auto& r) {
          r.push_back({"lm_head.weight", {96, 64}, m.tensors.at("model.embed_tokens.weight").data.data()});
        },
        DType::f32);
    const ModelSource s = ModelSource::open(d);
    EXPECT_THROW(s.shape("lm_head.weight"), std::runtime_error);
  }
  // a GGUF tensor of a type that cannot be dequantized
  {
    GgufBuilder b;
    b.str("general.architecture", "qwen3");
    b.u32("qwen3.block_count", 1);
    b.u32("qwen3.embedding_length", 64);
    b.u32("qwen3.feed_forward_length", 128);
    b.u32("qwen3.attention.head_count", 4);
    b.tensor("token_embd.weight", {64, 96}, uint32_t(GgmlType::I8), std::vector<uint8_t>(96 * 64, 1));
    b.tensor_f32("blk.0.ffn_up.weight", {64, 128},
                 std::vector<float>(64 * 128, 0.5f));  // the file's size fits
    test::write_bytes(dir / "q.gguf", b.build());
    expect_same(dir / "q.gguf", "tensor 'token_embd.weight': cannot dequantize type I8");
  }
  expect_same(dir / "nope", "no such file or directory");
}

// A model file that shrinks while it is read (truncated in place by another program) fails the
// read of every tensor after the cut with one line naming the file and the tensor (reading the
// mapping there would have died of SIGBUS); the bytes it still holds may already be another
// file's, so they are refused too.
TEST(ModelSource, AFileThatShrinksWhileReadFailsTheReadNotTheProcess) {
  test::TempDir dir("msrc_shrink");
  const std::string f = RP_FIXTURES_DIR;
  fs::copy(f + "/gguf_moe/tiny_qwen3_moe.f32.gguf", dir.path / "m.gguf");
  fs::create_directories(dir.path / "hf");
  for (const char* name : {"config.json", "model.safetensors"})
    fs::copy(f + "/hf_golden/tiny_llama/" + name, dir.path / "hf" / name);
  for (const auto& [path, file] : {std::pair{dir.path / "m.gguf", dir.path / "m.gguf"},
                                   std::pair{dir.path / "hf", dir.path / "hf" / "model.safetensors"}}) {
    SCOPED_TRACE(path.string());
    const ModelSource src = ModelSource::open(path.string());
    const LoadedModel whole = load_model(path.string());
    fs::resize_file(file, fs::file_size(file) / 2);
    int read = 0, refused = 0;
    for (const auto& [name, t] : whole.tensors) {
      try {
        EXPECT_TRUE(src.read_f32(name).data == t.data) << name;
        ++read;
      } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        EXPECT_EQ(what.rfind(file.string() + ": tensor '", 0), 0u) << what;
        EXPECT_NE(what.find("the file changed while being read: it is now"), std::string::npos) << what;
        EXPECT_EQ(what.find('\n'), std::string::npos) << what;
        ++refused;
      }
    }
    EXPECT_EQ(read, 0);  // none: what the file holds now may be another file's bytes
    EXPECT_GT(refused, 0);
  }
}

}  // namespace
}  // namespace rp
