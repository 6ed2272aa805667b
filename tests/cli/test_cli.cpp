// The `roundpipe` command as a user meets it: bad input gives one clear line and leaves
// no output behind; the default job trains a real model with a falling loss.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/checkpoint.hpp"
#include "scheduler/profile.hpp"

namespace fs = std::filesystem;

namespace {

struct CliRun {
  int code;
  std::string out, err;
};

fs::path tmpdir() {
  auto d = fs::temp_directory_path() / ("rp_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CliRun roundpipe(const std::string& args, const fs::path& dir) {
  std::string cmd = std::string(RP_BUILD_DIR) + "/roundpipe " + args + " > " + (dir / "out.txt").string() + " 2> " +
                    (dir / "err.txt").string() + " < /dev/null";
  int rc = std::system(cmd.c_str());
  return {WEXITSTATUS(rc), slurp(dir / "out.txt"), slurp(dir / "err.txt")};
}

void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

// A tiny HF-layout model written by the project's own writer (no download needed).
fs::path tiny_model(const fs::path& dir) {
  rp::ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 300;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.tie_word_embeddings = true;
  c.eos_token_id = 0;
  rp::ModelLayout m = rp::make_layout(c);
  std::vector<std::vector<float>> w;
  for (auto& g : m.groups) w.emplace_back(g.numel, 0.02f);
  std::vector<const float*> ptrs;
  for (auto& g : w) ptrs.push_back(g.data());
  // byte-level tokenizer: the 256 byte symbols, no merges
  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json added = nlohmann::json::array();
  // GPT-2 byte-to-unicode map
  std::vector<int> bs, cs;
  for (int b = 33; b <= 126; ++b) bs.push_back(b);
  for (int b = 161; b <= 172; ++b) bs.push_back(b);
  for (int b = 174; b <= 255; ++b) bs.push_back(b);
  cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) bs.push_back(b), cs.push_back(256 + n++);
  vocab["<|endoftext|>"] = 0;
  for (size_t i = 0; i < bs.size(); ++i) {
    std::string u;
    int cp = cs[i];
    if (cp < 0x80) u += char(cp);
    else u += char(0xC0 | (cp >> 6)), u += char(0x80 | (cp & 0x3F));
    vocab[u] = 1 + bs[i];
  }
  added.push_back({{"id", 0}, {"content", "<|endoftext|>"}, {"special", true}});
  nlohmann::json tok = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                        {"added_tokens", added}, {"normalizer", nullptr}, {"decoder", {{"type", "ByteLevel"}}}};
  fs::path out = dir / "tiny";
  rp::save_hf_checkpoint(out.string(), m, ptrs, tok, "", rp::DType::f32);
  return out;
}

std::string spec_for(const fs::path& model, const fs::path& data, const fs::path& out, const std::string& extra = "") {
  return "{\"model\": \"" + model.string() + "\", \"data\": \"" + data.string() + "\", \"output_dir\": \"" +
         out.string() + "\", \"seq_len\": 16, \"sequences_per_step\": 2, \"micro_batches\": 2, \"steps\": 2, "
         "\"backend\": \"cpu\", \"workers\": 2" + extra + "}";
}

void expect_one_line_error(const CliRun& r, const std::string& must_contain) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.find("roundpipe: error: "), 0u) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(Cli, TrainsTinyModelAndWritesLoadableCheckpoint) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n"
                          "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("step     2/2 | loss"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d / "run/metrics.csv"));
  auto lm = rp::load_model((d / "run/final").string());
  EXPECT_EQ(lm.config.num_hidden_layers, 2);
  // training moved the weights away from the constant 0.02 they started at
  double moved = 0;
  for (auto& [name, t] : lm.tensors)
    for (float v : t.data) moved += std::abs(v - 0.02f);
  EXPECT_GT(moved, 1e-3);
  fs::remove_all(d);
}

// The run directory holds the measured per-layer profile, and `roundpipe plan --profile`
// partitions with it.
TEST(Cli, TrainWritesAProfileThatPlanReads) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun r = roundpipe("train " + (d / "spec.json").string() + " --steps 3", d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE((r.out + r.err).find("automatic plan"), std::string::npos) << r.out << r.err;
  const fs::path prof = d / "run/profile.json";
  ASSERT_TRUE(fs::exists(prof)) << r.out << r.err;
  rp::Profile p = rp::Profile::load(prof.string());
  ASSERT_EQ(p.num_layers(), 4);  // embedding, 2 decoders, tail
  EXPECT_EQ(p.n_seq(), 1);
  EXPECT_EQ(p.seq_len(), 16);
  // 3 steps x 2 micro-batches: every layer was timed in every micro-batch (the plan may
  // have changed once, so a decoder's micro-batches split between kinds)
  for (int l = 0; l < 4; ++l) {
    const auto& lp = p.layer(l);
    const int64_t fb = std::max(lp.fwd.seen(), lp.bwd.seen()), tail = lp.tail.seen();
    EXPECT_EQ(fb + tail, 6) << "layer " << l;
    EXPECT_GT(lp.weight_bytes, 0) << "layer " << l;
    EXPECT_GT(lp.grad_bytes, 0) << "layer " << l;
  }
  EXPECT_EQ(p.layer(3).tail.seen(), 6);
  r = roundpipe("plan --model " + (d / "run/final").string() + " --gpus 2 --seq 16 --micro 2 --profile " +
                    prof.string(),
                d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("costs     profile " + prof.string()), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;
  fs::remove_all(d);
}

// The transfer keys reach the runtime: the trace records the settings the run used.
TEST(Cli, TransferSettingsFromTheSpecReachTheTrace) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run",
                                  ", \"trace\": true, \"transfer_priorities\": false, \"transfer_chunk_bytes\": 4096"));
  CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  std::ifstream f(d / "run/trace.json");
  auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["otherData"]["transfer_priorities"], "off");
  EXPECT_EQ(j["otherData"]["transfer_chunk_bytes"], "4096");
  fs::remove_all(d);
}

TEST(Cli, BadSpecsGiveOneLineNamingTheKey) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"hello world\"}\n");
  struct Case {
    std::string extra, needle;
  } cases[] = {
      {", \"wokers\": 2", "unknown key 'wokers'"},
      {", \"steps\": \"ten\"", "key 'steps': expected an integer"},
      {", \"micro_batches\": 0", "key 'micro_batches'"},
      {", \"sequences_per_step\": 3", "not divisible"},
      {", \"backend\": \"tpu\"", "key 'backend'"},
      {", \"transfer_chunk_bytes\": -1", "key 'transfer_chunk_bytes'"},
      {", \"transfer_priorities\": \"yes\"", "key 'transfer_priorities': expected true or false"},
      {", \"optimizer\": {\"lr\": 1e-3, \"beta\": 0.9}", "unknown key 'optimizer.beta'"},
      {", \"lr_schedule\": {\"kind\": \"exp\"}", "exp"},
      {", \"plan\": {\"forward\": [[0,1]], \"tail\": [3,3], \"backward\": [[1,0]]}", "tail stage"},
  };
  for (auto& c : cases) {
    write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run", c.extra));
    CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
    expect_one_line_error(r, c.needle);
    EXPECT_FALSE(fs::exists(d / "run")) << c.extra;
  }
  write(d / "broken.json", "{\"model\": \"x\",\n \"data\": }");
  expect_one_line_error(roundpipe("train " + (d / "broken.json").string(), d), "broken.json:2:");
  fs::remove_all(d);
}

TEST(Cli, BadModelAndDataFilesAreNamed) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"hello\"}\n{\"prompt\": 3, \"completion\": \"x\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "data.jsonl:2:");
  write(d / "data.jsonl", "{\"text\": \"hello\"}\n");
  // missing model
  write(d / "spec.json", spec_for(d / "nope.gguf", d / "data.jsonl", d / "run"));
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "nope.gguf");
  // truncated safetensors
  auto st = model / "model.safetensors";
  auto size = fs::file_size(st);
  fs::resize_file(st, size / 2);
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "model.safetensors");
  // unsupported config
  fs::remove_all(model);
  model = tiny_model(d);
  auto cfg = nlohmann::json::parse(slurp(model / "config.json"));
  cfg["model_type"] = "gpt_neox";
  write(model / "config.json", cfg.dump());
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "config.json");
  EXPECT_FALSE(fs::exists(d / "run"));
  fs::remove_all(d);
}

TEST(Cli, DefaultJobLossFallsOver20Steps) {
  const fs::path root = RP_SOURCE_DIR;
  if (!fs::exists(root / "assets/SmolLM2-135M-Instruct.Q4_1.gguf") || !fs::exists(root / "assets/kjv_instruct.jsonl"))
    GTEST_SKIP() << "default assets missing: run scripts/setup.sh (downloads SmolLM2 and builds the KJV data)";
  auto d = tmpdir();
  CliRun r{0, "", ""};
  {
    auto cwd = fs::current_path();
    fs::current_path(root);
    r = roundpipe("train examples/specs/default.json --output-dir " + (d / "run").string(), d);
    fs::current_path(cwd);
  }
  ASSERT_EQ(r.code, 0) << r.err;
  // metrics.csv: step,loss,... ; compare the mean of the first and last 5 steps
  std::ifstream f(d / "run/metrics.csv");
  std::string line;
  std::getline(f, line);
  std::vector<double> loss;
  while (std::getline(f, line)) loss.push_back(std::stod(line.substr(line.find(',') + 1)));
  ASSERT_EQ(loss.size(), 20u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += loss[i] / 5, last += loss[15 + i] / 5;
  EXPECT_LT(last, first - 0.2) << "first-5 mean " << first << ", last-5 mean " << last;
  auto lm = rp::load_model((d / "run/final").string());
  EXPECT_EQ(lm.config.num_hidden_layers, 30);
  fs::remove_all(d);
}

}  // namespace

namespace {

TEST(Cli, PlanPartitionsAConfigWithoutWeights) {
  auto d = tmpdir();
  write(d / "config.json",
        R"({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
            "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
            "max_position_embeddings": 40960})");
  CliRun r = roundpipe("plan --model " + (d / "config.json").string() + " --gpus 8 --seq 8192 --micro 16 --trace " +
                        (d / "sim.json").string(),
                    d);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* needle : {"28", "forward", "tail", "backward", "tokens/s", "bubble"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  auto trace = nlohmann::json::parse(slurp(d / "sim.json"));
  EXPECT_GT(trace["traceEvents"].size(), 16u);
  // A memory cap no single layer fits in is refused, naming the layer.
  r = roundpipe("plan --model " + (d / "config.json").string() + " --gpus 8 --memory-cap 10MiB", d);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("layer"), std::string::npos) << r.err;
  r = roundpipe("plan --model " + (d / "missing.json").string(), d);
  expect_one_line_error(r, "missing.json");
  fs::remove_all(d);
}

}  // namespace

namespace {

TEST(Cli, UsageErrorsAreOneLine) {
  auto d = tmpdir();
  for (const char* args : {"", "frobnicate", "train", "train x.json --steps 0", "train x.json --workers two",
                           "train x.json --backend tpu", "convert a b --dtype q4"}) {
    CliRun r = roundpipe(args, d);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("roundpipe: error: "), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  fs::remove_all(d);
}

TEST(Cli, OutputDirAndSeqLenProblemsAreNamedBeforeTraining) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "chat.jsonl", "{\"prompt\": \"a very long prompt that does not fit\", \"completion\": \" x\"}\n");
  write(d / "data.jsonl", "{\"text\": \"hello world, hello world\"}\n");
  write(d / "afile", "x");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "afile"));
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "key 'output_dir'");
  write(d / "spec.json", spec_for(model, d / "chat.jsonl", d / "run"));
  auto spec = nlohmann::json::parse(slurp(d / "spec.json"));
  spec["seq_len"] = 4;
  write(d / "spec.json", spec.dump());
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "key 'seq_len'");
  fs::remove_all(d);
}

TEST(Cli, LeftoversOfKilledRunsAreRemoved) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  fs::create_directories(d / "run/final.tmp-999999999");
  write(d / "run/final.tmp-999999999/model.safetensors.tmp-999999999", "partial");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(d / "run/final.tmp-999999999"));
  EXPECT_TRUE(fs::exists(d / "run/final/model.safetensors"));
  fs::remove_all(d);
}

}  // namespace
