// Fixtures of the disk tier's runtime tests (test_frozen_tier.cpp, test_frozen_source.cpp,
// test_activation_spill.cpp): a
// tiny LoRA model on a q4_0 base, its session options, a scratch folder per test, and a
// kSteps-step training run that fails the test instead of hanging.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test::tier_fixture {

namespace fs = std::filesystem;
constexpr int64_t kNSeq = 2, kSeqLen = 5, kM = 3;
constexpr int kSteps = 3;
constexpr double kWaitS = 120;  // a step of this model takes well under a second: more is a hang

struct Scratch {
  fs::path root, dir;
  Scratch() {
    root = fs::temp_directory_path() /
           fmt::format("rp_frozen_tier_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->random_seed());
    dir = root / ::testing::UnitTest::GetInstance()->current_test_info()->name();  // "Case/param": 2 levels
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
    // the folders above it up to the process's own, each once it is empty (another Scratch's stays)
    for (fs::path p = dir.parent_path(); fs::remove(p, ec) && !ec && p != root; p = p.parent_path()) {}
  }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  std::set<std::string> entries() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
    return out;
  }
};

inline ModelLayout lora_layout(int layers = 4, WeightFormat base = WeightFormat::q4_0) {
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  lc.target_modules = {"all-linear"};
  lc.base_format = base;  // q4_0: staged and dequantized on the device
  return make_layout(tiny_config(false, false, layers), lc);
}

inline TestSessionOptions options(int workers, std::vector<std::string>* log) {
  TestSessionOptions o;
  o.workers = workers;
  o.micro_batches = kM;
  o.micro = {kNSeq, kSeqLen};
  o.adam = adam_opts();
  o.shards = 2;
  o.transfer_chunk_bytes = 4096;  // several chunks per group: the lease outlives the first
  o.watchdog_s = 0;
  if (log) o.profiling.log = [log](const std::string& l) { log->push_back(l); };
  return o;
}

struct Result {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;  // group_weights_f32 of every group
};

// Submits kSteps steps of `tokens` tokens per pass (seeded per step).
inline void submit_steps(Session& s, int64_t tokens = kM * kNSeq * kSeqLen) {
  for (int t = 0; t < kSteps; ++t) {
    std::vector<int32_t> tg, ids;
    random_tokens(67, tokens, 100 + uint64_t(t) * 10, ids, tg);
    s.forward_backward(ids, tg);
    s.step(lr_at(t));
  }
}

// Trains kSteps steps; a step not done within kWaitS fails the test (a deadlock) instead of
// hanging. `during` runs once the first step is done, the session still running.
inline Result train(Session& s, int64_t tokens = kM * kNSeq * kSeqLen,
                    const std::function<void()>& during = {}) {
  Result r;
  submit_steps(s, tokens);
  for (int t = 0; t < kSteps; ++t) {
    std::optional<StepResult> sr = s.wait_for(t, kWaitS);
    if (!sr) {
      ADD_FAILURE() << "step " << t << " not done after " << kWaitS << " s: " << s.status();
      return r;
    }
    r.losses.push_back(sr->loss_sum / sr->tokens);
    if (t == 0 && during) during();
  }
  s.synchronize();
  for (int g = 0; g < int(s.layout().groups.size()); ++g) r.weights.push_back(s.group_weights_f32(g));
  return r;
}

// Trains kSteps steps that an injected fault must stop: the RuntimeFailure's line, or "" with a
// failure recorded when the run succeeded or hung.
inline std::string run_until_failure(Session& s) {
  try {
    submit_steps(s);
    for (int t = 0; t < kSteps; ++t)
      if (!s.wait_for(t, kWaitS)) {
        ADD_FAILURE() << "step " << t << " hangs: " << s.status();
        return "";
      }
    ADD_FAILURE() << "the run succeeded although an I/O failed";
  } catch (const RuntimeFailure& e) {
    return e.what();
  }
  return "";
}

inline FrozenTierOptions tier_at(const std::string& path, double gib = 0) {
  FrozenTierOptions t;
  t.path = path;
  t.ring_gib = gib;
  return t;
}

inline uint64_t frozen_bytes(const ModelLayout& m) {
  uint64_t n = 0;
  for (const ParamGroup& g : m.groups)
    if (g.frozen) n += uint64_t(g.storage_bytes);
  return n;
}

}  // namespace rp::test::tier_fixture
