#include "scheduler/step_ledger.hpp"

#include <chrono>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

StepLedger::StepLedger(Options o) : o_(std::move(o)) {
  if (o_.pass_slots < 1 || o_.staleness < 0 || o_.num_groups < 0)
    throw std::invalid_argument(fmt::format(
        "StepLedger: expected pass_slots >= 1, staleness >= 0 and num_groups >= 0, got {}, {} and {}",
        o_.pass_slots, o_.staleness, o_.num_groups));
  for (int g = 0; g < o_.num_groups; ++g) {
    const bool frozen = size_t(g) < o_.frozen.size() && o_.frozen[size_t(g)];
    norm_index_.push_back(frozen ? -1 : trainable_++);
  }
  if (trainable_ > 0) norms_ = std::make_unique<StepNormReducer>(trainable_);
  for (int i = o_.pass_slots - 1; i >= 0; --i) free_slots_.push_back(i);
  if (o_.loss_scaler)
    for (int64_t t = 0; t <= o_.staleness; ++t) scale_for_step_[t] = o_.loss_scaler->scale();
}

double StepLedger::now() const {
  if (o_.clock) return o_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int StepLedger::trainable_index(int group) const {
  return group >= 0 && size_t(group) < norm_index_.size() ? norm_index_[size_t(group)] : -1;
}

StepResult StepLedger::result_of(int64_t step, const Step& s, const std::string& err) const {
  StepResult r{step, s.loss_sum, s.loss_count, s.seconds, err};
  r.grad_norm = s.decision.grad_norm;
  r.skipped = s.decision.skip;
  r.loss_scale = s.loss_scale;
  r.moe_aux_loss = s.loss_count > 0 ? s.aux_weighted / s.loss_count : 0.0;
  r.expert_tokens = s.expert_tokens;
  return r;
}

// ---- passes ----------------------------------------------------------------------------------

void StepLedger::submit_pass(int64_t step, int64_t eval, double target_tokens) {
  auto& s = steps_[step];
  if (s.passes_submitted == 0) s.t_first = now();
  s.passes_submitted++;
  if (eval < 0) s.tokens += target_tokens;
  else evals_[eval];
  queue_.push_back({step, eval});
}

std::optional<PassDeal> StepLedger::next_deal() {
  if (queue_.empty() || free_slots_.empty() || !failed_.empty()) return std::nullopt;
  PassDeal d;
  d.step = queue_.front().step;
  d.eval = queue_.front().eval;
  if (o_.loss_scaler) {
    auto sc = scale_for_step_.find(d.step);
    if (sc == scale_for_step_.end()) return std::nullopt;  // decided with step t-1-staleness
    d.loss_scale = sc->second;
  }
  queue_.pop_front();
  d.slot = free_slots_.back();
  free_slots_.pop_back();
  d.pass = next_pass_++;
  return d;
}

void StepLedger::dealt(PassDeal& d, int stages, const std::vector<int>& uploads,
                       const std::vector<int>& grads, std::vector<LedgerAction>& out) {
  passes_[d.pass] = Pass{d.step, d.eval, d.slot, 0, stages};
  auto& s = steps_[d.step];
  if (s.uploads.size() < uploads.size()) s.uploads.resize(uploads.size(), 0);
  if (s.grads.size() < grads.size()) s.grads.resize(grads.size(), 0);
  for (size_t g = 0; g < uploads.size(); ++g) s.uploads[g] += uploads[g];
  for (size_t g = 0; g < grads.size(); ++g) s.grads[g] += grads[g];
  s.passes_dealt++;
  d.dropout_pass = d.eval >= 0 ? -1 : (d.step << 16) + s.train_passes_dealt++;
  s.loss_scale = d.loss_scale;
  close_if_ready(d.step, out);
}

void StepLedger::stage_done(int64_t pass, const StageReport& r, std::vector<LedgerAction>& out) {
  auto it = passes_.find(pass);
  if (it == passes_.end()) return;
  Pass& p = it->second;
  auto& s = steps_[p.step];
  if (p.eval >= 0) {
    evals_[p.eval].loss_sum += r.loss_sum;
    evals_[p.eval].loss_count += r.loss_count;
  } else {
    s.loss_sum += r.loss_sum;
    s.loss_count += r.loss_count;
    s.aux_weighted += r.aux_weighted;
    if (s.expert_tokens.size() < r.expert_tokens.size()) s.expert_tokens.resize(r.expert_tokens.size(), 0.0);
    for (size_t e = 0; e < r.expert_tokens.size(); ++e) s.expert_tokens[e] += r.expert_tokens[e];
  }
  if (++p.stages_done < p.stages) return;
  const int64_t step = p.step, eval = p.eval;
  if (eval >= 0) {
    auto& ev = evals_[eval];
    ev.done = true;
    LedgerAction a;
    a.kind = LedgerAction::Kind::eval_done;
    a.step = step;
    a.eval_result = EvalResult{eval, ev.loss_sum, ev.loss_count, ""};
    out.push_back(std::move(a));
  }
  free_slots_.push_back(p.slot);
  passes_.erase(it);
  s.passes_done++;
  finish_if_done(step, out);
  out.push_back(LedgerAction{});  // deal: a slot is free
}

// ---- steps -----------------------------------------------------------------------------------

void StepLedger::close_requested(int64_t step, double lr, double tokens, std::vector<LedgerAction>& out) {
  auto& s = steps_[step];
  s.close_requested = true;
  s.lr = lr;
  s.scale_tokens = tokens;
  close_if_ready(step, out);
}

void StepLedger::close_if_ready(int64_t step, std::vector<LedgerAction>& out) {
  auto& s = steps_[step];
  if (s.closed || !s.close_requested || s.passes_dealt < s.passes_submitted) return;
  s.closed = true;
  // A step without target tokens has no gradient: it is skipped like an inf/NaN step (an
  // AdamW call with a zero gradient would still move the weights by momentum and decay).
  const double tokens = s.norm_tokens();
  if (tokens <= 0) s.decision.skip = true;
  LedgerAction a;
  a.kind = LedgerAction::Kind::close_step;
  a.step = step;
  a.passes = s.passes_submitted;
  a.grad_scale = tokens > 0 ? float(1.0 / tokens) : 0.f;
  a.lr = s.lr;
  a.uploads = std::make_shared<const std::vector<int>>(s.uploads);
  a.grads = std::make_shared<const std::vector<int>>(s.grads);
  out.push_back(std::move(a));
  finish_if_done(step, out);
}

void StepLedger::grad_sumsq(int64_t step, int group, double sumsq, std::vector<LedgerAction>& out) {
  // summed in group order over the trainable groups (frozen ones send none)
  if (!norms_ || !norms_->add(step, trainable_index(group), sumsq)) return;
  // every group reported (only after CloseStep, so the token count is final)
  auto& s = steps_[step];
  const double total = norms_->take(step);
  const double tokens = s.norm_tokens();
  const double base = tokens > 0 ? 1.0 / tokens : 1.0;
  s.decision = decide_step(total, base, o_.max_grad_norm, o_.loss_scaler, s.loss_scale);
  if (tokens <= 0) s.decision.skip = true, s.decision.grad_scale = 0.f;
  LedgerAction a;
  a.kind = LedgerAction::Kind::step_scale;
  a.step = step;
  a.skip = s.decision.skip;
  a.grad_scale = s.decision.grad_scale;
  out.push_back(std::move(a));
  if (o_.loss_scaler) {
    // decisions arrive in step order (a group's step t+1 sum follows its step t update)
    scale_for_step_[step + 1 + o_.staleness] = o_.loss_scaler->scale();
    scale_for_step_.erase(scale_for_step_.begin(), scale_for_step_.lower_bound(step));
    out.push_back(LedgerAction{});  // deal: a step's scale is known now
  }
}

void StepLedger::group_updated(int64_t step, int group, double sumsq, std::vector<LedgerAction>& out) {
  auto& s = steps_[step];
  s.groups_updated++;
  // unguarded steps: the global norm from the update jobs' sums, in group order (the last
  // group's update completes the step, so it is known before the step is done)
  const int k = trainable_index(group);
  if (!o_.guard && k >= 0 && norms_ && norms_->add(step, k, sumsq)) {
    const double total = norms_->take(step), tokens = s.norm_tokens();
    s.decision.grad_norm = std::sqrt(total) * (tokens > 0 ? 1.0 / tokens : 0.0);
  }
  finish_if_done(step, out);
}

void StepLedger::finish_if_done(int64_t step, std::vector<LedgerAction>& out) {
  auto& s = steps_[step];
  // every group updated, and every pass's every stage reported (the tail's report carries the
  // loss and may arrive after the last GroupUpdated it caused)
  if (s.done || !s.closed || s.groups_updated < trainable_ || s.passes_done < s.passes_submitted) return;
  s.done = true;
  s.seconds = now() - s.t_first;
  LedgerAction a;
  a.kind = LedgerAction::Kind::step_done;
  a.step = step;
  a.step_result = result_of(step, s, "");
  out.push_back(std::move(a));
}

// ---- results ---------------------------------------------------------------------------------

std::optional<StepResult> StepLedger::step_result(int64_t step) {
  auto& s = steps_[step];
  if (!failed_.empty()) return result_of(step, s, failed_);
  if (s.done) return result_of(step, s, "");
  return std::nullopt;
}

std::optional<EvalResult> StepLedger::eval_result(int64_t id) {
  auto& ev = evals_[id];
  if (!failed_.empty()) return EvalResult{id, ev.loss_sum, ev.loss_count, failed_};
  if (ev.done) return EvalResult{id, ev.loss_sum, ev.loss_count, ""};
  return std::nullopt;
}

bool StepLedger::fail(const std::string& what) {
  if (!failed_.empty()) return false;
  failed_ = what.empty() ? std::string("failed") : what;
  return true;
}

// ---- loss scales -----------------------------------------------------------------------------

bool StepLedger::resume_at(int64_t step, const std::vector<float>& scales) {
  if (!steps_.empty() || next_pass_ != 0) return false;
  if (!o_.loss_scaler) return true;
  if (scales.size() != size_t(o_.staleness + 1)) return false;
  scale_for_step_.clear();
  for (size_t i = 0; i < scales.size(); ++i) scale_for_step_[step + int64_t(i)] = scales[i];
  return true;
}

std::vector<float> StepLedger::loss_scales_from(int64_t step) const {
  std::vector<float> out;
  for (int64_t t = step; t <= step + o_.staleness; ++t) {
    auto it = scale_for_step_.find(t);
    if (it == scale_for_step_.end()) break;
    out.push_back(it->second);
  }
  return out;
}

// ---- inspection ------------------------------------------------------------------------------

bool StepLedger::busy() const {
  if (!queue_.empty() || !passes_.empty()) return true;
  for (auto& [k, s] : steps_)
    if (s.close_requested && !s.done) return true;
  return false;
}

std::string StepLedger::describe() const {
  std::vector<std::string> out;
  for (auto& [k, s] : steps_) {
    if (s.done) continue;
    std::vector<std::string> passes;
    for (auto& [p, pi] : passes_)
      if (pi.step == k)
        passes.push_back(fmt::format("pass {} {}/{} stages done", p, pi.stages_done, pi.stages));
    const int64_t queued = s.passes_submitted - s.passes_dealt;
    if (queued > 0)
      passes.push_back(fmt::format("{} pass(es) waiting for a pass slot or the step's loss scale", queued));
    out.push_back(fmt::format(
        "step {}{}: {}{}, {} of {} groups updated", k, s.close_requested ? "" : " (open)",
        passes.empty() ? std::string("all passes done") : fmt::format("{}", fmt::join(passes, ", ")),
        s.closed ? std::string() : std::string(" (not closed towards the shards yet)"), s.groups_updated,
        trainable_));
  }
  if (!failed_.empty()) out.push_back("failed: " + failed_);
  return out.empty() ? "nothing in flight" : fmt::format("{}", fmt::join(out, "; "));
}

}  // namespace rp
