#include "trainer/run_setup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/atomic_file.hpp"
#include "base/counted.hpp"
#include "base/error_text.hpp"
#include "base/host_resources.hpp"
#include "base/output_folder.hpp"
#include "scheduler/host_memory.hpp"
#include "trainer/checkpoint_bundle.hpp"

namespace fs = std::filesystem;

namespace rp {

OutputDirLock::OutputDirLock(const TrainSpec& spec) {
  std::error_code ec;
  if (fs::exists(spec.output_dir, ec) && !fs::is_directory(spec.output_dir, ec))
    return;  // prepare_output_dir says
  if (const std::string why = dangling_link_text(spec.output_dir); !why.empty())
    throw std::invalid_argument(fmt::format(
        "{}: key 'output_dir': {}; create that folder or give another output_dir", spec.source, why));
  made_ = create_folders(spec.output_dir, ec);  // exactly what this run makes
  if (ec) {
    remove_made_if_empty();
    made_.clear();
    throw std::invalid_argument(fmt::format("{}: key 'output_dir': cannot create '{}': {}", spec.source,
                                            spec.output_dir, ec.message()));
  }
  fd_ = ::open(spec.output_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    remove_made_if_empty();
    throw std::invalid_argument(fmt::format("{}: key 'output_dir': cannot open '{}': {}", spec.source,
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
    throw std::invalid_argument(fmt::format(
        "{}: key 'output_dir': '{}' is in use by another roundpipe run; wait for it to end or give this run "
        "another output_dir",
        spec.source, spec.output_dir));
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

void log_leftovers(const std::vector<StaleTemporary>& stale) {
  std::vector<std::string> foreign;
  for (const auto& s : stale) {
    if (s.left_alone) foreign.push_back(s.path);
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

void check_output_dir(const TrainSpec& spec) {
  if (spec.metrics_jsonl && !spec.metrics_jsonl->empty())
    check_output_file(spec, *spec.metrics_jsonl, fmt::format("{}: key 'metrics_jsonl'", spec.source));
  const std::string& out = spec.output_dir;
  if (const std::string why = unsafe_output_folder(out); !why.empty())
    throw std::invalid_argument(fmt::format(
        "{}: key 'output_dir': '{}' {}; a run's outputs need a folder of their own", spec.source, out, why));
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
          fmt::format("{}: key 'output_dir': '{}' is, holds or lies inside the input '{}' (key '{}'), which "
                      "the run's outputs "
                      "could replace; choose a separate output_dir",
                      spec.source, out, *path, key));
  // a resume_from that is no checkpoint at all gets check_resume's more useful line
  if (spec.resume_from.empty() || !looks_like_checkpoint(spec.resume_from)) return;
  const fs::path o = resolved_path(out), r = resolved_path(spec.resume_from);
  // resuming a checkpoint of the run in output_dir is the one input allowed inside it
  if (path_within(o, r) || (path_within(r, o) && r.parent_path() != o))
    throw std::invalid_argument(
        fmt::format("{}: key 'output_dir': '{}' is, holds or lies inside the checkpoint '{}' the run resumes "
                    "from (--resume), "
                    "which the run's outputs could replace; choose a separate output_dir",
                    spec.source, out, spec.resume_from));
}

void prepare_output_dir(const TrainSpec& spec) {
  std::error_code ec;
  if (fs::exists(spec.output_dir, ec) && !fs::is_directory(spec.output_dir, ec))
    throw std::invalid_argument(fmt::format("{}: key 'output_dir': expected a directory, but '{}' is a file",
                                            spec.source, spec.output_dir));
  const fs::path fin = fs::path(spec.output_dir) / "final";
  if (fs::exists(fin, ec) && !fs::is_directory(fin, ec))
    throw std::invalid_argument(fmt::format(
        "{}: key 'output_dir': '{}' exists and is not a checkpoint folder", spec.source, fin.string()));
  // a save killed between its state and its weights: made whole before the leftovers go
  for (const std::string& line : mend_interrupted_saves(spec.output_dir)) spdlog::warn("{}", line);
  std::vector<StaleTemporary> stale = clean_stale_temporaries(spec.output_dir);
  for (auto& s : clean_stale_temporaries(spec.output_dir + "/state")) stale.push_back(std::move(s));
  log_leftovers(stale);
  const fs::path record = fs::path(spec.output_dir) / kRunMarkerFile;
  if (fs::exists(fs::symlink_status(record, ec)) && !has_run_record(spec.output_dir))
    throw std::invalid_argument(
        fmt::format("{}: key 'output_dir': {} is not a run record roundpipe wrote (expected a small JSON "
                    "file with \"written_by\": "
                    "\"roundpipe train\"), so nothing proves the folder's run outputs roundpipe's; move it "
                    "away or choose another "
                    "output_dir",
                    spec.source, record.string()));
  // no run makes a link: one named like a run output would be replaced (or written through)
  for (fs::directory_iterator it(spec.output_dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_run_output(it->path().filename().string()) && it->is_symlink(ec))
      throw std::invalid_argument(
          fmt::format("{}: key 'output_dir': {} is a symbolic link, where the run writes {} of its own; move "
                      "it away or choose "
                      "another output_dir",
                      spec.source, it->path().string(), it->is_directory(ec) ? "a folder" : "a file"));
  if (const auto foreign = unrecorded_outputs(spec.output_dir); !foreign.empty())
    throw std::invalid_argument(
        fmt::format("{}: key 'output_dir': '{}' holds {} that no roundpipe run recorded as its own (no {}), "
                    "and the run would "
                    "replace {}; move {} away or choose another output_dir",
                    spec.source, spec.output_dir, fmt::join(foreign, ", "), kRunMarkerFile,
                    foreign.size() == 1 ? "it" : "them", foreign.size() == 1 ? "it" : "them"));
  if (!spec.resume_from.empty() || spec.overwrite_output_dir) return;
  // a fresh run would replace an earlier run's checkpoints and metrics
  const std::vector<std::string> found = checkpoints_in(spec.output_dir);
  if (found.empty()) return;
  const std::string resume = newest_resumable_checkpoint(spec.output_dir, found);
  const std::string advice =
      resume.empty() ? std::string(
                           "none of them can be resumed (their trainer state is missing or belongs to other "
                           "weights); start over")
                     : fmt::format("continue it with --resume {}/{}, start over", spec.output_dir, resume);
  throw std::invalid_argument(
      fmt::format("{}: key 'output_dir': '{}' holds an earlier run's checkpoints ({}); {} there with "
                  "--overwrite-output-dir "
                  "(\"overwrite_output_dir\": true), or choose another output_dir",
                  spec.source, spec.output_dir, fmt::join(found, ", "), advice));
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
}  // namespace

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
      for (const fs::path& e : entries_in(p))
        if (e.filename().string().rfind("events.out.tfevents.", 0) == 0 &&
            fs::is_regular_file(fs::symlink_status(e, ec)))
          fs::remove(e, ec);
        else kept.push_back(e.string());
      fs::remove(p, ec);
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

void check_data_paths(const TrainSpec& spec) {
  auto check = [&](const char* key, const std::string& path) {
    // a folder must list, a file must open for reading; errno names what stops it
    int err = 0;
    struct stat st {};
    // a FIFO would block the open below, a device be read without end
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
      throw std::invalid_argument(fmt::format(
          "{}: key '{}': {}: not a regular file (a device, FIFO or socket); expected a file or a folder",
          spec.source, key, path));
    if (DIR* dir = ::opendir(path.c_str())) {
      ::closedir(dir);
    } else if (errno != ENOTDIR) {
      err = errno;
    } else if (const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
      ::close(fd);
    } else {
      err = errno;
    }
    if (err)
      throw std::invalid_argument(
          fmt::format("{}: key '{}': {}: {}", spec.source, key, path, std::strerror(err)));
  };
  // a resumed full fine-tuning run reads its weights from the checkpoint, not from "model"
  if (spec.resume_from.empty() || spec.lora || !spec.adapter.empty()) check("model", spec.model);
  for (const auto& p : data_paths(spec)) check("data", p);
  for (const auto& p : eval_data_paths(spec)) check("eval_data", p);
}

void check_compute_dtype(const TrainSpec& spec) {
  if (spec.compute_dtype != "f16") return;  // fp16 storage exists only on the CUDA backend
  const bool cuda = spec.backend == "cuda" || (spec.backend == "auto" && cuda_device_count() > 0);
  if (!cuda)
    throw std::invalid_argument(fmt::format(
        "{}: key 'compute_dtype': \"f16\" needs the cuda backend (the cpu backend computes in f32){}",
        spec.source, spec.backend == "auto" ? "; no CUDA device is visible" : ""));
}

void require_tokenizer(const LoadedModel& model) {
  if (model.tokenizer_json.is_null())
    throw std::runtime_error(model.source + ": the model carries no tokenizer (tokenizer.json)");
}

namespace {

void log_model(const ModelConfig& c) {
  if (c.num_moe_layers() > 0)
    spdlog::info(
        "model: {} layers ({} sparse: {} experts, top-{}, expert ffn {}; load-balancing loss {}), hidden {}, "
        "{} heads ({} kv), vocab {}, {:.1f} M parameters ({:.1f} M active per token){}",
        c.num_hidden_layers, c.num_moe_layers(), c.num_experts, c.num_experts_per_tok,
        c.moe_intermediate_size,
        c.aux_loss_coef() > 0 ? fmt::format("x {}", c.aux_loss_coef()) : std::string("off"), c.hidden_size,
        c.num_attention_heads, c.num_key_value_heads, c.vocab_size, c.num_parameters() / 1e6,
        c.num_active_parameters() / 1e6, c.tie_word_embeddings ? ", tied embeddings" : "");
  else
    spdlog::info("model: {} layers, hidden {}, {} heads ({} kv), ffn {}, vocab {}, {:.1f} M parameters{}",
                 c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                 c.intermediate_size, c.vocab_size, c.num_parameters() / 1e6,
                 c.tie_word_embeddings ? ", tied embeddings" : "");
}

}  // namespace

LoadedModel load_model_for_training(const std::string& path) {
  spdlog::info("loading model {}", path);
  LoadedModel lm = load_model(path);
  log_model(lm.config);
  require_tokenizer(lm);
  return lm;
}

ModelSource open_model_for_training(const std::string& path) {
  spdlog::info("loading model {}", path);
  ModelSource src = ModelSource::open(path);
  log_model(src.config());
  require_tokenizer(src.header());
  return src;
}

std::string optimizer_line(const TrainSpec& spec) {
  const AdamWOptions& a = spec.adam;
  const std::string kind =
      std::string(a.decoupled ? "AdamW" : "Adam with L2 weight decay") + (a.amsgrad ? " (AMSGrad)" : "");
  const std::string clip =
      spec.max_grad_norm > 0 ? fmt::format("clipping at {:g}", spec.max_grad_norm) : "clipping off";
  return fmt::format("optimizer: {} (lr {:g}, weight decay {:g}, {}), {}", kind, a.lr, a.weight_decay, clip,
                     spec.async
                         ? "staleness 1 (async, the default; \"async\": false for a synchronous step)"
                         : "synchronous (staleness 0, \"async\": false; the default \"async\": true overlaps "
                           "each update with the next step)");
}

namespace {
/// One line per data file whose supervised examples lost tokens to seq_len.
void warn_truncated(const std::string& file, const TokenStreamStats& st, int64_t seq_len) {
  if (st.truncated_examples == 0) return;
  spdlog::warn("{}: {} of {} truncated to {} (raise seq_len to keep {} whole)", file, st.truncated_examples,
               counted(st.examples, "example"), counted(seq_len, "token"),
               st.truncated_examples == 1 ? "it" : "them");
}
}  // namespace

TokenStream load_data_for_training(const TrainSpec& spec, const LoadedModel& model) {
  TokenStreamOptions o;
  o.seq_len = spec.seq_len;
  o.chat_template = TokenStream::chat_template_for(model, spec.chat_template);
  o.max_examples = spec.max_examples;
  o.seed = spec.seed;
  o.packing = spec.packing;
  o.eval_fraction = spec.eval_data.empty() ? spec.eval_fraction : 0;
  spdlog::info("loading data {} (chat template {})", spec.data, o.chat_template);
  std::optional<TokenStream> loaded;
  try {
    if (spec.data_mixture.empty()) loaded.emplace(model, spec.data, o);
    else loaded.emplace(model, spec.data_mixture, o);
  } catch (const std::length_error& e) {  // the packed sequences do not fit the host
    throw std::invalid_argument(fmt::format("{}: key 'seq_len': {}", spec.source, e.what()));
  }
  TokenStream& data = *loaded;
  const TokenStreamStats& st = data.stats();
  spdlog::info("data: {}{} -> {} of {}{}", st.examples == 0 ? std::string() : counted(st.examples, "example"),
               st.text_tokens == 0
                   ? std::string()
                   : fmt::format("{}{}", st.examples == 0 ? "" : ", ", counted(st.text_tokens, "text token")),
               counted(st.sequences, "sequence"), counted(spec.seq_len, "token"),
               st.dropped_examples
                   ? fmt::format(" ({} dropped: no target left)", counted(st.dropped_examples, "example"))
                   : std::string());
  warn_truncated(spec.data, st, spec.seq_len);
  if (o.eval_fraction > 0 && (st.eval_sequences == 0 || st.sequences == 0))
    throw std::invalid_argument(fmt::format(
        "{}: key 'eval_fraction': {:g} of the {} of {} holds out {} for evaluation and leaves {} for "
        "training; expected at least 1 of each{}",
        spec.source, o.eval_fraction, counted(st.sequences + st.eval_sequences, "sequence"), spec.data,
        st.eval_sequences, st.sequences,
        st.eval_sequences == 0 && st.sequences > 0
            ? fmt::format(" (a fraction of at least {:g} holds one out, or give eval_data)",
                          1.0 / double(st.sequences))
            : std::string()));
  if (st.sequences == 0)
    throw std::invalid_argument(fmt::format(
        "{}: key 'seq_len': {} tokens leave no training target in any of the {} of {} (their prompts "
        "are longer); raise seq_len",
        spec.source, spec.seq_len, counted(st.examples, "example"), spec.data));
  if (st.sequences < spec.sequences_per_step)
    spdlog::warn("data: {}, fewer than sequences_per_step {}: every step repeats sequences",
                 counted(st.sequences, "training sequence"), spec.sequences_per_step);
  const int64_t max_pos = model.config.max_position_embeddings;
  if (max_pos > 0 && spec.seq_len > max_pos)
    spdlog::warn("seq_len {} exceeds the model's max_position_embeddings {}", spec.seq_len, max_pos);
  return std::move(data);
}

std::vector<TokenBatch> load_eval_batches(const TrainSpec& spec, const LoadedModel& model,
                                          const TokenStream& train) {
  const int64_t per_pass = spec.sequences_per_step / spec.accumulation;
  if (spec.eval_data.empty()) {
    if (train.stats().eval_sequences == 0) return {};
    spdlog::info("eval: {} held out of {}", counted(train.stats().eval_sequences, "sequence"), spec.data);
    return train.evaluation_batches(per_pass);
  }
  TokenStreamOptions o;
  o.seq_len = spec.seq_len;
  o.chat_template = TokenStream::chat_template_for(model, spec.chat_template);
  o.packing = spec.packing;
  o.eval_fraction = 1;
  std::vector<TokenBatch> batches;  // every file evaluated whole, one after the other
  for (const std::string& path : eval_data_paths(spec)) {
    TokenStream ev(model, path, o);
    spdlog::info("eval: {} of {}", counted(ev.stats().eval_sequences, "sequence"), path);
    warn_truncated(path, ev.stats(), spec.seq_len);
    if (ev.stats().eval_sequences == 0)
      throw std::invalid_argument(
          fmt::format("{}: key 'eval_data': {} holds no sequence with a target at seq_len {}", spec.source,
                      path, spec.seq_len));
    for (auto& b : ev.evaluation_batches(per_pass)) batches.push_back(std::move(b));
  }
  return batches;
}

std::string resolve_epochs(TrainSpec& spec, int64_t training_sequences) {
  if (!spec.epochs) return "";
  const int64_t n = training_sequences, per_step = spec.sequences_per_step;
  const double exact = *spec.epochs * double(n) / double(per_step);
  // a hair above the integer it should be (0.1 x 30 / 3 = 1.0000000000000002) stays that integer
  const double steps = std::max(1.0, std::ceil(exact - 1e-9));
  if (!(steps < double(int64_t(1) << 52)))
    throw std::invalid_argument(fmt::format(
        "{}: key 'epochs': {:g} epochs of {} sequences are too many steps", spec.source, *spec.epochs, n));
  spec.steps = int64_t(steps);
  const bool follows = spec.lr_schedule.total_steps == 0;
  if (follows) spec.lr_schedule.total_steps = spec.steps;
  if (spec.lr_schedule.kind != "constant" && spec.lr_schedule.total_steps < spec.lr_schedule.warmup_steps)
    throw std::invalid_argument(fmt::format(
        "{}: key 'epochs': {:g} epochs of {} training sequences are {} steps of {} sequences, fewer than "
        "lr_schedule.warmup_steps {}",
        spec.source, *spec.epochs, n, spec.steps, per_step, spec.lr_schedule.warmup_steps));
  return fmt::format("epochs: {:g} x {} training sequences / {} per step = {} steps{}", *spec.epochs, n,
                     per_step, spec.steps,
                     follows && spec.lr_schedule.kind != "constant"
                         ? fmt::format(" (the {} schedule decays over them)", spec.lr_schedule.kind)
                         : std::string());
}

SessionOptions session_options_of(const TrainSpec& spec, const ModelLayout& layout) {
  SessionOptions opt;
  opt.backend = spec.backend;
  opt.workers = spec.workers;
  opt.micro_batches = spec.micro_batches;
  const int64_t per_pass = spec.sequences_per_step / spec.accumulation;
  opt.micro.n_seq = per_pass / spec.micro_batches;
  opt.micro.seq_len = spec.seq_len;
  opt.async = spec.async;
  opt.async_weight_prediction = spec.async_compensation == "predict";
  opt.adam = spec.adam;
  opt.max_grad_norm = spec.max_grad_norm;
  opt.skip_nonfinite = spec.nonfinite == "skip";
  opt.device.capacity_bytes = size_t(spec.device_memory_gib * double(1ull << 30));
  opt.device.pcie_bytes_per_s = spec.pcie_gbps * 1e9;
  opt.device.dtype = parse_dtype(spec.compute_dtype);
  opt.device.f16_accumulation = spec.gemm_accumulate == "f16";
  opt.device.fp8 = spec.fp8;
  opt.device.fp8_weight_gradients = spec.fp8_weight_gradients;
  opt.device.fp8_stored_direct = spec.fp8_stored_direct;
  opt.device.expert_gemm_bucketed = spec.expert_gemm == "bucketed";
  opt.loss_scaling = spec.loss_scaling;
  opt.transfer_priorities = spec.transfer_priorities;
  opt.transfer_chunk_bytes = size_t(spec.transfer_chunk_bytes);
  opt.save_attention = spec.save_attention;
  opt.mlp_chunk_tokens = spec.mlp_chunk_tokens;
  if (spec.pin_budget_gib) opt.pin_budget_bytes = size_t(*spec.pin_budget_gib * double(1ull << 30));
  if (spec.frozen_tier) {
    opt.frozen_tier =
        FrozenTierOptions{spec.frozen_tier->path, spec.frozen_tier->ring_gib, spec.frozen_tier->resident_gib};
    opt.frozen_tier->host_budget_gib = spec.frozen_tier->host_budget_gib;
    opt.frozen_tier->spill_layers = int(spec.frozen_tier->spill_layers);
  }
  // No "plan" key: automatic (analytic estimate, then re-planned from the profile once it
  // settles). An explicit plan is never changed.
  if (!spec.plan.is_null())
    opt.plan = plan_from_json(spec.plan, layout.num_layers(), spec.workers, spec.source + ": key 'plan'");
  opt.trace = spec.trace;
  opt.watchdog_s = spec.watchdog_s;
  opt.trace_messages = spec.trace_messages;
  return opt;
}

std::string warn_host_memory(const TrainSpec& spec, const ModelLayout& layout) {
  const double total = double(host_total_bytes());
  if (!(total > 0)) return "";
  HostRun run;
  if (layout.lora) {
    run.lora_r = layout.lora->r;
    run.lora_targets = layout.lora->target_modules;
    for (const std::string& t : layout.lora->target_parameters) run.lora_targets.push_back(t);
    run.frozen = layout.lora->base_format;
  }
  run.seq_len = spec.seq_len;
  run.micro_batches = spec.micro_batches;
  run.sequences_per_micro = spec.sequences_per_step / spec.accumulation / spec.micro_batches;
  run.workers = spec.workers;
  run.pass_slots = SessionOptions{}.pass_slots;
  // absent: the session keeps the attention outputs only when they fit, so the need is without
  run.saved_attention = spec.save_attention.value_or(false);
  const bool cpu = spec.backend == "cpu" || (spec.backend == "auto" && cuda_device_count() == 0);
  run.elem_bytes = cpu ? 4 : int64_t(dtype_size(parse_dtype(spec.compute_dtype)));
  const HostMemoryNeed need = host_memory_need(layout, run);
  if (need.total() <= kHostHeadroom * total) return "";
  std::string text = fmt::format("host memory: this run needs about {}, over {:.0f}% of this machine's {}{}",
                                 host_memory_text(need), 100 * kHostHeadroom, byte_text(total),
                                 cpu ? " (the CPU backend's virtual GPUs come on top)" : "");
  const auto changes = host_memory_alternatives(layout.config, run, total);
  if (!changes.empty()) text += "; changes that lower it:";
  for (const HostMemoryChange& ch : changes)
    text += fmt::format("\n  - {}: needs {} ({}){}", ch.what, byte_text(ch.need),
                        ch.fits ? "fits" : "still over", ch.how.empty() ? "" : "; " + ch.how);
  spdlog::warn("{}", text);
  return text;
}

}  // namespace rp
