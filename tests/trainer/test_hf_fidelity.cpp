// Fidelity against Hugging Face transformers + torch AdamW: the default model (SmolLM2-135M,
// fp32 on the CPU backend) trains up to 200 steps in sync mode on the batches of the fixture
// tests/fixtures/hf_train/smollm2_memorise.json (made by make_fixture.py beside it on a machine
// with torch): the first 50 steps' losses within 0.5% of the reference each, then, once the
// passages are memorised, every 25-step window's mean within 5% and every step within 0.03
// nats. Runs 75 steps unless RP_FIDELITY_STEPS says otherwise. Skips with the reason until the
// fixture exists.
//
// With RP_FIDELITY_ASYNC=1 it also trains the same batches with the staleness-1 optimizer and
// prints the gap to sync (RP_FIDELITY_OUT=file.csv: every step's losses): docs/fidelity.md
// reports that run. Without the
// fixture, that measurement builds the same 8 sequences itself (RP_FIDELITY_ASYNC=1 only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "data/tokenizer.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/session.hpp"

namespace {

namespace fs = std::filesystem;

struct Fixture {
  int64_t seq_len = 64;
  std::vector<std::vector<int32_t>> ids, targets;
  rp::AdamWOptions adam;
  double lr = 2e-4;
  int64_t steps = 200;
  std::vector<double> losses;  // empty: no reference
};

const fs::path kFixture = fs::path(RP_FIXTURES_DIR) / "hf_train/smollm2_memorise.json";
const fs::path kModel = fs::path(RP_SOURCE_DIR) / "assets/SmolLM2-135M-Instruct.Q4_1.gguf";

Fixture read_fixture() {
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(kFixture));
  Fixture f;
  f.seq_len = j.at("seq_len").get<int64_t>();
  for (const auto& s : j.at("sequences")) {
    f.ids.push_back(s.at("ids").get<std::vector<int32_t>>());
    f.targets.push_back(s.at("targets").get<std::vector<int32_t>>());
  }
  const auto& a = j.at("adam");
  f.lr = a.at("lr").get<double>();
  f.adam.lr = f.lr;
  f.adam.beta1 = a.at("betas")[0].get<double>();
  f.adam.beta2 = a.at("betas")[1].get<double>();
  f.adam.eps = a.at("eps").get<double>();
  f.adam.weight_decay = a.at("weight_decay").get<double>();
  f.steps = j.at("steps").get<int64_t>();
  f.losses = j.at("losses").get<std::vector<double>>();
  return f;
}

/// The fixture's sequences built here (make_fixture.py's rule) for the async measurement
/// without a reference: the first 64 tokens of the first 8 assistant passages, then eos.
Fixture own_sequences(const rp::LoadedModel& lm) {
  Fixture f;
  f.adam.beta1 = 0.9;
  f.adam.beta2 = 0.95;
  f.adam.eps = 1e-8;
  f.adam.lr = f.lr;
  const rp::Tokenizer tok = rp::Tokenizer::from_json(lm.tokenizer_json, "model");
  const int32_t eos = int32_t(lm.config.eos_token_id);
  std::ifstream in(fs::path(RP_SOURCE_DIR) / "assets/kjv_instruct.jsonl");
  std::string line;
  while (f.ids.size() < 8 && std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    std::vector<int32_t> t = tok.encode(j["messages"].back()["content"].get<std::string>());
    t.push_back(eos);
    t.resize(std::min<size_t>(t.size(), size_t(f.seq_len) + 1));
    std::vector<int32_t> x(size_t(f.seq_len), eos), y(size_t(f.seq_len), -100);
    for (size_t i = 0; i < t.size() && i < size_t(f.seq_len); ++i) x[i] = t[i];
    for (size_t i = 1; i < t.size(); ++i) y[i - 1] = t[i];
    f.ids.push_back(x);
    f.targets.push_back(y);
  }
  return f;
}

/// Losses of `steps` steps of the runtime on the fixture's batches.
std::vector<double> train(const rp::LoadedModel& lm, const Fixture& f, bool async) {
  const rp::ModelLayout layout = rp::make_layout(lm.config);
  std::vector<std::vector<float>> w;
  rp::fill_groups(lm, layout, w);
  rp::SessionOptions o;
  o.backend = "cpu";
  o.workers = 2;
  o.micro_batches = 2;
  o.micro = {1, f.seq_len};
  o.async = async;
  o.adam = f.adam;
  rp::Session s(layout, std::move(w), o);
  const size_t K = f.ids.size();
  std::vector<double> out;
  for (int64_t t = 0; t < f.steps; ++t) {
    std::vector<int32_t> ids, tg;
    for (size_t k : {size_t(2 * t) % K, size_t(2 * t + 1) % K}) {
      ids.insert(ids.end(), f.ids[k].begin(), f.ids[k].end());
      tg.insert(tg.end(), f.targets[k].begin(), f.targets[k].end());
    }
    s.forward_backward(ids, tg);
    s.step(f.lr);
    if (t > 0) {
      const rp::StepResult r = s.wait(t - 1);
      out.push_back(r.loss_sum / r.tokens);
    }
  }
  const rp::StepResult r = s.wait(f.steps - 1);
  out.push_back(r.loss_sum / r.tokens);
  return out;
}

constexpr int64_t kExactSteps = 50;  // the loss falls from 1.9 to about 0.04 nats
constexpr int64_t kWindow = 25;

struct Gap {
  double max_rel = 0, final_rel = 0, max_abs = 0, tail_rel = 0;
  int64_t worst_step = 0, worst_abs_step = 0;
};
/// Per-step gaps of `a` against `ref`; tail_rel compares the means of the last quarter of the
/// run (single losses of a memorised passage are tiny and noisy).
Gap gap(const std::vector<double>& a, const std::vector<double>& ref) {
  Gap g;
  double ta = 0, tr = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    const double r = std::fabs(a[t] - ref[t]) / std::max(ref[t], 1e-12);
    if (r > g.max_rel) g.max_rel = r, g.worst_step = int64_t(t) + 1;
    if (std::fabs(a[t] - ref[t]) > g.max_abs)
      g.max_abs = std::fabs(a[t] - ref[t]), g.worst_abs_step = int64_t(t) + 1;
    if (t >= a.size() * 3 / 4) ta += a[t], tr += ref[t];
  }
  g.final_rel = (a.back() - ref.back()) / ref.back();
  g.tail_rel = (ta - tr) / tr;
  return g;
}

TEST(HfFidelity, SyncTrainingTracksTransformersAndTorchAdamW) {
  const bool measure_async =
      std::getenv("RP_FIDELITY_ASYNC") && std::string(std::getenv("RP_FIDELITY_ASYNC")) == "1";
  if (!fs::exists(kModel)) GTEST_SKIP() << kModel << " is missing (scripts/setup.sh downloads it)";
  if (!fs::exists(kFixture) && !measure_async)
    GTEST_SKIP()
        << "no reference yet: " << kFixture
        << " is made by tests/fixtures/hf_train/make_fixture.py on a machine with torch (see its header)";
  const rp::LoadedModel lm = rp::load_model(kModel.string());
  Fixture f = fs::exists(kFixture) ? read_fixture() : own_sequences(lm);
  // 75 of the fixture's 200 steps by default: the 50 exact steps and one 25-step window of the
  // memorised phase (2 shared CI cores: 5-10 minutes, under the suite's 900 s per-test limit);
  // RP_FIDELITY_STEPS=200 runs them all.
  const char* steps_env = std::getenv("RP_FIDELITY_STEPS");
  const int64_t steps = steps_env ? std::atoll(steps_env) : 75;
  if (steps > 0 && steps < f.steps) {
    f.steps = steps;
    if (!f.losses.empty()) f.losses.resize(size_t(steps));
  }
  const std::vector<double> sync = train(lm, f, false);
  ASSERT_EQ(sync.size(), size_t(f.steps));
  if (!f.losses.empty()) {
    ASSERT_EQ(f.losses.size(), size_t(f.steps));
    // While the loss falls (the first kExactSteps steps) the two fp32 implementations agree
    // step for step. Once the passages are memorised (losses near 0.03 nats) tiny rounding
    // differences (summation orders) are amplified from step to step, as between any two
    // fp32 frameworks, so there each window's mean loss is held to the reference and every
    // step to an absolute bound.
    for (int64_t t = 0; t < f.steps; ++t) {
      const double ref = f.losses[size_t(t)];
      if (t < kExactSteps) EXPECT_NEAR(sync[size_t(t)], ref, 0.005 * ref) << "step " << t + 1;
      else EXPECT_NEAR(sync[size_t(t)], ref, 0.03) << "step " << t + 1;
    }
    for (int64_t w0 = kExactSteps; w0 + kWindow <= f.steps; w0 += kWindow) {
      double a = 0, b = 0;
      for (int64_t t = w0; t < w0 + kWindow; ++t) a += sync[size_t(t)], b += f.losses[size_t(t)];
      EXPECT_NEAR(a / kWindow, b / kWindow, 0.05 * b / kWindow)
          << "mean loss of steps " << w0 + 1 << "-" << w0 + kWindow;
    }
    const Gap g = gap(sync, f.losses);
    std::printf(
        "[fidelity] sync vs transformers over %lld steps: largest gap %.3f%% (step %lld), largest absolute "
        "gap "
        "%.4f nats (step %lld), final loss %.4f vs %.4f\n",
        (long long)f.steps, 100 * g.max_rel, (long long)g.worst_step, g.max_abs, (long long)g.worst_abs_step,
        sync.back(), f.losses.back());
  }
  if (measure_async) {
    const std::vector<double> async = train(lm, f, true);
    const Gap g = gap(async, sync);
    std::printf(
        "[fidelity] async vs sync over %lld steps: final loss %.4f vs %.4f (%+.2f%%), mean of the last "
        "quarter %+.2f%%, largest gap %.2f%% at step %lld, largest absolute gap %.4f nats at step %lld\n",
        (long long)f.steps, async.back(), sync.back(), 100 * g.final_rel, 100 * g.tail_rel, 100 * g.max_rel,
        (long long)g.worst_step, g.max_abs, (long long)g.worst_abs_step);
    if (const char* out = std::getenv("RP_FIDELITY_OUT")) {  // every step, for docs/fidelity.md
      std::ofstream csv(out);
      csv << "step,sync,async" << (f.losses.empty() ? "" : ",reference") << "\n";
      for (int64_t t = 0; t < f.steps; ++t)
        csv << t + 1 << "," << sync[size_t(t)] << "," << async[size_t(t)]
            << (f.losses.empty() ? std::string() : "," + std::to_string(f.losses[size_t(t)])) << "\n";
    }
    for (int64_t t = 0; t < f.steps; t += 10)
      std::printf("[fidelity] step %3lld: sync %.4f async %.4f%s\n", (long long)t + 1, sync[size_t(t)],
                  async[size_t(t)],
                  f.losses.empty() ? "" : (" reference " + std::to_string(f.losses[size_t(t)])).c_str());
  }
}

}  // namespace
