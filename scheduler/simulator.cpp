#include "scheduler/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "scheduler/stage_peak.hpp"
#include "scheduler/stage_progress.hpp"
#include "trace/chrome_trace.hpp"

namespace rp {

std::vector<StageCost> stage_costs(const std::vector<LayerCost>& costs, const IterationPlan& plan,
                                   const PartitionOptions& opt) {
  std::vector<StageCost> out;
  std::vector<StageEstimate> est;
  for (const Stage& s : plan.stages) {
    StageEstimate e = estimate_stage(costs, s, opt);
    est.push_back(e);
    StageCost c;
    for (int l = s.first; l <= s.last; ++l) {
      const LayerCost& x = costs[size_t(l)];
      c.compute += s.kind == StageKind::forward ? x.fwd : s.kind == StageKind::backward ? x.bwd : x.tail;
    }
    c.act_up_bytes = e.act_up_bytes;
    c.act_down_bytes = e.act_down_bytes;
    c.param_bytes = e.weight_upload_bytes;
    c.grad_bytes = e.grad_bytes;
    out.push_back(c);
  }
  if (!est.empty()) {
    const std::vector<char> refused = prefetch_refused(est, opt);
    for (size_t i = 0; i < out.size(); ++i) out[i].params_after_previous = refused[i] != 0;
  }
  return out;
}

int default_iterations(int stages, int gpus) {
  const int cycle = gpus / std::gcd(stages, gpus);
  return std::max(4, 2 * std::min(cycle, kMaxDefaultCycle) + 2);
}

double uniform_bubble_ratio(int gpus, int64_t micro_batches, int stages) {
  const double nn = double(gpus) * double(gpus - 1);
  return nn / (double(micro_batches) * double(stages) + nn);
}

namespace {

void check(const IterationPlan& plan, const std::vector<StageCost>& costs, const SimOptions& o) {
  validate_plan(plan, "simulate");
  if (costs.size() != plan.stages.size())
    throw std::invalid_argument(
        fmt::format("simulate: {} stage costs for a plan of {} stages", costs.size(), plan.stages.size()));
  auto opt = [](const char* k, bool ok) {
    if (!ok) throw std::invalid_argument(fmt::format("simulate: option '{}' out of range", k));
  };
  opt("gpus", o.gpus >= 1);
  opt("micro_batches", o.micro_batches >= 1);
  opt("iterations", o.iterations >= 0);
  opt("staleness", o.staleness == 0 || o.staleness == 1);
  opt("passes_in_flight", o.passes_in_flight >= 0);
  opt("weight_buffers", o.weight_buffers >= 1);
  opt("act_slots", o.act_slots >= 1);
  opt("pointer", o.pointer >= 0);
  opt("bandwidth", o.bandwidth.act_up >= 0 && o.bandwidth.act_down >= 0 && o.bandwidth.param_up >= 0 &&
                       o.bandwidth.grad_down >= 0);
  opt("disk_read_bandwidth", o.disk_read_bandwidth >= 0);
  opt("disk_write_bandwidth", o.disk_write_bandwidth >= 0);
  opt("disk_ring", o.disk_ring >= 1);
  opt("optimizer_seconds", o.optimizer_seconds.empty() || int(o.optimizer_seconds.size()) == plan.num_layers);
  for (size_t i = 0; i < costs.size(); ++i) {
    const StageCost& c = costs[i];
    if (!std::isfinite(c.compute) || c.compute < 0 || c.act_up_bytes < 0 || c.act_down_bytes < 0 ||
        c.param_bytes < 0 || c.grad_bytes < 0 || c.disk_read_bytes < 0 || c.spill_write_bytes < 0 ||
        c.spill_read_bytes < 0)
      throw std::invalid_argument(fmt::format("simulate: stage {}: costs must be finite and >= 0", i));
  }
}

/// The discrete-event replay behind simulate(): each GPU runs its tasks by StageProgress, the
/// rules the worker runs (scheduler/stage_progress.hpp), on FIFO streams with the costs' times.
class Replay {
 public:
  Replay(const IterationPlan& plan, const std::vector<StageCost>& costs, const SimOptions& o, int iterations)
      : plan_(plan), costs_(costs), o_(o), S_(int(plan.stages.size())), T_(iterations) {
    gpus_.resize(size_t(o.gpus));
    for (int q = 0; q < T_ * S_; ++q) {
      Task tk;
      tk.t = q / S_;
      tk.s = q % S_;
      tk.gpu = int((o.pointer + int64_t(q)) % o.gpus);
      tk.k = gpus_[size_t(tk.gpu)].order.size();
      tk.prog = StageProgress(o.micro_batches, o.act_slots);
      tk.input.assign(size_t(o.micro_batches), 0);
      queue_reads(tk, q);
      gpus_[size_t(tk.gpu)].order.push_back(q);
      tasks_.push_back(std::move(tk));
    }
    published_.assign(size_t(T_), std::vector<char>(size_t(plan.num_layers), 0));
    remaining_.assign(size_t(T_), S_);
    admitted_.assign(size_t(T_), 0);
    passed_.assign(size_t(T_), 0);
    marked_.assign(size_t(o.gpus), 0);
    touched_.assign(size_t(o.gpus), 1);
    spill_written_.assign(size_t(T_), std::vector<int>(size_t(o.micro_batches), 0));
    for (int s = 0; s < S_ && disk_on(); ++s) spill_writers_ += costs[size_t(s)].spill_write_bytes > 0;
    r_.iteration_end.assign(size_t(T_), 0.0);
  }

  SimResult run() {
    for (int t = 0; t < T_; ++t)
      if (o_.passes_in_flight == 0 || t < o_.passes_in_flight) admit(t);
    advance_all(0.0);
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      handle(e);
      advance_all(e.time);
    }
    for (const Task& tk : tasks_)
      if (tk.finish < 0)
        throw std::logic_error(fmt::format(
            "simulate: stage {} of iteration {} never finished (the replay stalled)", tk.s, tk.t));
    for (auto& g : gpus_) r_.gpu_busy.push_back(g.busy);
    return std::move(r_);
  }

 private:
  struct Task {
    int t = 0, s = 0, gpu = 0;
    size_t k = 0;  ///< index among its GPU's tasks
    StageProgress prog;
    std::vector<char> input;  ///< the previous stage's output of micro-batch m is on the host
    bool params_issued = false, params_done = false, grads_done = false;
    bool disk_done = false;   ///< its weights' disk read finished (or it reads none)
    std::vector<char> spill;  ///< micro-batch m's spilled activations are back from the disk (or none)
    int64_t spill_next = 0;   ///< the next micro-batch whose spill read to issue
    bool work_ready = false;  ///< became current: holds every slot early start did not give it
    double retired = -1, finish = -1;
  };
  struct GpuState {
    std::vector<int> order;  ///< its tasks, in dealt order
    size_t cur = 0;          ///< index of the current task in `order`
    double free[5] = {0, 0, 0, 0, 0};
    double busy = 0;
  };
  enum class Kind : uint8_t { upload, compute, download, params, grads, publish, disk_read, disk_write };
  struct Event {
    double time;
    uint64_t seq;
    Kind kind;
    int q;      ///< task (publish: iteration)
    int64_t m;  ///< micro-batch (publish: layer)
    bool operator<(const Event& e) const { return time != e.time ? time > e.time : seq > e.seq; }
  };

  static double xfer(int64_t bytes, double bw) { return bw > 0 ? double(bytes) / bw : 0.0; }

  /// Issues `seconds` of work on GPU g's stream `st` at `now` (FIFO); returns when it ends.
  double issue(int g, SimInterval::Stream st, double now, double seconds, int q, int64_t m, Kind done) {
    GpuState& gp = gpus_[size_t(g)];
    const double a = std::max(now, gp.free[st]), b = a + seconds;
    gp.free[st] = b;
    if (o_.record_timeline && b > a)
      r_.timeline.push_back({g, st, tasks_[size_t(q)].t, tasks_[size_t(q)].s, m, a, b});
    events_.push({b, seq_++, done, q, m});
    return b;
  }

  bool disk_on() const { return o_.disk_read_bandwidth > 0; }

  /// Issues `seconds` on the host's disk (FIFO, shared by every GPU) at `now`: task q's
  /// weights (m = -1) or micro-batch m's spill.
  void issue_disk(double now, double seconds, int q, int64_t m, Kind done) {
    const double a = std::max(now, disk_free_), b = a + seconds;
    disk_free_ = b;
    r_.disk_busy += seconds;
    if (o_.record_timeline && b > a)
      r_.timeline.push_back({-1, SimInterval::disk, tasks_[size_t(q)].t, tasks_[size_t(q)].s, m, a, b});
    events_.push({b, seq_++, done, q, m});
  }

  /// Queues task q's weight read behind every earlier task's; notes its spill reads.
  void queue_reads(Task& tk, int q) {
    const StageCost& c = costs_[size_t(tk.s)];
    tk.disk_done = !disk_on() || c.disk_read_bytes == 0;
    if (!tk.disk_done) weight_reads_.push_back(q);
    const bool spill = disk_on() && c.spill_read_bytes > 0;
    tk.spill.assign(size_t(o_.micro_batches), spill ? 0 : 1);
    if (spill) spill_tasks_.push_back(q);
  }

  /// Issues the disk reads that may start at `now`. Weights in task order, each once its pass
  /// is dealt and the weight read disk_ring back has its parameters on the GPU (its ring
  /// buffer is free again). Spilled activations of a backward task's micro-batch m once the
  /// task is its GPU's current or next, m is at most 2 x act_slots micro-batches ahead of its
  /// compute, and every forward stage of its iteration wrote m. Returns whether one started.
  bool advance_disk(double now) {
    bool moved = false;
    const size_t ring = size_t(o_.disk_ring);
    for (; next_read_ < weight_reads_.size(); ++next_read_) {
      const int q = weight_reads_[next_read_];
      if (!dealt(tasks_[size_t(q)])) break;
      if (next_read_ >= ring && !tasks_[size_t(weight_reads_[next_read_ - ring])].params_done) break;
      issue_disk(now, xfer(costs_[size_t(tasks_[size_t(q)].s)].disk_read_bytes, o_.disk_read_bandwidth), q,
                 -1, Kind::disk_read);
      moved = true;
    }
    while (spill_first_ < spill_tasks_.size() &&
           tasks_[size_t(spill_tasks_[spill_first_])].spill_next >= o_.micro_batches)
      ++spill_first_;
    for (size_t i = spill_first_; i < spill_tasks_.size(); ++i) {
      const int q = spill_tasks_[i];
      Task& tk = tasks_[size_t(q)];
      if (!dealt(tk)) break;
      if (tk.k > gpus_[size_t(tk.gpu)].cur + 1) continue;
      const int64_t ahead = tk.prog.next_compute() + 2 * int64_t(o_.act_slots);
      while (tk.spill_next < o_.micro_batches && tk.spill_next < ahead &&
             spill_written_[size_t(tk.t)][size_t(tk.spill_next)] >= spill_writers_) {
        issue_disk(now, xfer(costs_[size_t(tk.s)].spill_read_bytes, o_.disk_read_bandwidth), q,
                   tk.spill_next++, Kind::disk_read);
        moved = true;
      }
    }
    return moved;
  }

  void admit(int t) {
    admitted_[size_t(t)] = 1;
    newest_dealt_ = std::max(newest_dealt_, t);
    touch_iteration(t);
  }

  /// Every GPU holding a task of iteration t may move again (its pass was dealt, or an update
  /// its parameters wait for was published).
  void touch_iteration(int t) {
    if (t >= T_) return;
    for (int s = 0; s < S_; ++s) touched_[size_t(tasks_[size_t(t * S_ + s)].gpu)] = 1;
  }

  bool dealt(const Task& tk) const { return admitted_[size_t(tk.t)] != 0; }

  /// The parameters of task q may upload: its pass is dealt, a weight buffer is free (the task
  /// weight_buffers back retired; with one buffer the previous task finished), and the
  /// updates it must contain (rule 1: iteration t - 1 - staleness) are published.
  bool params_may_upload(const Task& tk) const {
    if (tk.params_issued || !dealt(tk) || !tk.disk_done) return false;
    const GpuState& gp = gpus_[size_t(tk.gpu)];
    const size_t wb = size_t(o_.weight_buffers);
    if (tk.k >= wb) {
      const Task& back = tasks_[size_t(gp.order[tk.k - wb])];
      if ((wb == 1 ? back.finish : back.retired) < 0) return false;
    }
    // no room beside the previous task under the cap: its weights go up once that task retired
    if (costs_[size_t(tk.s)].params_after_previous && tk.k >= 1 &&
        tasks_[size_t(gp.order[tk.k - 1])].retired < 0)
      return false;
    const int dep = tk.t - 1 - o_.staleness;
    if (dep >= 0) {
      const Stage& st = plan_.stages[size_t(tk.s)];
      for (int l = st.first; l <= st.last; ++l)
        if (!published_[size_t(dep)][size_t(l)]) return false;
    }
    return true;
  }

  bool input_ready(const Task& tk, int64_t m) const {
    return m < o_.micro_batches && (tk.s == 0 ? dealt(tk) : tk.input[size_t(m)] != 0) && tk.spill[size_t(m)];
  }

  void uploads(int q, double now) {
    Task& tk = tasks_[size_t(q)];
    while (tk.prog.upload_wait(input_ready(tk, tk.prog.next_upload())) == StageProgress::Wait::none) {
      const int64_t m = tk.prog.upload_issued(1);
      issue(tk.gpu, SimInterval::act_up, now, xfer(costs_[size_t(tk.s)].act_up_bytes, o_.bandwidth.act_up), q,
            m, Kind::upload);
    }
  }

  /// Makes every move GPU g's tasks may make at `now`; returns whether it made one.
  bool advance(int g, double now) {
    GpuState& gp = gpus_[size_t(g)];
    if (gp.cur >= gp.order.size()) return false;
    const int q = gp.order[gp.cur];
    Task& cur = tasks_[size_t(q)];
    if (!dealt(cur)) return false;
    bool moved = false;
    for (size_t i = gp.cur; i < gp.order.size() && i <= gp.cur + 1; ++i) {
      Task& tk = tasks_[size_t(gp.order[i])];
      if (!params_may_upload(tk)) continue;
      tk.params_issued = moved = true;
      issue(g, SimInterval::param_up, now, xfer(costs_[size_t(tk.s)].param_bytes, o_.bandwidth.param_up),
            gp.order[i], -1, Kind::params);
    }
    if (!cur.work_ready) {  // the current task's work buffers
      cur.work_ready = true;
      for (int j = 0; j < cur.prog.slots() && j < o_.micro_batches; ++j)
        if (!cur.prog.holds_slot(j)) cur.prog.hold_slot(j);
    }
    const int64_t up0 = cur.prog.next_upload(), comp0 = cur.prog.next_compute();
    uploads(q, now);
    while (cur.prog.compute_wait(true, cur.params_done) == StageProgress::Wait::none) {
      const int64_t m = cur.prog.compute_issued();
      issue(g, SimInterval::compute, now, costs_[size_t(cur.s)].compute, q, m, Kind::compute);
      gp.busy += costs_[size_t(cur.s)].compute;
    }
    moved |= up0 != cur.prog.next_upload() || comp0 != cur.prog.next_compute();
    // early start: the prefetched next task takes the slots this one is done with
    if (gp.cur + 1 < gp.order.size() && o_.weight_buffers > 1) {
      const int nq = gp.order[gp.cur + 1];
      Task& next = tasks_[size_t(nq)];
      if (next.params_issued) {
        for (int j = 0; j < next.prog.slots() && j < o_.micro_batches; ++j)
          if (!next.prog.holds_slot(j) && cur.prog.may_hand_over(j)) {
            cur.prog.drop_slot(j);
            next.prog.hold_slot(j);
          }
        const int64_t n0 = next.prog.next_upload();
        uploads(nq, now);
        moved |= n0 != next.prog.next_upload();
      }
    }
    // retired (every micro-batch computed): the next task becomes current, with one buffer
    // only once this one finished
    if (cur.retired >= 0 && (o_.weight_buffers > 1 || cur.finish >= 0)) {
      ++passed_[size_t(cur.t)];
      gp.cur++;
      moved = true;
    }
    return moved;
  }

  /// The GPUs whose current task may be dealt, ascending: those of the tasks of iterations
  /// oldest_ (the oldest with a task its GPU has not moved past) to newest_dealt_. advance() of
  /// any other GPU makes no move, so visiting these alone in the same order changes nothing,
  /// and an event costs the tasks in flight, not the whole pool (a pool of 1024 GPUs took
  /// minutes). The set only shrinks while advance_all runs: gathered once per call.
  const std::vector<int>& movable_gpus() {
    while (oldest_ < T_ && passed_[size_t(oldest_)] == S_) ++oldest_;
    if (oldest_ == gathered_[0] && newest_dealt_ == gathered_[1]) return movable_;
    gathered_[0] = oldest_;
    gathered_[1] = newest_dealt_;
    movable_.clear();
    const int64_t tasks = int64_t(std::max(0, newest_dealt_ - oldest_ + 1)) * S_;
    if (tasks >= o_.gpus) {
      for (int g = 0; g < o_.gpus; ++g) movable_.push_back(g);
      return movable_;
    }
    for (int64_t q = int64_t(oldest_) * S_; q < int64_t(oldest_) * S_ + tasks; ++q) {
      const int g = tasks_[size_t(q)].gpu;
      if (!marked_[size_t(g)]) movable_.push_back(g);
      marked_[size_t(g)] = 1;
    }
    std::sort(movable_.begin(), movable_.end());
    for (int g : movable_) marked_[size_t(g)] = 0;
    return movable_;
  }

  /// Advances the GPUs until none moves. A GPU that made no move makes none until an event
  /// touches its tasks (advance() changes only its own GPU's state), so it is skipped till then.
  void advance_all(double now) {
    const std::vector<int>& gpus = movable_gpus();
    for (bool moved = true; moved;) {
      moved = false;
      moved |= advance_disk(now);
      for (int g : gpus) {
        if (!touched_[size_t(g)]) continue;
        if (advance(g, now)) moved = true;
        else touched_[size_t(g)] = 0;
      }
    }
  }

  void maybe_finish(int q, double now) {
    Task& tk = tasks_[size_t(q)];
    if (tk.finish >= 0 || !tk.grads_done || !tk.prog.outputs_done()) return;
    tk.finish = now;
    r_.iteration_end[size_t(tk.t)] = std::max(r_.iteration_end[size_t(tk.t)], now);
    if (--remaining_[size_t(tk.t)] == 0 && o_.passes_in_flight > 0 && tk.t + o_.passes_in_flight < T_)
      admit(tk.t + o_.passes_in_flight);
  }

  void handle(const Event& e) {
    if (e.kind == Kind::publish) {  // the iteration whose uploads wait for it (rule 1)
      published_[size_t(e.q)][size_t(e.m)] = 1;
      touch_iteration(e.q + 1 + o_.staleness);
      return;
    }
    touched_[size_t(tasks_[size_t(e.q)].gpu)] = 1;
    if (e.kind == Kind::disk_read || e.kind == Kind::disk_write) {
      Task& tk = tasks_[size_t(e.q)];
      if (e.kind == Kind::disk_write) spill_written_[size_t(tk.t)][size_t(e.m)]++;
      else if (e.m < 0) tk.disk_done = true;
      else tk.spill[size_t(e.m)] = 1;
      return;
    }
    Task& tk = tasks_[size_t(e.q)];
    const StageCost& c = costs_[size_t(tk.s)];
    const Stage& st = plan_.stages[size_t(tk.s)];
    switch (e.kind) {
      case Kind::upload: tk.prog.upload_copy_done(e.m); break;
      case Kind::compute:
        tk.prog.computed(e.m, 1);
        issue(tk.gpu, SimInterval::act_down, e.time, xfer(c.act_down_bytes, o_.bandwidth.act_down), e.q, e.m,
              Kind::download);
        if (!tk.prog.retired()) break;
        // retirement: the gradients drain (forward stages have none)
        tk.retired = e.time;
        if (st.kind == StageKind::forward) tk.grads_done = true;
        else
          issue(tk.gpu, SimInterval::grad_down, e.time, xfer(c.grad_bytes, o_.bandwidth.grad_down), e.q, -1,
                Kind::grads);
        break;
      case Kind::download:
        tk.prog.download_copy_done(e.m);
        if (disk_on() && c.spill_write_bytes > 0)  // its spilled share goes to the disk
          issue_disk(e.time, xfer(c.spill_write_bytes, o_.disk_write_bandwidth), e.q, e.m, Kind::disk_write);
        if (tk.s + 1 < S_) {  // the next stage's input
          tasks_[size_t(e.q + 1)].input[size_t(e.m)] = 1;
          touched_[size_t(tasks_[size_t(e.q + 1)].gpu)] = 1;
        }
        maybe_finish(e.q, e.time);
        break;
      case Kind::params: tk.params_done = true; break;
      case Kind::grads:
        tk.grads_done = true;
        for (int l = st.first; l <= st.last; ++l)
          events_.push({e.time + (o_.optimizer_seconds.empty() ? 0.0 : o_.optimizer_seconds[size_t(l)]),
                        seq_++, Kind::publish, tk.t, l});
        maybe_finish(e.q, e.time);
        break;
      case Kind::publish:
      case Kind::disk_read:
      case Kind::disk_write: break;
    }
  }

  const IterationPlan& plan_;
  const std::vector<StageCost>& costs_;
  const SimOptions& o_;
  const int S_, T_;
  std::vector<Task> tasks_;  ///< q = t * S + s
  std::vector<GpuState> gpus_;
  std::vector<std::vector<char>> published_;  ///< [iteration][layer]: its update is on the host
  std::vector<int> remaining_;                ///< per iteration: tasks not finished
  std::vector<char> admitted_;                ///< per iteration: its pass is dealt
  int newest_dealt_ = -1;                     ///< the newest iteration dealt
  std::vector<int> passed_;                   ///< per iteration: tasks their GPU moved past
  int oldest_ = 0;                            ///< the oldest iteration with a task not passed
  std::vector<int> movable_;                  ///< movable_gpus() for the iterations gathered_
  int gathered_[2] = {-1, -1};
  std::vector<char> marked_;                     ///< per GPU: in movable_ (while gathering)
  std::vector<char> touched_;                    ///< per GPU: may move (an event touched it since)
  std::vector<int> weight_reads_;                ///< tasks with a weight read, in task order
  size_t next_read_ = 0;                         ///< the next of weight_reads_ to start
  std::vector<int> spill_tasks_;                 ///< tasks that read spilled activations, in task order
  size_t spill_first_ = 0;                       ///< the first of spill_tasks_ with reads left
  std::vector<std::vector<int>> spill_written_;  ///< [iteration][micro-batch]: forward stages that wrote it
  int spill_writers_ = 0;                        ///< forward stages that spill
  double disk_free_ = 0;                         ///< when the host's disk is next free
  std::priority_queue<Event> events_;
  uint64_t seq_ = 0;
  SimResult r_;
};

}  // namespace

SimResult simulate(const IterationPlan& plan, const std::vector<StageCost>& costs, const SimOptions& o) {
  check(plan, costs, o);
  const int S = int(plan.stages.size()), G = o.gpus;
  // the deal cycle, or for a default replay of a larger pool the kMaxDefaultCycle iterations
  // it covers (an average over whole periods of the passes in flight, as a cycle's is)
  int cycle = G / std::gcd(S, G);
  if (o.iterations == 0) cycle = std::min(cycle, kMaxDefaultCycle);
  const int iterations = o.iterations > 0 ? o.iterations : default_iterations(S, G);
  const int64_t M = o.micro_batches;
  SimResult r = Replay(plan, costs, o, iterations).run();

  const int n = iterations;
  r.makespan = *std::max_element(r.iteration_end.begin(), r.iteration_end.end());
  r.first_iteration_seconds = r.iteration_end[0];
  if (n == 1) {
    r.iteration_seconds = r.makespan;
  } else {
    // average over the second half, in whole deal cycles when possible (the GPU that
    // starts an iteration repeats every `cycle` iterations)
    int span = (n - 1) / 2 / cycle * cycle;
    if (span == 0) span = n - 1 - std::max(0, n / 2 - 1);
    r.iteration_seconds =
        (r.iteration_end[size_t(n - 1)] - r.iteration_end[size_t(n - 1 - span)]) / double(span);
  }
  // the host's one disk does its work of every iteration in turn: a finite replay's last
  // iterations, with no next iteration's reads queued behind them, must not count as faster
  if (o.disk_read_bandwidth > 0) r.iteration_seconds = std::max(r.iteration_seconds, r.disk_busy / double(n));
  double busy = 0, work = 0;
  for (double b : r.gpu_busy) {
    r.gpu_idle.push_back(r.makespan - b);
    busy += b;
  }
  for (auto& c : costs) work += double(M) * c.compute;
  r.bubble_ratio = r.makespan > 0 ? 1 - busy / (double(G) * r.makespan) : 0;
  // clamp rounding noise: whole deal cycles cannot take less than the work divided by G
  r.steady_bubble_ratio =
      r.iteration_seconds > 0 ? std::max(0.0, 1 - work / (double(G) * r.iteration_seconds)) : 0;
  return r;
}

double predict_iteration_seconds(const IterationPlan& plan, const std::vector<StageCost>& costs, int gpus,
                                 int64_t micro_batches, SimOptions base) {
  base.gpus = gpus;
  base.micro_batches = micro_batches;
  base.record_timeline = false;
  return simulate(plan, costs, base).iteration_seconds;
}

nlohmann::json sim_trace_json(const SimResult& r, const IterationPlan& plan) {
  static const char* stream_name[] = {"compute", "act_up", "act_down", "param_up", "grad_down", "disk"};
  std::vector<TraceInterval> iv;
  iv.reserve(r.timeline.size());
  for (auto& i : r.timeline) {
    const Stage& st = plan.stages.at(size_t(i.stage));
    const char c = st.kind == StageKind::forward ? 'F' : st.kind == StageKind::tail ? 'T' : 'B';
    std::string name = fmt::format("{}{} L{}-{}", c, i.stage, st.first, st.last);
    if (i.micro >= 0) name += fmt::format(" mb{}", i.micro);
    iv.push_back(
        {i.gpu < 0 ? std::string("host.disk") : fmt::format("gpu{}.{}", i.gpu, stream_name[int(i.stream)]),
         std::move(name),
         i.start,
         i.end,
         {{"iteration", i.iteration}, {"stage", i.stage}, {"micro_batch", double(i.micro)}}});
  }
  return chrome_trace_json(iv);
}

void write_sim_trace(const std::string& path, const SimResult& r, const IterationPlan& plan) {
  write_trace_file(path, sim_trace_json(r, plan));
}

}  // namespace rp
