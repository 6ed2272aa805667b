// A model without an end-of-sequence token cannot be trained on (the sequences are padded with
// it): the error names the model and where the token is looked for.
#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

// It said "pack_sequences: pad_id must be >= 0, got -1", naming neither the model nor the cause.
TEST(CliEos, AModelWithoutAnEndOfSequenceTokenIsNamed) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  auto config = nlohmann::json::parse(slurp(model / "config.json"));
  config.erase("eos_token_id");
  write(model / "config.json", config.dump());
  // the tokenizer's one special token gets a name none of the known end tokens has
  std::string tok = slurp(model / "tokenizer.json");
  for (size_t at; (at = tok.find("<|endoftext|>")) != std::string::npos;) tok.replace(at, 13, "<|pad|>");
  write(model / "tokenizer.json", tok);
  fs::remove(model / "tokenizer_config.json");
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  const CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("roundpipe: error: " + model.string() + ": the model names no end-of-sequence token"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("eos_token_id in config.json"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(d / "run")) << "nothing of the run is left";
  fs::remove_all(d);
}

}  // namespace
