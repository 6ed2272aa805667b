// `roundpipe merge ADAPTER_DIR OUT_DIR`: a PEFT adapter folder made by the real peft library
// (tests/fixtures/peft) folded into its base model, the base found through the adapter's
// base_model_name_or_path; errors are one line naming the file and key.
#include <gtest/gtest.h>

#include <cmath>

#include "model/checkpoint.hpp"
#include "model/safetensors.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

const std::string kPeft = std::string(RP_FIXTURES_DIR) + "/peft/";

TEST(CliMerge, WritesPeftsMergeAsAPlainFolderUntiedWhenPeftUntied) {
  auto d = tmpdir();
  const CliRun r = roundpipe("merge " + kPeft + "tied_untie/adapter " + (d / "out").string() + " --dtype f32", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("merged"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "out/adapter_config.json"));
  const rp::LoadedModel m = rp::load_model((d / "out").string());
  EXPECT_FALSE(m.config.tie_word_embeddings);  // peft trained lm_head apart from the tied embedding
  rp::SafetensorsFile peft(kPeft + "tied_untie/merged.safetensors");
  for (const auto& e : peft.entries()) {
    const rp::HostTensor ref = peft.read_f32(e);
    const rp::HostTensor& got = m.tensors.at(e.name);
    ASSERT_EQ(got.shape, ref.shape) << e.name;
    double diff = 0;
    for (size_t i = 0; i < ref.data.size(); ++i) diff = std::max(diff, double(std::abs(got.data[i] - ref.data[i])));
    EXPECT_LE(diff, 1e-6) << e.name;
  }
  fs::remove_all(d);
}

TEST(CliMerge, ErrorsAreOneLine) {
  auto d = tmpdir();
  expect_one_line_error(roundpipe("merge " + (d / "none").string() + " " + (d / "out").string(), d), "not a folder");
  expect_one_line_error(roundpipe("merge " + kPeft + "base_tied " + (d / "out").string(), d),
                        "base_tied/adapter_config.json: missing (not a PEFT adapter folder)");
  expect_one_line_error(
      roundpipe("merge " + kPeft + "untied_all/adapter " + (d / "out").string() + " --base " + (d / "nobase").string(), d),
      "nobase: no such file or directory");
  EXPECT_FALSE(fs::exists(d / "out"));
  fs::remove_all(d);
}

}  // namespace
