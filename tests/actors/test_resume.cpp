// Session::save_optimizer_state / load_optimizer_state: training k steps, saving, and
// continuing in a new session for N-k steps reproduces an uninterrupted N-step run bit for
// bit (losses, fp32 master weights, AdamW moments and step counters, loss scaler), in async
// (staleness-1) and sync mode with 2 workers; damaged or mismatched state files give one line
// naming the file and what was expected.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace fs = std::filesystem;

namespace rp::test {
namespace {

constexpr int64_t kM = 2, kNSeq = 2, kSeqLen = 5;

struct Config {
  bool async = true;
  bool loss_scaling = false;  // forced on f32 (allow_loss_scaling_any_dtype), overflowing at first
  bool amsgrad = false;
  double max_grad_norm = 0;
  int layers = 4;
  double beta2 = 0.99;
};

TestSessionOptions options(const Config& c) {
  TestSessionOptions o;
  o.workers = 2;
  o.micro_batches = kM;
  o.micro = {kNSeq, kSeqLen};
  o.async = c.async;
  o.adam.beta1 = 0.9;
  o.adam.beta2 = c.beta2;
  o.adam.eps = 1e-6;
  o.adam.weight_decay = 0.01;
  o.adam.amsgrad = c.amsgrad;
  o.shards = 2;
  o.max_grad_norm = c.max_grad_norm;
  if (c.loss_scaling) {
    // 2^127 overflows, backoff 2^-100 gives 2^27, growth every 2 clean steps: the scale
    // changes around every save point, so a resume must restore the scaler exactly
    LossScalerOptions l;
    l.init_scale = std::ldexp(1.f, 127);
    l.backoff_factor = std::ldexp(1.f, -100);
    l.growth_interval = 2;
    o.loss_scaling = l;
    o.allow_loss_scaling_any_dtype = true;
  }
  return o;
}

ModelLayout layout_of(const Config& c) { return make_layout(tiny_config(false, true, c.layers)); }

void feed(Session& s, const ModelLayout& m, int t) {
  std::vector<int32_t> ids, tg;
  random_tokens(m.config.vocab_size, kM * kNSeq * kSeqLen, 500 + t, ids, tg);
  s.forward_backward(ids, tg);
  s.step(1e-2 * (1.0 + 0.05 * t));
}

struct Outcome {
  std::vector<StepResult> results;
  std::vector<std::vector<float>> weights;
  std::vector<AdamWState> states;
  std::optional<LossScaler> scaler;
};

void collect(TestSession& s, int from, int to, Outcome& out) {
  for (int t = from; t < to; ++t) out.results.push_back(s.wait(t));
  s.synchronize();
  out.weights = s.master_weights();
  out.states = s.optimizer_states();
  if (s.loss_scaler()) out.scaler = *s.loss_scaler();
}

Outcome uninterrupted(const Config& c, int n) {
  ModelLayout m = layout_of(c);
  TestSession s(m, random_weights(m, 7), options(c));
  for (int t = 0; t < n; ++t) feed(s, m, t);
  Outcome out;
  collect(s, 0, n, out);
  return out;
}

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("rp_resume_" + std::to_string(::getpid()) + "_" + name);
}

/// k steps, save, then a new session (constructed with the *initial* weights when the file
/// carries the master, so they must come from the file) continues to n.
Outcome resumed(const Config& c, int k, int n, bool include_master, const fs::path& file) {
  ModelLayout m = layout_of(c);
  Outcome out;
  std::vector<std::vector<float>> at_k;
  {
    TestSession a(m, random_weights(m, 7), options(c));
    for (int t = 0; t < k; ++t) feed(a, m, t);
    for (int t = 0; t < k; ++t) out.results.push_back(a.wait(t));
    a.synchronize();
    a.save_optimizer_state(file.string(), include_master);
    at_k = a.master_weights();
  }
  TestSession b(m, include_master ? random_weights(m, 7) : at_k, options(c));
  const OptimizerStateInfo info = b.load_optimizer_state(file.string());
  EXPECT_EQ(info.steps, k);
  EXPECT_EQ(info.has_master, include_master);
  EXPECT_EQ(b.steps_closed(), k);
  for (int t = k; t < n; ++t) feed(b, m, t);
  collect(b, k, n, out);
  return out;
}

bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

void expect_identical(const Outcome& got, const Outcome& ref, const std::string& what) {
  ASSERT_EQ(got.results.size(), ref.results.size()) << what;
  for (size_t t = 0; t < ref.results.size(); ++t) {
    EXPECT_EQ(got.results[t].loss_sum, ref.results[t].loss_sum) << what << " step " << t;
    EXPECT_EQ(got.results[t].tokens, ref.results[t].tokens) << what << " step " << t;
    EXPECT_EQ(got.results[t].skipped, ref.results[t].skipped) << what << " step " << t;
    EXPECT_EQ(got.results[t].loss_scale, ref.results[t].loss_scale) << what << " step " << t;
    if (std::isfinite(ref.results[t].grad_norm)) {
      EXPECT_EQ(got.results[t].grad_norm, ref.results[t].grad_norm) << what << " step " << t;
    }
  }
  ASSERT_EQ(got.weights.size(), ref.weights.size());
  for (size_t g = 0; g < ref.weights.size(); ++g) {
    EXPECT_TRUE(same_bits(got.weights[g].data(), ref.weights[g].data(), ref.weights[g].size() * 4))
        << what << " weights of group " << g;
    const auto &a = got.states[g], &b = ref.states[g];
    EXPECT_EQ(a.step, b.step) << what << " group " << g;
    ASSERT_EQ(a.m.size(), b.m.size()) << what << " group " << g;
    ASSERT_EQ(a.vmax.size(), b.vmax.size()) << what << " group " << g;
    EXPECT_TRUE(same_bits(a.m.data(), b.m.data(), b.m.size() * 4)) << what << " m of group " << g;
    EXPECT_TRUE(same_bits(a.v.data(), b.v.data(), b.v.size() * 4)) << what << " v of group " << g;
    EXPECT_TRUE(same_bits(a.vmax.data(), b.vmax.data(), b.vmax.size() * 4)) << what << " vmax of group " << g;
  }
  ASSERT_EQ(got.scaler.has_value(), ref.scaler.has_value()) << what;
  if (ref.scaler) {
    EXPECT_TRUE(*got.scaler == *ref.scaler) << what << ": loss scaler";
  }
}

TEST(Resume, BitIdenticalToAnUninterruptedRun) {
  struct Case {
    Config c;
    int k, n;
    bool include_master;
    const char* name;
  } cases[] = {
      {{true}, 3, 6, true, "async"},
      {{true}, 1, 4, false, "async, master from the constructor, resume after step 1"},
      {{false}, 3, 5, true, "sync"},
      {{true, false, true, 0.0}, 2, 5, true, "async amsgrad"},
      // loss scaling: async steps 0 and 1 overflow (step 1 uses the scale decided before step 0's
      // outcome); resuming at 1 must keep step 1's scale 2^127 although the scaler is at 2^27
      {{true, true}, 1, 6, true, "async, loss scaling, resume between the two skipped steps"},
      {{true, true, false, 0.5}, 4, 7, true, "async, loss scaling and clipping"},
      {{false, true}, 2, 5, true, "sync, loss scaling"},
  };
  for (const auto& cs : cases) {
    const Outcome ref = uninterrupted(cs.c, cs.n);
    // the reference must be a real run: weights moved
    ModelLayout m = layout_of(cs.c);
    EXPECT_FALSE(same_bits(ref.weights[1].data(), random_weights(m, 7)[1].data(), ref.weights[1].size() * 4));
    const fs::path f = temp_file("state.bin");
    expect_identical(resumed(cs.c, cs.k, cs.n, cs.include_master, f), ref, cs.name);
    fs::remove(f);
  }
  // the skipped steps of the loss-scaling case really straddle the save point
  Config ls{true, true};
  const Outcome r = uninterrupted(ls, 3);
  EXPECT_TRUE(r.results[0].skipped && r.results[1].skipped && !r.results[2].skipped);
}

// A state saved in async mode holds two weight versions (the master after step k-1 and the copy
// step k computes with, after step k-2); dropping the second one is not an exact resume.
TEST(Resume, AsyncStateNeedsTheLowPrecisionCopy) {
  Config c;
  const Outcome ref = uninterrupted(c, 4);
  const fs::path f = temp_file("async.bin");
  ModelLayout m = layout_of(c);
  {
    TestSession a(m, random_weights(m, 7), options(c));
    feed(a, m, 0);
    feed(a, m, 1);
    a.synchronize();
    a.save_optimizer_state(f.string());
  }
  // a sync session recasts the copy from the master: step 2 then computes with the weights
  // after step 1 instead of step 0, so its loss differs from the async run's
  Config sync = c;
  sync.async = false;
  TestSession b(m, random_weights(m, 7), options(sync));
  EXPECT_TRUE(b.load_optimizer_state(f.string()).async);
  feed(b, m, 2);
  EXPECT_NE(b.wait(2).loss_sum, ref.results[2].loss_sum);
  fs::remove(f);
}

// ---- damaged and mismatched files ------------------------------------------------------------

struct Saved {
  fs::path file;
  std::string bytes;
};

Saved save_after(const Config& c, int k, const std::string& name) {
  ModelLayout m = layout_of(c);
  TestSession a(m, random_weights(m, 7), options(c));
  for (int t = 0; t < k; ++t) feed(a, m, t);
  a.synchronize();
  Saved s{temp_file(name), {}};
  a.save_optimizer_state(s.file.string());
  std::ifstream in(s.file, std::ios::binary);
  s.bytes.assign(std::istreambuf_iterator<char>(in), {});
  return s;
}

void write_bytes(const fs::path& p, const std::string& b) { std::ofstream(p, std::ios::binary) << b; }

/// Loads `file` into a fresh session of config `c`; expects a one-line std::runtime_error that
/// names the file and contains `needle`. Returns whether the session is still usable (it must
/// then train a step from scratch) or refuses further calls.
bool expect_load_error(const Config& c, const fs::path& file, const std::string& needle) {
  ModelLayout m = layout_of(c);
  TestSession s(m, random_weights(m, 7), options(c));
  try {
    s.load_optimizer_state(file.string());
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
    return true;
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(file.string(), 0), 0u) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  try {
    feed(s, m, 0);
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("create a new Session"), std::string::npos) << e.what();
    return false;
  }
  EXPECT_EQ(s.steps_closed(), 1);
  EXPECT_GT(s.wait(0).tokens, 0);
  return true;
}

TEST(Resume, DamagedFilesGiveOneLineNamingTheFile) {
  Config c;
  const Saved s = save_after(c, 2, "good.bin");
  const fs::path bad = temp_file("bad.bin");
  // missing
  EXPECT_TRUE(expect_load_error(c, temp_file("missing.bin"), "cannot open"));
  // not a state file
  write_bytes(bad, "{\"step\": 3}\n");
  EXPECT_TRUE(expect_load_error(c, bad, "not a RoundPipe optimizer state"));
  // a flipped bit in the header (the step count): found before anything changes
  std::string b = s.bytes;
  b[16] ^= 1;
  write_bytes(bad, b);
  EXPECT_TRUE(expect_load_error(c, bad, "checksum mismatch in the header"));
  // truncated inside the header, then inside the payload (the session is then unusable)
  write_bytes(bad, s.bytes.substr(0, 20));
  EXPECT_TRUE(expect_load_error(c, bad, "truncated"));
  write_bytes(bad, s.bytes.substr(0, s.bytes.size() * 2 / 3));
  EXPECT_FALSE(expect_load_error(c, bad, "truncated"));
  // a flipped bit in the last group's payload
  b = s.bytes;
  b[b.size() - 40] ^= 4;
  write_bytes(bad, b);
  EXPECT_FALSE(expect_load_error(c, bad, "checksum mismatch"));
  // a damaged moment count (before the AdamW section's checksum): refused before any allocation
  b = s.bytes;
  const size_t adam = b.find("RPADAMW1");
  ASSERT_NE(adam, std::string::npos);
  b[adam + 24 + 5] = 0x7f;  // n ~ 5e14 parameters
  write_bytes(bad, b);
  EXPECT_TRUE(expect_load_error(c, bad, "AdamW moments of"));
  // trailing bytes
  write_bytes(bad, s.bytes + "x");
  EXPECT_FALSE(expect_load_error(c, bad, "trailing bytes"));
  // intact, it loads
  {
    ModelLayout m = layout_of(c);
    TestSession ok(m, random_weights(m, 7), options(c));
    EXPECT_EQ(ok.load_optimizer_state(s.file.string()).steps, 2);
  }
  fs::remove(bad);
  fs::remove(s.file);
}

TEST(Resume, MismatchedStatesNameWhatWasExpected) {
  Config c;
  const Saved s = save_after(c, 1, "mismatch.bin");
  Config other_model = c;
  other_model.layers = 3;
  EXPECT_TRUE(expect_load_error(other_model, s.file, "parameter groups, the model has"));
  Config other_beta = c;
  other_beta.beta2 = 0.95;
  EXPECT_TRUE(expect_load_error(other_beta, s.file, "same optimizer settings"));
  Config scaled = c;
  scaled.loss_scaling = true;
  EXPECT_TRUE(expect_load_error(scaled, s.file, "no loss scaler"));
  const Saved ls = save_after(scaled, 1, "scaled.bin");
  EXPECT_TRUE(expect_load_error(c, ls.file, "holds a loss scaler"));
  fs::remove(s.file);
  fs::remove(ls.file);
}

TEST(Resume, CallsOutOfPlaceAreRefused) {
  Config c;
  ModelLayout m = layout_of(c);
  const fs::path f = temp_file("order.bin");
  TestSession s(m, random_weights(m, 7), options(c));
  std::vector<int32_t> ids, tg;
  random_tokens(m.config.vocab_size, kM * kNSeq * kSeqLen, 1, ids, tg);
  s.forward_backward(ids, tg);
  EXPECT_THROW(s.save_optimizer_state(f.string()), std::logic_error);  // a pass in flight
  s.step(1e-2);
  EXPECT_THROW(s.save_optimizer_state(f.string()), std::logic_error);  // a step not waited for
  EXPECT_THROW(s.load_optimizer_state(f.string()), std::logic_error);  // not a new session
  s.synchronize();
  s.save_optimizer_state(f.string());
  EXPECT_TRUE(fs::exists(f));
  for (auto& e : fs::directory_iterator(f.parent_path()))
    EXPECT_EQ(e.path().filename().string().find(f.filename().string() + ".tmp-"), std::string::npos)
        << "leftover " << e.path();
  // into a folder that does not exist: an error naming it, no file
  const fs::path nowhere = temp_file("no_such_dir") / "state.bin";
  try {
    s.save_optimizer_state(nowhere.string());
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(nowhere.string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(nowhere));
  // a resumed session cannot wait for the steps of the run that saved
  TestSession b(m, random_weights(m, 7), options(c));
  b.load_optimizer_state(f.string());
  EXPECT_THROW(b.wait(0), std::invalid_argument);
  EXPECT_THROW(b.load_optimizer_state(f.string()), std::logic_error);
  fs::remove(f);
}

}  // namespace
}  // namespace rp::test
