// Test support: the per-layer protocol (as message ordering; docs/protocol.md) driven
// through the real optimizer shard actors on CAF's
// deterministic test coordinator, in chosen message delivery orders.
//
// The real shards (actors/optimizer_shard.cpp) are spawned cooperatively scheduled
// (ShardOptions::detached = false) next to fake workers and fake copy actors written here and
// a typed scheduler whose bookkeeping is the runtime's StepLedger, which play the other side
// of the protocol for a small pipeline
// (3 workers, 5 parameter groups, 4 micro-batches per pass, one pass per step, 3 steps):
//   worker:  AcquireWeights -> upload (param copy actor reads the host low-precision
//            copy, half in one job and half in a later one) -> ReleaseWeights; waits for
//            ActReady per micro-batch; after the last micro-batch AcquireGradSlot ->
//            gradient write (grad copy actor, also in two halves) -> GradWritten -> StageDone.
//   scheduler: takes the driver's SubmitPass and CloseStepRequest (at moments the driver
//            chooses) to the ledger, deals the passes' stages round-robin when it says
//            (pointer carried across passes; two pass slots), closes steps (CloseStep with
//            the ledger's totals, gradient scale and learning rate), feeds it StageDone and
//            GroupUpdated; every step must end done by the ledger.
// The gradient a stage writes is a deterministic function of the weights its upload
// actually read, so reading a wrong version also changes the final weights.
//
// A Monitor observes every read and write of the host buffers with versions (a version
// is recognised by content: the reference run gives the exact bytes of every version,
// and they are checked to be pairwise distinct) and, after every job the coordinator
// runs, diffs the low-precision copies (publishes) and the AdamW step counters (updates).
// It records a Violation for every broken rule. The driver picks which actor runs next.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <fmt/format.h>

#include "actors/messages.hpp"
#include "actors/optimizer_shard.hpp"
#include "actors/pass_buffers.hpp"
#include "kernels/dtype.hpp"
#include "optimizer/adamw.hpp"
#include "scheduler/step_ledger.hpp"
#include "tests/actors/runtime_reference.hpp"

// ---- messages private to the harness -------------------------------------------------
namespace rp::test::proto {
struct RunTask {  // fake scheduler -> fake worker
  int64_t pass = 0;
  int stage = 0;
  caf::actor next;    ///< worker of stage + 1, null for the last stage
  int64_t step = -1;  ///< the step the pass belongs to (-1: step = pass, a training pass)
  bool eval = false;  ///< an evaluation pass: forward stages and the tail, weights read, no gradient
};
struct CopyParam {  // worker -> its param copy actor
  int group = 0;
  int64_t iter = 0;
  uint64_t token = 0;
  caf::actor reply_to;
};
struct CopyGrad {  // worker -> its grad copy actor
  int group = 0;
  int64_t step = 0;
  bool overwrite = false;
  std::shared_ptr<const std::vector<float>> data;
  uint64_t token = 0;
  caf::actor reply_to;
};
struct CopyHalf {
  uint64_t id = 0;
};                // copy actor -> itself: do the second half
struct CopyAck {  // copy actor -> worker
  uint64_t token = 0;
  std::shared_ptr<const std::vector<uint16_t>> read;  ///< uploads: the bytes read
};
struct Computed {
  int64_t pass = 0;
  int stage = 0;
  int64_t mb = 0;
};  // worker -> itself
}  // namespace rp::test::proto

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::test::proto::RunTask)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::test::proto::CopyParam)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::test::proto::CopyGrad)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::test::proto::CopyHalf)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::test::proto::CopyAck)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::test::proto::Computed)

namespace rp::test::proto {

// ---- ShardOptions fields added by the patch in docs/protocol.md ----------------------
// Detected at compile time so this file builds before and after the patch; without it
// the shard is detached (runs on a private thread the coordinator cannot order) and the
// tests skip.
template <class O>
auto set_cooperative(O& o, int) -> decltype(o.detached = false, true) {
  o.detached = false;
  return true;
}
template <class O>
bool set_cooperative(O&, long) {
  return false;
}
template <class O>
auto set_disable_rule(O& o, int r, int) -> decltype(o.disable_rule = r, true) {
  o.disable_rule = r;
  return true;
}
template <class O>
bool set_disable_rule(O&, int r, long) {
  return r == 0;
}

inline bool shard_is_testable() {
  ShardOptions o;
  return set_cooperative(o, 0);
}
inline bool shard_has_guard_switch() {
  ShardOptions o;
  return set_disable_rule(o, 1, 0);
}

// ---- the pipeline ----------------------------------------------------------------------
struct StageSpec {
  bool backward = false;    ///< tail and backward stages produce gradients of their groups
  std::vector<int> groups;  ///< groups read (uploaded) and, if backward, written
};

struct Pipeline {
  int workers = 3;
  int groups = 5;
  int64_t micro_batches = 4;
  int iterations = 3;  ///< one pass per step: pass t = iteration t = step t
  int staleness = 1;
  int64_t numel = 16;
  int shards = 2;
  /// Evaluation passes per step (Session::evaluate): each runs the stages up to the tail
  /// forward only (uploads, no gradient) and is dealt before its step closes.
  int evals_per_step = 0;
  // F(0,1) F(2,3) T(4 + tied 0) B(2,3) B(0,1): group 0 is read by three stages of a pass
  // and gets two gradient contributions (overwrite, then accumulate). With 5 stages on 3
  // workers, stage s of pass t runs on the worker right after stage s+2 of pass t-1.
  std::vector<StageSpec> stages = {
      {false, {0, 1}}, {false, {2, 3}}, {true, {4, 0}}, {true, {2, 3}}, {true, {0, 1}}};

  /// The same 5 groups in 3 stages F(0-3) T(4 + tied 0) B(0-3): one stage per worker, so
  /// pass t+1 runs entirely alongside pass t (more overlap between steps).
  static Pipeline coarse(int staleness) {
    Pipeline p;
    p.staleness = staleness;
    p.stages = {{false, {0, 1, 2, 3}}, {true, {4, 0}}, {true, {0, 1, 2, 3}}};
    return p;
  }
  static Pipeline fine(int staleness) {
    Pipeline p;
    p.staleness = staleness;
    return p;
  }

  int shard_of(int g) const { return g % shards; }
  int uploads_per_pass(int g) const {
    int n = 0;
    for (auto& s : stages) n += std::count(s.groups.begin(), s.groups.end(), g) > 0;
    return n;
  }
  /// Stages of an evaluation pass: the forward stages and the tail (the first backward one).
  int eval_stages() const {
    int n = 0;
    while (n < int(stages.size()) && !stages[size_t(n)].backward) ++n;
    return n + 1;
  }
  int eval_uploads(int g) const {
    int n = 0;
    for (int s = 0; s < eval_stages(); ++s)
      n += std::count(stages[s].groups.begin(), stages[s].groups.end(), g) > 0;
    return n;
  }
  /// Uploads of group g per step: the training pass and the evaluation passes.
  int uploads_per_step(int g) const { return uploads_per_pass(g) + evals_per_step * eval_uploads(g); }
  /// Pass number of evaluation pass e of step t (after every training pass number).
  int64_t eval_pass(int64_t t, int e) const { return iterations + t * evals_per_step + e; }
  int grads_per_pass(int g) const {
    int n = 0;
    for (auto& s : stages) n += s.backward && std::count(s.groups.begin(), s.groups.end(), g) > 0;
    return n;
  }
  /// Weights version iteration t computes with (version k = after step k, -1 = initial).
  int64_t version_for(int64_t t) const { return std::max<int64_t>(t - 1 - staleness, -1); }
  /// Worker of stage s of pass p: round-robin with the pointer carried across passes.
  int worker_of(int64_t pass, int s) const { return int((pass * int64_t(stages.size()) + s) % workers); }
  /// 1 / the step's target tokens (8 + k), rounded as the step ledger does.
  float grad_scale(int64_t k) const { return float(1.0 / double(8 + k)); }
  double lr(int64_t k) const { return 0.05 * (1.0 + 0.5 * double(k)); }
  AdamWOptions adam() const { return adam_opts(); }  // the runtime tests' settings
};

/// The gradient stage `stage` of step `step` writes for group `g`, from the bf16 weights
/// its upload read.
inline std::vector<float> contribution(const std::vector<uint16_t>& read, int64_t step, int stage, int g) {
  std::vector<float> c(read.size());
  for (size_t i = 0; i < c.size(); ++i)
    c[i] = 0.5f * bf16_to_f32(read[i]) +
           0.01f * float(int((step * 7 + stage * 3 + g * 5 + int64_t(i)) % 11) - 5);
  return c;
}

inline std::vector<std::vector<float>> initial_weights(const Pipeline& p) {
  std::mt19937_64 rng(12345);
  std::normal_distribution<float> nd(0.f, 0.5f);
  std::vector<std::vector<float>> w(p.groups, std::vector<float>(p.numel));
  for (auto& v : w)
    for (auto& x : v) x = nd(rng);
  return w;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& w) {
  std::vector<uint16_t> out(w.size());
  cast_f32_to(w.data(), out.data(), int64_t(w.size()), DType::bf16);
  return out;
}

/// The sequential loop the actors must reproduce bit for bit: step k's gradient is taken
/// at the weights of version max(k-1-s, -1), then the same rp::adamw_update runs.
struct Reference {
  /// [k+1][g]: fp32 weights and bf16 copy of version k (index 0 = initial, version -1)
  std::vector<std::vector<std::vector<float>>> master;
  std::vector<std::vector<std::vector<uint16_t>>> lowp;
  std::vector<AdamWState> state;  ///< after the last step

  explicit Reference(const Pipeline& p) {
    auto w = initial_weights(p);
    state.assign(p.groups, AdamWState{});
    master.push_back(w);
    lowp.emplace_back();
    for (auto& v : w) lowp.back().push_back(to_bf16(v));
    for (int k = 0; k < p.iterations; ++k) {
      const auto& read = lowp[size_t(p.version_for(k) + 1)];
      for (int g = 0; g < p.groups; ++g) {
        std::vector<float> grad;
        for (size_t s = 0; s < p.stages.size(); ++s) {
          auto& st = p.stages[s];
          if (!st.backward || !std::count(st.groups.begin(), st.groups.end(), g)) continue;
          auto c = contribution(read[g], k, int(s), g);
          if (grad.empty()) {
            grad = c;
          } else {
            for (size_t i = 0; i < c.size(); ++i) grad[i] += c[i];
          }
        }
        adamw_update(w[g].data(), state[g], grad.data(), p.numel, p.grad_scale(k), p.adam(), p.lr(k));
      }
      master.push_back(w);
      lowp.emplace_back();
      for (auto& v : w) lowp.back().push_back(to_bf16(v));
    }
  }

  /// Version (-1..) whose bf16 elements [lo, hi) of group g equal `x`, or -2.
  int64_t version_of(int g, const uint16_t* x, size_t lo, size_t hi) const {
    for (size_t k = 0; k < lowp.size(); ++k)
      if (std::memcmp(lowp[k][g].data() + lo, x + lo, (hi - lo) * 2) == 0) return int64_t(k) - 1;
    return -2;
  }
};

// ---- the monitor -------------------------------------------------------------------
struct Violation {
  int rule = 0;  ///< 1..5 as in docs/protocol.md; 0 = completion, leftovers, numerics
  std::string what;
};

class Monitor {
 public:
  Monitor(const Pipeline& p, const Reference& ref, ParamStore& store, std::vector<std::vector<float>>& master,
          std::vector<AdamWState>& adam)
      : p_(p), ref_(ref), store_(store), master_(master), adam_(adam), g_(p.groups) {
    for (int g = 0; g < p.groups; ++g) {
      g_[g].last_lowp = lowp_vec(g);
      g_[g].uploads_done.assign(p.iterations, 0);
    }
    closed_at_shard_.assign(p.shards, std::vector<char>(p.iterations, 0));
    grads_seen_by_shard_.assign(p.groups, std::vector<int>(p.iterations, 0));
  }

  void violate(int rule, std::string what) {
    if (violations.size() < 64) violations.push_back({rule, std::move(what)});
  }
  bool violated(int rule) const {
    for (auto& v : violations)
      if (v.rule == rule) return true;
    return false;
  }

  const uint16_t* lowp(int g) const { return store_.lowp[g].as<uint16_t>(); }
  float* grad_slot(int g) const { return store_.grad[g].as<float>(); }
  size_t half() const { return size_t(p_.numel / 2); }

  // -- uploads (param copy actor): first half read in one job, second half in a later one
  void upload_begin(int g, int64_t iter, std::vector<uint16_t>& buf) {
    g_[g].uploads_in_flight++;
    buf.assign(size_t(p_.numel), 0);
    std::memcpy(buf.data(), lowp(g), half() * 2);
  }
  void upload_end(int g, int64_t iter, std::vector<uint16_t>& buf) {
    const size_t n = size_t(p_.numel);
    std::memcpy(buf.data() + half(), lowp(g) + half(), (n - half()) * 2);
    auto& gs = g_[g];
    gs.uploads_in_flight--;
    if (iter >= 0 && iter < p_.iterations) gs.uploads_done[iter]++;
    const int64_t a = ref_.version_of(g, buf.data(), 0, half()),
                  b = ref_.version_of(g, buf.data(), half(), n);
    const int64_t want = p_.version_for(iter);
    if (a == -2 || b == -2)
      violate(0,
              fmt::format("upload of group {} for iteration {} read values of no reference version (halves: "
                          "version {} and {}; -2 = none): an earlier write went wrong",
                          g, iter, a, b));
    else if (a != b)
      violate(2, fmt::format(
                     "upload of group {} for iteration {} read a torn copy (halves of versions {} and {})", g,
                     iter, a, b));
    else if (a != want)
      violate(1, fmt::format("upload of group {} for iteration {} read version {}, expected {}", g, iter, a,
                             want));
  }

  // -- gradient writes (grad copy actor): first half in one job, second half later
  void grad_begin(int g, int64_t step, bool overwrite, const std::vector<float>& c) {
    auto& gs = g_[g];
    if (gs.writers_in_flight > 0)
      violate(2, fmt::format("two gradient writes in flight to group {}'s slot (step {})", g, step));
    if (adam_[g].step < step)
      violate(3, fmt::format("gradient write of group {} for step {} before step {} consumed the slot", g,
                             step, step - 1));
    if (overwrite && gs.slot_step >= 0 && !gs.consumed)
      violate(
          3, fmt::format("gradient write of group {} for step {} overwrites {} unconsumed contribution(s) of "
                         "step {}",
                         g, step, gs.slot_count, gs.slot_step));
    if (!overwrite && (gs.slot_step != step || gs.consumed))
      violate(3,
              fmt::format("gradient write of group {} for step {} accumulates onto a slot holding step {}{}",
                          g, step, gs.slot_step, gs.consumed ? " (already consumed)" : ""));
    if (overwrite) {
      gs.slot_step = step;
      gs.slot_count = 0;
      gs.consumed = false;
    }
    gs.writers_in_flight++;
    write(g, overwrite, c, 0, half());
  }
  void grad_end(int g, int64_t step, bool overwrite, const std::vector<float>& c) {
    auto& gs = g_[g];
    write(g, overwrite, c, half(), size_t(p_.numel));
    gs.writers_in_flight--;
    if (gs.slot_step == step) gs.slot_count++;
  }

  // -- the fake scheduler received GroupUpdated
  void group_updated(int64_t k, int g) {
    auto& gs = g_[g];
    if (k != gs.last_group_updated + 1)
      violate(4, fmt::format("GroupUpdated(step {}, group {}) after step {}: not each step once, in order", k,
                             g, gs.last_group_updated));
    gs.last_group_updated = std::max(gs.last_group_updated, k);
    group_updated_count++;
  }

  // -- around every job the coordinator runs
  /// `shard`: index of the shard the job belongs to (-1: not a shard); `msg`: the message
  /// it is about to process (front of its mailbox).
  void before_job(int shard, const caf::mailbox_element* msg) {
    pending_shard_ = shard;
    pending_grad_ = std::nullopt;
    pending_close_ = -1;
    if (shard < 0 || !msg) return;
    auto& x = msg->content();
    if (x.match_elements<GradWritten>()) pending_grad_ = x.get_as<GradWritten>(0);
    if (x.match_elements<CloseStep>()) pending_close_ = x.get_as<CloseStep>(0).step;
  }

  void after_job() {
    ++jobs;
    if (pending_grad_ && pending_grad_->step >= 0 && pending_grad_->step < p_.iterations)
      grads_seen_by_shard_[pending_grad_->group][pending_grad_->step]++;
    if (pending_close_ >= 0 && pending_close_ < p_.iterations)
      closed_at_shard_[pending_shard_][pending_close_] = 1;
    for (int g = 0; g < p_.groups; ++g) {
      check_publish(g);
      check_updates(g);
    }
    if (pending_shard_ >= 0)
      for (int g = 0; g < p_.groups; ++g)
        if (p_.shard_of(g) == pending_shard_) check_eager(g);
  }

  /// Version last seen in group g's low-precision copy.
  int64_t published(int g) const { return g_[g].published; }

  std::vector<Violation> violations;
  int64_t jobs = 0;
  int group_updated_count = 0;

 private:
  struct GroupWatch {
    std::vector<uint16_t> last_lowp;
    int64_t published = -1;  ///< version in the low-precision copy
    int uploads_in_flight = 0;
    std::vector<int> uploads_done;  ///< finished uploads per iteration
    int writers_in_flight = 0;
    int64_t slot_step = -1;  ///< step whose contributions the slot holds
    int slot_count = 0;
    bool consumed = false;
    int64_t updates = 0;  ///< AdamW step counter last seen
    int64_t last_group_updated = -1;
  };

  std::vector<uint16_t> lowp_vec(int g) const { return std::vector<uint16_t>(lowp(g), lowp(g) + p_.numel); }

  void write(int g, bool overwrite, const std::vector<float>& c, size_t lo, size_t hi) {
    float* s = grad_slot(g);
    for (size_t i = lo; i < hi; ++i) s[i] = overwrite ? c[i] : s[i] + c[i];
  }

  int expected_uploads(int g) const { return p_.uploads_per_step(g); }

  void check_publish(int g) {
    auto& gs = g_[g];
    if (std::memcmp(gs.last_lowp.data(), lowp(g), size_t(p_.numel) * 2) == 0) return;
    gs.last_lowp = lowp_vec(g);
    const int64_t k = ref_.version_of(g, gs.last_lowp.data(), 0, size_t(p_.numel));
    if (k == -2) {
      violate(0, fmt::format("group {}'s low-precision copy holds the values of no reference version", g));
      return;
    }
    if (k <= gs.published)
      violate(4, fmt::format("group {} published version {} after version {}", g, k, gs.published));
    if (gs.uploads_in_flight > 0)
      violate(2, fmt::format("group {}'s version {} was published while {} upload(s) of it were in flight", g,
                             k, gs.uploads_in_flight));
    for (int64_t i = 0; i <= k + p_.staleness; ++i) {
      const int done = i < p_.iterations ? gs.uploads_done[i] : 0;
      if (done < expected_uploads(g)) {
        violate(5,
                fmt::format("group {}'s version {} was published before the uploads of iteration {} finished "
                            "({} of {})",
                            g, k, i, done, expected_uploads(g)));
        break;
      }
    }
    gs.published = k;
  }

  void check_updates(int g) {
    auto& gs = g_[g];
    const int64_t now = adam_[g].step;
    if (now == gs.updates) return;
    if (now != gs.updates + 1)
      violate(4, fmt::format("group {}: {} updates in one job (steps {}..{})", g, now - gs.updates,
                             gs.updates, now - 1));
    for (int64_t k = gs.updates; k < now; ++k) {
      const int want = p_.grads_per_pass(g);
      if (gs.slot_step != k || gs.consumed || gs.slot_count < want || gs.writers_in_flight > 0)
        violate(4,
                fmt::format(
                    "group {}'s update of step {} read an incomplete gradient (slot holds step {}, {} of {} "
                    "contributions, {} write(s) in flight{})",
                    g, k, gs.slot_step, gs.slot_count, want, gs.writers_in_flight,
                    gs.consumed ? ", already consumed" : ""));
      if (gs.published < k - 1)
        violate(
            5, fmt::format("group {}'s update of step {} ran while version {} was unpublished (more than one "
                           "outstanding step)",
                           g, k, k - 1));
      gs.consumed = true;
    }
    gs.updates = now;
    if (now <= p_.iterations &&
        std::memcmp(master_[g].data(), ref_.master[size_t(now)][g].data(), size_t(p_.numel) * 4) != 0)
      violate(0, fmt::format("group {}'s fp32 weights after step {} differ from the sequential reference", g,
                             now - 1));
  }

  // Rule 4, "as soon as": once the shard has processed step k's CloseStep and every
  // GradWritten of g for step k, and version k-1 is published, g's update of step k
  // must have run in that very job: no barrier with other groups or steps.
  void check_eager(int g) {
    auto& gs = g_[g];
    const int64_t k = gs.updates;
    if (k >= p_.iterations) return;
    if (closed_at_shard_[p_.shard_of(g)][k] && grads_seen_by_shard_[g][k] >= p_.grads_per_pass(g) &&
        gs.published >= k - 1)
      violate(4, fmt::format("group {}'s update of step {} did not run as soon as its gradient was complete",
                             g, k));
  }

  const Pipeline& p_;
  const Reference& ref_;
  ParamStore& store_;
  std::vector<std::vector<float>>& master_;
  std::vector<AdamWState>& adam_;
  std::vector<GroupWatch> g_;
  std::vector<std::vector<char>> closed_at_shard_;
  std::vector<std::vector<int>> grads_seen_by_shard_;
  int pending_shard_ = -1;
  std::optional<GradWritten> pending_grad_;
  int64_t pending_close_ = -1;
};

// ---- fake actors ----------------------------------------------------------------------
struct Shared {  // what every fake actor of one run sees (single-threaded: the coordinator)
  const Pipeline* p = nullptr;
  Monitor* mon = nullptr;
  std::vector<caf::actor> shards, workers;
  int stage_done = 0;
  int steps_done = 0;  ///< steps the scheduler's ledger reported done
  int outstanding_requests = 0;
  /// Per evaluation pass: a function of every weight byte its stages read (its "loss").
  std::map<int64_t, double> eval_loss;
  bool uncounted_evals = false;  ///< testing the test: CloseStep leaves the evaluation uploads out
};

/// The "loss" an evaluation stage adds for the bf16 weights of group g it read.
inline double eval_term(int g, const std::vector<uint16_t>& w) {
  double s = 0;
  for (size_t i = 0; i < w.size(); ++i) s += double(bf16_to_f32(w[i])) * double(1 + g + int(i % 3));
  return s;
}

inline void reject_unexpected(caf::scheduled_actor* self, Shared* sh, const char* who) {
  self->set_default_handler([sh, who](caf::scheduled_actor*,
                                      caf::message_view& x) -> caf::result<caf::message> {
    sh->mon->violate(0, fmt::format("{} received an unexpected message {}", who, x.content().stringify()));
    return caf::sec::unexpected_message;
  });
}

struct CopyState {
  struct Job {
    bool grad = false;
    CopyParam up;
    CopyGrad down;
    std::vector<uint16_t> buf;
  };
  std::map<uint64_t, Job> jobs;
  uint64_t next = 0;
};

/// One copy stream: every copy takes two jobs (half, then the other half), so other
/// actors may run in between.
inline caf::behavior copy_actor(caf::stateful_actor<CopyState>* self, Shared* sh) {
  reject_unexpected(self, sh, "copy actor");
  return {
      [=](CopyParam& c) {
        auto& j = self->state.jobs[self->state.next];
        j.up = c;
        sh->mon->upload_begin(c.group, c.iter, j.buf);
        self->send(self, CopyHalf{self->state.next++});
      },
      [=](CopyGrad& c) {
        auto& j = self->state.jobs[self->state.next];
        j.grad = true;
        j.down = c;
        sh->mon->grad_begin(c.group, c.step, c.overwrite, *c.data);
        self->send(self, CopyHalf{self->state.next++});
      },
      [=](CopyHalf& h) {
        auto it = self->state.jobs.find(h.id);
        if (it == self->state.jobs.end()) return;
        auto j = std::move(it->second);
        self->state.jobs.erase(it);
        if (j.grad) {
          sh->mon->grad_end(j.down.group, j.down.step, j.down.overwrite, *j.down.data);
          self->send(j.down.reply_to, CopyAck{j.down.token, nullptr});
        } else {
          sh->mon->upload_end(j.up.group, j.up.iter, j.buf);
          self->send(j.up.reply_to,
                     CopyAck{j.up.token, std::make_shared<const std::vector<uint16_t>>(std::move(j.buf))});
        }
      },
  };
}

struct WorkerState {
  struct Task {
    RunTask rt;
    int params_pending = 0;
    int64_t next_mb = 0;
    bool computing = false;
    int grads_pending = 0;
    std::map<int, std::shared_ptr<const std::vector<uint16_t>>> read;  ///< weights uploaded, per group
  };
  std::deque<RunTask> queue;
  std::optional<Task> task;
  std::set<std::tuple<int64_t, int, int64_t>> ready;  ///< ActReady (pass, stage, micro-batch)
  std::map<uint64_t, std::pair<bool, int>> tokens;    ///< copy token -> (is grad, group)
  uint64_t next_token = 1;
};

/// A fake worker: runs its stage tasks in dealt order, one micro-batch at a time.
inline caf::behavior fake_worker(caf::stateful_actor<WorkerState>* self, Shared* sh, int index,
                                 caf::actor param_copy, caf::actor grad_copy, caf::actor scheduler) {
  reject_unexpected(self, sh, "worker");
  const Pipeline& p = *sh->p;
  auto shard = [sh](int g) { return sh->shards[sh->p->shard_of(g)]; };

  // Forward declarations through shared std::function objects (the handlers call each other).
  auto start_next = std::make_shared<std::function<void()>>();
  auto pump = std::make_shared<std::function<void()>>();

  auto finish = [=] {
    auto& t = *self->state.task;
    if (t.rt.eval)
      for (auto& [g, w] : t.read) sh->eval_loss[t.rt.pass] += eval_term(g, *w);
    for (int64_t m = 0; m < p.micro_batches; ++m) self->state.ready.erase({t.rt.pass, t.rt.stage, m});
    StageDone sd;
    sd.pass = t.rt.pass;
    sd.stage_index = t.rt.stage;
    sd.worker = index;
    self->send(scheduler, sd);
    self->state.task.reset();
    (*start_next)();
  };

  auto start_grads = [=] {
    auto& t = *self->state.task;
    const int64_t step = t.rt.step >= 0 ? t.rt.step : t.rt.pass, pass = t.rt.pass;
    const int stage = t.rt.stage;
    const auto& groups = p.stages[stage].groups;
    t.grads_pending = int(groups.size());
    for (int g : groups) {
      sh->outstanding_requests++;
      self->request(shard(g), caf::infinite, AcquireGradSlot{g, step})
          .then(
              [=](GradGrant& gr) {
                sh->outstanding_requests--;
                if (gr.group != g || gr.step != step)
                  sh->mon->violate(0, fmt::format("GradGrant({}, {}) answers AcquireGradSlot({}, {})",
                                                  gr.group, gr.step, g, step));
                if (!self->state.task || self->state.task->rt.pass != pass ||
                    self->state.task->rt.stage != stage)
                  return sh->mon->violate(0, "gradient grant for a finished task");
                auto& tk = *self->state.task;
                auto data =
                    std::make_shared<const std::vector<float>>(contribution(*tk.read.at(g), step, stage, g));
                uint64_t tok = self->state.next_token++;
                self->state.tokens[tok] = {true, g};
                self->send(grad_copy,
                           CopyGrad{g, step, gr.overwrite, data, tok, caf::actor_cast<caf::actor>(self)});
              },
              [=](caf::error& e) {
                sh->outstanding_requests--;
                sh->mon->violate(0, "AcquireGradSlot failed: " + to_string(e));
              });
    }
  };

  *pump = [=] {
    if (!self->state.task) return;
    auto& t = *self->state.task;
    if (t.params_pending > 0 || t.computing || t.next_mb >= p.micro_batches) return;
    if (t.rt.stage > 0 && !self->state.ready.count({t.rt.pass, t.rt.stage, t.next_mb})) return;
    t.computing = true;
    self->send(self, Computed{t.rt.pass, t.rt.stage, t.next_mb});
  };

  *start_next = [=] {
    if (self->state.task || self->state.queue.empty()) return;
    self->state.task.emplace();
    auto& t = *self->state.task;
    t.rt = self->state.queue.front();
    self->state.queue.pop_front();
    const int64_t step = t.rt.step >= 0 ? t.rt.step : t.rt.pass;
    const auto& groups = p.stages[t.rt.stage].groups;
    t.params_pending = int(groups.size());
    for (int g : groups) {
      sh->outstanding_requests++;
      self->request(shard(g), caf::infinite, AcquireWeights{g, step})
          .then(
              [=](WeightsGranted& w) {
                sh->outstanding_requests--;
                if (w.group != g || w.step != step)
                  sh->mon->violate(0, fmt::format("WeightsGranted({}, {}) answers AcquireWeights({}, {})",
                                                  w.group, w.step, g, step));
                uint64_t tok = self->state.next_token++;
                self->state.tokens[tok] = {false, g};
                self->send(param_copy, CopyParam{g, step, tok, caf::actor_cast<caf::actor>(self)});
              },
              [=](caf::error& e) {
                sh->outstanding_requests--;
                sh->mon->violate(0, "AcquireWeights failed: " + to_string(e));
              });
    }
    (*pump)();
  };

  return {
      [=](RunTask& rt) {
        self->state.queue.push_back(std::move(rt));
        (*start_next)();
      },
      [=](ActReady& a) {
        self->state.ready.insert({a.pass, a.stage_index, a.micro_batch});
        (*pump)();
      },
      [=](Computed& c) {
        if (!self->state.task || self->state.task->rt.pass != c.pass || self->state.task->rt.stage != c.stage)
          return sh->mon->violate(0, "stray compute completion");
        auto& t = *self->state.task;
        t.computing = false;
        if (t.rt.next) self->send(t.rt.next, ActReady{c.pass, c.stage + 1, c.mb});
        t.next_mb++;
        if (t.next_mb < p.micro_batches) return (*pump)();
        if (p.stages[t.rt.stage].backward && !t.rt.eval) start_grads();
        else finish();
      },
      [=](CopyAck& a) {
        auto it = self->state.tokens.find(a.token);
        if (it == self->state.tokens.end() || !self->state.task)
          return sh->mon->violate(0, "stray copy completion");
        auto [grad, g] = it->second;
        self->state.tokens.erase(it);
        auto& t = *self->state.task;
        const int64_t step = t.rt.step >= 0 ? t.rt.step : t.rt.pass;
        if (!grad) {
          self->send(shard(g), ReleaseWeights{g, step});
          t.read[g] = a.read;
          t.params_pending--;
          (*pump)();
        } else {
          self->send(shard(g), GradWritten{g, step});
          if (--t.grads_pending == 0) finish();
        }
      },
  };
}

/// The scheduler side, a typed SchedulerActor whose bookkeeping is the runtime's own StepLedger
/// (scheduler/step_ledger.hpp): the driver's SubmitPass and CloseStepRequest go to the ledger,
/// which decides when each pass is dealt (two pass slots) and when and with which per-group
/// totals, gradient scale and learning rate each step closes (CloseStep); StageDone and
/// GroupUpdated go to it too, and it says when each step is done. The harness names passes
/// its own way (training pass t = t, evaluation passes after them: Pipeline::eval_pass); the
/// ledger numbers them in dealing order.
struct LedgerSchedulerState {
  std::unique_ptr<StepLedger> ledger;
  std::deque<SubmitPass> queued;         ///< submitted, not dealt (the ledger's queue order)
  std::map<int64_t, int64_t> ledger_of;  ///< harness pass -> ledger pass
};

inline SchedulerActor::behavior_type fake_scheduler(
    SchedulerActor::stateful_pointer<LedgerSchedulerState> self, Shared* sh) {
  reject_unexpected(self, sh, "scheduler");
  const Pipeline& p = *sh->p;
  StepLedger::Options o;
  o.num_groups = p.groups;
  o.pass_slots = 2;
  o.staleness = p.staleness;
  o.clock = [] { return 0.0; };
  self->state.ledger = std::make_unique<StepLedger>(o);
  auto carry_out = std::make_shared<std::function<void(std::vector<LedgerAction>&)>>();
  // deals what the ledger allows: the harness's RunTasks, round-robin as Pipeline::worker_of
  auto deal = [=] {
    auto& st = self->state;
    while (auto d = st.ledger->next_deal()) {
      SubmitPass sp = std::move(st.queued.front());
      st.queued.pop_front();
      const bool eval = sp.eval >= 0;
      const int64_t pass = eval ? p.eval_pass(sp.step, int(sp.eval)) : sp.step;
      const int S = eval ? p.eval_stages() : int(p.stages.size());
      std::vector<int> up, gr;
      for (int g = 0; g < p.groups; ++g) {
        up.push_back(eval ? p.eval_uploads(g) : p.uploads_per_pass(g));
        gr.push_back(eval ? 0 : p.grads_per_pass(g));
      }
      std::vector<LedgerAction> after;
      st.ledger->dealt(*d, S, up, gr, after);
      st.ledger_of[pass] = d->pass;
      for (int s = 0; s < S; ++s) {
        caf::actor next = s + 1 < S ? sh->workers[p.worker_of(pass, s + 1)] : caf::actor{};
        // the fake workers are untyped: a typed actor reaches them anonymously
        caf::anon_send(sh->workers[p.worker_of(pass, s)], RunTask{pass, s, next, sp.step, eval});
      }
      (*carry_out)(after);
    }
  };
  *carry_out = [=](std::vector<LedgerAction>& actions) {
    for (auto& a : actions) {
      switch (a.kind) {
        case LedgerAction::Kind::close_step: {
          CloseStep c{a.step, a.passes, a.grad_scale, a.lr, a.uploads, a.grads};
          if (sh->uncounted_evals) {  // a broken scheduler: the evaluation passes' uploads left out
            auto up = std::make_shared<std::vector<int>>();
            for (int g = 0; g < p.groups; ++g) up->push_back(p.uploads_per_pass(g));
            c.uploads = up;
          }
          for (auto& s : sh->shards) self->send(caf::actor_cast<ShardActor>(s), c);
          break;
        }
        case LedgerAction::Kind::step_done: sh->steps_done++; break;
        case LedgerAction::Kind::deal: deal(); break;
        case LedgerAction::Kind::step_scale:
        case LedgerAction::Kind::eval_done: break;
      }
    }
  };
  auto unused = [sh](const char* what) {
    sh->mon->violate(0, fmt::format("the scheduler received {}", what));
  };
  return {
      [=](SetPeers&) { unused("SetPeers"); },
      [=](SubmitPass& sp) {
        // the step's gradient is divided by its target tokens: 8 + step (Pipeline::grad_scale)
        self->state.ledger->submit_pass(sp.step, sp.eval, double(8 + sp.step));
        self->state.queued.push_back(std::move(sp));
        deal();
      },
      [=](CloseStepRequest& c) {
        std::vector<LedgerAction> out;
        self->state.ledger->close_requested(c.step, c.lr, c.tokens, out);
        (*carry_out)(out);
      },
      [=](StageDone& d) {
        sh->stage_done++;
        std::vector<LedgerAction> out;
        self->state.ledger->stage_done(self->state.ledger_of.at(d.pass), StageReport{}, out);
        (*carry_out)(out);
      },
      [=](GradSumSq&) { unused("GradSumSq"); },
      [=](LayerTimings&) { unused("LayerTimings"); },
      [=](GroupUpdated& u) {
        sh->mon->group_updated(u.step, u.group);
        std::vector<LedgerAction> out;
        self->state.ledger->group_updated(u.step, u.group, u.sumsq, out);
        (*carry_out)(out);
      },
      [=](Failure& f) { sh->mon->violate(0, "failure: " + f.what); },
      [=](WatchdogTick) {},
      [=](WaitStep&) -> caf::result<StepResult> { return caf::make_error(caf::sec::unexpected_message); },
      [=](WaitEval&) -> caf::result<EvalResult> { return caf::make_error(caf::sec::unexpected_message); },
      [=](GetRuntimeInfo) -> caf::result<RuntimeInfo> {
        return caf::make_error(caf::sec::unexpected_message);
      },
      [=](ResumeAt&) -> caf::result<Ack> { return caf::make_error(caf::sec::unexpected_message); },
      [=](LossScalesFrom&) -> caf::result<LossScales> {
        return caf::make_error(caf::sec::unexpected_message);
      },
      [=](GetStatus) -> caf::result<StatusReport> { return StatusReport{self->state.ledger->describe()}; },
      [=](Shutdown) { self->quit(); },
  };
}

// ---- delivery orders -------------------------------------------------------------------
enum class Policy {
  random,          ///< uniformly random runnable actor
  fifo,            ///< oldest job first (the coordinator's default)
  lifo,            ///< newest job first
  delay,           ///< random, but `actor` runs only when nothing else can
  prioritize,      ///< `actor` first whenever it has a message, otherwise random
  starve_shards,   ///< shards only when nothing else can run
  starve_workers,  ///< workers only when nothing else can run
};
enum class Events {
  random,  ///< dispatch / close at random moments
  early,   ///< everything dispatched and closed before anything runs
  late,    ///< the next pass / close only when the system is idle
};
struct Order {
  Policy policy = Policy::random;
  Events events = Events::random;
  uint64_t seed = 0;
  int actor = -1;  ///< role index for delay / prioritize (see Roles)
  /// true: D0 C0 D1 C1 ... (a Session closes step t before it submits pass t+1);
  /// false: closes lag independently (CloseStep(t) may come after passes t+1, t+2 were
  /// dealt; in 'early' mode all passes go first), which the shard must survive too.
  bool session_order = true;
};

/// Role index of each actor: 0 scheduler, 1..shards shards, then workers, param copy
/// actors, grad copy actors.
struct Roles {
  int shards, workers;
  int scheduler() const { return 0; }
  int shard(int i) const { return 1 + i; }
  int worker(int i) const { return 1 + shards + i; }
  int param_copy(int i) const { return 1 + shards + workers + i; }
  int grad_copy(int i) const { return 1 + shards + 2 * workers + i; }
  int count() const { return 1 + shards + 3 * workers; }
  bool is_shard(int r) const { return r >= 1 && r <= shards; }
  bool is_worker(int r) const { return r > shards && r <= shards + workers; }
};

struct Outcome {
  bool completed = false;        ///< every stage task and every group update happened
  bool mailboxes_empty = false;  ///< at the end, every actor's mailbox is empty
  bool weights_equal = false;    ///< fp32 weights and AdamW state equal the reference bit for bit
  bool job_cap_hit = false;
  int64_t jobs = 0;
  uint64_t order_hash = 0;  ///< FNV-1a over the roles in the order they ran
  std::vector<Violation> violations;
  bool violated(int rule) const {
    for (auto& v : violations)
      if (v.rule == rule) return true;
    return false;
  }
  bool ok() const { return completed && mailboxes_empty && weights_equal && violations.empty(); }
  std::string describe() const {
    std::string s = fmt::format("completed={} mailboxes_empty={} weights_equal={} jobs={}{}", completed,
                                mailboxes_empty, weights_equal, jobs, job_cap_hit ? " (job cap hit)" : "");
    for (size_t i = 0; i < violations.size() && i < 8; ++i)
      s += fmt::format("\n  rule {}: {}", violations[i].rule, violations[i].what);
    return s;
  }
};

/// Whether `a` has no message left. An idle actor's inbox is in the 'blocked' state, which
/// fifo_inbox::empty() does not count as empty (and size() would unblock it).
inline bool mailbox_empty(caf::scheduled_actor& a) {
  auto& mb = a.mailbox();
  return mb.blocked() ? mb.queue().empty() : mb.empty();
}

/// One actor system on the test coordinator, reused for many runs.
class Harness {
 public:
  explicit Harness(Pipeline p) : p_(std::move(p)), ref_(p_) {
    cfg_.set("scheduler.policy", caf::atom("testing"));
    cfg_.set("logger.file-verbosity", caf::atom("quiet"));
    cfg_.set("logger.console", caf::atom("none"));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    sys_->await_actors_before_shutdown(false);  // never hang a failing test in the destructor
    sched_ = &dynamic_cast<caf::scheduler::test_coordinator&>(sys_->scheduler());
    sched_->run();
    base_running_ = sys_->registry().running();
  }
  ~Harness() { sys_.reset(); }

  const Pipeline& pipeline() const { return p_; }
  const Reference& reference() const { return ref_; }
  static constexpr int64_t kJobCap = 50000;  ///< a run is ~1,000 jobs; more means a livelock

  /// run() where the fake scheduler's CloseStep leaves the evaluation uploads out of the
  /// step's totals (a broken scheduler the monitor must catch).
  Outcome run_with_uncounted_evals(const Order& order) { return run(order, 0, true); }

  Outcome run(const Order& order, int disable_rule = 0, bool uncounted_evals = false) {
    const Pipeline& p = p_;
    Roles roles{p.shards, p.workers};
    // host memory of the run
    ModelLayout layout;
    layout.groups.resize(size_t(p.groups));
    for (auto& g : layout.groups) g.numel = p.numel;
    ParamStore store(layout, DType::bf16);
    auto master = initial_weights(p);
    std::vector<AdamWState> adam(size_t(p.groups));
    for (int g = 0; g < p.groups; ++g)
      cast_f32_to(master[g].data(), store.lowp[g].data(), p.numel, DType::bf16);
    Monitor mon(p, ref_, store, master, adam);
    Shared sh;
    sh.p = &p;
    sh.mon = &mon;
    sh.uncounted_evals = uncounted_evals;

    // actors
    std::vector<caf::actor> by_role(size_t(roles.count()));
    SchedulerActor scheduler = sys_->spawn(fake_scheduler, &sh);
    by_role[roles.scheduler()] = caf::actor_cast<caf::actor>(scheduler);
    for (int s = 0; s < p.shards; ++s) {
      std::vector<ShardGroup> owned;
      for (int g = 0; g < p.groups; ++g)
        if (p.shard_of(g) == s)
          owned.push_back(ShardGroup{g, &master[g], &adam[g], p.uploads_per_pass(g), p.grads_per_pass(g)});
      ShardOptions so;
      so.staleness = p.staleness;
      so.adam = p.adam();
      set_cooperative(so, 0);
      set_disable_rule(so, disable_rule, 0);
      // the fake scheduler plays the real one's part of the typed interface
      sh.shards.push_back(
          caf::actor_cast<caf::actor>(spawn_optimizer_shard(*sys_, std::move(owned), &store, so, scheduler)));
      by_role[roles.shard(s)] = sh.shards.back();
    }
    std::vector<caf::actor> workers;
    for (int w = 0; w < p.workers; ++w) {
      auto pc = sys_->spawn(copy_actor, &sh);
      auto gc = sys_->spawn(copy_actor, &sh);
      workers.push_back(sys_->spawn(fake_worker, &sh, w, pc, gc, caf::actor_cast<caf::actor>(scheduler)));
      by_role[roles.worker(w)] = workers.back();
      by_role[roles.param_copy(w)] = pc;
      by_role[roles.grad_copy(w)] = gc;
    }
    sh.workers = workers;
    std::unordered_map<caf::resumable*, int> role_of;
    for (int r = 0; r < roles.count(); ++r)
      role_of[dynamic_cast<caf::resumable*>(caf::actor_cast<caf::abstract_actor*>(by_role[r]))] = r;
    // Let every actor initialise (spawning enqueues it) before the protocol starts.
    sched_->run();
    mon.jobs = 0;

    // the driver's own events: dispatch pass t and close step t, each stream in order,
    // close t after dispatch t; with session_order also dispatch t+1 after close t.
    // With evaluation passes, each step's dispatches are its training pass and its
    // evaluation passes in a random order (the training pass's place drawn per step).
    const int per_step = 1 + p.evals_per_step;
    int64_t next_dispatch = 0, next_close = 0;  // dispatch events, closes
    std::mt19937_64 rng(order.seed * 0x9e3779b97f4a7c15ull + 17);
    std::vector<int> train_at(size_t(p.iterations));
    for (auto& x : train_at) x = int(rng() % uint64_t(per_step));
    auto events_left = [&] { return next_close < p.iterations; };
    auto fire_event = [&] {
      const int64_t steps_dealt = next_dispatch / per_step;  // steps whose every pass is dealt
      const bool can_dispatch =
          next_dispatch < p.iterations * per_step && (!order.session_order || next_close == steps_dealt);
      const bool can_close = next_close < steps_dealt;
      bool close = can_close;
      if (can_dispatch && can_close) close = order.events == Events::early ? false : bool(rng() & 1);
      if (close) {
        const int64_t k = next_close++;
        return caf::anon_send(scheduler, CloseStepRequest{k, p.lr(k)});
      }
      const int64_t t = next_dispatch / per_step;
      const int j = int(next_dispatch++ % per_step);
      SubmitPass sp;
      sp.step = t;
      if (j != train_at[size_t(t)]) sp.eval = j < train_at[size_t(t)] ? j : j - 1;
      caf::anon_send(scheduler, std::move(sp));
    };
    Outcome out;
    uint64_t h = 1469598103934665603ull;
    auto& jobs = sched_->jobs;
    auto role = [&](caf::resumable* j) {
      auto it = role_of.find(j);
      return it == role_of.end() ? -1 : it->second;
    };
    std::vector<size_t> cand;
    for (;;) {
      if (mon.jobs >= kJobCap) {
        out.job_cap_hit = true;
        break;
      }
      // driver events
      if (events_left()) {
        bool fire = jobs.empty() || order.events == Events::early ||
                    (order.events == Events::random && rng() % (jobs.size() + 1) == 0);
        if (fire) {
          fire_event();
          continue;
        }
      }
      if (jobs.empty()) break;
      // pick a job
      size_t idx = 0;
      const size_t n = jobs.size();
      auto pick_among = [&](auto pred) {  // random among jobs satisfying pred, else random among all
        cand.clear();
        for (size_t i = 0; i < n; ++i)
          if (pred(role(jobs[i]))) cand.push_back(i);
        return cand.empty() ? size_t(rng() % n) : cand[rng() % cand.size()];
      };
      switch (order.policy) {
        case Policy::random: idx = size_t(rng() % n); break;
        case Policy::fifo: idx = 0; break;
        case Policy::lifo: idx = n - 1; break;
        case Policy::delay: idx = pick_among([&](int r) { return r != order.actor; }); break;
        case Policy::prioritize: idx = pick_among([&](int r) { return r == order.actor; }); break;
        case Policy::starve_shards: idx = pick_among([&](int r) { return !roles.is_shard(r); }); break;
        case Policy::starve_workers: idx = pick_among([&](int r) { return !roles.is_worker(r); }); break;
      }
      if (idx != 0) std::rotate(jobs.begin(), jobs.begin() + idx, jobs.begin() + idx + 1);
      const int r = role(jobs.front());
      h = (h ^ uint64_t(r + 1)) * 1099511628211ull;
      const caf::mailbox_element* front = nullptr;
      if (roles.is_shard(r)) front = sched_->next_job<caf::scheduled_actor>().mailbox().peek();
      mon.before_job(roles.is_shard(r) ? r - 1 : -1, front);
      sched_->run_once();
      mon.after_job();
    }
    out.jobs = mon.jobs;
    out.order_hash = h;

    // end of run: everything happened, nothing left, the weights are the reference's
    const int stages = (int(p.stages.size()) + p.evals_per_step * p.eval_stages()) * p.iterations;
    out.completed = !events_left() && sh.stage_done == stages &&
                    mon.group_updated_count == p.groups * p.iterations && sh.outstanding_requests == 0 &&
                    sh.steps_done == p.iterations;
    if (!out.completed && !out.job_cap_hit)
      mon.violate(
          0,
          fmt::format("deadlock: no message left to deliver, but {} of {} stage tasks done, {} of {} group "
                      "updates, {} request(s) unanswered",
                      sh.stage_done, stages, mon.group_updated_count, p.groups * p.iterations,
                      sh.outstanding_requests));
    out.mailboxes_empty = true;
    for (int r = 0; r < roles.count(); ++r) {
      auto* sa = dynamic_cast<caf::scheduled_actor*>(caf::actor_cast<caf::abstract_actor*>(by_role[r]));
      if (!sa || !mailbox_empty(*sa)) {
        out.mailboxes_empty = false;
        mon.violate(0, fmt::format("actor of role {} has messages left in its mailbox", r));
      }
    }
    out.weights_equal = true;
    const size_t last = size_t(p.iterations);
    for (int g = 0; g < p.groups; ++g) {
      auto& rs = ref_.state[g];
      if (std::memcmp(master[g].data(), ref_.master[last][g].data(), size_t(p.numel) * 4) != 0 ||
          adam[g].step != rs.step || adam[g].m != rs.m || adam[g].v != rs.v)
        out.weights_equal = false;
      // the newest version rule 5 lets out is published (version T-1-s)
      const int64_t want = p.iterations - 1 - p.staleness;
      if (out.completed && mon.published(g) != want)
        mon.violate(5, fmt::format("group {} ends with version {} published, expected {}", g,
                                   mon.published(g), want));
    }
    // evaluation passes: each one's loss is that of the weights its step reads (version
    // max(t-1-s, -1)), so the evaluations of one step agree bit for bit
    for (int64_t t = 0; t < p.iterations && out.completed; ++t) {
      const auto& w = ref_.lowp[size_t(p.version_for(t) + 1)];
      double want = 0;
      for (int s = 0; s < p.eval_stages(); ++s)  // as the worker sums them: stage by stage, groups ascending
        for (int g : std::set<int>(p.stages[size_t(s)].groups.begin(), p.stages[size_t(s)].groups.end()))
          want += eval_term(g, w[size_t(g)]);
      for (int e = 0; e < p.evals_per_step; ++e) {
        const double got = sh.eval_loss[p.eval_pass(t, e)];
        if (got != want)
          mon.violate(
              1, fmt::format(
                     "evaluation {} of step {}: loss {} differs from that of the weights of step {} ({})", e,
                     t, got, t, want));
      }
    }
    out.violations = mon.violations;

    // shut down: shards quit on Shutdown, the rest on an exit message
    for (auto& s : sh.shards) caf::anon_send(s, Shutdown{});
    for (int r = 0; r < roles.count(); ++r)
      if (!roles.is_shard(r)) caf::anon_send_exit(by_role[r], caf::exit_reason::user_shutdown);
    sched_->run();
    workers.clear();
    sh.workers.clear();
    sh.shards.clear();
    by_role.clear();
    scheduler = nullptr;
    if (sys_->registry().running() != base_running_) {
      out.violations.push_back({0, fmt::format("{} actor(s) still running after shutdown",
                                               sys_->registry().running() - base_running_)});
    }
    return out;
  }

 private:
  Pipeline p_;
  Reference ref_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  caf::scheduler::test_coordinator* sched_ = nullptr;
  size_t base_running_ = 0;
};

}  // namespace rp::test::proto
