// Impossible sizes are refused before anything is allocated from them: a config or GGUF whose
// layer count cannot fit in its weight files, a parameter count past 2^48, and GGUF tensors
// whose byte ranges overlap (they would read each other's data as weights).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "model/config.hpp"
#include "test_io_util.hpp"

namespace rp {
namespace {

using test::GgufBuilder;
using test::TempDir;
namespace fs = std::filesystem;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

/// A llama GGUF with the given block_count and only the embedding and the final norm.
std::vector<uint8_t> gguf_with_layers(uint64_t block_count) {
  GgufBuilder g;
  g.str("general.architecture", "llama");
  g.u64("llama.block_count", block_count);
  g.u32("llama.embedding_length", 32);
  g.u32("llama.feed_forward_length", 64);
  g.u32("llama.attention.head_count", 4);
  g.tensor_f32("token_embd.weight", {32, 48}, std::vector<float>(32 * 48, 0.5f));
  g.tensor_f32("output_norm.weight", {32}, std::vector<float>(32, 1.f));
  return g.build();
}

TEST(SizeChecks, GgufBlockCountBeyondTheFileIsRefusedBeforeLoading) {
  TempDir dir("sizes");
  const std::string p = (dir.path / "deep.gguf").string();
  test::write_bytes(p, gguf_with_layers(100000000));
  const std::string e = error_of([&] { load_model(p); });
  EXPECT_NE(e.find("deep.gguf: the sizes in the metadata (llama.block_count 100000000"), std::string::npos)
      << e;
  EXPECT_NE(e.find("but the file holds"), std::string::npos) << e;
  // the same check guards `roundpipe plan` (it reads the config from the GGUF)
  GgufFile f(p);
  EXPECT_NE(error_of([&] { config_from_gguf(f); }).find("llama.block_count 100000000"), std::string::npos);
  // 2^32 - 1 layers: the parameter count itself passes 2^48
  test::write_bytes(p, gguf_with_layers(4294967295ull * 1000));
  GgufFile g(p);
  EXPECT_NE(error_of([&] { config_from_gguf(g); }).find("parameter count fits 2^48"), std::string::npos);
}

TEST(SizeChecks, ConfigLayerCountBeyondTheSafetensorsIsRefused) {
  TempDir dir("sizes");
  const fs::path src = fs::path(RP_FIXTURES_DIR) / "hf_golden/tiny_llama";
  const fs::path m = dir.path / "m";
  fs::create_directories(m);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(src / f, m / f);
  nlohmann::json c = nlohmann::json::parse(std::ifstream(m / "config.json"));
  c["num_hidden_layers"] = 4294967295ull;
  std::ofstream(m / "config.json") << c.dump();
  const std::string e = error_of([&] { load_model(m.string()); });
  EXPECT_NE(e.find("config.json: the sizes in the metadata (num_hidden_layers 4294967295"), std::string::npos)
      << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

// A weight file cut short (a copy or download that stopped) is named by the refusal, beside the
// config whose sizes it cannot hold: the config alone pointed at the wrong file.
TEST(SizeChecks, ATruncatedWeightFileIsNamed) {
  TempDir dir("sizes");
  const fs::path src = fs::path(RP_FIXTURES_DIR) / "hf_golden/tiny_llama";
  const fs::path m = dir.path / "m";
  fs::create_directories(m);
  fs::copy_file(src / "config.json", m / "config.json");
  fs::copy_file(src / "model.safetensors", m / "model.safetensors");
  fs::resize_file(m / "model.safetensors", 1000);
  const std::string e = error_of([&] { load_model(m.string()); });
  EXPECT_NE(e.find("config.json: the sizes in the metadata (num_hidden_layers"), std::string::npos) << e;
  EXPECT_NE(e.find("of weights, but model.safetensors holds 1000 bytes"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
  // two shards: both counted, and said so
  fs::copy_file(m / "model.safetensors", m / "model-00002-of-00002.safetensors");
  const std::string two = error_of([&] { load_model(m.string()); });
  EXPECT_NE(two.find("but its 2 .safetensors files hold 2000 bytes"), std::string::npos) << two;
}

TEST(SizeChecks, ParameterCountIsComputedWithoutOverflow) {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 16;
  ASSERT_TRUE(parameter_count(c));
  EXPECT_EQ(*parameter_count(c), c.num_parameters());
  c.hidden_size = int64_t(1) << 40;  // hidden x hidden wraps int64 in the plain formula
  EXPECT_FALSE(parameter_count(c));
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.hidden_size = 64;
  c.num_hidden_layers = int64_t(1) << 40;
  EXPECT_FALSE(parameter_count(c));
}

TEST(SizeChecks, OverlappingGgufTensorsAreRefused) {
  TempDir dir("sizes");
  GgufBuilder g;
  g.str("general.architecture", "llama");
  g.tensor_f32("a", {64}, std::vector<float>(64, 1.f));
  g.tensor_f32("b", {64}, std::vector<float>(64, 2.f));
  std::vector<uint8_t> bytes = g.build();
  // tensor b's info: name, n_dims, ne[0], type, then its offset (256 here): point it at 128
  const std::string name = "b";
  size_t at = 0;
  for (size_t i = 0; i + 9 < bytes.size(); ++i)
    if (bytes[i] == 1 && std::memcmp(&bytes[i + 8], name.data(), 1) == 0 && bytes[i + 9] == 1) at = i;
  ASSERT_GT(at, 0u);
  const size_t off_pos = at + 8 + 1 + 4 + 8 + 4;
  uint64_t off = 0;
  std::memcpy(&off, &bytes[off_pos], 8);
  ASSERT_EQ(off, 256u);
  const std::string p = (dir.path / "overlap.gguf").string();
  test::write_bytes(p, bytes);
  EXPECT_NO_THROW(GgufFile{p});
  off = 128;  // b now starts inside a (bytes 0-256)
  std::memcpy(&bytes[off_pos], &off, 8);
  test::write_bytes(p, bytes);
  const std::string e = error_of([&] { GgufFile f(p); });
  EXPECT_NE(e.find("overlap.gguf: corrupt header: tensors 'a' (bytes 0-256) and 'b' (from byte 128) overlap"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace rp
