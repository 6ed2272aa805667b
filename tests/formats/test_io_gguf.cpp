// GGUF reader: hand-computed quant blocks, metadata of every value type, corrupt files.
#include <gtest/gtest.h>

#include <cmath>

#include "formats/gguf.hpp"
#include "test_io_util.hpp"

namespace rp {
namespace {

using test::GgufBuilder;
using test::TempDir;

std::vector<uint8_t> le16(uint16_t v) { return {uint8_t(v & 0xFF), uint8_t(v >> 8)}; }

void append(std::vector<uint8_t>& b, const std::vector<uint8_t>& x) { b.insert(b.end(), x.begin(), x.end()); }

// f16 bit patterns: 1.0 = 0x3C00, 0.5 = 0x3800, 2.0 = 0x4000, -2.0 = 0xC000, 0.25 = 0x3400

TEST(IoGguf, DequantQ8_0Block) {
  std::vector<uint8_t> b = le16(0x3800);  // d = 0.5
  for (int i = 0; i < 32; ++i) b.push_back(uint8_t(int8_t(i - 16)));
  std::vector<float> y(32);
  dequantize_ggml(uint32_t(GgmlType::Q8_0), b.data(), y.data(), 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], (i - 16) * 0.5f) << i;
}

TEST(IoGguf, DequantQ4_0Block) {
  std::vector<uint8_t> b = le16(0x4000);  // d = 2
  for (int j = 0; j < 16; ++j) b.push_back(uint8_t(j | ((15 - j) << 4)));
  std::vector<float> y(32);
  dequantize_ggml(uint32_t(GgmlType::Q4_0), b.data(), y.data(), 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 2.0f);            // low nibbles -> first half
    EXPECT_EQ(y[j + 16], (15 - j - 8) * 2.0f);  // high nibbles -> second half
  }
}

TEST(IoGguf, DequantQ4_1Block) {
  std::vector<uint8_t> b = le16(0x3C00);  // d = 1
  append(b, le16(0xC000));                // m = -2
  for (int j = 0; j < 16; ++j) b.push_back(uint8_t(j | ((15 - j) << 4)));
  std::vector<float> y(64);
  std::vector<uint8_t> two = b;
  two[0] = 0x00, two[1] = 0x34;  // second block: d = 0.25
  append(b, two);
  dequantize_ggml(uint32_t(GgmlType::Q4_1), b.data(), y.data(), 64);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j - 2.0f);
    EXPECT_EQ(y[j + 16], (15 - j) - 2.0f);
    EXPECT_EQ(y[32 + j], j * 0.25f - 2.0f);
    EXPECT_EQ(y[32 + j + 16], (15 - j) * 0.25f - 2.0f);
  }
}

TEST(IoGguf, DequantQ5_0Block) {
  std::vector<uint8_t> b = le16(0x3C00);  // d = 1
  append(b, {0xFF, 0xFF, 0x00, 0x00});    // qh: bit j set for elements 0..15 only
  for (int j = 0; j < 16; ++j) b.push_back(uint8_t(j | ((15 - j) << 4)));
  std::vector<float> y(32);
  dequantize_ggml(uint32_t(GgmlType::Q5_0), b.data(), y.data(), 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], float((j | 16) - 16)) << j;       // 5th bit set
    EXPECT_EQ(y[j + 16], float((15 - j) - 16)) << j;  // 5th bit clear
  }
}

TEST(IoGguf, DequantQ5_1Block) {
  std::vector<uint8_t> b = le16(0x3800);  // d = 0.5
  append(b, le16(0x3C00));                // m = 1
  append(b, {0x00, 0x00, 0xFF, 0xFF});    // qh: bits 16..31 -> elements 16..31
  for (int j = 0; j < 16; ++j) b.push_back(uint8_t(j | ((15 - j) << 4)));
  std::vector<float> y(32);
  dequantize_ggml(uint32_t(GgmlType::Q5_1), b.data(), y.data(), 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.5f + 1.0f);
    EXPECT_EQ(y[j + 16], (31 - j) * 0.5f + 1.0f);
  }
}

TEST(IoGguf, DequantF16AndBF16) {
  std::vector<uint8_t> h;
  for (uint16_t v : {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x3555}) append(h, le16(v));
  std::vector<float> y(6);
  dequantize_ggml(uint32_t(GgmlType::F16), h.data(), y.data(), 6);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], 65504.0f);
  EXPECT_EQ(y[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(y[4] == 0.0f && std::signbit(y[4]));
  EXPECT_EQ(y[5], 0.333251953125f);
  std::vector<uint8_t> bf;
  for (uint16_t v : {0x3F80, 0xC040, 0x4049}) append(bf, le16(v));
  dequantize_ggml(uint32_t(GgmlType::BF16), bf.data(), y.data(), 3);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -3.0f);
  EXPECT_EQ(y[2], 3.140625f);
}

TEST(IoGguf, DequantQ4_KAndQ5_KBlocks) {
  // 8 sub-blocks of 32 values, 6-bit scale/min each: value = d*sc*q - dmin*m.
  std::vector<uint8_t> b = le16(0x3C00);                        // d = 1
  append(b, le16(0x3C00));                                      // dmin = 1
  append(b, {1, 2, 3, 4, 3, 0, 0, 0, 0x05, 0x06, 0x07, 0x08});  // sc 1..8, m0 = 3
  std::vector<uint8_t> q5 = b;
  for (int i = 0; i < 128; ++i) b.push_back(0x21);  // low nibble 1, high 2
  std::vector<float> y(256);
  dequantize_ggml(uint32_t(GgmlType::Q4_K), b.data(), y.data(), 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    const float want = float(s + 1) * (s % 2 == 0 ? 1.0f : 2.0f) - (s == 0 ? 3.0f : 0.0f);
    ASSERT_EQ(y[e], want) << e;
  }
  for (int i = 0; i < 32; ++i) q5.push_back(0xFF);  // qh: every value gets +16
  for (int i = 0; i < 128; ++i) q5.push_back(0x21);
  dequantize_ggml(uint32_t(GgmlType::Q5_K), q5.data(), y.data(), 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    const float want = float(s + 1) * (s % 2 == 0 ? 17.0f : 18.0f) - (s == 0 ? 3.0f : 0.0f);
    ASSERT_EQ(y[e], want) << e;
  }
}

TEST(IoGguf, DequantQ6_KBlock) {
  // 16 sub-blocks of 16 values with int8 scales; q = 6 bits - 32.
  std::vector<uint8_t> b(128, 0x00);  // ql = 0
  b.insert(b.end(), 64, 0xFF);        // qh = 3 in every 2-bit field -> q = 48-32
  for (int k = 0; k < 16; ++k) b.push_back(uint8_t(int8_t(k % 2 ? -(k + 1) : k + 1)));
  append(b, le16(0x3800));  // d = 0.5
  std::vector<float> y(256);
  dequantize_ggml(uint32_t(GgmlType::Q6_K), b.data(), y.data(), 256);
  for (int e = 0; e < 256; ++e) {
    const int k = e / 16;
    ASSERT_EQ(y[e], 0.5f * float(k % 2 ? -(k + 1) : k + 1) * 16.0f) << e;
  }
}

TEST(IoGguf, RejectsUnsupportedDequant) {
  std::vector<uint8_t> b(84);
  std::vector<float> y(256);
  EXPECT_THROW(dequantize_ggml(uint32_t(GgmlType::Q2_K), b.data(), y.data(), 256), std::invalid_argument);
  EXPECT_THROW(dequantize_ggml(uint32_t(GgmlType::Q8_0), b.data(), y.data(), 31), std::invalid_argument);
}

std::vector<uint8_t> small_file(uint32_t version = 3) {
  GgufBuilder g;
  g.str("general.architecture", "llama");
  g.u32("u32", 7);
  g.i32("i32", -7);
  g.u64("u64", 1ull << 40);
  g.f32("f32", 1e-5f);
  g.f64("f64", 0.125);
  g.boolean("flag", true);
  g.raw("u8", 0, {200});
  g.raw("i8", 1, {0xFE});
  g.raw("u16", 2, {0x34, 0x12});
  g.raw("i16", 3, {0xFF, 0xFF});
  g.raw("i64", 11, {0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF});
  g.str_array("strs", {"a", "", "Ġhello"});
  g.i32_array("ints", {1, -2, 3});
  // nested: array of 2 arrays of u8
  g.raw("nested", 9, {9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,     //
                      0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5,  //
                      0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 6, 7});
  std::vector<uint8_t> q8 = le16(0x3C00);
  for (int i = 0; i < 32; ++i) q8.push_back(uint8_t(i));
  std::vector<uint8_t> q8b = q8;
  q8b[0] = 0x00, q8b[1] = 0xC0;  // d = -2
  append(q8, q8b);
  g.tensor("t.q8", {32, 2}, 8, q8);
  std::vector<uint8_t> f16;
  for (uint16_t v : {0x3C00, 0x4000, 0xC000}) append(f16, le16(v));
  g.tensor("t.f16", {3}, 1, f16);
  g.tensor_f32("t.f32", {2, 2, 1}, {1.5f, -2.5f, 3.5f, 4.5f});
  return g.build(version);
}

TEST(IoGguf, ReadsMetadataAndTensors) {
  TempDir dir("gguf");
  for (uint32_t version : {2u, 3u}) {
    const std::string path = dir / "small.gguf";
    test::write_bytes(path, small_file(version));
    GgufFile f(path);
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_EQ(f.data_offset() % 32, 0u);
    const auto& m = f.metadata();
    EXPECT_EQ(m["general.architecture"], "llama");
    EXPECT_EQ(m["u32"], 7);
    EXPECT_EQ(m["i32"], -7);
    EXPECT_EQ(m["u64"], 1ull << 40);
    EXPECT_EQ(m["f32"].get<double>(), 1e-5);  // shortest float decimal
    EXPECT_EQ(m["f64"].get<double>(), 0.125);
    EXPECT_EQ(m["flag"], true);
    EXPECT_EQ(m["u8"], 200);
    EXPECT_EQ(m["i8"], -2);
    EXPECT_EQ(m["u16"], 0x1234);
    EXPECT_EQ(m["i16"], -1);
    EXPECT_EQ(m["i64"], -2);
    EXPECT_EQ(m["strs"], nlohmann::json::array({"a", "", "Ġhello"}));
    EXPECT_EQ(m["ints"], nlohmann::json::array({1, -2, 3}));
    EXPECT_EQ(m["nested"], nlohmann::json::parse("[[5],[6,7]]"));
    EXPECT_EQ(f.get_int("u32"), 7);
    EXPECT_THROW(f.get_int("strs"), std::runtime_error);
    EXPECT_THROW(f.get("nope"), std::runtime_error);
    ASSERT_EQ(f.tensors().size(), 3u);
    const GgufTensorInfo* q = f.find("t.q8");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->shape(), (std::vector<int64_t>{2, 32}));  // reversed: ne[0] innermost
    auto v = f.dequantize(*q);
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(v[i], float(i));
      EXPECT_EQ(v[32 + i], -2.0f * i);
    }
    auto h = f.dequantize(*f.find("t.f16"));
    EXPECT_EQ(h, (std::vector<float>{1, 2, -2}));
    const auto* t3 = f.find("t.f32");
    EXPECT_EQ(t3->shape(), (std::vector<int64_t>{1, 2, 2}));
    EXPECT_EQ(f.dequantize(*t3), (std::vector<float>{1.5f, -2.5f, 3.5f, 4.5f}));
  }
}

TEST(IoGguf, CustomAlignment) {
  GgufBuilder g;
  g.u32("general.alignment", 64);
  g.tensor_f32("a", {3}, {1, 2, 3});
  g.tensor_f32("b", {2}, {4, 5});
  TempDir dir("gguf");
  test::write_bytes(dir / "a.gguf", g.build(3, 64));
  GgufFile f(dir / "a.gguf");
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.find("b")->offset, 64u);
  EXPECT_EQ(f.dequantize(*f.find("b")), (std::vector<float>{4, 5}));
}

void expect_clean_error(const std::string& path, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return;
  }
  // Some corruptions (e.g. of a metadata value) leave a readable file: that is fine.
}

TEST(IoGguf, TruncatedFilesThrowCleanly) {
  TempDir dir("gguf");
  const auto bytes = small_file();
  const std::string path = dir / "cut.gguf";
  GgufFile full([&] {
    test::write_bytes(path, bytes);
    return path;
  }());
  const uint64_t need = full.data_offset() + full.find("t.f32")->offset + 16;
  for (size_t len = 0; len < need; ++len) {
    test::write_bytes(path, {bytes.begin(), bytes.begin() + len});
    try {
      GgufFile f(path);
      ADD_FAILURE() << "no error for a file cut at " << len;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
      // a cut file is called cut (not only "corrupt": its counts may be right)
      EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << len << ": " << e.what();
    }
  }
}

TEST(IoGguf, CorruptHeadersNeverCrash) {
  TempDir dir("gguf");
  const auto bytes = small_file();
  const std::string path = dir / "bad.gguf";
  size_t header_end;
  {
    test::write_bytes(path, bytes);
    header_end = GgufFile(path).data_offset();
  }
  for (size_t i = 0; i < header_end; ++i) {
    for (uint8_t x : {uint8_t(0xFF), uint8_t(0x80), uint8_t(0x01)}) {
      auto b = bytes;
      b[i] ^= x;
      test::write_bytes(path, b);
      expect_clean_error(path, [&] {
        GgufFile f(path);
        for (const auto& t : f.tensors())
          if (ggml_can_dequantize(t.type)) f.dequantize(t);
      });
    }
  }
  auto b = bytes;
  b[0] = 'X';
  test::write_bytes(path, b);
  EXPECT_THROW(GgufFile{path}, std::runtime_error);
  b = bytes;
  b[4] = 4;  // version 4
  test::write_bytes(path, b);
  try {
    GgufFile f(path);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("version 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(GgufFile{dir / "missing.gguf"}, std::runtime_error);
  EXPECT_THROW(GgufFile{dir.path.string()}, std::runtime_error);
}

// A corrupted file's key can be megabytes long (a broken length): an error quotes at most the
// first bytes of it and its length, never all of it (a 4.9 MB echo before the cap).
TEST(IoGguf, AMegabyteKeyIsQuotedShort) {
  TempDir dir("gguf");
  const std::string key(1 << 20, 'k');
  const std::string path = dir / "long-key.gguf";
  for (int c = 0; c < 4; ++c) {
    GgufBuilder g;
    g.str("general.architecture", "llama");
    if (c == 0) g.raw(key, 99, {});             // unknown value type
    if (c == 1) g.raw(key, 7, {5});             // bool byte 5
    if (c == 2) g.u32(key, 1), g.u32(key, 2);   // duplicate key
    if (c == 3) g.tensor_f32(key, {1, 0}, {});  // a tensor of dimension 0
    test::write_bytes(path, g.build(3));
    try {
      GgufFile f(path);
      ADD_FAILURE() << "case " << c << ": no error";
    } catch (const std::runtime_error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << m.substr(0, 300);
      EXPECT_LT(m.size(), 300u + path.size()) << "case " << c << ": " << m.substr(0, 300);
      EXPECT_NE(m.find("... (1048576 bytes)"), std::string::npos) << m.substr(0, 300);
    }
  }
}

TEST(IoGguf, RejectsBadTensorInfos) {
  TempDir dir("gguf");
  auto expect_msg = [&](const GgufBuilder& g, const std::string& what) {
    test::write_bytes(dir / "t.gguf", g.build());
    try {
      GgufFile f(dir / "t.gguf");
      ADD_FAILURE() << "expected: " << what;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  {
    GgufBuilder g;
    g.tensor("q", {31}, 8, std::vector<uint8_t>(34));
    expect_msg(g, "not a multiple of the Q8_0 block size 32");
  }
  {
    GgufBuilder g;
    g.tensor("u", {4}, 99, std::vector<uint8_t>(16));
    expect_msg(g, "unknown ggml type 99");
  }
  {
    GgufBuilder g;
    g.tensor("z", {4, 0}, 0, {});
    expect_msg(g, "invalid dimension");
  }
  {
    GgufBuilder g;
    g.tensor_f32("d", {1}, {1});
    g.tensor_f32("d", {1}, {1});
    expect_msg(g, "duplicate tensor 'd'");
  }
  {
    GgufBuilder g;
    g.u32("general.alignment", 3);
    expect_msg(g, "general.alignment");
  }
}

TEST(IoGguf, NameMapping) {
  EXPECT_EQ(gguf_to_hf_name("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(gguf_to_hf_name("output.weight"), "lm_head.weight");
  EXPECT_EQ(gguf_to_hf_name("output_norm.weight"), "model.norm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.12.attn_q.weight"), "model.layers.12.self_attn.q_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.0.attn_k_norm.weight"), "model.layers.0.self_attn.k_norm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_norm.weight"), "model.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_down.weight"), "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.attn_output.weight"), "model.layers.3.self_attn.o_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.x.attn_q.weight"), "");
  EXPECT_EQ(gguf_to_hf_name("blk.1.attn_q.bias"), "");
  EXPECT_EQ(gguf_to_hf_name("rope_freqs.weight"), "");
}

TEST(IoGguf, UnpermuteInvertsConverterPermute) {
  for (auto [rows, cols, heads] : {std::tuple{8, 3, 1}, {24, 5, 3}, {64, 7, 4}}) {
    auto hf = test::random_values(size_t(rows * cols), uint32_t(rows));
    auto w = test::llama_permute(hf, rows, cols, heads);
    ASSERT_NE(w, hf);
    unpermute_qk_rows(w.data(), rows, cols, heads);
    EXPECT_EQ(w, hf);
  }
  // Row 2*i + j of a head in GGUF is HF row j*hd/2 + i: hd = 4 -> GGUF rows 0,1,2,3 = HF 0,2,1,3.
  std::vector<float> w = {0, 2, 1, 3};
  unpermute_qk_rows(w.data(), 4, 1, 1);
  EXPECT_EQ(w, (std::vector<float>{0, 1, 2, 3}));
  EXPECT_THROW(unpermute_qk_rows(w.data(), 4, 1, 3), std::invalid_argument);
}

}  // namespace
}  // namespace rp
