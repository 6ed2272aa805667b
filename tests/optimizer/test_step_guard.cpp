// Around the update: global-norm clipping across groups, inf/NaN skips, dynamic loss
// scaling, and a bit-identical resume of all of it (AdamW state with hyper-parameters,
// loss scaler, master weights) on another ISA path and pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "adam_ref.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/clip.hpp"
#include "optimizer/isa.hpp"
#include "optimizer/loss_scale.hpp"
#include "optimizer/thread_pool.hpp"

namespace {
using rp::AdamWOptions;
using rp::AdamWState;
using rp::DType;
using rp::Isa;
using rp::LossScaler;
using rp::LossScalerOptions;

struct IsaGuard {
  Isa saved = rp::adamw_isa();
  ~IsaGuard() { rp::set_adamw_isa(saved); }
};

// ---- LossScaler --------------------------------------------------------------------------

TEST(LossScaler, TorchDefaults) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.f);
  EXPECT_EQ(s.options().growth_factor, 2.f);
  EXPECT_EQ(s.options().backoff_factor, 0.5f);
  EXPECT_EQ(s.options().growth_interval, 2000);
}

TEST(LossScaler, GrowsAfterIntervalBacksOffOnOverflow) {
  LossScaler s(LossScalerOptions{1024.f, 2.f, 0.5f, 3});
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1024.f);
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_TRUE(s.update(false));  // third clean step in a row: grow
  EXPECT_EQ(s.scale(), 2048.f);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.update(true));  // overflow: skip, halve, reset the window
  EXPECT_EQ(s.scale(), 1024.f);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 512.f);
  for (int i = 0; i < 2; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 512.f);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.f);
  EXPECT_EQ(s.steps_skipped(), 2);
  EXPECT_EQ(s.steps_applied(), 7);
}

TEST(LossScaler, NeverGrowsToInfinity) {
  LossScaler s(LossScalerOptions{std::ldexp(1.f, 127), 2.f, 0.5f, 1});
  s.update(false);
  EXPECT_EQ(s.scale(), std::ldexp(1.f, 127));  // 2^128 is inf in fp32: kept
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScaler, AsyncStaleStepsDoNotDoubleBackoffOrCountGrowth) {
  LossScaler s(LossScalerOptions{1024.f, 2.f, 0.5f, 2});
  // steps t and t+1 both ran their backward at 1024 (async) and both overflow
  EXPECT_FALSE(s.update(true, 1024.f));
  EXPECT_EQ(s.scale(), 512.f);
  EXPECT_FALSE(s.update(true, 1024.f));
  EXPECT_EQ(s.scale(), 512.f);  // not 256: the second overflow was at the old scale
  // a clean step that still used the old scale does not count towards growth
  EXPECT_TRUE(s.update(false, 1024.f));
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_TRUE(s.update(false, 512.f));
  EXPECT_TRUE(s.update(false, 512.f));
  EXPECT_EQ(s.scale(), 1024.f);
  // an overflow at a scale below the current one backs off from the scale it used
  EXPECT_FALSE(s.update(true, 512.f));
  EXPECT_EQ(s.scale(), 256.f);
}

TEST(LossScaler, BackoffStopsAtTheFloor) {
  // 200 overflowing steps with a tiny backoff used to drive the scale to 0
  LossScalerOptions o{1024.f, 2.f, 1e-3f, 10};
  o.min_scale = 4.f;
  LossScaler s(o);
  EXPECT_FALSE(s.at_floor());
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 4.f);  // 1024 * 1e-3 = 1.024 is below the floor
  EXPECT_TRUE(s.at_floor());
  for (int i = 0; i < 200; ++i) EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 4.f);
  EXPECT_EQ(s.steps_skipped(), 201);
  // the default floor is 1 (torch's defaults otherwise)
  LossScaler d;
  for (int i = 0; i < 40; ++i) d.update(true);
  EXPECT_EQ(d.scale(), 1.f);
  EXPECT_TRUE(d.at_floor());
  // a clean step at the floor still grows after the interval
  LossScaler g(o);
  g.update(true);
  for (int i = 0; i < 10; ++i) g.update(false);
  EXPECT_EQ(g.scale(), 8.f);
  EXPECT_FALSE(g.at_floor());
}

TEST(LossScaler, ValidatesOptions) {
  EXPECT_THROW(LossScaler(LossScalerOptions{0.f, 2.f, 0.5f, 10}), std::invalid_argument);
  EXPECT_THROW(LossScaler(LossScalerOptions{INFINITY, 2.f, 0.5f, 10}), std::invalid_argument);
  EXPECT_THROW(LossScaler(LossScalerOptions{1.f, 1.f, 0.5f, 10}), std::invalid_argument);
  EXPECT_THROW(LossScaler(LossScalerOptions{1.f, 2.f, 1.f, 10}), std::invalid_argument);
  EXPECT_THROW(LossScaler(LossScalerOptions{1.f, 2.f, 0.f, 10}), std::invalid_argument);
  EXPECT_THROW(LossScaler(LossScalerOptions{1.f, 2.f, 0.5f, 0}), std::invalid_argument);
  for (float m : {0.f, -1.f, NAN, INFINITY, 2048.f}) {  // min_scale: > 0, finite, <= init_scale
    LossScalerOptions o{1024.f, 2.f, 0.5f, 10};
    o.min_scale = m;
    EXPECT_THROW(LossScaler{o}, std::invalid_argument) << m;
  }
}

TEST(LossScaler, SaveLoadRoundTripAndErrors) {
  LossScaler a(LossScalerOptions{4096.f, 3.f, 0.25f, 5});
  for (bool inf : {false, false, true, false, false, false}) a.update(inf);
  std::stringstream ss;
  a.save(ss);
  const std::string bytes = ss.str();
  LossScaler b;
  b.load(ss);
  EXPECT_TRUE(a == b);
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.growth_tracker(), 3);
  EXPECT_EQ(b.options().growth_interval, 5);
  // both continue identically
  for (bool inf : {false, false, true, false}) EXPECT_EQ(a.update(inf), b.update(inf));
  EXPECT_TRUE(a == b);

  auto expect_error = [&](const std::string& data, const char* what) {
    LossScaler c;
    std::istringstream is(data);
    try {
      c.load(is);
      ADD_FAILURE() << "accepted; wanted " << what;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_TRUE(c == LossScaler{});  // unchanged
  };
  expect_error("", "truncated");
  expect_error("RPADAMW1xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "bad magic");
  expect_error(bytes.substr(0, 20), "truncated");
  std::string flip = bytes;
  flip[9] ^= 4;
  expect_error(flip, "checksum");
}

// ---- norm reduction and the step decision --------------------------------------------------

TEST(StepNormReducer, OrderIndependentAndStrict) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<double> u(0, 1e6);
  std::vector<double> parts(37);
  for (auto& x : parts) x = u(rng) * u(rng);
  rp::StepNormReducer r(37);
  std::vector<int> order(37);
  for (int i = 0; i < 37; ++i) order[size_t(i)] = i;
  double first = 0;
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t k = 0; k < order.size(); ++k)
      EXPECT_EQ(r.add(trial, order[k], parts[size_t(order[k])]), k + 1 == order.size());
    const double t = r.take(trial);
    if (trial == 0) first = t;
    EXPECT_EQ(std::bit_cast<uint64_t>(t), std::bit_cast<uint64_t>(first));
  }
  r.add(9, 0, 1.0);
  EXPECT_THROW(r.add(9, 0, 1.0), std::invalid_argument);
  EXPECT_THROW(r.add(9, 37, 1.0), std::invalid_argument);
  EXPECT_THROW(r.take(9), std::logic_error);
  EXPECT_THROW(r.take(10), std::logic_error);
}

TEST(DecideStep, ClipsToTheNormOfTheConcatenatedGradients) {
  // three groups of true gradients, written loss-scaled by 1024 and as token sums (x 500)
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  const double tokens = 500, loss_scale = 1024;
  std::vector<std::vector<float>> raw;
  long double sumsq_true = 0;
  for (int64_t n : {1000, 70000, 3}) {
    raw.emplace_back(static_cast<size_t>(n));
    for (auto& x : raw.back()) {
      const double tru = nd(rng) * 0.01;  // true gradient
      x = float(tru * tokens * loss_scale);
      const long double t = (long double)x / tokens / loss_scale;
      sumsq_true += t * t;
    }
  }
  const double norm_true = std::sqrt(double(sumsq_true));
  rp::StepNormReducer red(3);
  for (int g : {2, 0, 1})
    red.add(0, g, rp::sum_of_squares(raw[size_t(g)].data(), int64_t(raw[size_t(g)].size())));
  const double total = red.take(0);
  LossScaler scaler(LossScalerOptions{1024.f, 2.f, 0.5f, 100});
  const double max_norm = 0.5;
  const auto d = rp::decide_step(total, 1.0 / tokens, max_norm, &scaler, 1024.f);
  ASSERT_FALSE(d.skip);
  EXPECT_NEAR(d.grad_norm, norm_true, 1e-12 * norm_true);
  EXPECT_GT(norm_true, max_norm);  // the case clips
  EXPECT_NEAR(d.clip_coef, max_norm / (norm_true + 1e-6), 1e-12);
  EXPECT_NEAR(double(d.grad_scale), 1.0 / tokens / loss_scale * max_norm / (norm_true + 1e-6),
              1e-7 * double(d.grad_scale));
  // the clipped gradients have (almost exactly) max_norm
  long double clipped = 0;
  for (auto& g : raw)
    for (float x : g) clipped += (long double)(x * d.grad_scale) * (x * d.grad_scale);
  EXPECT_NEAR(std::sqrt(double(clipped)), max_norm, 1e-6);
  EXPECT_EQ(scaler.growth_tracker(), 1);

  // below max_norm: no clipping, grad_scale = 1 / (tokens * loss_scale)
  const auto e = rp::decide_step(total, 1.0 / tokens, 1e9, &scaler, 1024.f);
  EXPECT_EQ(e.clip_coef, 1.0);
  EXPECT_EQ(e.grad_scale, float(1.0 / tokens / 1024.0));
  // no clipping, no scaler
  const auto f = rp::decide_step(total, 1.0 / tokens, 0, nullptr, 1.f);
  EXPECT_EQ(f.grad_scale, float(1.0 / tokens));
  EXPECT_THROW(rp::decide_step(total, 0, 0, nullptr, 1.f), std::invalid_argument);
  EXPECT_THROW(rp::decide_step(total, 1, 0, nullptr, 2.f), std::invalid_argument);
}

TEST(DecideStep, NonFiniteSkipsAndBacksOff) {
  LossScaler s(LossScalerOptions{65536.f, 2.f, 0.5f, 2000});
  for (double bad : {double(INFINITY), double(NAN)}) {
    const float used = s.scale();
    const auto d = rp::decide_step(bad, 1e-3, 1.0, &s, used);
    EXPECT_TRUE(d.skip);
    EXPECT_EQ(d.grad_scale, 0.f);
    EXPECT_EQ(s.scale(), used * 0.5f);
  }
  const auto d = rp::decide_step(INFINITY, 1e-3, 0, nullptr, 1.f);  // detection without a scaler
  EXPECT_TRUE(d.skip);
}

// ---- the runtime's step loop, in miniature -------------------------------------------------

/// Several parameter groups updated the way the optimizer shards do it: per-group partial
/// sums of squares, reduced in group order, decide_step, then adamw_update on each group
/// (nothing at all on a skipped step). Gradients of step t are a function of t only; the
/// backward "overflows" (an inf in group 1) whenever the loss scale reaches 2^17.
struct MiniRun {
  std::vector<int64_t> sizes{1000, 200003, 17, 40000};
  AdamWOptions opt;
  double max_norm = 0.05;
  std::vector<std::vector<float>> master;
  std::vector<AdamWState> state;
  std::vector<std::vector<uint16_t>> lowp;
  LossScaler scaler{LossScalerOptions{65536.f, 2.f, 0.5f, 3}};
  int skipped = 0;

  MiniRun() {
    opt.weight_decay = 0.01;
    opt.amsgrad = true;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd;
    for (int64_t n : sizes) {
      master.emplace_back(static_cast<size_t>(n));
      for (auto& x : master.back()) x = nd(rng);
      lowp.emplace_back(static_cast<size_t>(n));
      state.emplace_back();
    }
  }

  std::vector<float> raw_grad(int64_t t, size_t g, float scale) const {
    std::mt19937 rng(uint32_t(1000 * t + g));
    std::normal_distribution<float> nd(0.f, 0.02f);
    std::vector<float> out(static_cast<size_t>(sizes[g]));
    for (auto& x : out) x = nd(rng) * 300.f * scale;  // token sum over 300 tokens, loss-scaled
    if (g == 1 && scale >= 131072.f) out[12345] = INFINITY;
    return out;
  }

  /// One step; returns the decision. `pool` may be null (one thread).
  rp::StepDecision step(int64_t t, rp::ThreadPool* pool) {
    const float used = scaler.scale();
    std::vector<std::vector<float>> grads;
    rp::StepNormReducer red(int(sizes.size()));
    for (size_t g = 0; g < sizes.size(); ++g) grads.push_back(raw_grad(t, g, used));
    for (size_t k = 0; k < sizes.size(); ++k) {  // report in a t-dependent order
      const size_t g = (k + size_t(t)) % sizes.size();
      const double s = pool ? rp::sum_of_squares(grads[g].data(), sizes[g], *pool)
                            : rp::sum_of_squares(grads[g].data(), sizes[g]);
      red.add(t, int(g), s);
    }
    const auto d = rp::decide_step(red.take(t), 1.0 / 300, max_norm, &scaler, used);
    if (d.skip) {
      ++skipped;
      return d;
    }
    const double lr = 1e-3 * (1 + 0.05 * double(t));
    for (size_t g = 0; g < sizes.size(); ++g) {
      if (pool)
        rp::adamw_update(master[g].data(), state[g], grads[g].data(), sizes[g], d.grad_scale, opt, lr,
                         lowp[g].data(), DType::f16, *pool);
      else
        rp::adamw_update(master[g].data(), state[g], grads[g].data(), sizes[g], d.grad_scale, opt, lr,
                         lowp[g].data(), DType::f16);
    }
    return d;
  }

  void expect_same(const MiniRun& o) const {
    for (size_t g = 0; g < sizes.size(); ++g) {
      ASSERT_EQ(0, std::memcmp(master[g].data(), o.master[g].data(), master[g].size() * 4)) << "group " << g;
      ASSERT_EQ(state[g].m, o.state[g].m) << "group " << g;
      ASSERT_EQ(state[g].v, o.state[g].v) << "group " << g;
      ASSERT_EQ(state[g].vmax, o.state[g].vmax) << "group " << g;
      ASSERT_EQ(state[g].step, o.state[g].step) << "group " << g;
      ASSERT_EQ(lowp[g], o.lowp[g]) << "group " << g;
    }
    ASSERT_TRUE(scaler == o.scaler);
  }
};

TEST(StepLoop, SkippedStepsChangeNothingAndScaleRecovers) {
  IsaGuard guard;
  rp::ThreadPool pool(3);
  MiniRun r;
  int skips = 0, applied = 0;
  for (int64_t t = 0; t < 12; ++t) {
    const MiniRun before = r;
    const float scale_before = r.scaler.scale();
    const auto d = r.step(t, &pool);
    if (d.skip) {
      ++skips;
      EXPECT_EQ(scale_before, 131072.f);
      EXPECT_EQ(r.scaler.scale(), 65536.f);  // backoff 0.5
      EXPECT_EQ(r.scaler.growth_tracker(), 0);
      // weights, moments, step counters and the low-precision copy are untouched
      for (size_t g = 0; g < r.sizes.size(); ++g) {
        ASSERT_EQ(0, std::memcmp(r.master[g].data(), before.master[g].data(), r.master[g].size() * 4));
        ASSERT_EQ(r.state[g].m, before.state[g].m);
        ASSERT_EQ(r.state[g].v, before.state[g].v);
        ASSERT_EQ(r.state[g].vmax, before.state[g].vmax);
        ASSERT_EQ(r.state[g].step, before.state[g].step);
        ASSERT_EQ(r.lowp[g], before.lowp[g]);
      }
    } else {
      ++applied;
      EXPECT_GT(d.grad_norm, r.max_norm);  // every applied step is clipped here
      EXPECT_NEAR(d.clip_coef, r.max_norm / (d.grad_norm + 1e-6), 1e-15);
      for (size_t g = 0; g < r.sizes.size(); ++g) EXPECT_EQ(r.state[g].step, applied);
    }
  }
  // growth interval 3 from 2^16: three clean steps, then 2^17 overflows; repeat
  EXPECT_EQ(skips, 3);
  EXPECT_EQ(applied, 9);
  EXPECT_EQ(r.scaler.steps_skipped(), 3);
}

TEST(StepLoop, ClippedUpdateMatchesReferenceOnConcatenation) {
  // The clipped step equals the textbook update of the concatenated, clipped gradients.
  MiniRun r;
  r.opt.amsgrad = false;
  std::vector<float> all_w;
  for (auto& m : r.master) all_w.insert(all_w.end(), m.begin(), m.end());
  adam_ref::Ref ref(all_w);
  for (int64_t t = 0; t < 3; ++t) {
    const float used = r.scaler.scale();
    std::vector<float> all_g;
    for (size_t g = 0; g < r.sizes.size(); ++g) {
      auto gg = r.raw_grad(t, g, used);
      all_g.insert(all_g.end(), gg.begin(), gg.end());
    }
    // torch clip_grad_norm_ on the concatenation, in long double
    long double ss = 0;
    for (float x : all_g) ss += (long double)x * x;
    const double unscale = 1.0 / 300 / double(used);
    const double norm = std::sqrt(double(ss)) * unscale;
    const double coef = std::min(1.0, r.max_norm / (norm + 1e-6));
    const auto d = r.step(t, nullptr);
    ASSERT_FALSE(d.skip);
    EXPECT_NEAR(d.grad_norm, norm, 1e-12 * norm);
    ref.step(all_g.data(), unscale * coef, r.opt, 1e-3 * (1 + 0.05 * double(t)));
    std::vector<float> w;
    rp::AdamWState st;
    st.step = r.state[0].step;
    for (size_t g = 0; g < r.sizes.size(); ++g) {
      w.insert(w.end(), r.master[g].begin(), r.master[g].end());
      st.m.insert(st.m.end(), r.state[g].m.begin(), r.state[g].m.end());
      st.v.insert(st.v.end(), r.state[g].v.begin(), r.state[g].v.end());
    }
    ASSERT_EQ(adam_ref::compare(w.data(), st, ref, r.opt), "") << "step " << t;
  }
}

TEST(StepLoop, ResumeAtStepKIsBitIdenticalAcrossPathsAndPools) {
  IsaGuard guard;
  rp::ThreadPool p3(3), p2(rp::ThreadPool::Options{2, rp::allowed_cpus()});
  const int64_t T = 14;
  for (int64_t k : {1, 3, 7}) {  // 3: right after a skipped step; 7: mid growth window
    rp::set_adamw_isa(rp::best_isa());
    MiniRun full;
    for (int64_t t = 0; t < T; ++t) full.step(t, &p3);

    MiniRun first;
    for (int64_t t = 0; t < k; ++t) first.step(t, &p3);
    // checkpoint: AdamW state with its hyper-parameters, the loss scaler, the fp32 masters
    std::stringstream ck;
    for (auto& s : first.state) rp::save_state(ck, s, &first.opt);
    first.scaler.save(ck);
    for (auto& m : first.master)
      ck.write(reinterpret_cast<const char*>(m.data()), std::streamsize(m.size() * 4));

    MiniRun resumed;               // fresh objects; different ISA and pool
    resumed.opt = AdamWOptions{};  // must come back from the checkpoint
    for (size_t g = 0; g < resumed.sizes.size(); ++g) {
      bool has = false;
      rp::load_state(ck, resumed.state[g], resumed.sizes[g], &resumed.opt, &has);
      ASSERT_TRUE(has);
    }
    resumed.scaler.load(ck);
    for (auto& m : resumed.master) ck.read(reinterpret_cast<char*>(m.data()), std::streamsize(m.size() * 4));
    ASSERT_TRUE(bool(ck));
    EXPECT_EQ(resumed.opt.weight_decay, 0.01);
    EXPECT_TRUE(resumed.opt.amsgrad);
    rp::set_adamw_isa(Isa::scalar);
    for (int64_t t = k; t < T; ++t) resumed.step(t, &p2);
    full.expect_same(resumed);
    if (HasFatalFailure()) return;
  }
}

TEST(StateIO, HyperParametersRoundTripAndOldFilesStillLoad) {
  AdamWOptions o;
  o.lr = 3e-4;
  o.beta1 = 0.85;
  o.beta2 = 0.97;
  o.eps = 1e-6;
  o.weight_decay = 0.2;
  o.decoupled = false;
  o.amsgrad = true;
  o.maximize = true;
  std::vector<float> w(50, 1.f), g(50, 0.5f);
  AdamWState st;
  rp::adamw_update(w.data(), st, g.data(), 50, 1.f, o, 1e-3);
  std::stringstream a, b;
  rp::save_state(a, st, &o);
  rp::save_state(b, st);  // no hyper-parameters: the format of before
  AdamWOptions back;
  bool has = false;
  AdamWState s1;
  rp::load_state(a, s1, 50, &back, &has);
  EXPECT_TRUE(has);
  EXPECT_EQ(back.lr, o.lr);
  EXPECT_EQ(back.beta1, o.beta1);
  EXPECT_EQ(back.beta2, o.beta2);
  EXPECT_EQ(back.eps, o.eps);
  EXPECT_EQ(back.weight_decay, o.weight_decay);
  EXPECT_EQ(back.decoupled, o.decoupled);
  EXPECT_EQ(back.amsgrad, o.amsgrad);
  EXPECT_EQ(back.maximize, o.maximize);
  EXPECT_EQ(s1.m, st.m);
  AdamWOptions untouched;
  untouched.lr = 42;
  AdamWState s2;
  rp::load_state(b, s2, 50, &untouched, &has);
  EXPECT_FALSE(has);
  EXPECT_EQ(untouched.lr, 42);
  EXPECT_EQ(s2.vmax, st.vmax);
  // a flipped hyper-parameter byte fails the checksum
  std::string bytes = a.str();
  bytes[8 + 4 + 4 + 8 + 8 + 3] ^= 1;
  std::istringstream is(bytes);
  AdamWState s3;
  EXPECT_THROW(rp::load_state(is, s3, 50), std::runtime_error);
}

}  // namespace
