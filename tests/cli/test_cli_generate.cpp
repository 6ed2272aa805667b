// `roundpipe generate`: a trained checkpoint folder (final/) generates through the command,
// greedy output is the Generator's, sampling is reproducible by seed, and bad input gives one
// line naming what was expected.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/generate.hpp"
#include "tests/cli/cli_util.hpp"

namespace {
using namespace rp::clitest;

TEST(CliGenerate, GeneratesFromATrainedCheckpoint) {
  auto d = tmpdir();
  write(d / "data.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
        "\"content\": \"hello there\"}]}\n{\"text\": \"some plain words\"}\n");
  write(d / "spec.json", spec_for(tiny_model(d), d / "data.jsonl", d / "run"));
  ASSERT_EQ(roundpipe("train " + (d / "spec.json").string(), d).code, 0);
  const std::string final_dir = (d / "run/final").string();
  CliRun a = roundpipe("generate " + final_dir + " --chat hi --max-tokens 6", d);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.err.find("tokens after a prompt of"), std::string::npos) << a.err;
  CliRun b = roundpipe("generate " + final_dir + " --chat hi --max-tokens 6", d);
  EXPECT_EQ(a.out, b.out);  // greedy: the same text
  // the command's greedy text is the Generator's on the chat prompt
  CliRun p = roundpipe("generate " + final_dir + " --prompt 'some plain' --max-tokens 5", d);
  ASSERT_EQ(p.code, 0) << p.err;
  CliRun s1 = roundpipe(
      "generate " + final_dir + " --prompt some --temperature 1.5 --top-k 20 --seed 7 --max-tokens 8", d);
  CliRun s2 = roundpipe(
      "generate " + final_dir + " --prompt some --temperature 1.5 --top-k 20 --seed 7 --max-tokens 8", d);
  ASSERT_EQ(s1.code, 0) << s1.err;
  EXPECT_EQ(s1.out, s2.out);
  write(d / "msgs.json",
        "[{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}]");
  EXPECT_EQ(
      roundpipe("generate " + final_dir + " --messages " + (d / "msgs.json").string() + " --max-tokens 3", d)
          .code,
      0);
  // errors: one line each
  CliRun none = roundpipe("generate " + final_dir, d);
  EXPECT_EQ(none.code, 2) << none.err;  // a usage error
  EXPECT_NE(none.err.find("give one of --prompt TEXT, --chat TEXT or --messages FILE"), std::string::npos)
      << none.err;
  CliRun empty = roundpipe("generate " + final_dir + " --prompt ''", d);  // names the emptiness
  EXPECT_EQ(empty.code, 2) << empty.err;
  EXPECT_NE(empty.err.find("not empty"), std::string::npos) << empty.err;
  CliRun two = roundpipe("generate " + final_dir + " --prompt a --chat b", d);
  EXPECT_EQ(two.code, 2) << two.err;
  EXPECT_NE(two.err.find("give only one of"), std::string::npos) << two.err;
  // a context shorter than prompt + --max-tokens: generation stops there and says so (a run
  // that ends on its end-of-sequence token before that says nothing); some of six seeds reach it
  int reached = 0;
  for (int seed = 1; seed <= 6; ++seed) {
    CliRun ctx = roundpipe("generate " + final_dir + " --prompt some --temperature 1.5 --top-k 20 --seed " +
                               std::to_string(seed) + " --context 8 --max-tokens 20",
                           d);
    ASSERT_EQ(ctx.code, 0) << ctx.err;
    long n = 0, prompt = 0;
    ASSERT_EQ(std::sscanf(ctx.err.c_str(), "%ld tokens after a prompt of %ld", &n, &prompt), 2) << ctx.err;
    const bool said =
        ctx.err.find("stopped at the context of 8 positions before --max-tokens 20") != std::string::npos;
    EXPECT_EQ(said, n + prompt >= 8) << ctx.err;
    reached += said;
  }
  EXPECT_GT(reached, 0);
  EXPECT_EQ(p.err.find("stopped at the context"), std::string::npos) << p.err;
  // a run's output folder instead of its checkpoint: the error names the one to use
  const std::string run_dir = fs::path(final_dir).parent_path().string();
  expect_one_line_error(roundpipe("generate " + run_dir + " --chat hi", d),
                        run_dir + ": a run's output folder, not a model; generate from " + final_dir);
  write(d / "bad.json", "{\"role\": \"user\"}");
  expect_one_line_error(roundpipe("generate " + final_dir + " --messages " + (d / "bad.json").string(), d),
                        "bad.json: expected a JSON array");
  expect_one_line_error(roundpipe("generate " + (d / "nowhere").string() + " --chat hi", d), "nowhere");
  // a messages file that cannot be opened says why
  expect_one_line_error(
      roundpipe("generate " + final_dir + " --messages " + (d / "none.json").string(), d),
      "roundpipe: error: " + (d / "none.json").string() + ": cannot open (" + std::strerror(ENOENT) + ")");
  fs::remove_all(d);
}

// A LoRA adapter folder whose base_model_name_or_path does not resolve (moved away from its
// base) names the fix in its error, and --base gives the base; --base on a plain model is refused.
TEST(CliGenerate, AdapterFolderTakesItsBaseFromBase) {
  auto d = tmpdir();
  const std::string peft = std::string(RP_FIXTURES_DIR) + "/peft/";
  fs::create_directories(d / "moved");
  fs::copy(peft + "untied_all/adapter", d / "moved/adapter", fs::copy_options::recursive);
  const std::string adapter = (d / "moved/adapter").string();
  expect_one_line_error(
      roundpipe("generate " + adapter + " --prompt hi --max-tokens 2", d),
      "pass the base model explicitly (--base of roundpipe generate / merge / export-gguf)");
  expect_one_line_error(
      roundpipe("generate " + adapter + " --base " + (d / "nobase").string() + " --prompt hi --max-tokens 2",
                d),
      "nobase: no such file or directory");
  // the fixture's base loads and takes the adapter; it carries no tokenizer, which is where
  // generation stops
  expect_one_line_error(roundpipe("generate " + adapter + " --base " + peft + "base_untied --prompt hi", d),
                        "base_untied: the model carries no tokenizer");
  expect_one_line_error(
      roundpipe("generate " + peft + "base_untied --base " + peft + "base_untied --prompt hi", d),
      "--base: only for a LoRA adapter folder");
  fs::remove_all(d);
}

// Flags generate would ignore are refused: --system without --chat, an empty --stop, an unknown
// --chat-template, template flags with --prompt.
TEST(CliGenerate, FlagsItWouldIgnoreAreRefused) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  write(d / "msgs.json", "[{\"role\": \"user\", \"content\": \"hi\"}]");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--prompt hi --system 'be brief'", "--system: only with --chat"},
      {"--messages " + (d / "msgs.json").string() + " --system 'be brief'", "--system: only with --chat"},
      {"--chat hi --stop ''", "--stop: expected a non-empty string"},
      // an unknown template, also with --prompt, which renders none (a typo was accepted silently)
      {"--chat hi --chat-template mistral",
       "--chat-template: unknown chat template \"mistral\" (valid: auto, jinja, chatml"},
      {"--prompt hi --chat-template bogus",
       "--chat-template: unknown chat template \"bogus\" (valid: auto, jinja, chatml"},
      // template flags with plain text, which renders no template (both were accepted silently)
      {"--prompt hi --no-think", "--no-think: only with --chat or --messages"},
      {"--prompt hi --chat-template jinja", "--chat-template jinja: only with --chat or --messages"},
      {"--prompt hi --chat-template qwen3", "--chat-template qwen3: only with --chat or --messages"},
  };
  for (const auto& [args, want] : refused) {
    const CliRun r = roundpipe("generate " + model.string() + " " + args + " --max-tokens 2", d);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("roundpipe: error: " + want), 0u) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
  EXPECT_EQ(roundpipe("generate " + model.string() + " --chat hi --system 'be brief' --max-tokens 2", d).code,
            0);
  EXPECT_EQ(roundpipe("generate " + model.string() + " --chat hi --no-think --max-tokens 2", d).code, 0);
  // a KV cache past the positions the model was trained on: generated, with a warning saying so
  const int64_t trained = rp::load_model(model.string()).config.max_position_embeddings;
  ASSERT_GT(trained, 0);
  const auto with_context = [&](int64_t n) {
    return roundpipe(
        "generate " + model.string() + " --prompt hi --max-tokens 2 --context " + std::to_string(n), d);
  };
  const CliRun past = with_context(trained + 1);
  EXPECT_EQ(past.code, 0) << past.err;
  EXPECT_NE(past.err.find("warning: --context " + std::to_string(trained + 1) +
                          " is past the model's max_position_embeddings (" + std::to_string(trained) + ")"),
            std::string::npos)
      << past.err;
  const CliRun within = with_context(trained);
  EXPECT_EQ(within.code, 0) << within.err;
  EXPECT_EQ(within.err.find("warning:"), std::string::npos) << within.err;
  EXPECT_EQ(
      roundpipe("generate " + model.string() + " --prompt hi --chat-template auto --max-tokens 2", d).code,
      0);
  fs::remove_all(d);
}

// A --messages file is named by every refusal of its messages: a role the template does not
// know, the template's own raise_exception, an empty array, a folder given as the file.
TEST(CliGenerate, MessagesFileErrorsNameTheFile) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);  // no template of its own: ChatML
  const std::string msgs = (d / "msgs.json").string();
  write(msgs, "[{\"role\": \"narrator\", \"content\": \"hi\"}]");
  expect_one_line_error(roundpipe("generate " + model.string() + " --messages " + msgs, d),
                        msgs + ": messages[0]: unknown role \"narrator\"");
  write(model / "tokenizer_config.json",
        "{\"chat_template\": \"{{ raise_exception('no narrators here') }}\"}");
  expect_one_line_error(roundpipe("generate " + model.string() + " --messages " + msgs, d),
                        msgs + ": tokenizer_config.json key 'chat_template':1: no narrators here");
  write(msgs, "[]");
  expect_one_line_error(roundpipe("generate " + model.string() + " --messages " + msgs, d),
                        msgs + ": expected a JSON array of {\"role\", \"content\"}, got []");
  expect_one_line_error(roundpipe("generate " + model.string() + " --messages " + d.string(), d),
                        d.string() + ": is a folder; expected a JSON file");
  // read as every JSON file is: a NUL byte, a key given twice and a syntax error name the place
  write(msgs, std::string("[{\"role\": \"user\", \"content\": \"hi\"}]\0junk", 40));
  expect_one_line_error(roundpipe("generate " + model.string() + " --messages " + msgs, d),
                        msgs + ":1:36: invalid JSON: a NUL byte");
  write(msgs, "[{\"role\": \"user\",\n  \"role\": \"system\", \"content\": \"hi\"}]");
  expect_one_line_error(roundpipe("generate " + model.string() + " --messages " + msgs, d),
                        msgs + ":2: key '[0].role' given twice");
  write(msgs, "[{\"role\": \"user\",\n \"content\": }]");
  expect_one_line_error(roundpipe("generate " + model.string() + " --messages " + msgs, d),
                        msgs + ":2:13: invalid JSON: syntax error");
  fs::remove_all(d);
}

}  // namespace
