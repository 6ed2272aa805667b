// A Hugging Face folder saved from a GroupReader (save_hf_checkpoint's streaming overload):
// each layout group is asked for once, in order, and the files are those of a save from
// groups held in memory, for dense, fused-projection (Phi-3) and stacked-expert (GPT-OSS)
// models.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/layout.hpp"
#include "roundpipe/checkpoint.hpp"
#include "test_io_util.hpp"

namespace rp {
namespace {

namespace fs = std::filesystem;

/// Every file of folder `d` (name -> bytes).
std::map<std::string, std::vector<uint8_t>> folder_bytes(const fs::path& d) {
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& e : fs::directory_iterator(d))
    out[e.path().filename().string()] = test::read_bytes(e.path());
  return out;
}

void expect_streamed_equals_held(const std::string& model) {
  SCOPED_TRACE(model);
  test::TempDir dir("streamed_save");
  LoadedModel m = load_model(model);
  const ModelLayout layout = make_layout(m.config);
  std::vector<std::vector<float>> groups;
  fill_groups(m, layout, groups);
  std::vector<const float*> ptrs;
  for (const auto& g : groups) ptrs.push_back(g.data());
  save_hf_checkpoint((dir.path / "held").string(), layout, ptrs, m.tokenizer_json, m.chat_template,
                     DType::f32);

  // one buffer for every group, overwritten with NaN before the next is copied in: a tensor
  // written from a group after the reader moved on would carry NaN or another group's values
  std::vector<float> buffer;
  std::vector<size_t> asked;
  const GroupReader read = [&](size_t g) {
    std::fill(buffer.begin(), buffer.end(), std::numeric_limits<float>::quiet_NaN());
    buffer.resize(groups.at(g).size(), std::numeric_limits<float>::quiet_NaN());
    std::copy(groups[g].begin(), groups[g].end(), buffer.begin());
    asked.push_back(g);
    return buffer.data();
  };
  save_hf_checkpoint((dir.path / "streamed").string(), layout, read, m.tokenizer_json, m.chat_template,
                     DType::f32);
  std::vector<size_t> each_once;
  for (size_t g = 0; g < layout.groups.size(); ++g) each_once.push_back(g);
  EXPECT_EQ(asked, each_once);
  const auto held = folder_bytes(dir.path / "held"), streamed = folder_bytes(dir.path / "streamed");
  ASSERT_EQ(held.size(), streamed.size());
  for (const auto& [name, bytes] : held) {
    ASSERT_TRUE(streamed.count(name)) << name;
    EXPECT_TRUE(streamed.at(name) == bytes) << name;
  }
  const LoadedModel back = load_model((dir.path / "streamed").string());
  ASSERT_EQ(back.tensors.size(), m.tensors.size());
  for (const auto& [name, t] : m.tensors) EXPECT_TRUE(back.tensors.at(name).data == t.data) << name;
}

TEST(StreamedSave, AsksForEachGroupOnceInOrderAndWritesTheSameFiles) {
  const std::string f = RP_FIXTURES_DIR;
  expect_streamed_equals_held(f + "/hf_golden/tiny_llama");
  expect_streamed_equals_held(f + "/hf_golden/tiny_phi3");               // q/k/v and gate/up fused
  expect_streamed_equals_held(f + "/hf_gpt_oss/tiny_gpt_oss");           // the experts stacked
  expect_streamed_equals_held(f + "/gguf_moe/tiny_qwen3_moe.f32.gguf");  // per-expert tensors
}

// A reader that fails mid-save (a file that cannot be read) fails the save and keeps the
// folder it would have replaced; a reader giving no data names the tensor.
TEST(StreamedSave, AFailingReaderKeepsThePreviousFolder) {
  test::TempDir dir("streamed_fail");
  LoadedModel m = load_model(std::string(RP_FIXTURES_DIR) + "/hf_golden/tiny_llama");
  const ModelLayout layout = make_layout(m.config);
  std::vector<std::vector<float>> groups;
  fill_groups(m, layout, groups);
  const fs::path out = dir.path / "out";
  save_hf_checkpoint(
      out.string(), layout, [&](size_t g) { return groups[g].data(); }, m.tokenizer_json, m.chat_template,
      DType::bf16);
  const auto before = folder_bytes(out);
  const GroupReader failing = [&](size_t g) -> const float* {
    if (g == 2) throw std::runtime_error("model.gguf: read failed");
    return groups[g].data();
  };
  EXPECT_THROW(
      save_hf_checkpoint(out.string(), layout, failing, m.tokenizer_json, m.chat_template, DType::f32),
      std::runtime_error);
  const GroupReader empty = [&](size_t g) -> const float* { return g == 1 ? nullptr : groups[g].data(); };
  try {
    save_hf_checkpoint(out.string(), layout, empty, m.tokenizer_json, m.chat_template, DType::f32);
    ADD_FAILURE() << "a group without data was written";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0."), std::string::npos) << e.what();
  }
  EXPECT_TRUE(folder_bytes(out) == before);
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename(), "out") << "left behind: " << e.path();
}

}  // namespace
}  // namespace rp
