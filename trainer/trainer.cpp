// rp::Trainer (roundpipe/trainer.hpp): one training run from a spec.
#include "roundpipe/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "base/atomic_file.hpp"
#include "base/counted.hpp"
#include "base/host_resources.hpp"
#include "model/model_flops.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/session.hpp"
#include "scheduler/cost_model.hpp"
#include "trainer/async_range.hpp"
#include "trainer/checkpoint_bundle.hpp"
#include "trainer/checkpoint_rotation.hpp"
#include "trainer/disk_space.hpp"
#include "trainer/lora_setup.hpp"
#include "trainer/metrics.hpp"
#include "trainer/model_card.hpp"
#include "trainer/progress_clock.hpp"
#include "trainer/replica_run.hpp"
#include "trainer/run_setup.hpp"
#include "trainer/sample.hpp"
#include "trainer/save_targets.hpp"
#include "trainer/step_watch.hpp"
#include "trainer/tensorboard.hpp"

namespace rp {
namespace {

/// One run() of a Trainer: what it loaded and where the loop is.
class Run {
 public:
  Run(const TrainSpec& spec, const TrainerCallbacks& cb, const StopToken& stop)
      : spec_(spec),
        cb_(cb),
        stop_(stop),
        t0_(std::chrono::steady_clock::now()),
        watch_(spec_),
        series_(spec_) {}
  TrainResult execute();

 private:
  using Clock = std::chrono::steady_clock;
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  std::string path(const std::string& name) const { return spec_.output_dir + "/" + name; }
  void setup();
  void start_session(const ModelLayout& layout, std::vector<std::vector<float>> weights,
                     std::vector<std::vector<uint8_t>> frozen, std::optional<FrozenSource> source);
  int64_t loop();
  std::optional<StepResult> await(int64_t t);
  std::optional<StepResult> await_together(int64_t t);
  bool report(int64_t t);
  bool report_through(int64_t t);
  bool drain(int64_t t);
  void save(const std::string& name);
  void save_profile();
  void save_merged();
  void evaluate(int64_t steps_done);
  void discard_unstarted_outputs();
  /// The checkpoint an error leaves as the last good one ("" when there is none).
  std::string kept_checkpoint() const {
    return !last_checkpoint_.empty() ? last_checkpoint_ : resume_ ? resume_->dir : "";
  }
  TrainResult finish(int64_t t);
  TrainResult abandon(int64_t t);

  TrainSpec spec_;  // a copy: `epochs` fills in steps once the data is loaded
  const TrainerCallbacks& cb_;
  const StopToken stop_;
  const std::chrono::steady_clock::time_point t0_;
  std::optional<ResumePoint> resume_;
  LoadedModel model_;  // config, tokenizer and chat template (the tensors are dropped once copied)
  BaseModelRef base_;  // the base model as the adapter folders and model cards name it
  std::optional<double> last_loss_, last_eval_loss_;  // of the last reported step / evaluation
  int64_t last_eval_step_ = 0;
  /// Writes the model card of folder `dir` into the new folder about to replace it.
  std::function<void(const std::string&)> card_writer(const std::string& dir,
                                                      ModelCardFacts::Kind kind) const;
  std::optional<TokenStream> data_;
  std::vector<TokenBatch> eval_batches_;                  ///< the evaluation set (empty: no evaluation)
  std::map<int64_t, std::vector<int64_t>> pending_eval_;  ///< steps done -> evaluation passes in flight
  void submit_eval(int64_t steps_done);
  bool collect_eval(int64_t steps_done, StepReport& into, bool drop_at_stop);
  void evaluate_before_training();
  /// spec.sample_prompt's answer with the session's master weights ("" without a prompt).
  std::string sample_text(const char* when);  // "" on replicas other than 0
  std::string sample_before_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<MetricsFile> metrics_;
  std::unique_ptr<MetricsJsonl> jsonl_;  // spec metrics_jsonl
  std::unique_ptr<TensorBoardWriter> tb_;
  double mfu_per_token_per_s_ = 0;  // MFU of one token per second (CUDA backend), else 0
  void log_scalars(const StepReport& s);
  int64_t start_ = 0;              // steps done before this run
  bool wrote_run_marker_ = false;  // this run wrote the folder's roundpipe_run.json
  void drop_lone_run_marker();
  OutputDirLock output_lock_;  // the leader's, for the whole run
  int64_t reported_ = -1;      // last step reported
  double last_report_ = 0;     // elapsed() when the step timer last started (the loop, then each report)
  double paused_ = 0;          // seconds since then that belong to no step: evaluations, checkpoints
  std::optional<ProgressClock> clock_;  // tokens/s and ETA from the steps' own times
  int64_t evals_after(int64_t steps_done) const;
  std::string last_checkpoint_;
  std::optional<Clock::time_point> stop_deadline_;  // set when the stop request is first seen
  /// spec.stop_timeout_s as a clock duration.
  Clock::duration stop_budget() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spec_.stop_timeout_s));
  }
  /// A single process: sets stop_deadline_ (spec.stop_timeout_s on) when the StopToken's
  /// request is first seen. Replicas: the agreement sets it (stop_agreed).
  void arm_stop_deadline() {
    if (!replicas_ && stop_.stop_requested() && !stop_deadline_)
      stop_deadline_ = Clock::now() + stop_budget();
  }
  /// At most 0.1 s, and not past the stop deadline when there is one.
  double wait_slice() const {
    double slice = 0.1;
    if (stop_deadline_)
      slice = std::min(slice, std::chrono::duration<double>(*stop_deadline_ - Clock::now()).count());
    return std::max(slice, 0.0);
  }
  StepWatch watch_;
  uint64_t checkpoint_bytes_ = 0;  // free disk space a save needs
  // data-parallel replicas (trainer/replica_run.hpp); null: a single process
  std::shared_ptr<Replicas> replicas_;
  bool leader() const { return !replicas_ || replicas_->rank() == 0; }  // writes the files
  int replica_count() const { return replicas_ ? replicas_->size() : 1; }
  void barrier() { sum_over(replicas_.get(), {}); }
  bool stop_agreed();
  /// A stop is under way: the StopToken's request, or with replicas the agreed one (every
  /// replica saw the same exchange say stop, so they all close, report and save the same steps).
  bool stopping() const { return replicas_ ? stop_agreed_ : stop_.stop_requested(); }
  bool stop_agreed_ = false;
  std::vector<int> stop_ranks_;   // replicas: the ranks whose StopToken asked for the stop
  double reduce_wait_total_ = 0;  // replicas: StepReport::reduce_wait_s over the reported steps
  TrainResult execute_steps();
  void derive_epochs();
  double epoch_at(int64_t steps_done) const;
  int64_t epoch_origin_ = 0;  // data position at start_ (sequences)
  void agree_eval(StepReport& s);
  void finish_final(TrainResult& res, int64_t t);
  RunSeriesTracker series_;
  std::optional<int64_t> early_stop_at_;  // early stopping decided after this many steps
  std::string early_stop_reason_;
};

void Run::setup() {
  validate_spec(spec_);     // a spec built in code gets the checks of a spec file
  check_data_paths(spec_);  // seconds, before a model load of minutes
  spdlog::info("{}", optimizer_line(spec_));
  check_output_dir(spec_);  // never a folder that holds the user's other work or the run's inputs
  replicas_ = replicas_for(spec_);
  if (replicas_ && replicas_->rank() > 0 && spdlog::get_level() < spdlog::level::warn)
    spdlog::set_level(spdlog::level::warn);  // replica 0 tells the story; the others warn and fail
  if (leader()) {                            // before anything is loaded or written
    output_lock_ = OutputDirLock(spec_);
    prepare_output_dir(spec_);
  }
  barrier();  // no replica reads the output folder (a resume) before the leader tidied it
  check_compute_dtype(spec_);
  if (auto w = async_lr_warning(spec_)) spdlog::warn("{}", *w);
  resume_ = check_resume(spec_);
  // a save that would have to replace a file of the user's is refused now, not after the steps
  if (leader()) check_save_targets(spec_, trains_lora(spec_), resume_ ? resume_->saved.step : 0);
  RunWeights w;
  if (trains_lora(spec_)) {
    // LoRA: the base always comes from spec.model (a LoRA checkpoint is a PEFT adapter folder),
    // read tensor by tensor into its storage form (never the whole model in fp32)
    auto base_ptr = std::make_shared<ModelSource>(open_model_for_training(spec_.model));
    ModelSource& base = *base_ptr;
    if (resume_) check_resume_model(*resume_, spec_, base.config());
    // with a disk tier the session reads the frozen groups from the files as it needs them
    w = lora_run_weights(spec_, base, resume_ ? resume_->dir : spec_.adapter, base_ptr);
    if (spec_.lora)
      spec_.lora->base_format = w.layout.lora->base_format;  // the form in use (the state records it)
    model_ = base.header();
  } else {
    // a resumed run takes weights, config and tokenizer from the checkpoint; spec.model must be
    // of its architecture (a model that is not there any more is not needed)
    std::error_code ec;
    if (resume_ && std::filesystem::exists(spec_.model, ec))
      check_resume_model(*resume_, spec_, ModelSource::open(spec_.model).config());
    model_ = load_model_for_training(resume_ ? resume_->dir : spec_.model);
    w.layout = make_layout(model_.config);
    fill_groups(model_, w.layout, w.trainable);
  }
  model_.tensors.clear();
  base_ = base_model_ref(spec_.model, spec_.base_model_id);
  if (trains_lora(spec_))
    spdlog::info("adapter base: {}{}", base_.portable(),
                 base_.id.empty()
                     ? " (the local path: no base_model_id in the spec and none in the model's metadata)"
                     : fmt::format(" (from {}; local file {})", base_.id_from, base_.path));
  const ModelLayout& layout = w.layout;
  warn_host_memory(spec_, layout);  // before the data and the session's buffers: what to change
  data_.emplace(load_data_for_training(spec_, model_));
  derive_epochs();
  eval_batches_ = load_eval_batches(spec_, model_, *data_);
  start_session(layout, std::move(w.trainable), std::move(w.frozen), std::move(w.source));
  if (resume_) {
    epoch_origin_ = resume_->saved.data_position;
    if (const std::string line = series_.resume(resume_->dir, resume_->saved, leader()); !line.empty())
      spdlog::info("{}", line);
  }
  checkpoint_bytes_ = checkpoint_bytes(layout, spec_);
  // a full disk is found now, not at the final save after every step was trained
  if (leader()) {
    require_disk_space(spec_.output_dir, checkpoint_bytes_, "a checkpoint");
    std::filesystem::create_directories(spec_.output_dir);
    // starting over: no checkpoint of the earlier run stays to be mixed with this one's
    if (spec_.overwrite_output_dir && !resume_)
      if (const std::string line = clear_earlier_run(spec_); !line.empty()) spdlog::info("{}", line);
    wrote_run_marker_ = mark_output_dir(spec_);
    metrics_ = std::make_unique<MetricsFile>(path("metrics.csv"), start_, replica_count() > 1);
    if (spec_.metrics_jsonl)
      jsonl_ = std::make_unique<MetricsJsonl>(
          spec_.metrics_jsonl->empty() ? path("metrics.jsonl") : *spec_.metrics_jsonl, start_,
          replica_count() > 1);
  }
  if (spec_.tensorboard && leader()) tb_ = std::make_unique<TensorBoardWriter>(path("tensorboard"));
  if (session_->device_name().rfind("cuda", 0) == 0) {
    // training FLOPs per token (model/model_flops.hpp: 6 per trained matmul weight, 4 per
    // frozen one, the router and top-k experts of a sparse layer, and the attention), as
    // bench_throughput counts them
    const double flops = model_flops_per_token(layout, spec_.seq_len);
    mfu_per_token_per_s_ = flops / (double(spec_.workers) * replica_count() * DeviceModel{}.peak_flops);
  }
  reported_ = start_ - 1;
  clock_.emplace(start_, spec_.steps);
  if (cb_.on_ready) cb_.on_ready();
}

void Run::start_session(const ModelLayout& layout, std::vector<std::vector<float>> weights,
                        std::vector<std::vector<uint8_t>> frozen, std::optional<FrozenSource> source) {
  SessionOptions opt = session_options_of(spec_, layout);
  opt.frozen_source = std::move(source);
  opt.replicas = replicas_;
  session_ = std::make_unique<Session>(layout, std::move(weights), std::move(frozen), opt);
  if (resume_) start_ = restore_checkpoint(*resume_, spec_, *session_, *data_);
  const IterationPlan& plan = session_->initial_plan();
  if (replicas_)
    spdlog::info("replicas: {} (MPI), each {} of every step's {}; gradients summed in rank order",
                 replicas_->size(), spec_.accumulation / replicas_->size(),
                 counted(spec_.accumulation, "pass", "passes"));
  spdlog::info("runtime: {} x {}, {} optimizer, {} plan {} ({}), {} of {} x {}{}", spec_.workers,
               session_->device_name(), spec_.async ? "staleness-1 async" : "synchronous",
               opt.plan ? "explicit" : "automatic", plan.summary(), counted(plan.stages.size(), "stage"),
               counted(spec_.micro_batches, "micro-batch", "micro-batches"), opt.micro.n_seq,
               counted(spec_.seq_len, "token"),
               !spec_.fp8                   ? ""
               : spec_.fp8_weight_gradients ? "; FP8 e4m3 linears and weight gradients"
               : spec_.fp8_stored_direct && spec_.lora && spec_.lora->base_format == WeightFormat::fp8
                   ? "; FP8 e4m3 linears, the fp8 base's from its stored codes (fp8_stored_direct)"
                   : "; FP8 e4m3 linears");
}

/// Waits for step t, watching the stop token: nullopt once a stop was requested and step t
/// is not done by spec.stop_timeout_s after the request (a stalled run must still stop).
/// Outside a stop it waits as long as the step takes (the watchdog reports stalls).
/// Replicas: only an agreed stop bounds the wait (await_together); a request this replica
/// alone has seen waits for the next agreement, at the next step.
std::optional<StepResult> Run::await(int64_t t) {
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
std::optional<StepResult> Run::await_together(int64_t t) {
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
bool Run::report(int64_t t) {
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
  if (metrics_) metrics_->write(s);
  if (jsonl_) jsonl_->write(s);
  log_scalars(s);
  if (cb_.on_step) cb_.on_step(s);
  for (const auto& w : watch_.check(s, kept_checkpoint())) spdlog::warn("{}", w);
  return true;
}

/// Evaluations of the evaluation set still to run after `steps_done` steps (every
/// eval_every steps and after the last).
int64_t Run::evals_after(int64_t steps_done) const {
  if (eval_batches_.empty() || steps_done >= spec_.steps) return 0;
  const int64_t k = spec_.eval_every;
  if (k <= 0) return 1;
  return spec_.steps / k - steps_done / k + (spec_.steps % k != 0 ? 1 : 0);
}

/// Evaluation passes after `steps_done` steps, queued in the pipeline right behind that step's
/// passes; report() collects them with the step's row.
void Run::submit_eval(int64_t steps_done) {
  auto& ids = pending_eval_[steps_done];
  for (const TokenBatch& b : eval_batches_)
    ids.push_back(b.positions.empty() ? session_->evaluate(b.ids, b.targets)
                                      : session_->evaluate(b.ids, b.targets, b.positions));
}

/// TensorBoard scalars of a step (tags train/..., eval/...).
void Run::log_scalars(const StepReport& s) {
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

/// Waits for the evaluation passes of `steps_done` and fills the eval fields of `into`. A stop
/// bounds the wait like a step's: false (nothing filled) once the stop deadline passed, or as
/// soon as a stop is seen with `drop_at_stop`. The passes left go on in the runtime; nothing
/// waits for them (they change no weight, and the session's teardown is bounded).
/// During a stop, every evaluation pass that finishes moves the deadline to stop_timeout_s
/// from then: the steps queued behind the evaluation in the pipeline can only finish after it,
/// so an evaluation that makes progress must not use up their time (a finished step would be
/// abandoned unsaved); one whose pass makes no progress for stop_timeout_s still ends the wait.
bool Run::collect_eval(int64_t steps_done, StepReport& into, bool drop_at_stop) {
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
void Run::evaluate_before_training() {
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

std::string Run::sample_text(const char* when) {
  if (spec_.sample_prompt.empty() || !leader()) return {};
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
  const SampleResult res = sample(gen, model_, r);
  spdlog::info("sample {}: {} -> {}", when, spec_.sample_prompt, res.text);
  return res.text;
}

bool Run::report_through(int64_t t) {
  for (int64_t k = reported_ + 1; k <= t; ++k)
    if (!report(k)) return false;
  return true;
}

/// After the loop (t steps closed): reports every closed step. False when a stop request
/// abandoned some: they did not finish within spec.stop_timeout_s of it.
bool Run::drain(int64_t t) {
  if (stopping() && reported_ < t - 1)
    spdlog::info("stop requested: finishing {} in flight (at most {:g} s)",
                 counted(t - 1 - reported_, "step"), spec_.stop_timeout_s);
  return report_through(t - 1);
}

/// merge_adapters: final-merged/, a plain Hugging Face folder of the base with the adapters
/// folded in (the adapter folder final/ stays).
void Run::save_merged() {
  const PlainModel m = merged_model(*session_);  // the fp32 model once, built group by group
  std::vector<const float*> ptrs;
  for (const auto& g : m.groups) ptrs.push_back(g.data());
  const std::string dir = path("final-merged");
  const auto card = card_writer(dir, ModelCardFacts::Kind::merged);
  save_hf_checkpoint(dir, m.layout, ptrs, model_.tokenizer_json, model_.chat_template,
                     parse_dtype(spec_.save_dtype), [&](const std::string& tmp) {
                       card(tmp);
                       write_manifest(tmp, "train");  // what the run wrote: a re-save or merge keeps the rest
                     });
  spdlog::info("saved the merged model {}", dir);
}

std::function<void(const std::string&)> Run::card_writer(const std::string& dir,
                                                         ModelCardFacts::Kind kind) const {
  ModelCardFacts f;
  f.kind = kind;
  f.folder = dir;
  f.base = base_;
  f.spec = &spec_;
  f.steps_done = session_->steps_closed();
  const TokenStreamStats& st = data_->stats();
  f.train_sequences = st.sequences;
  f.eval_sequences = st.eval_sequences;
  f.epochs = st.sequences > 0 ? double(data_->position()) / double(st.sequences) : 0;
  f.train_loss = last_loss_;
  f.eval_loss = last_eval_loss_;
  f.eval_step = last_eval_step_;
  f.version = RP_VERSION;
  return [dir, text = model_card_text(f)](const std::string& tmp) {
    if (!place_model_card(tmp, dir, text))
      spdlog::info(
          "kept the README.md in {} (not a model card roundpipe wrote; the run's card is not written)", dir);
  };
}

// A run stopped before its first step leaves nothing it wrote: this run's TensorBoard file,
// a fresh run's metrics.csv (a resumed run's keeps the rows of the steps before it) and the
// output folder when this run made it and it is empty now.
void Run::discard_unstarted_outputs() {
  std::error_code ec;
  if (tb_) {
    const std::string file = tb_->path();
    tb_.reset();
    std::filesystem::remove(file, ec);
    std::filesystem::remove(path("tensorboard"), ec);  // only when empty
  }
  if (metrics_ && start_ == 0) {
    const std::string file = metrics_->path();
    metrics_.reset();
    std::filesystem::remove(file, ec);
  }
  drop_lone_run_marker();
  output_lock_.remove_made_if_empty();
}

// The roundpipe_run.json this run wrote goes again when the run leaves nothing else there.
void Run::drop_lone_run_marker() {
  if (!wrote_run_marker_) return;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(spec_.output_dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename() != kRunMarkerFile) return;
  std::filesystem::remove(path(kRunMarkerFile), ec);
}

void Run::save_profile() {
  if (!leader()) return;
  session_->save_profile(path("profile.json"));
  spdlog::info("saved profile {}", path("profile.json"));
}

/// A checkpoint is a consistent snapshot: every closed step applied, none in flight (the
/// next step's passes are not submitted yet), so the weights, the optimizer state and the
/// data position all belong to the same step.
void Run::save(const std::string& name) {
  session_->synchronize();
  const double t0 = elapsed();
  const std::string dir = path(name);
  if (!leader()) {  // replica 0 writes it: every replica holds the same weights and state
    last_checkpoint_ = dir;
    series_.saved(spec_.output_dir, name, session_->steps_closed(), false);
    return;
  }
  const int64_t steps = session_->steps_closed();
  // never replace a good checkpoint with non-finite weights
  if (const int64_t g = first_nonfinite_group(session_->master_weights()); g >= 0)
    throw TrainingDiverged(
        fmt::format("step {}: parameter group '{}' holds inf/NaN values; refusing to write {} ({}). Lower "
                    "optimizer.lr or "
                    "set optimizer.max_grad_norm",
                    steps, session_->layout().groups[size_t(g)].name, dir,
                    kept_checkpoint().empty() ? std::string("no checkpoint was written")
                                              : kept_checkpoint() + " is kept"));
  require_disk_space(spec_.output_dir, checkpoint_bytes_, fmt::format("checkpoint {}", dir));
  TrainerState state = trainer_state_of(spec_, steps, data_->position());
  state.series = series_.series_for(name, steps);
  save_checkpoint_bundle(
      *session_, dir, model_, parse_dtype(spec_.save_dtype), state, base_,
      card_writer(dir, session_->layout().lora ? ModelCardFacts::Kind::adapter : ModelCardFacts::Kind::full));
  const double seconds = elapsed() - t0;
  spdlog::info("saved checkpoint {} in {:.1f} s", dir, seconds);
  if (const std::string mix = data_->mixture_proportions(); !mix.empty())
    spdlog::info("data mixture over steps 1-{}: {}", steps, mix);
  last_checkpoint_ = dir;
  for (const std::string& line : series_.saved(spec_.output_dir, name, steps, true)) spdlog::info("{}", line);
  save_profile();
  if (cb_.on_checkpoint) cb_.on_checkpoint(CheckpointReport{dir, steps, seconds});
}

/// The evaluation point between steps (TrainerCallbacks::on_eval): the pipeline is drained.
void Run::evaluate(int64_t steps_done) {
  session_->synchronize();
  if (session_->layout().lora) {  // the callback sees the model the adapters make
    const PlainModel m = merged_model(*session_);
    cb_.on_eval(EvalContext{steps_done, m.layout, m.groups});
    return;
  }
  cb_.on_eval(EvalContext{steps_done, session_->layout(), session_->master_weights()});
}

/// Runs the steps; returns the number of steps closed (t: steps 0..t-1). A stop request ends
/// it before the next step is closed, also while it waits for a step.
int64_t Run::loop() {
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

/// A stop abandoned the steps after reported_: none of them is saved, since their updates may
/// be half applied (some groups updated, others not). The measured profile is kept.
TrainResult Run::abandon(int64_t t) {
  const int64_t done = reported_ + 1;
  std::string waits;
  try {
    waits = session_->status();
  } catch (const std::exception& e) {
    waits = e.what();
  }
  // the runtime's whole status (every worker's task and copy, every shard) is kilobytes: the
  // line names its start and the leader keeps all of it beside the run's other files
  std::string where;
  if (leader()) {
    const std::string file = path("stop_status.txt");
    try {
      write_file_atomically(file, [&](std::ostream& os) {
        os << "# what the runtime waited for at the stop; its steps count from 0 (its step 0 is the progress "
              "lines' step 1)\n"
           << waits << "\n";
      });
      where = "; all of it in " + file;
    } catch (const std::exception& e) {
      spdlog::warn("{}", e.what());
    }
  }
  constexpr size_t kShown = 160;
  const std::string shown = waits.size() > kShown ? waits.substr(0, kShown) + "..." : waits;
  // steps counted from 1 as in the progress lines: steps done+1..t did not finish
  spdlog::warn(
      "stop: step {}/{} did not finish within {:g} s of the stop request; {} not saved (a checkpoint "
      "holds only completed steps); waiting for (steps counted from 0): {}{}",
      done + 1, spec_.steps, spec_.stop_timeout_s,
      t > done + 1 ? fmt::format("steps {}..{} are", done + 1, t) : fmt::format("step {} is", t), shown,
      where);
  try {
    save_profile();  // what the stuck steps waited for, even when none finished
  } catch (const std::exception& e) {
    spdlog::warn("{}", e.what());
  }
  TrainResult res;
  res.first_step = start_;
  res.steps_done = done;
  res.steps_abandoned = t - done;
  res.total_steps = spec_.steps;
  res.stopped = true;
  res.latest_checkpoint = kept_checkpoint();
  res.stopped_by = stop_ranks_;
  res.metrics = metrics_ ? metrics_->path() : "";
  res.seconds = elapsed();
  res.peak_device_bytes = session_->peak_device_bytes();
  try {
    res.plan = session_->plan().summary();
  } catch (const std::exception&) {
    res.plan = session_->initial_plan().summary();
  }
  return res;
}

TrainResult Run::finish(int64_t t) {
  // replicas: a stop asked for during the last steps bounds their drain too, on all replicas
  if (replicas_ && !stop_agreed_) stop_agreed();
  if (!drain(t)) return abandon(t);
  session_->synchronize();
  if (spec_.trace && leader()) {
    session_->write_trace(path("trace.json"));
    spdlog::info("wrote trace {}/trace.json", spec_.output_dir);
  }
  TrainResult res;
  res.first_step = start_;
  res.steps_done = t;
  res.skipped_steps = watch_.skipped_total();
  if (stopping() && t < spec_.steps) {
    // the steps done become a checkpoint like a periodic one
    const bool fresh = t > start_ && !(spec_.save_every > 0 && t % spec_.save_every == 0);
    // (a stop right on a periodic save: that save wrote the checkpoint and the profile already)
    if (fresh) save(fmt::format("checkpoint-{}", t));
    else if (t == start_ && leader()) discard_unstarted_outputs();
    res.stopped = true;
    res.stopped_by = stop_ranks_;
    res.checkpoint = fresh ? last_checkpoint_ : std::string();
    res.latest_checkpoint = kept_checkpoint();
  } else {
    finish_final(res, t);
    if (spec_.merge_adapters && leader()) save_merged();
    res.sample_before = sample_before_;
    res.sample_after = sample_text("after fine-tuning");
  }
  res.metrics = metrics_ ? metrics_->path() : "";  // none when an unstarted run discarded it
  res.seconds = elapsed();
  res.peak_device_bytes = session_->peak_device_bytes();
  res.plan = session_->plan().summary();
  res.total_steps = spec_.steps;
  if (const auto& b = series_.series().best) {
    res.best_checkpoint = path(b->name);
    res.best_metric = b->value;
    res.best_step = b->step;
  }
  return res;
}

/// The end of a run that was not stopped (every step done, or early stopping): final/ holds the
/// weights after t steps, or with load_best_model_at_end the best checkpoint when it beats them.
void Run::finish_final(TrainResult& res, int64_t t) {
  if (early_stop_at_) {
    res.early_stopped = true;
    res.early_stop_reason = early_stop_reason_;
    spdlog::info("{}; saving final/ as at the end of the run", early_stop_reason_);
  }
  std::string best = series_.best_for_final(t);
  if (!best.empty() && leader() && !resumable_checkpoint(path(best))) {
    spdlog::warn(
        "load_best_model_at_end: the best checkpoint {} is gone or incomplete; final/ holds the last step {}",
        path(best), t);
    best.clear();
  }
  res.final_step = t;
  if (!best.empty()) {
    const BestCheckpoint& b = *series_.series().best;
    res.final_step = b.step;
    if (leader()) {
      session_->synchronize();
      const double t0 = elapsed();
      require_disk_space(spec_.output_dir, checkpoint_bytes_, fmt::format("checkpoint {}", path("final")));
      copy_checkpoint_bundle(path(best), path("final"));
      spdlog::info(
          "load_best_model_at_end: final/ holds {} (step {}, {} {:.6g}), the best checkpoint; the last step "
          "{} ({} {:.6g}) is not kept ({:.1f} s)",
          best, b.step, b.metric, b.value, t, series_.metric(), series_.metric_at(t).value_or(NAN),
          elapsed() - t0);
      save_profile();
      if (cb_.on_checkpoint) cb_.on_checkpoint(CheckpointReport{path("final"), b.step, elapsed() - t0});
    }
    last_checkpoint_ = path("final");
    res.checkpoint = last_checkpoint_;
    return;
  }
  try {
    save("final");
  } catch (const FolderConflict& e) {
    // a file of the user's appeared in final/ during the run: the steps are kept all the same
    const std::string kept = fmt::format("checkpoint-{}", t);
    save(kept);
    throw std::runtime_error(
        fmt::format("{}; the last step {} is saved in {} instead", e.what(), t, path(kept)));
  }
  res.checkpoint = last_checkpoint_;
  if (spec_.load_best_model_at_end)
    spdlog::info("load_best_model_at_end: final/ holds the last step {} (no checkpoint beats it by {})", t,
                 series_.metric());
}

/// "epochs": the run's steps now that the data is loaded (resolve_epochs); a resumed run must
/// still have steps to do.
void Run::derive_epochs() {
  if (!spec_.epochs) return;
  spdlog::info("{}", resolve_epochs(spec_, data_->stats().sequences));
  if (resume_ && resume_->saved.step >= spec_.steps)
    throw std::invalid_argument(
        fmt::format("{}: the checkpoint is at step {} and {:g} epochs are {} steps; nothing "
                    "is left to do (raise 'epochs')",
                    resume_->dir, resume_->saved.step, *spec_.epochs, spec_.steps));
}

/// Passes over the training sequences after `steps_done` steps.
double Run::epoch_at(int64_t steps_done) const {
  const int64_t n = data_ ? data_->stats().sequences : 0;
  if (n <= 0) return 0;
  return (double(epoch_origin_) + double(steps_done - start_) * double(spec_.sequences_per_step)) / double(n);
}

/// Replicas evaluate the whole set each; the decisions taken from it (the best checkpoint,
/// early stopping) use replica 0's result on every replica, so they cannot part.
void Run::agree_eval(StepReport& s) {
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

TrainResult Run::execute_steps() {
  setup();
  evaluate_before_training();
  if (start_ == 0) sample_before_ = sample_text("before fine-tuning");
  last_report_ = elapsed();  // step 1's time starts here, not with the model load
  TrainResult res = finish(loop());
  if (replicas_ && res.steps_done > start_) {
    const ReplicaStats st = replicas_->stats();
    const double steps = double(res.steps_done - start_);
    spdlog::info(
        "replicas: {} gradient sums, {:.1f} MB summed per step, {:.1f} MB sent per step by each replica, "
        "{:.3f} s per step with a sum in flight, {:.3f} s per step waiting for one (not hidden by compute)",
        st.reductions, st.bytes_reduced / steps / 1e6, st.bytes_sent / steps / 1e6, st.busy_s / steps,
        reduce_wait_total_ / steps);
  }
  res.replica = replicas_ ? replicas_->rank() : 0;
  res.replicas = replica_count();
  barrier();  // no replica ends before replica 0 wrote the last checkpoint
  return res;
}

/// Replicas: a failure here reaches every other replica at once, as "replica <rank> failed:
/// <error>", instead of leaving them waiting for this one's gradients.
TrainResult Run::execute() {
  try {
    return execute_steps();
  } catch (const std::exception& e) {
    if (replicas_) replicas_->abort(e.what());
    // a run that failed before its first step leaves nothing it wrote, nor a folder it made
    if (leader() && reported_ < start_) discard_unstarted_outputs();
    if (leader()) drop_lone_run_marker();
    if (leader()) output_lock_.remove_made_if_empty();
    throw;
  }
}

/// Whether to stop before the next step. Replicas decide together (one exchange per step),
/// so they all close the same steps: a stop asked of any of them (a signal to one rank, or
/// to all) stops every one at the same step boundary; from then on the decision holds.
bool Run::stop_agreed() {
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

}  // namespace

Trainer::Trainer(TrainSpec spec) : spec_(std::move(spec)) {}

Trainer Trainer::from_json(const nlohmann::json& j, const std::string& where) {
  return Trainer(spec_from_json(j, where));
}

Trainer Trainer::from_file(const std::string& path) { return Trainer(load_spec(path)); }

TrainResult Trainer::run(const TrainerCallbacks& callbacks, const StopToken& stop) {
  Run r(spec_, callbacks, stop);
  return r.execute();
}

}  // namespace rp
