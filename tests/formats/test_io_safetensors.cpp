// safetensors read/write, sharded checkpoints, corrupt files, atomic HF checkpoint saves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "formats/checkpoint.hpp"
#include "formats/safetensors.hpp"
#include "test_io_util.hpp"

namespace rp {
namespace {

using nlohmann::json;
using test::TempDir;
namespace fs = std::filesystem;

struct Named {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

std::vector<Named> sample_tensors() {
  std::vector<Named> v;
  v.push_back({"a.weight", {3, 5}, test::random_values(15, 1)});
  v.push_back({"b.bias", {7}, test::random_values(7, 2)});
  v.push_back({"c.scalar", {}, {42.5f}});
  v.push_back({"d.empty", {0, 4}, {}});
  v.push_back({"e.big", {64, 33}, test::random_values(64 * 33, 3, 100.0f)});
  v[0].data[0] = -0.0f;
  v[0].data[1] = std::numeric_limits<float>::infinity();
  v[0].data[2] = 1e-40f;  // subnormal
  return v;
}

std::vector<TensorRef> refs(const std::vector<Named>& v) {
  std::vector<TensorRef> r;
  for (const auto& t : v) r.push_back({t.name, t.shape, t.data.data()});
  return r;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(IoSafetensors, F32RoundTripIsBitwise) {
  TempDir dir("st");
  auto src = sample_tensors();
  save_safetensors(dir / "m.safetensors", refs(src), DType::f32, {{"note", "hi"}});
  SafetensorsFile f(dir / "m.safetensors");
  EXPECT_EQ(f.metadata()["format"], "pt");
  EXPECT_EQ(f.metadata()["note"], "hi");
  ASSERT_EQ(f.entries().size(), src.size());
  // header length is a multiple of 8 and data is contiguous
  auto bytes = test::read_bytes(dir / "m.safetensors");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  auto all = load_safetensors(dir / "m.safetensors");
  for (const auto& t : src) {
    ASSERT_TRUE(all.count(t.name)) << t.name;
    EXPECT_EQ(all[t.name].shape, t.shape);
    EXPECT_TRUE(bitwise_equal(all[t.name].data, t.data)) << t.name;
    EXPECT_EQ(f.find(t.name)->dtype, "F32");
  }
  EXPECT_FALSE(fs::exists(dir / "m.safetensors.tmp-" + std::to_string(getpid())));
}

TEST(IoSafetensors, Bf16AndF16Rounding) {
  TempDir dir("st");
  std::vector<float> v = {1.0f, 1.00390625f /*1+2^-8: tie -> even*/, 1.01171875f, -3.0f, 65504.0f};
  save_safetensors(dir / "b.safetensors", {{"x", {5}, v.data()}}, DType::bf16);
  save_safetensors(dir / "h.safetensors", {{"x", {5}, v.data()}}, DType::f16);
  SafetensorsFile b(dir / "b.safetensors"), h(dir / "h.safetensors");
  EXPECT_EQ(b.find("x")->dtype, "BF16");
  EXPECT_EQ(h.find("x")->dtype, "F16");
  auto bv = b.read_f32(*b.find("x")).data;
  EXPECT_EQ(bv, (std::vector<float>{1.0f, 1.0f, 1.015625f, -3.0f, 65536.0f}));
  EXPECT_EQ(h.read_f32(*h.find("x")).data, v);  // all exactly representable in f16
}

// A weight that f16 cannot hold (|x| > 65504) would be written as infinity: the write is
// refused naming the tensor and the first such value, and nothing is left at the path; bf16
// keeps it, and infinities and NaNs already there are no overflow.
TEST(IoSafetensors, NarrowingThatWouldWriteAnInfinityIsRefused) {
  TempDir dir("st");
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v = {1.0f, 70000.0f, -1e6f, inf, nan, 65504.0f};
  try {
    save_safetensors(dir / "h.safetensors", {{"ok", {1}, v.data()}, {"x", {6}, v.data()}}, DType::f16);
    ADD_FAILURE() << "written";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "tensor 'x': 2 values are beyond f16's range (the first, 70000, at element 1) would be written "
            "as infinity; save in bf16 or f32 instead"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 0);
  save_safetensors(dir / "b.safetensors", {{"x", {6}, v.data()}}, DType::bf16);
  const SafetensorsFile bf(dir / "b.safetensors");
  const std::vector<float> b = bf.read_f32(*bf.find("x")).data;
  EXPECT_EQ(b[1], 70144.0f);  // bf16's nearest
  EXPECT_TRUE(std::isinf(b[3]) && std::isnan(b[4]));
  std::vector<float> specials = {inf, -inf, nan, 65504.0f};
  save_safetensors(dir / "s.safetensors", {{"x", {4}, specials.data()}}, DType::f16);
}

TEST(IoSafetensors, ShardedWithIndex) {
  TempDir dir("st");
  auto src = sample_tensors();
  auto files = save_safetensors_sharded(dir.path.string(), refs(src), DType::f32, 1000);
  ASSERT_GT(files.size(), 2u);
  EXPECT_EQ(files.back(), "model.safetensors.index.json");
  json idx = json::parse(test::read_bytes(dir / "model.safetensors.index.json"));
  EXPECT_EQ(idx["weight_map"].size(), src.size());
  for (auto path : {dir.path.string(), dir / "model.safetensors.index.json"}) {
    auto all = load_safetensors(path);
    ASSERT_EQ(all.size(), src.size());
    for (const auto& t : src) EXPECT_TRUE(bitwise_equal(all.at(t.name).data, t.data)) << t.name;
  }
  // index naming a tensor its shard lacks
  idx["weight_map"]["ghost"] = idx["weight_map"]["a.weight"];
  {
    std::ofstream o(dir / "model.safetensors.index.json");
    o << idx.dump();
  }
  try {
    load_safetensors(dir.path.string());
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'ghost'"), std::string::npos) << e.what();
  }
  // single shard: plain model.safetensors
  TempDir one("st");
  EXPECT_EQ(save_safetensors_sharded(one.path.string(), refs(src), DType::bf16, 1 << 30),
            std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(load_safetensors(one.path.string()).size(), src.size());
}

TEST(IoSafetensors, WriterErrors) {
  TempDir dir("st");
  std::vector<float> x = {1, 2};
  EXPECT_THROW(
      save_safetensors(dir / "d.safetensors", {{"x", {2}, x.data()}, {"x", {2}, x.data()}}, DType::f32),
      std::runtime_error);
  EXPECT_THROW(save_safetensors(dir / "n.safetensors", {{"x", {2}, nullptr}}, DType::f32),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(dir / "n.safetensors"));
  EXPECT_THROW(save_safetensors(dir / "no/such/dir/x.safetensors", {{"x", {2}, x.data()}}, DType::f32),
               std::runtime_error);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 0);
}

TEST(IoSafetensors, TruncatedAndCorruptFilesThrowCleanly) {
  TempDir dir("st");
  auto src = sample_tensors();
  save_safetensors(dir / "ok.safetensors", refs(src), DType::bf16);
  const auto bytes = test::read_bytes(dir / "ok.safetensors");
  const std::string path = dir / "bad.safetensors";
  auto check = [&](const std::vector<uint8_t>& b, bool must_fail) {
    test::write_bytes(path, b);
    try {
      auto all = load_safetensors(path);
      EXPECT_FALSE(must_fail) << "no error for " << b.size() << " bytes";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      // the JSON library's own tag says nothing to a user
      EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
    }
  };
  for (size_t len = 0; len < bytes.size(); len += (len < 600 ? 1 : 97))
    check({bytes.begin(), bytes.begin() + len}, true);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  for (size_t i = 0; i < 8 + n; ++i)
    for (uint8_t x : {uint8_t(0xFF), uint8_t(0x20), uint8_t(0x01)}) {
      auto b = bytes;
      b[i] ^= x;
      check(b, false);
    }
  // specific inconsistencies
  auto with_header = [&](const std::string& h) {
    std::vector<uint8_t> b(8 + h.size() + 16, 0);
    const uint64_t len = h.size();
    std::memcpy(b.data(), &len, 8);
    std::memcpy(b.data() + 8, h.data(), h.size());
    return b;
  };
  check(with_header(R"({"x":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})"), true);
  // a megabyte key or value is quoted by its first bytes and its length, not echoed whole
  const std::string big(1 << 20, 'k');
  for (const std::string& h : {"{\"" + big + R"(":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})",
                               R"({"x":{"dtype":")" + big + R"(","shape":[4],"data_offsets":[0,16]}})"}) {
    test::write_bytes(path, with_header(h));
    try {
      load_safetensors(path);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      const std::string m = e.what();
      EXPECT_LT(m.size(), 300u + path.size()) << m.substr(0, 300);
      EXPECT_NE(m.find("... (1048576 bytes)"), std::string::npos) << m.substr(0, 300);
    }
  }
  check(with_header(R"({"x":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})"), true);
  check(with_header(R"({"x":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})"), true);
  check(with_header(R"({"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})"), true);
  check(
      with_header(
          R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})"),
      true);
  check(with_header(R"([1,2])"), true);
  check(with_header(R"({"x":{"dtype":"F32",)"), true);  // a header whose JSON ends early
  check(with_header(R"({"x":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})"), true);  // not float
  check(with_header(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})"), false);
}

// ---- atomic HF checkpoint saves -----------------------------------------------------------

ModelConfig tiny_config(const std::string& arch, bool tied) {
  ModelConfig c;
  c.architecture = arch;
  c.vocab_size = 40, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = arch == "qwen3" ? 8 : 4;
  c.qk_norm = arch == "qwen3";
  c.tie_word_embeddings = tied;
  c.bos_token_id = 1, c.eos_token_id = 2;
  return c;
}

TEST(IoCheckpoint, SaveAndLoadHfRoundTrip) {
  for (auto [arch, tied] : {std::pair{"llama", false}, {"qwen3", true}}) {
    TempDir dir("ckpt");
    const ModelLayout layout = make_layout(tiny_config(arch, tied));
    std::vector<std::vector<float>> groups;
    std::vector<const float*> ptrs;
    for (size_t g = 0; g < layout.groups.size(); ++g)
      groups.push_back(test::random_values(size_t(layout.groups[g].numel), uint32_t(g + 10)));
    for (auto& g : groups) ptrs.push_back(g.data());
    json tok = {
        {"model",
         {{"type", "BPE"}, {"vocab", {{"a", 0}, {"<s>", 1}, {"</s>", 2}}}, {"merges", json::array()}}},
        {"added_tokens", json::array()}};
    const std::string out = dir / "ckpt";
    save_hf_checkpoint(out, layout, ptrs, tok, "{{ messages }}", DType::f32);
    for (auto f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                   "generation_config.json"})
      EXPECT_TRUE(fs::exists(fs::path(out) / f)) << f;
    json tc = json::parse(test::read_bytes(out + "/tokenizer_config.json"));
    EXPECT_EQ(tc["bos_token"], "<s>");
    EXPECT_EQ(tc["eos_token"], "</s>");
    EXPECT_EQ(tc["chat_template"], "{{ messages }}");
    LoadedModel m = load_model(out);
    EXPECT_EQ(m.config.architecture, arch);
    EXPECT_EQ(m.config.tie_word_embeddings, tied);
    EXPECT_EQ(m.chat_template, "{{ messages }}");
    EXPECT_EQ(m.tokenizer_json, tok);
    std::vector<std::vector<float>> back;
    fill_groups(m, layout, back);
    for (size_t g = 0; g < groups.size(); ++g) EXPECT_TRUE(bitwise_equal(back[g], groups[g])) << g;
    // bf16 save over the existing checkpoint replaces it
    save_hf_checkpoint(out, layout, ptrs, nullptr, "", DType::bf16);
    EXPECT_FALSE(fs::exists(fs::path(out) / "tokenizer.json"));
    json cfg = json::parse(test::read_bytes(out + "/config.json"));
    EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
    LoadedModel m2 = load_model(out);
    const auto& e = m2.tensors.at("model.embed_tokens.weight").data;
    for (size_t i = 0; i < e.size(); ++i) ASSERT_EQ(e[i], bf16_to_f32(f32_to_bf16(groups[0][i])));
    EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);
  }
}

TEST(IoCheckpoint, FailedSaveLeavesNoPartialCheckpoint) {
  TempDir dir("ckpt");
  const ModelLayout layout = make_layout(tiny_config("llama", true));
  std::vector<std::vector<float>> groups;
  std::vector<const float*> ptrs;
  for (const auto& g : layout.groups) groups.push_back(test::random_values(size_t(g.numel), 5));
  for (auto& g : groups) ptrs.push_back(g.data());
  const std::string out = dir / "ckpt";
  auto only_entry_is = [&](const std::string& name) {
    std::vector<std::string> names;
    for (auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename().string());
    return names == std::vector<std::string>{name};
  };
  // 1. failure while writing the weights (injected: the last group's buffer is missing),
  //    with no previous checkpoint: nothing is left behind.
  auto bad = ptrs;
  bad.back() = nullptr;
  EXPECT_THROW(save_hf_checkpoint(out, layout, bad, nullptr, "", DType::f32), std::runtime_error);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 0);
  // 2. a good checkpoint, then failing saves: the old one survives intact.
  save_hf_checkpoint(out, layout, ptrs, nullptr, "", DType::f32);
  const auto before = test::read_bytes(out + "/model.safetensors");
  EXPECT_THROW(save_hf_checkpoint(out, layout, bad, nullptr, "", DType::f32), std::runtime_error);
  EXPECT_TRUE(only_entry_is("ckpt"));
  EXPECT_EQ(test::read_bytes(out + "/model.safetensors"), before);
  //    failure at the very end (tokenizer.json cannot be serialised: invalid UTF-8)
  json tok = {{"model", {{"vocab", {{std::string("\xff\xfe"), 0}}}}}};
  EXPECT_THROW(save_hf_checkpoint(out, layout, ptrs, tok, "", DType::bf16), std::runtime_error);
  EXPECT_TRUE(only_entry_is("ckpt"));
  EXPECT_EQ(test::read_bytes(out + "/model.safetensors"), before);
  EXPECT_FALSE(fs::exists(out + "/tokenizer.json"));
  // 3. wrong number of groups is refused before anything is written
  EXPECT_THROW(save_hf_checkpoint(out, layout, {ptrs[0]}, nullptr, "", DType::f32), std::invalid_argument);
  // 4. destination is a file
  test::write_bytes(dir / "file", {1, 2, 3});
  EXPECT_THROW(save_hf_checkpoint(dir / "file", layout, ptrs, nullptr, "", DType::f32), std::runtime_error);
  EXPECT_EQ(test::read_bytes(dir / "file"), (std::vector<uint8_t>{1, 2, 3}));
}

TEST(IoCheckpoint, LoadHfDirErrorsNameFileAndTensor) {
  TempDir dir("ckpt");
  const ModelConfig c = tiny_config("llama", false);
  const ModelLayout layout = make_layout(c);
  std::vector<std::vector<float>> groups;
  std::vector<const float*> ptrs;
  for (const auto& g : layout.groups) groups.push_back(test::random_values(size_t(g.numel), 6));
  for (auto& g : groups) ptrs.push_back(g.data());
  const std::string out = dir / "ckpt";
  save_hf_checkpoint(out, layout, ptrs, nullptr, "", DType::f32);
  auto all = load_safetensors(out);
  auto rewrite = [&](const std::map<std::string, HostTensor>& ts) {
    std::vector<TensorRef> r;
    for (const auto& [n, t] : ts) r.push_back({n, t.shape, t.data.data()});
    save_safetensors(out + "/model.safetensors", r, DType::f32);
  };
  auto expect_error = [&](const std::string& want) {
    try {
      load_model(out);
      ADD_FAILURE() << "expected " << want;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(out + "/model.safetensors: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  auto m = all;
  m.erase("model.layers.1.mlp.up_proj.weight");
  rewrite(m);
  expect_error("missing tensor 'model.layers.1.mlp.up_proj.weight'");
  m = all;
  m["model.layers.0.self_attn.k_proj.weight"].shape = {16, 8};
  rewrite(m);
  expect_error("tensor 'model.layers.0.self_attn.k_proj.weight': expected shape [8, 16], got [16, 8]");
  m = all;
  m["model.layers.0.self_attn.q_proj.bias"] = HostTensor{{16}, std::vector<float>(16)};
  rewrite(m);
  expect_error("unexpected tensor 'model.layers.0.self_attn.q_proj.bias'");
  EXPECT_THROW(load_model(dir / "nothing"), std::runtime_error);
}

}  // namespace
}  // namespace rp
