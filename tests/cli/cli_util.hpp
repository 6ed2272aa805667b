// Helpers of the CLI tests: run the built `roundpipe` binary in a scratch folder, and a tiny
// Hugging Face model written by the project's own writer (no download needed).
#pragma once
#include <cmath>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "formats/checkpoint.hpp"
#include "roundpipe/spec.hpp"

namespace fs = std::filesystem;

namespace rp::clitest {

struct CliRun {
  int code;
  std::string out, err;
};

/// Removes the folders tmpdir() made when their test ends, however it ends: a GTEST_SKIP or a
/// failed ASSERT returns before a test's own cleanup (one such test left 2.3 GB a run).
class TmpdirCleaner : public ::testing::EmptyTestEventListener {
 public:
  static std::vector<fs::path>& made() {
    static std::vector<fs::path> v;
    return v;
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    for (const fs::path& p : made()) {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
    made().clear();
  }
};

/// A fresh scratch folder named after the process and the current test, removed when the test
/// ends.
inline fs::path tmpdir() {
  static const bool listening = [] {
    ::testing::UnitTest::GetInstance()->listeners().Append(new TmpdirCleaner);  // gtest owns it
    return true;
  }();
  (void)listening;
  auto d = fs::temp_directory_path() / ("rp_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  TmpdirCleaner::made().push_back(d);
  return d;
}

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline CliRun roundpipe(const std::string& args, const fs::path& dir) {
  std::string cmd = std::string(RP_BUILD_DIR) + "/roundpipe " + args + " > " + (dir / "out.txt").string() +
                    " 2> " + (dir / "err.txt").string() + " < /dev/null";
  int rc = std::system(cmd.c_str());
  return {WEXITSTATUS(rc), slurp(dir / "out.txt"), slurp(dir / "err.txt")};
}

/// roundpipe(args, dir) run in working directory `cwd`, with `env` ("NAME=value ...") set.
inline CliRun roundpipe_in(const fs::path& cwd, const std::string& args, const fs::path& dir,
                           const std::string& env = "") {
  std::string cmd = "cd '" + cwd.string() + "' && " + env + " " + std::string(RP_BUILD_DIR) + "/roundpipe " +
                    args + " > " + (dir / "out.txt").string() + " 2> " + (dir / "err.txt").string() +
                    " < /dev/null";
  int rc = std::system(cmd.c_str());
  return {WEXITSTATUS(rc), slurp(dir / "out.txt"), slurp(dir / "err.txt")};
}

inline void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

/// The marker a roundpipe writer leaves beside "<target>.<kind>-<pid>" (base/atomic_file.hpp),
/// as a writer with that pid, since killed, left it.
inline void mark(const fs::path& leftover, const std::string& kind, const std::string& target,
                 const std::string& pid) {
  write(fs::path(leftover.string() + ".roundpipe-owner"),
        "roundpipe leftover v1\npid=" + pid + "\nstart=1\nkind=" + kind + "\ntarget=" + target + "\n");
}

// A tiny HF-layout model written by the project's own writer (no download needed).
/// A tiny model with a byte-level tokenizer in dir/tiny (or dir/<name>); `moe`: a Qwen3-MoE
/// (4 experts, top-2, the load-balancing loss on) with varied weights so routing is not tied;
/// `gpt_oss` (with moe): a GPT-OSS instead (biases, sinks, layer 0 sliding with window 4, the
/// experts' width 32 so mxfp4 blocks fit), in dir/tiny-gpt-oss.
inline fs::path tiny_model(const fs::path& dir, bool moe = false, bool gpt_oss = false) {
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
  if (moe) {
    c.architecture = "qwen3_moe";
    c.qk_norm = true;
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 12;
    c.norm_topk_prob = true;
    c.router_aux_loss_coef = 0.01;
    c.output_router_logits = true;
  }
  if (moe && gpt_oss) {
    c.architecture = "gpt_oss";
    c.qk_norm = false;
    c.hidden_size = 32;
    c.moe_intermediate_size = 32;
    c.tie_word_embeddings = false;
    c.attention_bias = true;
    c.attention_sinks = true;
    c.sliding_window = 4;
    c.layer_types = {"sliding_attention", "full_attention"};
  }
  rp::ModelLayout m = rp::make_layout(c);
  std::vector<std::vector<float>> w;
  for (auto& g : m.groups) {
    w.emplace_back(g.numel, 0.02f);
    if (moe)  // varied, deterministic weights: the router's logits differ between experts
      for (const auto& t : g.tensors)
        for (int64_t i = 0; i < t.numel(); ++i)
          w.back()[size_t(t.offset + i)] =
              t.shape.size() == 1 ? 1.0f : 0.15f * float(std::sin(0.7 * double(i) + double(t.offset % 97)));
  }
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
  nlohmann::json tok = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"decoder", {{"type", "ByteLevel"}}}};
  fs::path out = dir / (gpt_oss ? "tiny-gpt-oss" : moe ? "tiny-moe" : "tiny");
  rp::save_hf_checkpoint(out.string(), m, ptrs, tok, "", rp::DType::f32);
  return out;
}

/// A spec of the tiny model's run; `extra` (", \"key\": value, ...") adds keys or replaces the
/// defaults (a spec file may not give a key twice). Text that is no JSON stays as written.
inline std::string spec_for(const fs::path& model, const fs::path& data, const fs::path& out,
                            const std::string& extra = "") {
  const std::string text =
      "{\"model\": \"" + model.string() + "\", \"data\": \"" + data.string() + "\", \"output_dir\": \"" +
      out.string() +
      "\", \"seq_len\": 16, \"sequences_per_step\": 2, \"micro_batches\": 2, \"steps\": 2, "
      "\"backend\": \"cpu\", \"workers\": 2" +
      extra + "}";
  try {
    return nlohmann::json::parse(text).dump();  // the last of a repeated key wins
  } catch (const nlohmann::json::exception&) {
    return text;
  }
}

/// Reads spec_for(d / "m", d / "data.jsonl", d / "run", extra) as the spec file "s.json"
/// (spec_from_json, then validate_spec when `validate`): `accepted(spec)` ("ok" when not given)
/// for a spec it accepts, else the refusal's line.
inline std::string spec_result(const fs::path& d, const std::string& extra,
                               const std::function<std::string(const rp::TrainSpec&)>& accepted = {},
                               bool validate = false) {
  try {
    const rp::TrainSpec s = rp::spec_from_json(
        nlohmann::json::parse(spec_for(d / "m", d / "data.jsonl", d / "run", extra)), "s.json");
    if (validate) rp::validate_spec(s);
    return accepted ? accepted(s) : "ok";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

/// Why a test of the default job cannot run here ("" when it can): the default model and data
/// that scripts/setup.sh fetches and builds are not in assets/.
inline std::string default_assets_missing() {
  const fs::path root = RP_SOURCE_DIR;
  if (fs::exists(root / "assets/SmolLM2-135M-Instruct.Q4_1.gguf") &&
      fs::exists(root / "assets/kjv_instruct.jsonl"))
    return "";
  return "default assets missing: run scripts/setup.sh (downloads SmolLM2 and builds the KJV data)";
}

/// A folder with the tiny model (d / "tiny"), one line of data (d / "data.jsonl") and the spec of
/// its run into d / "run" (d / "spec.json", spec_for with `extra`).
struct TinyRun {
  fs::path d, model, spec;
};
inline TinyRun tiny_run(const std::string& data_line = "{\"text\": \"hello world, hello world\"}\n",
                        const std::string& extra = "") {
  TinyRun t;
  t.d = tmpdir();
  t.model = tiny_model(t.d);
  write(t.d / "data.jsonl", data_line);
  t.spec = t.d / "spec.json";
  write(t.spec, spec_for(t.model, t.d / "data.jsonl", t.d / "run", extra));
  return t;
}

/// `roundpipe train SPEC` run in `dir` while the shell runs `signals` against it ($pid: e.g.
/// "sleep 3; kill -TERM $pid"); timeout passes a SIGTERM on (once: --foreground) and kills a run
/// that ignores its signals (rc 137) instead of hanging the test. rc: the exit status as the
/// shell wrote it ("130\n"); all: stdout + stderr; seconds: the whole command's time.
struct SignalledRun {
  std::string rc, all;
  double seconds = 0;
};
inline SignalledRun train_with_signals(const fs::path& dir, const std::string& spec,
                                       const std::string& signals) {
  const std::string cmd = "cd " + dir.string() + " && (timeout --foreground -s KILL 60 " +
                          std::string(RP_BUILD_DIR) + "/roundpipe train " + spec +
                          " > out.txt 2> err.txt < /dev/null & pid=$!; " + signals +
                          "; wait $pid; echo $? > rc.txt)";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  SignalledRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rc = slurp(dir / "rc.txt");
  r.all = slurp(dir / "out.txt") + slurp(dir / "err.txt");
  return r;
}

inline void expect_one_line_error(const CliRun& r, const std::string& must_contain) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.find("roundpipe: error: "), 0u) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace rp::clitest
