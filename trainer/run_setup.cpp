#include "trainer/run_setup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "base/atomic_file.hpp"
#include "trainer/checkpoint_bundle.hpp"

namespace fs = std::filesystem;

namespace rp {

OutputDirLock::OutputDirLock(const TrainSpec& spec) {
  std::error_code ec;
  if (fs::exists(spec.output_dir, ec) && !fs::is_directory(spec.output_dir, ec)) return;  // prepare_output_dir says
  created_ = fs::create_directories(spec.output_dir, ec);
  if (ec)
    throw std::invalid_argument(
        fmt::format("{}: key 'output_dir': cannot create '{}': {}", spec.source, spec.output_dir, ec.message()));
  fd_ = ::open(spec.output_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    if (created_) fs::remove(spec.output_dir, ec);
    throw std::invalid_argument(
        fmt::format("{}: key 'output_dir': cannot open '{}': {}", spec.source, spec.output_dir, std::strerror(err)));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
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
}

OutputDirLock::~OutputDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

OutputDirLock::OutputDirLock(OutputDirLock&& o) noexcept : fd_(o.fd_), created_(o.created_) { o.fd_ = -1; }

OutputDirLock& OutputDirLock::operator=(OutputDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    created_ = o.created_;
    o.fd_ = -1;
  }
  return *this;
}

void prepare_output_dir(const TrainSpec& spec) {
  std::error_code ec;
  if (fs::exists(spec.output_dir, ec) && !fs::is_directory(spec.output_dir, ec))
    throw std::invalid_argument(fmt::format("{}: key 'output_dir': expected a directory, but '{}' is a file",
                                            spec.source, spec.output_dir));
  const fs::path fin = fs::path(spec.output_dir) / "final";
  if (fs::exists(fin, ec) && !fs::is_directory(fin, ec))
    throw std::invalid_argument(fmt::format("{}: key 'output_dir': '{}' exists and is not a checkpoint folder",
                                            spec.source, fin.string()));
  std::vector<StaleTemporary> stale = clean_stale_temporaries(spec.output_dir);
  for (auto& s : clean_stale_temporaries(spec.output_dir + "/state")) stale.push_back(std::move(s));
  for (const auto& s : stale) {
    if (s.restored) spdlog::warn("restored {} from {} (a run was killed while replacing it)", s.target, s.path);
    else spdlog::info("removed {} left by an interrupted run", s.path);
  }
  if (!spec.resume_from.empty() || spec.overwrite_output_dir) return;
  // a fresh run would replace an earlier run's checkpoints and metrics
  const std::vector<std::string> found = checkpoints_in(spec.output_dir);
  if (found.empty()) return;
  const std::string resume = newest_checkpoint(found);
  throw std::invalid_argument(fmt::format(
      "{}: key 'output_dir': '{}' holds an earlier run's checkpoints ({}); continue it with --resume {}/{}, start "
      "over there with --overwrite-output-dir (\"overwrite_output_dir\": true), or choose another output_dir",
      spec.source, spec.output_dir, fmt::join(found, ", "), spec.output_dir, resume));
}

void check_data_paths(const TrainSpec& spec) {
  auto check = [&](const char* key, const std::string& path) {
    // a folder must list, a file must open for reading; errno names what stops it
    int err = 0;
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
  check("data", spec.data);
  if (!spec.eval_data.empty()) check("eval_data", spec.eval_data);
}

void check_compute_dtype(const TrainSpec& spec) {
  if (spec.compute_dtype != "f16") return;  // fp16 storage exists only on the CUDA backend
  const bool cuda = spec.backend == "cuda" || (spec.backend == "auto" && cuda_device_count() > 0);
  if (!cuda)
    throw std::invalid_argument(fmt::format(
        "{}: key 'compute_dtype': \"f16\" needs the cuda backend (the cpu backend computes in f32){}", spec.source,
        spec.backend == "auto" ? "; no CUDA device is visible" : ""));
}

void require_tokenizer(const LoadedModel& model) {
  if (model.tokenizer_json.is_null())
    throw std::runtime_error(model.source + ": the model carries no tokenizer (tokenizer.json)");
}

namespace {

void log_model(const ModelConfig& c) {
  if (c.num_moe_layers() > 0)
    spdlog::info("model: {} layers ({} sparse: {} experts, top-{}, expert ffn {}; load-balancing loss {}), hidden {}, "
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
    loaded.emplace(model, spec.data, o);
  } catch (const std::length_error& e) {  // the packed sequences do not fit the host
    throw std::invalid_argument(fmt::format("{}: key 'seq_len': {}", spec.source, e.what()));
  }
  TokenStream& data = *loaded;
  const TokenStreamStats& st = data.stats();
  spdlog::info("data: {}{} -> {} sequences of {} tokens{}",
               st.examples == 0 ? std::string() : fmt::format("{} examples", st.examples),
               st.text_tokens == 0 ? std::string()
                                   : fmt::format("{}{} text tokens", st.examples == 0 ? "" : ", ", st.text_tokens),
               st.sequences, spec.seq_len,
               st.dropped_examples ? fmt::format(" ({} examples dropped: no target left)", st.dropped_examples)
                                   : std::string());
  if (o.eval_fraction > 0 && (st.eval_sequences == 0 || st.sequences == 0))
    throw std::invalid_argument(fmt::format(
        "{}: key 'eval_fraction': {:g} of the {} sequences of {} holds out {} for evaluation and leaves {} for "
        "training; expected at least 1 of each{}",
        spec.source, o.eval_fraction, st.sequences + st.eval_sequences, spec.data, st.eval_sequences, st.sequences,
        st.eval_sequences == 0 && st.sequences > 0
            ? fmt::format(" (a fraction of at least {:g} holds one out, or give eval_data)",
                          1.0 / double(st.sequences))
            : std::string()));
  if (st.sequences == 0)
    throw std::invalid_argument(fmt::format(
        "{}: key 'seq_len': {} tokens leave no training target in any of the {} examples of {} (their prompts "
        "are longer); raise seq_len",
        spec.source, spec.seq_len, st.examples, spec.data));
  if (st.sequences < spec.sequences_per_step)
    spdlog::warn("data: {} training sequence(s), fewer than sequences_per_step {}: every step repeats sequences",
                 st.sequences, spec.sequences_per_step);
  const int64_t max_pos = model.config.max_position_embeddings;
  if (max_pos > 0 && spec.seq_len > max_pos)
    spdlog::warn("seq_len {} exceeds the model's max_position_embeddings {}", spec.seq_len, max_pos);
  return std::move(data);
}

std::vector<TokenBatch> load_eval_batches(const TrainSpec& spec, const LoadedModel& model, const TokenStream& train) {
  const int64_t per_pass = spec.sequences_per_step / spec.accumulation;
  if (spec.eval_data.empty()) {
    if (train.stats().eval_sequences == 0) return {};
    spdlog::info("eval: {} sequences held out of {}", train.stats().eval_sequences, spec.data);
    return train.evaluation_batches(per_pass);
  }
  TokenStreamOptions o;
  o.seq_len = spec.seq_len;
  o.chat_template = TokenStream::chat_template_for(model, spec.chat_template);
  o.packing = spec.packing;
  o.eval_fraction = 1;
  TokenStream ev(model, spec.eval_data, o);
  spdlog::info("eval: {} sequences of {}", ev.stats().eval_sequences, spec.eval_data);
  if (ev.stats().eval_sequences == 0)
    throw std::invalid_argument(fmt::format("{}: key 'eval_data': {} holds no sequence with a target at seq_len {}",
                                            spec.source, spec.eval_data, spec.seq_len));
  return ev.evaluation_batches(per_pass);
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
  opt.adam = spec.adam;
  opt.max_grad_norm = spec.max_grad_norm;
  opt.skip_nonfinite = spec.nonfinite == "skip";
  opt.device.capacity_bytes = size_t(spec.device_memory_gib * double(1ull << 30));
  opt.device.pcie_bytes_per_s = spec.pcie_gbps * 1e9;
  opt.device.dtype = parse_dtype(spec.compute_dtype);
  opt.loss_scaling = spec.loss_scaling;
  opt.transfer_priorities = spec.transfer_priorities;
  opt.transfer_chunk_bytes = size_t(spec.transfer_chunk_bytes);
  opt.save_attention = spec.save_attention;
  opt.mlp_chunk_tokens = spec.mlp_chunk_tokens;
  if (spec.pin_budget_gib) opt.pin_budget_bytes = size_t(*spec.pin_budget_gib * double(1ull << 30));
  // No "plan" key: automatic (analytic estimate, then re-planned from the profile once it
  // settles). An explicit plan is never changed.
  if (!spec.plan.is_null())
    opt.plan = plan_from_json(spec.plan, layout.num_layers(), spec.workers, spec.source + ": key 'plan'");
  opt.trace = spec.trace;
  opt.watchdog_s = spec.watchdog_s;
  opt.trace_messages = spec.trace_messages;
  return opt;
}

}  // namespace rp
