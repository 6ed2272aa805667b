// rp::Trainer (roundpipe/trainer.hpp): one training run from a spec; its setup, start and end
// (trainer/training_run.hpp).
#include "roundpipe/trainer.hpp"

#include <filesystem>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/atomic_file.hpp"
#include "base/counted.hpp"
#include "base/error_text.hpp"
#include "base/host_resources.hpp"  // host_available_bytes
#include "base/output_folder.hpp"   // kPathQuoteBytes
#include "model/fp8_linear.hpp"     // fp8_wgrad_reach
#include "model/model_flops.hpp"
#include "roundpipe/checkpoint.hpp"
#include "scheduler/cost_model.hpp"
#include "trainer/async_range.hpp"
#include "trainer/checkpoint_bundle.hpp"
#include "trainer/checkpoint_rotation.hpp"
#include "trainer/disk_space.hpp"
#include "trainer/lora_setup.hpp"
#include "trainer/run_setup.hpp"  // setting_origin
#include "trainer/save_targets.hpp"
#include "trainer/training_run.hpp"

namespace rp {

namespace {

/// The session refuses a frozen_tier setting as "frozen_tier.<key>: <why>" (FrozenTierOptions:
/// std::invalid_argument for the value, std::runtime_error for the file the path names);
/// the line reads like the spec's other errors, "<where>: key 'frozen_tier.<key>': <why>", where
/// is the last command-line setting that wrote the key (or the object holding it), else the
/// spec file. Other messages stay as they are.
std::string spec_key_error(const TrainSpec& spec, const std::string& message) {
  constexpr std::string_view kSection = "frozen_tier.";
  const size_t colon = message.find(": ");
  if (message.rfind(kSection, 0) != 0 || colon == std::string::npos ||
      message.find(' ') < colon)  // a key has no spaces
    return message;
  const std::string key = message.substr(0, colon);
  const std::string where = setting_origin(spec, key);
  // a --set's text holds the value whole: a path of thousands of bytes is quoted shortened, as
  // the message after it quotes it
  return fmt::format("{}: key '{}': {}", excerpt(where, kPathQuoteBytes), key, message.substr(colon + 2));
}

}  // namespace

void TrainingRun::setup() {
  validate_spec(spec_);     // a spec built in code gets the checks of a spec file
  check_data_paths(spec_);  // seconds, before a model load of minutes
  check_output_dir(spec_);  // never a folder that holds the user's other work or the run's inputs
  // LoRA vs full fine-tuning, the adapters' rank: refused before the output folder is touched
  check_resume_kind(spec_);
  replicas_ = replicas_for(spec_);
  if (replicas_ && replicas_->rank() > 0 && spdlog::get_level() < spdlog::level::warn)
    spdlog::set_level(spdlog::level::warn);  // replica 0 tells the story; the others warn and fail
  if (leader()) {                            // before anything is loaded or written
    output_lock_ = OutputDirLock(spec_);
    prepare_output_dir(spec_);
  }
  barrier();  // no replica reads the output folder (a resume) before the leader tidied it
  check_compute_dtype(spec_);
  resume_ = check_resume(spec_);
  if (resume_) check_resume_state_fits(*resume_, spec_);  // another model's state: before any load
  // a save that would have to replace a file of the user's is refused now, not after the steps
  if (leader()) check_save_targets(spec_, trains_lora(spec_), resume_ ? resume_->saved.step : 0);
  // the first line on stdout: the refusals above (the spec, the output folder, the resume point)
  // print nothing before theirs
  spdlog::info("{}", optimizer_line(spec_));
  if (auto w = async_lr_warning(spec_)) spdlog::warn("{}", *w);
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
    else if (resume_) {  // said, so that a mistyped --model is not taken for one in use
      const std::string origin = setting_origin(spec_, "model");  // "--model PATH" or the spec file
      spdlog::warn(
          "{}: {} does not exist; not needed: the resumed run takes its weights, config and "
          "tokenizer from {}",
          origin.rfind("--", 0) == 0 ? origin : origin + ": key 'model'",
          origin.rfind("--", 0) == 0 ? std::string("the model") : spec_.model, resume_->dir);
    }
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
  // before the data and the session's buffers: a shape that can never fit, then what to change
  check_batch_fits_host(spec_, layout.config, host_available_bytes());
  warn_host_memory(spec_, layout, replica_count());
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
    if (!spec_.overwrite_output_dir && !resume_)
      if (const std::string line = clear_earlier_events(spec_); !line.empty()) spdlog::info("{}", line);
    wrote_run_marker_ = mark_output_dir(spec_);
    // a stop signal before the first step (the CLI's startup handler, which leaves at once)
    // takes the record back with the folders the run made; from the first step on it stays
    if (wrote_run_marker_) until_ready_.push_back(record_unfinished_file(path(kRunMarkerFile)));
    metrics_ = std::make_unique<MetricsFile>(path("metrics.csv"), start_, replica_count() > 1);
    if (start_ == 0) until_ready_.push_back(record_unfinished_file(path("metrics.csv")));  // its header only
    if (spec_.metrics_jsonl)
      jsonl_ = std::make_unique<MetricsJsonl>(
          spec_.metrics_jsonl->empty() ? path("metrics.jsonl") : *spec_.metrics_jsonl, start_,
          replica_count() > 1);
  }
  if (spec_.tensorboard && leader()) {
    std::error_code ec;
    const bool new_folder = !std::filesystem::exists(path("tensorboard"), ec);
    tb_ = std::make_unique<TensorBoardWriter>(path("tensorboard"));
    until_ready_.push_back(record_unfinished_file(tb_->path()));  // its version event only
    if (new_folder) until_ready_.push_back(record_unfinished_file(path("tensorboard")));
  }
  if (session_->device_name().rfind("cuda", 0) == 0) {
    // training FLOPs per token (model/model_flops.hpp: 6 per trained matmul weight, 4 per
    // frozen one, the router and top-k experts of a sparse layer, and the attention), as
    // bench_throughput counts them
    const double flops = model_flops_per_token(layout, spec_.seq_len);
    mfu_per_token_per_s_ = flops / (double(spec_.workers) * replica_count() * DeviceModel{}.peak_flops);
  }
  reported_ = start_ - 1;
  clock_.emplace(start_, spec_.steps);
  auto ready = [this] {  // from here on the files stay, also when on_ready throws
    for (int h : std::exchange(until_ready_, {}))
      if (h >= 0) forget_unfinished_file(h);
  };
  try {
    if (cb_.on_ready) cb_.on_ready();
  } catch (...) {
    ready();
    throw;
  }
  ready();
}

namespace {

/// The start line's FP8 part: what the linears and their weight gradients run in, as the model's
/// widths allow (fp8_wgrad_reach: a linear whose input width is not a multiple of 16 keeps bf16
/// weight gradients).
std::string fp8_summary(const TrainSpec& s, const ModelConfig& model) {
  if (!s.fp8) return "";
  if (fp8_weight_gradients_on(s)) {
    const Fp8WgradReach r = fp8_wgrad_reach(model);
    if (r.fp8_wgrad == 0)
      return "; FP8 e4m3 linears, weight gradients in bf16 (FP8 weight gradients need a linear whose "
             "input width is a multiple of 16; this model has none)";
    if (r.fp8_wgrad < r.linears)
      return fmt::format(
          "; FP8 e4m3 linears and weight gradients ({} of {} linears; the others, whose input width is not "
          "a multiple of 16, in bf16)",
          r.fp8_wgrad, r.linears);
    return "; FP8 e4m3 linears and weight gradients";
  }
  if (s.fp8_stored_direct && s.lora && s.lora->base_format == WeightFormat::fp8)
    return "; FP8 e4m3 linears, the fp8 base's from its stored codes (fp8_stored_direct)";
  return "; FP8 e4m3 linears";
}

}  // namespace

void TrainingRun::start_session(const ModelLayout& layout, std::vector<std::vector<float>> weights,
                                std::vector<std::vector<uint8_t>> frozen,
                                std::optional<FrozenSource> source) {
  SessionOptions opt = session_options_of(spec_, layout);
  opt.frozen_source = std::move(source);
  opt.replicas = replicas_;
  try {
    session_ = std::make_unique<Session>(layout, std::move(weights), std::move(frozen), opt);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(spec_key_error(spec_, e.what()));
  } catch (const std::runtime_error& e) {  // the cache or the spill file cannot be made there
    std::string named = spec_key_error(spec_, e.what());
    if (named == e.what()) throw;
    throw std::runtime_error(std::move(named));
  }
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
               counted(spec_.seq_len, "token"), fp8_summary(spec_, layout.config));
}

/// "epochs": the run's steps now that the data is loaded (resolve_epochs); a resumed run must
/// still have steps to do.
void TrainingRun::derive_epochs() {
  if (!spec_.epochs) return;
  spdlog::info("{}", resolve_epochs(spec_, data_->stats().sequences));
  if (resume_ && resume_->saved.step >= spec_.steps)
    throw std::invalid_argument(
        fmt::format("{}: the checkpoint is at step {} and {:g} epochs are {} steps; nothing "
                    "is left to do (raise 'epochs')",
                    resume_->dir, resume_->saved.step, *spec_.epochs, spec_.steps));
}

TrainResult TrainingRun::execute_steps() {
  setup();
  evaluate_before_training();
  if (start_ == 0) sample_before_ = sample_text("before fine-tuning");
  last_report_ = elapsed();  // step 1's time starts here, not with the model load
  const double trained_from = last_report_;
  const FrozenTierReads reads0 = session_->frozen_tier_reads();
  TrainResult res = finish(loop());
  report_tier_reads(reads0, res.steps_done - start_, elapsed() - trained_from);
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

/// What the disk tier read while training (evaluation and checkpoints included): the bytes per
/// step and the disk's rate while it was read, and what the activation spill wrote and read
/// back, to hold against `roundpipe plan --disk-gbps` (whose per-iteration read counts both).
void TrainingRun::report_tier_reads(const FrozenTierReads& from, int64_t steps, double seconds) const {
  const FrozenTierReport& tier = session_->frozen_tier();
  if ((!tier.enabled && tier.spill_layers.empty()) || steps <= 0 || !(seconds > 0)) return;
  const FrozenTierReads to = session_->frozen_tier_reads();
  const std::string spill =
      tier.spill_layers.empty()
          ? std::string()
          : fmt::format("wrote {} and read back {} per step",
                        byte_text(double(to.spill_written - from.spill_written) / double(steps)),
                        byte_text(double(to.spill_read - from.spill_read) / double(steps)));
  if (!tier.enabled) return spdlog::info("activation spill: {}", spill);
  const double bytes = double(to.bytes - from.bytes), busy = to.seconds - from.seconds;
  spdlog::info(
      "frozen tier: read {} per step ({:.1f} reads) at {:.2f} GB/s while reading; the reader busy "
      "{:.0f}% of the training time{}",
      byte_text(bytes / double(steps)), double(to.reads - from.reads) / double(steps),
      busy > 0 ? bytes / busy / 1e9 : 0.0, 100 * busy / seconds,
      spill.empty() ? "" : "; the activation spill " + spill);
}

/// what() of a std::exception, else a line saying what was thrown.
static std::string failure_text(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception (thrown by a callback)";
  }
}

/// Replicas: a failure here reaches every other replica at once, as "replica <rank> failed:
/// <error>", instead of leaving them waiting for this one's gradients.
TrainResult TrainingRun::execute() {
  try {
    return execute_steps();
  } catch (...) {  // a callback may throw anything, not only a std::exception
    if (replicas_) replicas_->abort(failure_text(std::current_exception()));
    // a run that failed before its first step leaves nothing it wrote, nor a folder it made
    if (leader() && reported_ < start_) discard_unstarted_outputs();
    if (leader()) drop_lone_run_marker();
    if (leader()) output_lock_.remove_made_if_empty();
    throw;
  }
}

Trainer::Trainer(TrainSpec spec) : spec_(std::move(spec)) {}

Trainer Trainer::from_json(const nlohmann::json& j, const std::string& where) {
  return Trainer(spec_from_json(j, where));
}

Trainer Trainer::from_file(const std::string& path) { return Trainer(load_spec(path)); }

TrainResult Trainer::run(const TrainerCallbacks& callbacks, const StopToken& stop) {
  TrainingRun r(spec_, callbacks, stop);
  return r.execute();
}

}  // namespace rp
