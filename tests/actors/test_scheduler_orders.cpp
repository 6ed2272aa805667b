// The scheduler's two-phase deal (actors/scheduler_actor.hpp), driven message by message on
// CAF's deterministic test coordinator: the real scheduler and its pass filler, typed fake
// workers and optimizer shards playing the other side of the scheduler's interface, and the
// delivery order picked by a seeded policy (random, the filler only when nothing else can run,
// the filler first, newest first). In every order:
//  - a stage task (RunStage) arrives only once its pass's ids, targets, positions, per
//    micro-batch target tokens and rope lengths are in its slot's buffers, and they are still
//    there when the task finishes (no later pass refilled the slot under it);
//  - each worker receives its tasks in dealing order;
//  - every step and evaluation completes with the loss its passes reported; no mailbox keeps a
//    message; after Shutdown no actor is left, the filler included.
// And the failure paths: a Failure or a Shutdown between a deal and its fill deals nothing
// more; a fill that fails fails the run naming the pass; a training pass without its
// target-token count fails the run.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <fmt/format.h>

#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/messages.hpp"
#include "actors/scheduler_actor.hpp"
#include "model/layout.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

constexpr int64_t kMicro = 2;
const MicroBatchShape kShape{1, 6};

/// The data of the k-th pass submitted (= its pass number: passes are dealt first come, first
/// served). Odd passes are packed (positions restart within the sequence).
struct PassData {
  std::vector<int32_t> ids, targets, positions;
};
PassData pass_data(int64_t k) {
  PassData d;
  const int64_t n = kMicro * kShape.tokens();
  for (int64_t i = 0; i < n; ++i) {
    d.ids.push_back(int32_t(1000 * (k + 1) + i));
    d.targets.push_back((i + k) % 3 == 0 ? -100 : int32_t(7 * k + i));
    if (k % 2 == 1) d.positions.push_back(int32_t((i % kShape.seq_len) % (2 + k % 3)));
  }
  return d;
}

struct Record {
  std::vector<std::string> violations;
  std::set<int64_t> passes_received;    ///< passes any worker got a RunStage of
  std::map<int64_t, StepResult> steps;  ///< WaitStep answers
  std::map<int64_t, EvalResult> evals;  ///< WaitEval answers
  int64_t stage_done = 0;
  void violate(std::string s) { violations.push_back(std::move(s)); }
};

/// Whether pass `rs.pass`'s data is in `rs.buffers`; empty when it is, else what differs.
std::string check_filled(const RunStage& rs) {
  const PassData d = pass_data(rs.pass);
  const PassBuffers& pb = *rs.buffers;
  const int64_t T = kShape.tokens();
  for (int64_t m = 0; m < kMicro; ++m) {
    const int32_t* ids = pb.ids[size_t(m)].as<int32_t>();
    const int32_t* tg = pb.targets[size_t(m)].as<int32_t>();
    float count = 0;
    for (int64_t i = 0; i < T; ++i) {
      if (ids[i] != d.ids[size_t(m * T + i)]) return fmt::format("ids[{}][{}] = {}", m, i, ids[i]);
      if (tg[i] != d.targets[size_t(m * T + i)]) return fmt::format("targets[{}][{}] = {}", m, i, tg[i]);
      count += d.targets[size_t(m * T + i)] >= 0;
    }
    if (pb.target_tokens[size_t(m)] != count)
      return fmt::format("target_tokens[{}] = {} (want {})", m, pb.target_tokens[size_t(m)], count);
    if (rs.packed != !d.positions.empty()) return "packed flag";
    if (rs.packed) {
      const int32_t* pos = pb.positions[size_t(m)].as<int32_t>();
      int32_t top = 0;
      for (int64_t i = 0; i < T; ++i) {
        if (pos[i] != d.positions[size_t(m * T + i)]) return fmt::format("positions[{}][{}]", m, i);
        top = std::max(top, pos[i]);
      }
      if (pb.rope_length[size_t(m)] != top + 1) return fmt::format("rope_length[{}]", m);
    }
  }
  return {};
}

struct FakeWorkerState {
  std::deque<RunStage> tasks;
  int64_t last_pass = -1;
  int last_stage = -1;
};

/// Runs its tasks one at a time: a task ends one message later (ComputeDone to itself), so other
/// actors run in between. The tail reports the sum of the ids as its loss and the target
/// tokens as its count, read from the buffers.
WorkerActor::behavior_type fake_worker(WorkerActor::stateful_pointer<FakeWorkerState> self, Record* rec,
                                       int index, SchedulerActor scheduler) {
  return {
      [=](RunStage& rs) {
        auto& st = self->state;
        rec->passes_received.insert(rs.pass);
        if (std::string bad = check_filled(rs); !bad.empty())
          rec->violate(fmt::format("worker {}: RunStage of pass {} stage {} before its fill: {}", index,
                                   rs.pass, rs.stage_index, bad));
        if (rs.pass < st.last_pass || (rs.pass == st.last_pass && rs.stage_index <= st.last_stage))
          rec->violate(fmt::format("worker {}: pass {} stage {} after pass {} stage {}", index, rs.pass,
                                   rs.stage_index, st.last_pass, st.last_stage));
        st.last_pass = rs.pass;
        st.last_stage = rs.stage_index;
        st.tasks.push_back(std::move(rs));
        self->send(self, ComputeDone{uint64_t(st.tasks.back().pass), 0, {}});
      },
      [=](ActReady&) {},
      [=](CopyDone&) {},
      [=](FrozenFetched&) {},
      [=](SpillDone&) {},
      [=](GradsFinal&) {},
      [=](ComputeDone&) {
        auto& st = self->state;
        RunStage rs = std::move(st.tasks.front());
        st.tasks.pop_front();
        if (std::string bad = check_filled(rs); !bad.empty())
          rec->violate(fmt::format("worker {}: pass {}'s slot was refilled while its stage {} ran: {}", index,
                                   rs.pass, rs.stage_index, bad));
        StageDone sd;
        sd.pass = rs.pass;
        sd.stage_index = rs.stage_index;
        sd.worker = index;
        if (rs.stage.kind == StageKind::tail)
          for (int64_t m = 0; m < kMicro; ++m) {
            for (int64_t i = 0; i < kShape.tokens(); ++i)
              sd.loss_sum += rs.buffers->ids[size_t(m)].as<int32_t>()[i];
            sd.loss_count += rs.buffers->target_tokens[size_t(m)];
          }
        rec->stage_done++;
        self->send(scheduler, std::move(sd));
      },
      [=](GetStatus) -> StatusReport { return {fmt::format("fake worker {}", index)}; },
      [=](Shutdown) { self->quit(); },
  };
}

/// Reports every owned group updated as soon as a step is closed.
ShardActor::behavior_type fake_shard(ShardActor::pointer self, std::vector<int> groups,
                                     SchedulerActor scheduler) {
  return {
      [=](AcquireWeights& a) -> WeightsGranted {
        return {a.group, a.step};
      },
      [=](ReleaseWeights&) {},
      [=](AcquireGradSlot& a) -> GradGrant {
        return {a.group, a.step, false};
      },
      [=](GradWritten&) {},
      [=](CloseStep& c) {
        for (int g : groups) self->send(scheduler, GroupUpdated{c.step, g, 0.0});
      },
      [=](StepScale&) {},
      [=](JobDone&) {},
      [=](ResumeAt&) -> Ack { return {}; },
      [=](GetStatus) -> StatusReport { return {"fake shard"}; },
      [=](Shutdown) { self->quit(); },
  };
}

/// Asks for every step's and evaluation's result at its start, records the answers and ends
/// with the last one.
caf::behavior waiter(caf::event_based_actor* self, Record* rec, SchedulerActor scheduler, int64_t steps,
                     int64_t evals) {
  auto left = std::make_shared<int64_t>(steps + evals);
  auto answered = [self, left] {
    if (--*left == 0) self->quit();
  };
  for (int64_t t = 0; t < steps; ++t)
    self->request(scheduler, caf::infinite, WaitStep{t})
        .then(
            [=](StepResult& r) {
              rec->steps[t] = r;
              answered();
            },
            [=](caf::error& e) {
              rec->steps[t].error = "no answer: " + error_text(e);
              answered();
            });
  for (int64_t e = 0; e < evals; ++e)
    self->request(scheduler, caf::infinite, WaitEval{e})
        .then(
            [=](EvalResult& r) {
              rec->evals[e] = r;
              answered();
            },
            [=](caf::error& x) {
              rec->evals[e].error = "no answer: " + error_text(x);
              answered();
            });
  return {[](int) {}};
}

enum class Policy { random, filler_last, filler_first, lifo };

/// One actor system on the test coordinator with the scheduler, 3 fake workers, 2 fake shards.
class Rig {
 public:
  static constexpr int kWorkers = 3;
  static constexpr int64_t kSteps = 4;

  explicit Rig(int pass_slots = 2) : layout_(make_layout(tiny_config(false, true))) {
    cfg_.set("scheduler.policy", caf::atom("testing"));
    cfg_.set("logger.file-verbosity", caf::atom("quiet"));
    cfg_.set("logger.console", caf::atom("none"));
    register_protocol(cfg_);
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    sys_->await_actors_before_shutdown(false);
    sched_ = &dynamic_cast<caf::scheduler::test_coordinator&>(sys_->scheduler());
    sched_->run();
    base_running_ = sys_->registry().running();
    plan_ = make_uniform_plan(layout_.num_layers(), 2, 2);
    SchedulerConfig sc;
    sc.plan = plan_;
    sc.num_groups = int(layout_.groups.size());
    sc.layout = &layout_;
    for (int s = 0; s < pass_slots; ++s)
      sc.pass_slots.push_back(std::make_shared<PassBuffers>(layout_, plan_, kMicro, kShape, DType::f32));
    sc.detached_filler = false;
    scheduler_ = spawn_scheduler(*sys_, std::move(sc));
    role_[resumable(scheduler_)] = 0;
    std::vector<WorkerActor> workers;
    for (int w = 0; w < kWorkers; ++w) {
      workers.push_back(sys_->spawn(fake_worker, &rec_, w, scheduler_));
      role_[resumable(workers.back())] = 1;
    }
    std::vector<ShardActor> shards;
    for (int s = 0; s < 2; ++s) {
      std::vector<int> owned;
      for (int g = s; g < int(layout_.groups.size()); g += 2) owned.push_back(g);
      shards.push_back(sys_->spawn(fake_shard, owned, scheduler_));
      role_[resumable(shards.back())] = 2;
    }
    caf::anon_send(scheduler_, SetPeers{workers, shards});
    sched_->run();
  }
  ~Rig() {
    scheduler_ = nullptr;
    sys_.reset();
  }

  Record& record() { return rec_; }
  SchedulerActor scheduler() const { return scheduler_; }
  caf::scheduler::test_coordinator& coordinator() { return *sched_; }

  /// Pass k of `step` (evaluation id `eval`, or a training pass).
  void submit(int64_t k, int64_t step, int64_t eval = -1, bool count = true) {
    PassData d = pass_data(k);
    SubmitPass sp;
    sp.step = step;
    sp.eval = eval;
    double tokens = 0;
    for (int32_t t : d.targets) tokens += t >= 0;
    if (count) sp.target_tokens = tokens;
    if (eval < 0) {
      want_[step].loss_sum += sum_ids(d);
      want_[step].tokens += tokens;
    } else {
      want_eval_[eval] = {eval, sum_ids(d), tokens, {}};
    }
    sp.ids = std::make_shared<const std::vector<int32_t>>(d.ids);
    sp.targets = std::make_shared<const std::vector<int32_t>>(d.targets);
    if (!d.positions.empty()) sp.positions = std::make_shared<const std::vector<int32_t>>(d.positions);
    caf::anon_send(scheduler_, std::move(sp));
  }
  void close(int64_t step) { caf::anon_send(scheduler_, CloseStepRequest{step, 1e-3}); }
  void spawn_waiter(int64_t steps, int64_t evals) {
    role_[resumable(sys_->spawn(waiter, &rec_, scheduler_, steps, evals))] = 3;
  }

  /// Whether the filler (the one actor the rig did not spawn) has a message waiting.
  bool filler_pending() {
    for (auto* j : sched_->jobs)
      if (!role_.count(j)) return true;
    return false;
  }
  /// Runs one job picked by `policy`; false when there is none.
  bool step_once(Policy policy, std::mt19937_64& rng) {
    auto& jobs = sched_->jobs;
    if (jobs.empty()) return false;
    const size_t n = jobs.size();
    size_t idx = 0;
    auto pick = [&](bool want_filler) {
      std::vector<size_t> c;
      for (size_t i = 0; i < n; ++i)
        if (!role_.count(jobs[i]) == want_filler) c.push_back(i);
      return c.empty() ? size_t(rng() % n) : c[rng() % c.size()];
    };
    switch (policy) {
      case Policy::random: idx = size_t(rng() % n); break;
      case Policy::filler_last: idx = pick(false); break;
      case Policy::filler_first: idx = pick(true); break;
      case Policy::lifo: idx = n - 1; break;
    }
    if (idx != 0) std::rotate(jobs.begin(), jobs.begin() + idx, jobs.begin() + idx + 1);
    sched_->run_once();
    return true;
  }
  /// A run of kSteps steps, each two training passes and (every other step) an evaluation
  /// pass, submitted and closed in a Session's order at moments the seed picks.
  void run(Policy policy, uint64_t seed) {
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 3);
    std::vector<std::function<void()>> events;
    int64_t k = 0, evals = 0;
    for (int64_t t = 0; t < kSteps; ++t) {
      events.push_back([this, k = k++, t] { submit(k, t); });
      if (t % 2 == 1) events.push_back([this, k = k++, t, e = evals++] { submit(k, t, e); });
      events.push_back([this, k = k++, t] { submit(k, t); });
      events.push_back([this, t] { close(t); });
    }
    spawn_waiter(kSteps, evals);
    size_t next = 0;
    for (int64_t guard = 0; guard < 100000; ++guard) {
      const bool idle = sched_->jobs.empty();
      if (next < events.size() && (idle || rng() % 4 == 0)) {
        events[next++]();
        continue;
      }
      if (!step_once(policy, rng)) break;
    }
  }
  /// Every step and evaluation answered with the loss its passes reported.
  void expect_results() {
    for (int64_t t = 0; t < kSteps; ++t) {
      ASSERT_TRUE(rec_.steps.count(t)) << "step " << t << " never answered";
      const StepResult& r = rec_.steps.at(t);
      EXPECT_EQ(r.error, "") << "step " << t;
      EXPECT_EQ(r.loss_sum, want_[t].loss_sum) << "step " << t;
      EXPECT_EQ(r.tokens, want_[t].tokens) << "step " << t;
    }
    for (auto& [e, w] : want_eval_) {
      ASSERT_TRUE(rec_.evals.count(e)) << "evaluation " << e << " never answered";
      EXPECT_EQ(rec_.evals.at(e).error, "");
      EXPECT_EQ(rec_.evals.at(e).loss_sum, w.loss_sum) << "evaluation " << e;
    }
  }
  bool mailboxes_empty() { return sched_->jobs.empty(); }
  /// Shutdown through the scheduler; true when every actor (the filler too) is gone.
  bool shut_down() {
    caf::anon_send(scheduler_, Shutdown{});
    sched_->run();
    return sys_->registry().running() == base_running_;
  }

 private:
  template <class Handle>
  static caf::resumable* resumable(const Handle& h) {
    return dynamic_cast<caf::resumable*>(caf::actor_cast<caf::abstract_actor*>(h));
  }
  static double sum_ids(const PassData& d) {
    double s = 0;
    for (int32_t x : d.ids) s += x;
    return s;
  }

  ModelLayout layout_;
  IterationPlan plan_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  caf::scheduler::test_coordinator* sched_ = nullptr;
  size_t base_running_ = 0;
  SchedulerActor scheduler_;
  std::unordered_map<caf::resumable*, int> role_;
  Record rec_;
  std::map<int64_t, StepResult> want_;
  std::map<int64_t, EvalResult> want_eval_;
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 6; ++i) s += "\n  " + v[i];
  return s;
}

class SchedulerOrders : public ::testing::TestWithParam<std::tuple<Policy, int>> {};

TEST_P(SchedulerOrders, StagesSeeFilledBuffersInDealingOrder) {
  const auto [policy, slots] = GetParam();
  for (uint64_t seed = 0; seed < 12; ++seed) {
    Rig rig(slots);
    rig.run(policy, seed);
    EXPECT_TRUE(rig.record().violations.empty()) << "seed " << seed << joined(rig.record().violations);
    rig.expect_results();
    EXPECT_TRUE(rig.mailboxes_empty());
    EXPECT_TRUE(rig.shut_down()) << "seed " << seed << ": actors left after Shutdown";
    if (HasFailure()) break;
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, SchedulerOrders,
                         ::testing::Combine(::testing::Values(Policy::random, Policy::filler_last,
                                                              Policy::filler_first, Policy::lifo),
                                            ::testing::Values(1, 2)));

/// Runs the rig until the filler has a FillPass waiting (the first pass dealt); false if never.
bool until_fill_pending(Rig& rig) {
  std::mt19937_64 rng(1);
  while (!rig.filler_pending())
    if (!rig.step_once(Policy::filler_last, rng)) return false;
  return true;
}

TEST(SchedulerDeal, AFailureBetweenDealAndFillDealsNothingMore) {
  Rig rig;
  rig.spawn_waiter(1, 0);
  rig.submit(0, 0);
  rig.submit(1, 0);
  rig.close(0);
  ASSERT_TRUE(until_fill_pending(rig));
  caf::anon_send(rig.scheduler(), Failure{"worker 2: injected"});
  // the scheduler hears of the failure before the filler answers
  std::mt19937_64 rng(2);
  while (rig.step_once(Policy::filler_last, rng)) {}
  EXPECT_TRUE(rig.record().passes_received.empty()) << "a pass was dealt after the run failed";
  ASSERT_TRUE(rig.record().steps.count(0));
  EXPECT_EQ(rig.record().steps.at(0).error, "worker 2: injected");
  EXPECT_TRUE(rig.shut_down());
}

TEST(SchedulerDeal, AShutdownDuringAFillLeavesNoActorBehind) {
  Rig rig;
  rig.submit(0, 0);
  ASSERT_TRUE(until_fill_pending(rig));
  EXPECT_TRUE(rig.shut_down()) << "the filler or a peer outlived the scheduler";
  EXPECT_TRUE(rig.record().passes_received.empty());
}

TEST(SchedulerDeal, AFillThatFailsFailsTheRunNamingThePass) {
  Rig rig;
  rig.spawn_waiter(1, 0);
  SubmitPass sp;  // one micro-batch short of the slot
  sp.step = 0;
  sp.target_tokens = 1;
  sp.ids = std::make_shared<const std::vector<int32_t>>(size_t(kShape.tokens()), 5);
  sp.targets = sp.ids;
  caf::anon_send(rig.scheduler(), std::move(sp));
  rig.close(0);
  rig.coordinator().run();
  ASSERT_TRUE(rig.record().steps.count(0));
  const std::string& e = rig.record().steps.at(0).error;
  EXPECT_NE(e.find("pass 0"), std::string::npos) << e;
  EXPECT_NE(e.find("ids"), std::string::npos) << e;
  EXPECT_TRUE(rig.record().passes_received.empty());
  EXPECT_TRUE(rig.shut_down());
}

TEST(SchedulerDeal, ATrainingPassWithoutItsTokenCountFailsTheRun) {
  Rig rig;
  rig.spawn_waiter(1, 0);
  rig.submit(0, 0, -1, /*count=*/false);
  rig.close(0);
  rig.coordinator().run();
  ASSERT_TRUE(rig.record().steps.count(0));
  EXPECT_NE(rig.record().steps.at(0).error.find("target token count"), std::string::npos)
      << rig.record().steps.at(0).error;
  EXPECT_TRUE(rig.shut_down());
}

TEST(FillPassBuffers, RefusesDataOfAnotherShape) {
  ModelLayout m = make_layout(tiny_config(false, true));
  IterationPlan p = make_uniform_plan(m.num_layers(), 2, 2);
  PassBuffers pb(m, p, kMicro, kShape, DType::f32);
  SubmitPass sp;
  sp.ids = std::make_shared<const std::vector<int32_t>>(size_t(kMicro * kShape.tokens()), 1);
  sp.targets = std::make_shared<const std::vector<int32_t>>(size_t(kMicro * kShape.tokens() + 1), 1);
  EXPECT_THROW(fill_pass_buffers(pb, sp), std::invalid_argument);
  sp.targets = sp.ids;
  sp.positions = std::make_shared<const std::vector<int32_t>>(size_t(3), 0);
  EXPECT_THROW(fill_pass_buffers(pb, sp), std::invalid_argument);
}

}  // namespace
}  // namespace rp::test
