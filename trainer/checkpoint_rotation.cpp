#include "trainer/checkpoint_rotation.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "base/output_folder.hpp"
#include "trainer/checkpoint_bundle.hpp"

namespace fs = std::filesystem;

namespace rp {

std::string best_metric_name(const TrainSpec& spec) {
  const std::string& m = spec.metric_for_best_model;
  return m == "loss" || m == "perplexity" ? "eval_" + m : m;
}

double metric_value(const std::string& name, double eval_loss) {
  return name == "eval_perplexity" ? std::exp(eval_loss) : eval_loss;
}

bool metric_better(double a, double b, bool greater_is_better) { return greater_is_better ? a > b : a < b; }

bool early_stopping_update(EarlyStopState& st, double value, const TrainSpec::EarlyStopping& es,
                           bool greater_is_better) {
  const bool better = st.best && metric_better(value, *st.best, greater_is_better);
  if (!st.best || (better && std::abs(value - *st.best) > es.threshold)) st.bad_evals = 0;
  else ++st.bad_evals;
  if (!st.best || better) st.best = value;
  return st.bad_evals >= es.patience;
}

std::vector<std::string> checkpoints_beyond_limit(const std::vector<SavedCheckpoint>& saved, int64_t limit,
                                                  const std::string& best) {
  std::vector<std::string> out;
  if (limit <= 0 || int64_t(saved.size()) <= limit) return out;
  std::vector<const SavedCheckpoint*> by_step;
  for (const auto& c : saved) by_step.push_back(&c);
  std::stable_sort(by_step.begin(), by_step.end(),
                   [](const SavedCheckpoint* a, const SavedCheckpoint* b) { return a->step < b->step; });
  const std::string newest = by_step.back()->name;
  int64_t left = int64_t(by_step.size());
  for (const SavedCheckpoint* c : by_step) {
    if (left <= limit) break;
    if (c->name == newest || c->name == best) continue;
    out.push_back(c->name);
    --left;
  }
  return out;
}

std::map<std::string, uint64_t> folder_files(const std::string& dir) {
  std::map<std::string, uint64_t> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code e2;
    const bool file = it->symlink_status(e2).type() == fs::file_type::regular;
    const auto size = file ? fs::file_size(it->path(), e2) : 0;
    out[name] = file && !e2 ? uint64_t(size) : std::numeric_limits<uint64_t>::max();
  }
  return out;
}

SavedCheckpoint record_checkpoint(const std::string& output_dir, const std::string& name, int64_t step,
                                  std::optional<double> metric) {
  const std::string dir = (fs::path(output_dir) / name).string();
  SavedCheckpoint c;
  c.name = name;
  c.step = step;
  c.weights_xxh3 = read_trainer_state(state_dir_of(dir) + "/" + kRunStateFile).weights_xxh3;
  c.files = folder_files(dir);
  // only what the save wrote: a folder that still holds a file of the user's is never removed
  for (const auto& name : foreign_names(dir)) c.files.erase(name);
  c.metric = metric;
  return c;
}

std::string remove_series_checkpoint(const std::string& output_dir, const SavedCheckpoint& c) {
  const fs::path dir = fs::path(output_dir) / c.name;
  const fs::path sd = state_dir_of(dir.string());
  std::error_code ec;
  const bool weights = fs::exists(fs::symlink_status(dir, ec)),
             state = fs::exists(fs::symlink_status(sd, ec));
  if (!weights && !state) return "";
  if (weights) {
    if (fs::symlink_status(dir, ec).type() != fs::file_type::directory)
      return fmt::format("{} is not a folder", dir.string());
    if (folder_files(dir.string()) != c.files)
      return fmt::format("{} holds other files than the run saved there", dir.string());
  }
  if (state) {
    if (fs::symlink_status(sd, ec).type() != fs::file_type::directory)
      return fmt::format("{} is not a folder", sd.string());
    for (const auto& [name, bytes] : folder_files(sd.string()))
      if ((name != kRunStateFile && name != kOptimizerStateFile && name != kManifestFile) ||
          bytes == std::numeric_limits<uint64_t>::max())
        return fmt::format("{} holds {}, which the run did not save there", sd.string(), name);
    try {
      const TrainerState st = read_trainer_state((sd / kRunStateFile).string());
      if (st.step != c.step || st.weights_xxh3 != c.weights_xxh3)
        return fmt::format("{} belongs to another save than the one the run recorded", sd.string());
    } catch (const std::exception& e) {
      return fmt::format("{} cannot be read ({})", (sd / kRunStateFile).string(), e.what());
    }
  } else {
    std::string have;
    try {
      have = weights_checksum(dir.string());
    } catch (const std::exception&) {}
    if (c.weights_xxh3.empty() || have != c.weights_xxh3)
      return fmt::format("{} has no state and other weights than the run recorded", dir.string());
  }
  if (weights) fs::remove_all(dir, ec);
  if (ec) return fmt::format("{}: cannot remove ({})", dir.string(), ec.message());
  if (state) fs::remove_all(sd, ec);
  if (ec) return fmt::format("{}: cannot remove ({})", sd.string(), ec.message());
  return "";
}

std::string RunSeriesTracker::resume(const std::string& dir, const TrainerState& saved, bool record) {
  series_.early_stopping = saved.series.early_stopping;
  if (resolved_path(dir).parent_path() != resolved_path(spec_.output_dir)) {
    return saved.series.checkpoints.empty() && !saved.series.best
               ? std::string()
               : fmt::format(
                     "{} lies outside output_dir {}: its run's checkpoints are not rotated or ranked by this "
                     "run{}",
                     dir, spec_.output_dir, spec_.early_stopping ? " (early stopping continues)" : "");
  }
  series_.checkpoints = saved.series.checkpoints;
  series_.best = saved.series.best;
  const std::string name = fs::path(dir).filename().string();
  if (record && name != "final") {
    std::optional<double> m;
    if (series_.best && series_.best->name == name) m = series_.best->value;
    std::erase_if(series_.checkpoints, [&](const SavedCheckpoint& c) { return c.name == name; });
    series_.checkpoints.push_back(record_checkpoint(spec_.output_dir, name, saved.step, m));
  }
  return "";
}

bool RunSeriesTracker::evaluated(int64_t step, double eval_loss) {
  const double v = metric_value(metric_, eval_loss);
  last_eval_ = {step, v};
  if (!spec_.early_stopping) return false;
  return early_stopping_update(series_.early_stopping, v, *spec_.early_stopping, spec_.greater_is_better);
}

std::optional<double> RunSeriesTracker::metric_at(int64_t step) const {
  if (last_eval_ && last_eval_->first == step) return last_eval_->second;
  return std::nullopt;
}

RunSeries RunSeriesTracker::series_for(const std::string& name, int64_t step) const {
  RunSeries r = series_;
  const auto m = metric_at(step);
  if (m && (!r.best || metric_better(*m, r.best->value, spec_.greater_is_better)))
    r.best = BestCheckpoint{name, step, metric_, *m};
  return r;
}

std::vector<std::string> RunSeriesTracker::saved(const std::string& output_dir, const std::string& name,
                                                 int64_t step, bool write) {
  const RunSeries now = series_for(name, step);
  series_.best = now.best;
  std::vector<std::string> lines;
  if (!write || name == "final") return lines;
  std::erase_if(series_.checkpoints, [&](const SavedCheckpoint& c) { return c.name == name; });  // replaced
  series_.checkpoints.push_back(record_checkpoint(output_dir, name, step, metric_at(step)));
  const std::string best = series_.best ? series_.best->name : "";
  for (const std::string& old : checkpoints_beyond_limit(series_.checkpoints, spec_.save_total_limit, best)) {
    const auto it = std::find_if(series_.checkpoints.begin(), series_.checkpoints.end(),
                                 [&](const SavedCheckpoint& c) { return c.name == old; });
    const std::string why = remove_series_checkpoint(output_dir, *it);
    if (why.empty())
      lines.push_back(
          fmt::format("save_total_limit {}: removed {}/{}", spec_.save_total_limit, output_dir, old));
    else
      lines.push_back(fmt::format("save_total_limit {}: left {}/{} alone: {}", spec_.save_total_limit,
                                  output_dir, old, why));
    series_.checkpoints.erase(it);  // either way no longer the series' to remove
  }
  return lines;
}

std::string RunSeriesTracker::best_for_final(int64_t step) const {
  // a best "final" (a run resumed from final/) is the folder this save replaces
  if (!spec_.load_best_model_at_end || !series_.best || series_.best->step == step ||
      series_.best->name == "final")
    return "";
  const auto m = metric_at(step);
  if (m && !metric_better(series_.best->value, *m, spec_.greater_is_better)) return "";
  return series_.best->name;
}

}  // namespace rp
