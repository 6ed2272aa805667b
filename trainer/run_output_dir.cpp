// The run's output folder before training: its lock, the checks that it is safe to write into
// (not an input, not a folder of the user's own files), the leftovers of an earlier run that
// was killed, and the marker that records this folder as a roundpipe run's. Nothing here
// removes or renames a file a roundpipe run did not write.
#include "trainer/run_setup.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/atomic_file.hpp"
#include "base/error_text.hpp"
#include "base/output_folder.hpp"
#include "tier/cache_file.hpp"  // cache_lock_path
#include "trainer/checkpoint_bundle.hpp"
#include "trainer/trainer_state.hpp"

namespace fs = std::filesystem;

namespace rp {

OutputDirLock::OutputDirLock(const TrainSpec& spec) {
  std::error_code ec;
  if (fs::exists(spec.output_dir, ec) && !fs::is_directory(spec.output_dir, ec))
    return;  // prepare_output_dir says
  if (const std::string why = dangling_link_text(spec.output_dir); !why.empty())
    throw std::invalid_argument(
        fmt::format("{}: {}; create that folder or give another output_dir", output_dir_origin(spec), why));
  made_ = create_folders(spec.output_dir, ec);  // exactly what this run makes
  if (ec) {
    remove_made_if_empty();
    made_.clear();
    throw std::invalid_argument(
        fmt::format("{}: cannot create '{}': {}", output_dir_origin(spec), spec.output_dir, ec.message()));
  }
  fd_ = ::open(spec.output_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    remove_made_if_empty();
    throw std::invalid_argument(fmt::format("{}: cannot open '{}': {}", output_dir_origin(spec),
                                            spec.output_dir, std::strerror(err)));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
    record_folders_made(made_);  // a stop signal before the run writes anything takes them back
    return;
  }
  const int err = errno;
  if (err == EWOULDBLOCK) {
    ::close(fd_);
    fd_ = -1;
    throw std::invalid_argument(
        fmt::format("{}: '{}' is in use by another roundpipe run; wait for it to end or give this run "
                    "another output_dir",
                    output_dir_origin(spec), spec.output_dir));
  }
  spdlog::warn("could not lock the output folder {} ({}): nothing stops another run from writing into it",
               spec.output_dir, std::strerror(err));
  record_folders_made(made_);
}

OutputDirLock::~OutputDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
  if (!made_.empty()) record_folders_made({});
}

OutputDirLock::OutputDirLock(OutputDirLock&& o) noexcept : fd_(o.fd_), made_(std::move(o.made_)) {
  o.fd_ = -1;
  o.made_.clear();
}

void OutputDirLock::remove_made_if_empty() const { remove_empty_folders(made_); }

OutputDirLock& OutputDirLock::operator=(OutputDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    made_ = std::move(o.made_);
    o.made_.clear();
    o.fd_ = -1;
  }
  return *this;
}

namespace {

/// The names a run writes directly in its output folder (besides checkpoint-<n>).
constexpr const char* kRunOutputNames[] = {"metrics.csv",     "metrics.jsonl", "profile.json", "tensorboard",
                                           "state",           "final",         "final-merged", "trace.json",
                                           "stop_status.txt", kRunMarkerFile};

bool is_run_output(const std::string& name) {
  for (const char* n : kRunOutputNames)
    if (name == n) return true;
  return name.rfind("checkpoint-", 0) == 0 && name.size() > 11 &&
         name.find_first_not_of("0123456789", 11) == std::string::npos;
}

/// Whether `dir` holds a run record a roundpipe run wrote: a regular file whose JSON object says
/// "written_by": "roundpipe train".
bool has_run_record(const fs::path& dir) {
  std::error_code ec;
  const fs::path p = dir / kRunMarkerFile;
  if (!fs::is_regular_file(fs::symlink_status(p, ec)) || fs::file_size(p, ec) > 4096) return false;
  std::ifstream in(p, std::ios::binary);
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    return j.is_object() && j.contains("written_by") && j["written_by"] == "roundpipe train";
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

/// Run outputs in `dir` that no roundpipe run recorded there (no kRunMarkerFile).
std::vector<std::string> unrecorded_outputs(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (has_run_record(dir)) return out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_run_output(it->path().filename().string())) out.push_back(it->path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// Why the file at `path` is not one a run may write its metrics JSONL over ("" when nothing is
/// there, or it is empty, or every line is a JSON object with an integer "step", as the
/// runs write them, a torn last line after such lines aside: a killed run's).
std::string not_a_metrics_jsonl(const std::string& path) {
  std::error_code ec;
  const auto st = fs::symlink_status(path, ec);
  if (ec || st.type() == fs::file_type::not_found) return "";
  if (fs::is_directory(path, ec)) return "is a folder";
  if (!fs::is_regular_file(path, ec)) return "is not a regular file";
  if (fs::file_size(path, ec) > (uint64_t(1) << 30)) return "holds a file larger than 1 GiB";
  std::ifstream f(path, std::ios::binary);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto j = nlohmann::json::parse(lines[i], nullptr, false);
    const bool metrics = j.is_object() && j.contains("step") && j["step"].is_number_integer();
    if (!metrics && !(i > 0 && i + 1 == lines.size() && j.is_discarded()))
      return fmt::format("holds a file whose line {} is not a run's metrics line", i + 1);
  }
  return "";
}

void log_leftovers(const std::vector<StaleTemporary>& stale) {
  std::vector<std::string> foreign;
  for (const auto& s : stale) {
    if (!s.error.empty())
      spdlog::warn(
          "{}: left by a roundpipe run that ended (its marker {} says so), but {}; make it writable "
          "and remove both",
          s.path, owner_marker_path(s.path), s.error);
    else if (s.left_alone) foreign.push_back(s.path);
    else if (s.restored)
      spdlog::warn("restored {} from {} (a run was killed while replacing it)", s.target, s.path);
    else spdlog::info("removed {} left by an interrupted run", s.path);
  }
  if (!foreign.empty())
    spdlog::warn(
        "left alone {} (named like a killed writer's leftover, but no roundpipe run marked {} as its own)",
        fmt::join(foreign, ", "), foreign.size() == 1 ? "it" : "them");
}

}  // namespace

void check_output_file(const TrainSpec& spec, const std::string& file, const std::string& what) {
  if (file.empty()) return;
  std::vector<std::string> inputs = {spec.source, spec.model, spec.adapter, spec.resume_from};
  for (const auto& p : data_paths(spec)) inputs.push_back(p);
  for (const auto& p : eval_data_paths(spec)) inputs.push_back(p);
  if (const std::string in = overlapping_input(file, inputs); !in.empty())
    throw std::invalid_argument(
        one_line(fmt::format("{}: '{}' is or lies inside the run's input '{}', which writing it would "
                             "destroy; choose another file",
                             what, file, in)));
}

std::string setting_origin(const TrainSpec& spec, const std::string& key) {
  for (auto it = spec.settings.rbegin(); it != spec.settings.rend(); ++it)
    if (key == it->key || key.rfind(it->key + ".", 0) == 0)
      return it->origin;  // the key, or an object holding it
  return spec.source;
}

std::string output_dir_origin(const TrainSpec& spec) {
  const std::string where = setting_origin(spec, "output_dir");
  return where == kOutputDirFlag ? where : where + ": key 'output_dir'";
}

namespace {

/// Whether `m` (resolved) is the tier cache `p` or one of the files the tier keeps beside it
/// as written: its builders' lock "<p>.lock", its temporary "<p>.tmp-<pid>" and that
/// temporary's owner marker.
bool is_tier_file(const fs::path& m, const std::string& p) {
  if (m == resolved_path(p)) return true;
  std::error_code ec;
  const fs::path abs = fs::absolute(p, ec);
  if (resolved_path(abs.parent_path().string()) != m.parent_path()) return false;
  const std::string base = abs.filename().string(), name = m.filename().string();
  // the lock as the tier names it; a temporary as temporary_path names it, for any writer's pid
  return name == tier::cache_lock_path(base) || name.rfind(base + ".tmp-", 0) == 0;
}

/// frozen_tier.path must lie outside output_dir: the run writes its own files there
/// (metrics.csv, profile.json, final/ ...) and replaces an earlier run's, which would overwrite
/// the cache or carry it off with a checkpoint. Its builders' lock, its temporary
/// (<path>.tmp-<pid>) and the activation spill's file go beside the path as written, so that
/// folder must lie outside as well (a link there that points elsewhere does not move them).
/// Nor may output_dir lie inside the path (the cache is a file: a folder there is no cache),
/// nor may the metrics_jsonl file, which the run writes too, be the cache or a file beside it.
void check_tier_path(const TrainSpec& spec) {
  if (!spec.frozen_tier || spec.frozen_tier->path.empty()) return;
  const std::string& p = spec.frozen_tier->path;
  std::error_code ec;
  const fs::path out = resolved_path(spec.output_dir), file = resolved_path(p);
  const fs::path folder = resolved_path(fs::absolute(p, ec).parent_path().string());
  const std::string where = setting_origin(spec, "frozen_tier.path");
  if (path_within(file, out) || path_within(folder, out))
    throw std::invalid_argument(one_line(fmt::format(
        "{}: key 'frozen_tier.path': '{}' {} the run's output_dir '{}', whose files the run writes and "
        "replaces; choose a cache path outside output_dir",
        where, p, path_within(file, out) ? "lies inside" : "keeps its lock and spill files inside",
        spec.output_dir)));
  if (path_within(out, file))
    throw std::invalid_argument(
        one_line(fmt::format("{}: '{}' lies inside frozen_tier.path '{}', the tier's cache file; "
                             "choose an output_dir outside it",
                             output_dir_origin(spec), spec.output_dir, p)));
  if (spec.metrics_jsonl && !spec.metrics_jsonl->empty() &&
      is_tier_file(resolved_path(*spec.metrics_jsonl), p))
    throw std::invalid_argument(one_line(fmt::format(
        "{}: key 'frozen_tier.path': '{}' is, or keeps beside it (its .lock, .tmp-<pid>), the run's "
        "metrics_jsonl file '{}'; choose another cache path or metrics_jsonl",
        where, p, *spec.metrics_jsonl)));
}

/// output_dir's own checks: not a folder of the user's (/, $HOME, the working directory), not
/// an input of the run, nor what holds one.
void check_output_folder(const TrainSpec& spec) {
  const std::string& out = spec.output_dir;
  if (const std::string why = unsafe_output_folder(out); !why.empty())
    throw std::invalid_argument(fmt::format("{}: '{}' {}; a run's outputs need a folder of their own",
                                            output_dir_origin(spec), out, why));
  const std::vector<std::string> data = data_paths(spec), eval = eval_data_paths(spec);
  std::vector<std::pair<const char*, const std::string*>> inputs = {{"model", &spec.model},
                                                                    {"adapter", &spec.adapter}};
  for (const auto& p : data) inputs.push_back({"data", &p});
  for (const auto& p : eval) inputs.push_back({"eval_data", &p});
  // a resumed full fine-tuning run reads its weights from the checkpoint, not from "model"
  const bool reads_model = spec.resume_from.empty() || spec.lora || !spec.adapter.empty();
  for (const auto& [key, path] : inputs)
    if ((path != &spec.model || reads_model) && !overlapping_input(out, {*path}).empty())
      throw std::invalid_argument(
          fmt::format("{}: '{}' is, holds or lies inside the input '{}' (key '{}'), which "
                      "the run's outputs "
                      "could replace; choose a separate output_dir",
                      output_dir_origin(spec), out, *path, key));
  // a resume_from that is no checkpoint at all gets check_resume's more useful line
  if (spec.resume_from.empty() || !looks_like_checkpoint(spec.resume_from)) return;
  const fs::path o = resolved_path(out), r = resolved_path(spec.resume_from),
                 rs = resolved_path(state_dir_of(spec.resume_from));
  // resuming a checkpoint of the run in output_dir is the one input allowed inside it; its
  // trainer state (<run>/state/<checkpoint>) is an input too
  if (path_within(o, r) || path_within(o, rs) || (path_within(r, o) && r.parent_path() != o))
    throw std::invalid_argument(
        fmt::format("{}: '{}' is, holds or lies inside the checkpoint '{}' the run resumes "
                    "from (--resume), "
                    "which the run's outputs could replace; choose a separate output_dir",
                    output_dir_origin(spec), out, spec.resume_from));
}

}  // namespace

void check_output_dir(const TrainSpec& spec) {
  check_output_folder(spec);
  check_tier_path(spec);  // after output_dir's own checks: an output_dir of "/" is the fault
  if (spec.metrics_jsonl && !spec.metrics_jsonl->empty()) {
    const std::string key = fmt::format("{}: key 'metrics_jsonl'", setting_origin(spec, "metrics_jsonl"));
    // a folder first (named so below): one that holds an input is no file that "lies inside" it
    std::error_code ec;
    if (!fs::is_directory(*spec.metrics_jsonl, ec)) check_output_file(spec, *spec.metrics_jsonl, key);
    if (const std::string why = not_a_metrics_jsonl(*spec.metrics_jsonl); !why.empty())
      throw std::invalid_argument(one_line(
          fmt::format("{}: '{}' {}; a run replaces only an earlier run's metrics there: choose another path",
                      key, *spec.metrics_jsonl, why)));
  }
}

void prepare_output_dir(const TrainSpec& spec) {
  check_tier_path(spec);  // again, now that output_dir exists: a link to it resolves
  std::error_code ec;
  if (fs::exists(spec.output_dir, ec) && !fs::is_directory(spec.output_dir, ec))
    throw std::invalid_argument(fmt::format("{}: expected a directory, but '{}' is a file",
                                            output_dir_origin(spec), spec.output_dir));
  // a folder the run cannot write into (read-only, another user's) is refused now, not once the
  // model and the data have loaded and the run's first file is written
  if (::access(spec.output_dir.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    throw std::invalid_argument(
        fmt::format("{}: cannot write into '{}' ({}); the run writes its checkpoints and metrics there: make "
                    "it writable or choose another output_dir",
                    output_dir_origin(spec), spec.output_dir, std::strerror(err)));
  }
  const fs::path fin = fs::path(spec.output_dir) / "final";
  if (fs::exists(fin, ec) && !fs::is_directory(fin, ec))
    throw std::invalid_argument(
        fmt::format("{}: '{}' exists and is not a checkpoint folder", output_dir_origin(spec), fin.string()));
  // a save killed between its state and its weights: made whole before the leftovers go
  for (const std::string& line : mend_interrupted_saves(spec.output_dir)) spdlog::warn("{}", line);
  std::vector<StaleTemporary> stale = clean_stale_temporaries(spec.output_dir);
  for (auto& s : clean_stale_temporaries(spec.output_dir + "/state")) stale.push_back(std::move(s));
  log_leftovers(stale);
  const fs::path record = fs::path(spec.output_dir) / kRunMarkerFile;
  if (fs::exists(fs::symlink_status(record, ec)) && !has_run_record(spec.output_dir))
    throw std::invalid_argument(
        fmt::format("{}: {} is not a run record roundpipe wrote (expected a small JSON "
                    "file with \"written_by\": "
                    "\"roundpipe train\"), so nothing proves the folder's run outputs roundpipe's; move it "
                    "away or choose another "
                    "output_dir",
                    output_dir_origin(spec), record.string()));
  // no run makes a link: one named like a run output would be replaced (or written through)
  for (fs::directory_iterator it(spec.output_dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_run_output(it->path().filename().string()) && it->is_symlink(ec))
      throw std::invalid_argument(fmt::format(
          "{}: {} is a symbolic link, where the run writes {} of its own; move "
          "it away or choose "
          "another output_dir",
          output_dir_origin(spec), it->path().string(), it->is_directory(ec) ? "a folder" : "a file"));
  // nor a pipe, device or socket: reading a resumed run's metrics from a pipe, or writing one,
  // waits for another program forever
  for (fs::directory_iterator it(spec.output_dir, ec), end; !ec && it != end; it.increment(ec))
    if (const char* kind = special_file_kind(it->symlink_status(ec).type());
        kind != nullptr && is_run_output(it->path().filename().string()))
      throw std::invalid_argument(
          fmt::format("{}: {} is {}, where the run writes a file of its own; move it away or choose another "
                      "output_dir",
                      output_dir_origin(spec), it->path().string(), kind));
  if (const auto foreign = unrecorded_outputs(spec.output_dir); !foreign.empty())
    throw std::invalid_argument(
        fmt::format("{}: '{}' holds {} that no roundpipe run recorded as its own (no {}), "
                    "and the run would "
                    "replace {}; move {} away or choose another output_dir",
                    output_dir_origin(spec), spec.output_dir, fmt::join(foreign, ", "), kRunMarkerFile,
                    foreign.size() == 1 ? "it" : "them", foreign.size() == 1 ? "it" : "them"));
  if (spec.overwrite_output_dir) return;
  // a resume continues the run of the folder its checkpoint lies in; a fresh run, or a resume of
  // another folder's checkpoint, would replace this run's checkpoints and metrics
  // (a resume_from that is no checkpoint at all gets check_resume's more useful line)
  if (!spec.resume_from.empty() &&
      (!looks_like_checkpoint(spec.resume_from) ||
       path_within(resolved_path(spec.resume_from), resolved_path(spec.output_dir))))
    return;
  const std::vector<std::string> found = checkpoints_in(spec.output_dir);
  if (found.empty()) return;
  const std::string resume = newest_resumable_checkpoint(spec.output_dir, found);
  // a finished run has nothing to continue at the spec's length: --resume alone would be refused
  int64_t step = -1;
  if (!resume.empty() && !spec.epochs) try {
      step = read_trainer_state(state_dir_of(spec.output_dir + "/" + resume) + "/" + kRunStateFile).step;
    } catch (const std::exception&) {  // check_resume names what is wrong with it, if it is given
    }
  const std::string advice =
      resume.empty() ? std::string(
                           "none of them can be resumed (their trainer state is missing or belongs to other "
                           "weights); start over")
      : step >= spec.steps
          ? fmt::format(
                "that run is finished ({} is at step {} of the spec's {}): train it further with "
                "--resume {}/{} --steps <more than {}>, start over",
                resume, step, spec.steps, spec.output_dir, resume, step)
          : fmt::format("continue it with --resume {}/{}, start over", spec.output_dir, resume);
  throw std::invalid_argument(
      fmt::format("{}: '{}' holds an earlier run's checkpoints ({}); {} there with "
                  "--overwrite-output-dir "
                  "(\"overwrite_output_dir\": true), or choose another output_dir",
                  output_dir_origin(spec), spec.output_dir, fmt::join(found, ", "), advice));
}

namespace {
std::vector<fs::path> entries_in(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(it->path());
  std::sort(out.begin(), out.end());
  return out;
}

/// Removes what roundpipe wrote in folder `dir`: the files its manifest lists (at their
/// recorded size and content) and the manifest; then `dir` when empty. A folder without a
/// manifest (an earlier release's) proves nothing roundpipe's: all of it stays. The entries it
/// kept are added to `kept` as "<dir>/<name>".
void remove_written(const fs::path& dir, std::vector<std::string>& kept) {
  std::error_code ec;
  const std::vector<std::string> foreign = foreign_names(dir);
  const bool manifest = manifest_files(dir).has_value();
  for (const fs::path& e : entries_in(dir)) {
    const std::string name = e.filename().string();
    if (std::find(foreign.begin(), foreign.end(), name) != foreign.end()) kept.push_back(e.string());
    else if (name != kManifestFile) fs::remove(e, ec);
  }
  if (manifest) fs::remove(dir / kManifestFile, ec);  // last: a kill before leaves the rest provable
  fs::remove(dir, ec);                                // only when empty
}

/// Removes the event files (regular files named events.out.tfevents.*) of folder `tb`, then
/// `tb` when empty; anything else in it is added to `kept`. Returns how many went.
int remove_event_files(const fs::path& tb, std::vector<std::string>& kept) {
  std::error_code ec;
  int removed = 0;
  for (const fs::path& e : entries_in(tb))
    if (e.filename().string().rfind("events.out.tfevents.", 0) == 0 &&
        fs::is_regular_file(fs::symlink_status(e, ec)))
      removed += fs::remove(e, ec) ? 1 : 0;
    else kept.push_back(e.string());
  fs::remove(tb, ec);  // only when empty
  return removed;
}
}  // namespace

std::string clear_earlier_events(const TrainSpec& spec) {
  const fs::path out(spec.output_dir), tb = out / "tensorboard";
  std::error_code ec;
  if (!has_run_record(out) || fs::is_symlink(tb, ec) || !fs::is_directory(tb, ec)) return "";
  std::vector<std::string> kept;
  const int n = remove_event_files(tb, kept);
  if (n == 0) return "";
  return fmt::format(
      "removed the {} TensorBoard event file{} of an earlier run from {} (its metrics.csv is "
      "replaced too){}",
      n, n == 1 ? "" : "s", tb.string(),
      kept.empty() ? std::string() : fmt::format(" (kept {}: not written by roundpipe)", name_list(kept)));
}

std::string clear_earlier_run(const TrainSpec& spec) {
  const fs::path out(spec.output_dir);
  std::error_code ec;
  if (!has_run_record(out)) return "";
  std::vector<std::string> removed, kept;
  for (const fs::path& p : entries_in(out)) {
    const std::string name = p.filename().string();
    if (!is_run_output(name) || name == kRunMarkerFile) continue;
    // no run makes a link, nor a file where it makes a folder: the user's, never followed
    const bool folder_name = name == "state" || name == "tensorboard" || name == "final" ||
                             name == "final-merged" || checkpoint_number(name) >= 0;
    if (fs::is_symlink(p, ec) || (folder_name && !fs::is_directory(p, ec))) {
      kept.push_back(p.string());
      continue;
    }
    if (name == "state") {
      for (const fs::path& s : entries_in(p))
        if (fs::is_directory(fs::symlink_status(s, ec))) remove_written(s, kept);
        else kept.push_back(s.string());
      fs::remove(p, ec);  // only when empty
    } else if (name == "tensorboard") {
      remove_event_files(p, kept);
    } else if (fs::is_directory(fs::symlink_status(p, ec))) {
      remove_written(p, kept);
    } else {
      fs::remove(p, ec);
    }
    removed.push_back(name);
  }
  if (removed.empty()) return "";
  return fmt::format(
      "overwrite: removed the earlier run's {} from {}{}", fmt::join(removed, ", "), spec.output_dir,
      kept.empty() ? std::string() : fmt::format(" (kept {}: not written by roundpipe)", name_list(kept)));
}

bool mark_output_dir(const TrainSpec& spec) {
  const std::string marker = (fs::path(spec.output_dir) / kRunMarkerFile).string();
  std::error_code ec;
  if (fs::exists(fs::symlink_status(marker, ec))) return false;  // prepare_output_dir checked it
  const std::string text =
      "{\"written_by\": \"roundpipe train\", \"note\": \"this folder's metrics.csv, profile.json, "
      "tensorboard/, "
      "trace.json, stop_status.txt, checkpoint-<n>/, final/, final-merged/ and state/ are roundpipe's: a "
      "later "
      "run may replace them\"}\n";
  write_file_atomically(marker, [&](std::ostream& os) { os << text; });
  return true;
}

}  // namespace rp
