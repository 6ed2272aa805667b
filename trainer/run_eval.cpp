// TrainingRun (trainer/training_run.hpp): the evaluation set's passes between steps, the
// on_eval callback, and the sample_prompt answers before and after fine-tuning.
#include <cmath>

#include <spdlog/spdlog.h>

#include "base/host_resources.hpp"
#include "roundpipe/adapter.hpp"
#include "trainer/lora_setup.hpp"
#include "trainer/sample.hpp"
#include "trainer/training_run.hpp"

namespace rp {

/// Evaluations of the evaluation set still to run after `steps_done` steps (every
/// eval_every steps and after the last).
int64_t TrainingRun::evals_after(int64_t steps_done) const {
  if (eval_batches_.empty() || steps_done >= spec_.steps) return 0;
  const int64_t k = spec_.eval_every;
  if (k <= 0) return 1;
  return spec_.steps / k - steps_done / k + (spec_.steps % k != 0 ? 1 : 0);
}

/// Evaluation passes after `steps_done` steps, queued in the pipeline right behind that step's
/// passes; report() collects them with the step's row.
void TrainingRun::submit_eval(int64_t steps_done) {
  auto& ids = pending_eval_[steps_done];
  for (const TokenBatch& b : eval_batches_)
    ids.push_back(b.positions.empty() ? session_->evaluate(b.ids, b.targets)
                                      : session_->evaluate(b.ids, b.targets, b.positions));
}

/// Waits for the evaluation passes of `steps_done` and fills the eval fields of `into`. A stop
/// bounds the wait like a step's: false (nothing filled) once the stop deadline passed, or as
/// soon as a stop is seen with `drop_at_stop`. The passes left go on in the runtime; nothing
/// waits for them (they change no weight, and the session's teardown is bounded).
/// During a stop, every evaluation pass that finishes moves the deadline to stop_timeout_s
/// from then: the steps queued behind the evaluation in the pipeline can only finish after it,
/// so an evaluation that makes progress must not use up their time (a finished step would be
/// abandoned unsaved); one whose pass makes no progress for stop_timeout_s still ends the wait.
bool TrainingRun::collect_eval(int64_t steps_done, StepReport& into, bool drop_at_stop) {
  const std::vector<int64_t> ids = std::move(pending_eval_.at(steps_done));
  pending_eval_.erase(steps_done);
  double sum = 0, tokens = 0;
  for (int64_t id : ids) {
    for (;;) {
      arm_stop_deadline();
      if (stop_deadline_ && (drop_at_stop || Clock::now() >= *stop_deadline_)) return false;
      if (const std::optional<EvalResult> e = session_->wait_eval_for(id, wait_slice())) {
        sum += e->loss_sum;
        tokens += e->tokens;
        if (stop_deadline_ && !replicas_) stop_deadline_ = Clock::now() + stop_budget();
        break;
      }
    }
  }
  into.evaluated = true;
  into.eval_tokens = int64_t(tokens);
  into.eval_loss = tokens > 0 ? sum / tokens : 0;
  into.eval_perplexity = std::exp(into.eval_loss);
  return true;
}

/// A fresh run's evaluation of the initial weights: the reference the later ones fall from
/// (logged, and eval/loss at step 0 for TensorBoard).
void TrainingRun::evaluate_before_training() {
  if (eval_batches_.empty() || start_ > 0) return;
  const double e0 = elapsed();
  submit_eval(0);
  StepReport r;
  if (!collect_eval(0, r, true)) {
    spdlog::info("stop requested: the evaluation before training is left unfinished");
    return;
  }
  clock_->evaluation(elapsed() - e0);  // the pipeline was empty: the set's own time
  spdlog::info("eval before training: loss {:.4f} (ppl {:.2f}) over {} tokens", r.eval_loss,
               r.eval_perplexity, r.eval_tokens);
  if (jsonl_) jsonl_->eval_before_training(r.eval_loss, r.eval_perplexity);
  last_eval_loss_ = r.eval_loss;
  last_eval_step_ = 0;
  if (tb_) {
    tb_->scalar("eval/loss", r.eval_loss, 0);
    tb_->scalar("eval/perplexity", r.eval_perplexity, 0);
  }
}

/// Replicas evaluate the whole set each; the decisions taken from it (the best checkpoint,
/// early stopping) use replica 0's result on every replica, so they cannot part.
void TrainingRun::agree_eval(StepReport& s) {
  if (!replicas_) return;
  const bool zero = replicas_->rank() == 0;
  const std::vector<double> v =
      sum_over(replicas_.get(), {zero && s.evaluated ? 1.0 : 0.0, zero && s.evaluated ? s.eval_loss : 0.0,
                                 zero && s.evaluated ? double(s.eval_tokens) : 0.0});
  s.evaluated = v[0] > 0;
  s.eval_loss = v[1];
  s.eval_tokens = int64_t(v[2]);
  s.eval_perplexity = std::exp(s.eval_loss);
}

/// The evaluation point between steps (TrainerCallbacks::on_eval): the pipeline is drained.
void TrainingRun::evaluate(int64_t steps_done) {
  session_->synchronize();
  if (session_->layout().lora) {  // the callback sees the model the adapters make
    const PlainModel m = merged_model(*session_);
    cb_.on_eval(EvalContext{steps_done, m.layout, m.groups});
    return;
  }
  cb_.on_eval(EvalContext{steps_done, session_->layout(), session_->master_weights()});
}

std::string TrainingRun::sample_text(const char* when) {
  if (spec_.sample_prompt.empty() || !leader()) return {};
  if (stop_.stop_requested()) {  // a stop is not kept waiting for a sample
    spdlog::info("stop requested: the sample {} is skipped", when);
    return {};
  }
  session_->synchronize();
  std::optional<PlainModel> merged;  // LoRA: the base with the adapters folded in
  if (session_->layout().lora) {
    // the generator reads fp32 weights: a base that fits the host only in its storage form
    // skips the sample instead of running out of memory
    const double need = 4.0 * double(session_->layout().config.num_parameters());
    const size_t avail = host_available_bytes();
    if (avail > 0 && need > 0.9 * double(avail)) {
      spdlog::warn("sample {} skipped: the merged fp32 model needs about {} of host memory, {} is available",
                   when, byte_text(need), byte_text(double(avail)));
      return {};
    }
    merged = merged_model(*session_);
  }
  const ModelLayout& layout = merged ? merged->layout : session_->layout();
  std::vector<const float*> ptrs;
  for (const auto& g : merged ? merged->groups : session_->master_weights()) ptrs.push_back(g.data());
  GeneratorOptions go;
  go.backend = session_->device_name().rfind("cuda", 0) == 0 ? "cuda" : "cpu";
  go.dtype = parse_dtype(spec_.compute_dtype);
  go.max_context = 1024;
  Generator gen(layout, ptrs, go);
  SampleRequest r;
  r.messages = {{"user", spec_.sample_prompt, {}}};
  r.chat_template = spec_.chat_template;
  r.generate.max_new_tokens = 64;
  r.interrupt = [this] { return stop_.stop_requested(); };  // between tokens
  const SampleResult res = sample(gen, model_, r);
  if (res.interrupted) {
    spdlog::info("stop requested: the sample {} is left unfinished", when);
    return {};
  }
  spdlog::info("sample {}: {} -> {}", when, spec_.sample_prompt, res.text);
  return res.text;
}

}  // namespace rp
