// TrainingRun (trainer/training_run.hpp): checkpoints, final/ (or the best checkpoint) and
// final-merged/, the end of a run, and what a stopped or failed run leaves in its folder.
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <typeinfo>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/atomic_file.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/device.hpp"
#include "trainer/checkpoint_bundle.hpp"
#include "trainer/checkpoint_rotation.hpp"
#include "trainer/disk_space.hpp"
#include "trainer/lora_setup.hpp"
#include "trainer/training_run.hpp"

namespace rp {

namespace {
/// Rethrows the failure of a save in flight with `hint` (what a --resume can still start from)
/// after its line: a FolderConflict as one, an I/O failure (a plain std::runtime_error: a full
/// disk, a read-only folder) as one. The runtime's and the devices' own types go on as they are
/// (the Python package tells them apart), as does anything else.
[[noreturn]] void rethrow_with_hint(const std::string& hint) {
  try {
    throw;
  } catch (const FolderConflict& e) {
    throw FolderConflict(fmt::format("{}; {}", e.what(), hint));
  } catch (const std::runtime_error& e) {
    if (typeid(e) != typeid(std::runtime_error)) throw;
    throw std::runtime_error(fmt::format("{}; {}", e.what(), hint));
  }
}
}  // namespace

std::string TrainingRun::resume_hint() const {
  const std::string kept = kept_checkpoint();
  if (kept.empty()) return "no checkpoint was finished before it (nothing to --resume from)";
  if (!resumable_checkpoint(kept))
    return fmt::format("the last finished checkpoint {} is no longer complete (nothing to --resume from)",
                       kept);
  return fmt::format("--resume {} continues from the last finished checkpoint", kept);
}

void TrainingRun::rethrow_with_resume_hint() const { rethrow_with_hint(resume_hint()); }

/// A checkpoint is a consistent snapshot: every closed step applied, none in flight (the
/// next step's passes are not submitted yet), so the weights, the optimizer state and the
/// data position all belong to the same step.
void TrainingRun::save(const std::string& name) {
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
  try {
    require_disk_space(spec_.output_dir, checkpoint_bytes_, fmt::format("checkpoint {}", dir));
    TrainerState state = trainer_state_of(spec_, steps, data_->position(), &session_->layout().config);
    state.series = series_.series_for(name, steps);
    save_checkpoint_bundle(*session_, dir, model_, parse_dtype(spec_.save_dtype), state, base_,
                           card_writer(dir, session_->layout().lora ? ModelCardFacts::Kind::adapter
                                                                    : ModelCardFacts::Kind::full));
  } catch (const FolderConflict&) {
    if (name == "final") throw;  // finish_final saves the steps in checkpoint-<t> instead and names it
    rethrow_with_hint(resume_hint());
  } catch (const std::exception&) {
    rethrow_with_hint(resume_hint());
  }
  const double seconds = elapsed() - t0;
  spdlog::info("saved checkpoint {} in {:.1f} s", dir, seconds);
  if (const std::string mix = data_->mixture_proportions(); !mix.empty())
    spdlog::info("data mixture over steps 1-{}: {}", steps, mix);
  last_checkpoint_ = dir;
  for (const std::string& line : series_.saved(spec_.output_dir, name, steps, true)) spdlog::info("{}", line);
  save_profile();
  if (cb_.on_checkpoint) cb_.on_checkpoint(CheckpointReport{dir, steps, seconds});
}

void TrainingRun::save_profile() {
  if (!leader()) return;
  session_->save_profile(path("profile.json"));
  spdlog::info("saved profile {}", path("profile.json"));
}

/// merge_adapters: final-merged/, a plain Hugging Face folder of the base with the adapters
/// folded in (the adapter folder final/ stays).
void TrainingRun::save_merged() {
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

std::function<void(const std::string&)> TrainingRun::card_writer(const std::string& dir,
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
  f.backend =
      spec_.backend == "cpu" || (spec_.backend == "auto" && cuda_device_count() == 0) ? "cpu" : "cuda";
  return [dir, text = model_card_text(f)](const std::string& tmp) {
    if (!place_model_card(tmp, dir, text))
      spdlog::info(
          "kept the README.md in {} (not a model card roundpipe wrote; the run's card is not written)", dir);
  };
}

TrainResult TrainingRun::finish(int64_t t) {
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
void TrainingRun::finish_final(TrainResult& res, int64_t t) {
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
      try {
        require_disk_space(spec_.output_dir, checkpoint_bytes_, fmt::format("checkpoint {}", path("final")));
        copy_checkpoint_bundle(path(best), path("final"));
      } catch (const std::exception&) {
        rethrow_with_hint(resume_hint());
      }
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

/// A stop abandoned the steps after reported_: none of them is saved, since their updates may
/// be half applied (some groups updated, others not). The measured profile is kept.
TrainResult TrainingRun::abandon(int64_t t) {
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

// A run stopped before its first step leaves nothing it wrote: this run's TensorBoard file,
// a fresh run's metrics.csv (a resumed run's keeps the rows of the steps before it) and the
// output folder when this run made it and it is empty now.
void TrainingRun::discard_unstarted_outputs() {
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
void TrainingRun::drop_lone_run_marker() {
  if (!wrote_run_marker_) return;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(spec_.output_dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename() != kRunMarkerFile) return;
  std::filesystem::remove(path(kRunMarkerFile), ec);
}

}  // namespace rp
