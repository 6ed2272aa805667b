// TrainingRun (trainer/training_run.hpp): the step loop, the wait for each step under a stop
// request, and each step's report (metrics files, TensorBoard, on_step).
#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "base/counted.hpp"
#include "trainer/training_run.hpp"

namespace rp {

/// Runs the steps; returns the number of steps closed (t: steps 0..t-1). A stop request ends
/// it before the next step is closed, also while it waits for a step.
int64_t TrainingRun::loop() {
  const int64_t per_pass = spec_.sequences_per_step / spec_.accumulation;
  int64_t t = start_;
  while (t < spec_.steps && !early_stop_at_ && !stop_agreed()) {
    int64_t target_tokens = 0;  // of the whole step, over every replica's passes
    for (int64_t a = 0; a < spec_.accumulation; ++a) {
      // every replica reads every pass (the same data position everywhere) and trains its own
      const TokenBatch b = data_->next(per_pass);
      for (int32_t y : b.targets) target_tokens += y >= 0;
      if (!my_pass(replicas_.get(), a, spec_.accumulation)) continue;
      if (cb_.on_batch) cb_.on_batch(t, a, b);
      if (b.positions.empty()) session_->forward_backward(b.ids, b.targets);
      else session_->forward_backward(b.ids, b.targets, b.positions);
    }
    if (replicas_) session_->step(spec_.lr_schedule.at(t), target_tokens);
    else session_->step(spec_.lr_schedule.at(t));
    const int64_t k = t++;  // step k is closed
    const bool last = k + 1 == spec_.steps;
    // no evaluation is queued once a stop is under way: its passes would hold up the steps in flight
    const bool eval_step = !eval_batches_.empty() && !stopping() &&
                           (last || (spec_.eval_every > 0 && (k + 1) % spec_.eval_every == 0));
    if (eval_step) submit_eval(k + 1);
    const bool save_now = spec_.save_every > 0 && (k + 1) % spec_.save_every == 0 && !last;
    const bool eval_now = cb_.on_eval && cb_.eval_every > 0 && (k + 1) % cb_.eval_every == 0 && !last;
    // early stopping decides at each evaluation, before the next step is closed
    const bool decide_now = spec_.early_stopping && eval_step && !last;
    if (save_now || eval_now || decide_now) {
      // drain before the next step's passes: the pipeline refills afterwards, and the
      // results do not change (step k+1 computes with the weights of step k-1 anyway)
      if (!report_through(k)) break;
      if (early_stop_at_) break;  // finish() saves final/ as at a normal end
      const double p0 = elapsed();
      if (save_now) save(fmt::format("checkpoint-{}", k + 1));
      if (eval_now) evaluate(k + 1);
      paused_ += elapsed() - p0;  // not the next step's time
    } else if (k > start_ && reported_ < k - 1) {
      // Report one step behind: with the staleness-1 optimizer the next pass is already
      // queued while step k-1's update finishes.
      if (!report(k - 1)) break;
    }
  }
  return t;
}

/// Waits for step t, watching the stop token: nullopt once a stop was requested and step t
/// is not done by spec.stop_timeout_s after the request (a stalled run must still stop).
/// Outside a stop it waits as long as the step takes (the watchdog reports stalls).
/// Replicas: only an agreed stop bounds the wait (await_together); a request this replica
/// alone has seen waits for the next agreement, at the next step.
std::optional<StepResult> TrainingRun::await(int64_t t) {
  if (replicas_ && stop_agreed_) return await_together(t);
  for (;;) {
    arm_stop_deadline();
    if (auto r = session_->wait_for(t, wait_slice())) return r;
    if (stop_deadline_ && Clock::now() >= *stop_deadline_) return std::nullopt;
  }
}

/// Replicas after an agreed stop: step t counts as done when every replica has it, and is
/// abandoned by all of them once any replica passed spec.stop_timeout_s after the agreement
/// without all having it. One small exchange per slice of at most 0.1 s, so every replica
/// takes the same decision (they then make the same exchanges and save the same steps).
std::optional<StepResult> TrainingRun::await_together(int64_t t) {
  std::optional<StepResult> got;
  for (;;) {
    if (!got) {
      const double left = std::chrono::duration<double>(*stop_deadline_ - Clock::now()).count();
      got = session_->wait_for(t, std::clamp(left, 0.0, 0.1));
    }
    const bool late = Clock::now() >= *stop_deadline_;
    const std::vector<double> n = sum_over(replicas_.get(), {got ? 1.0 : 0.0, late ? 1.0 : 0.0});
    if (n[0] >= double(replica_count())) return got;
    if (n[1] > 0) return std::nullopt;
  }
}

/// Waits for step t and reports it (metrics.csv, then on_step); false when a stop abandoned it.
bool TrainingRun::report(int64_t t) {
  const std::optional<StepResult> got = await(t);
  if (!got) return false;
  StepResult r = *got;
  // the loss and router statistics over the global batch: sums over the replicas, in rank order
  combine_step(replicas_.get(), r, session_->layout().config.num_experts);
  const double now = elapsed();
  // the steps' own time: evaluations and checkpoints since the last report are not theirs
  const double dt = std::max(now - last_report_ - paused_, 0.0);
  const int64_t nsteps = t - reported_;
  last_report_ = now;
  paused_ = 0;
  clock_->steps(t + 1, nsteps, dt);
  reported_ = t;
  StepReport s;
  s.step = t + 1;
  s.total_steps = spec_.steps;
  s.epoch = epoch_at(t + 1);
  s.first_step = start_;
  s.loss = r.tokens > 0 ? r.loss_sum / r.tokens : 0;
  s.tokens = spec_.sequences_per_step * spec_.seq_len;
  s.target_tokens = int64_t(r.tokens);
  s.tokens_per_s = dt > 0 ? double(s.tokens * nsteps) / dt : 0;
  s.lr = spec_.lr_schedule.at(t);
  s.grad_norm = r.grad_norm;
  s.loss_scale = r.loss_scale;
  s.skipped = r.skipped;
  if (!r.expert_tokens.empty()) {
    double total = 0;
    for (double x : r.expert_tokens) total += x;
    const double ideal = total / double(r.expert_tokens.size());
    const auto [lo, hi] = std::minmax_element(r.expert_tokens.begin(), r.expert_tokens.end());
    s.experts = int64_t(r.expert_tokens.size());
    s.aux_loss = r.moe_aux_loss;
    s.expert_load_min = ideal > 0 ? *lo / ideal : 0;
    s.expert_load_max = ideal > 0 ? *hi / ideal : 0;
  }
  s.elapsed_s = now;
  if (pending_eval_.count(t + 1)) {
    // the wait for the evaluation passes queued behind this step: charged to neither step
    const double e0 = elapsed();
    const bool finished = collect_eval(t + 1, s, false);
    agree_eval(s);  // replicas: replica 0's evaluation, so that all rank and stop alike
    const double waited = elapsed() - e0;
    paused_ += waited;
    if (finished) clock_->evaluation(waited);
    else
      spdlog::warn(
          "stop: the evaluation after step {} did not finish within {:g} s of the stop request; step {} is "
          "reported without it",
          t + 1, spec_.stop_timeout_s, t + 1);
  }
  last_loss_ = s.loss;
  if (s.evaluated) last_eval_loss_ = s.eval_loss, last_eval_step_ = s.step;
  if (s.evaluated && series_.evaluated(t + 1, s.eval_loss) && !early_stop_at_ && t + 1 < spec_.steps) {
    const EarlyStopState& es = series_.series().early_stopping;
    early_stop_at_ = t + 1;
    early_stop_reason_ = fmt::format(
        "early stopping at step {}: {} did not improve on its best {:.6g} by more than {:g} in {} "
        "evaluation(s) in "
        "a row (patience {})",
        t + 1, series_.metric(), es.best.value_or(0), spec_.early_stopping->threshold, es.bad_evals,
        spec_.early_stopping->patience);
  }
  s.eta_s = clock_->eta(t + 1, evals_after(t + 1));
  s.mfu = s.tokens_per_s * mfu_per_token_per_s_;
  s.replica = replicas_ ? replicas_->rank() : 0;
  s.reduce_wait_s = r.reduce_wait_s;
  reduce_wait_total_ += r.reduce_wait_s;
  try {  // a full disk fails these writes first: the error says what --resume can start from
    if (metrics_) metrics_->write(s);
    if (jsonl_) jsonl_->write(s);
    log_scalars(s);
  } catch (const std::exception&) {
    rethrow_with_resume_hint();
  }
  if (cb_.on_step) cb_.on_step(s);
  for (const auto& w : watch_.check(s, kept_checkpoint())) spdlog::warn("{}", w);
  return true;
}

bool TrainingRun::report_through(int64_t t) {
  for (int64_t k = reported_ + 1; k <= t; ++k)
    if (!report(k)) return false;
  return true;
}

/// After the loop (t steps closed): reports every closed step. False when a stop request
/// abandoned some: they did not finish within spec.stop_timeout_s of it.
bool TrainingRun::drain(int64_t t) {
  if (stopping() && reported_ < t - 1)
    spdlog::info("stop requested: finishing {} in flight (at most {:g} s)",
                 counted(t - 1 - reported_, "step"), spec_.stop_timeout_s);
  return report_through(t - 1);
}

/// Passes over the training sequences after `steps_done` steps.
double TrainingRun::epoch_at(int64_t steps_done) const {
  const int64_t n = data_ ? data_->stats().sequences : 0;
  if (n <= 0) return 0;
  return (double(epoch_origin_) + double(steps_done - start_) * double(spec_.sequences_per_step)) / double(n);
}

/// TensorBoard scalars of a step (tags train/..., eval/...).
void TrainingRun::log_scalars(const StepReport& s) {
  if (!tb_) return;
  tb_->scalar("train/loss", s.loss, s.step);
  tb_->scalar("train/lr", s.lr, s.step);
  tb_->scalar("train/tokens_per_s", s.tokens_per_s, s.step);
  if (s.mfu > 0) tb_->scalar("train/mfu", s.mfu, s.step);
  tb_->scalar("train/grad_norm", s.grad_norm, s.step);
  tb_->scalar("train/epoch", s.epoch, s.step);
  if (spec_.loss_scaling) tb_->scalar("train/loss_scale", s.loss_scale, s.step);
  if (s.experts > 0) {
    tb_->scalar("train/aux_loss", s.aux_loss, s.step);
    tb_->scalar("train/expert_load_min", s.expert_load_min, s.step);
    tb_->scalar("train/expert_load_max", s.expert_load_max, s.step);
  }
  if (s.evaluated) {
    tb_->scalar("eval/loss", s.eval_loss, s.step);
    tb_->scalar("eval/perplexity", s.eval_perplexity, s.step);
  }
}

/// Whether to stop before the next step. Replicas decide together (one exchange per step),
/// so they all close the same steps: a stop asked of any of them (a signal to one rank, or
/// to all) stops every one at the same step boundary; from then on the decision holds.
bool TrainingRun::stop_agreed() {
  if (!replicas_) return stop_.stop_requested();
  if (stop_agreed_) return true;
  const std::vector<std::vector<double>> all = replicas_->allgather({stop_.stop_requested() ? 1.0 : 0.0});
  for (size_t q = 0; q < all.size(); ++q)
    if (all[q].at(0) > 0) stop_ranks_.push_back(int(q));
  if (stop_ranks_.empty()) return false;
  stop_agreed_ = true;
  stop_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(spec_.stop_timeout_s));
  spdlog::info("stop requested on replica {}: all {} replicas stop after step {}",
               fmt::join(stop_ranks_, ", "), replica_count(), session_->steps_closed());
  return true;
}

}  // namespace rp
