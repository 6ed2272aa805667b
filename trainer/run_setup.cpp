#include "trainer/run_setup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/counted.hpp"
#include "base/host_resources.hpp"
#include "scheduler/host_memory.hpp"

namespace rp {

void check_data_paths(const TrainSpec& spec) {
  // named by what gave the path: the --model / --data / --set that did, else the spec file
  auto check = [&](const char* key, const std::string& path) {
    // a folder must list, a file must open for reading; errno names what stops it
    int err = 0;
    struct stat st {};
    // a FIFO would block the open below, a device be read without end
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
      throw std::invalid_argument(fmt::format(
          "{}: key '{}': {}: not a regular file (a device, FIFO or socket); expected a file or a folder",
          setting_origin(spec, key), key, path));
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
          fmt::format("{}: key '{}': {}: {}", setting_origin(spec, key), key, path, std::strerror(err)));
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
        setting_origin(spec, "compute_dtype"), spec.backend == "auto" ? "; no CUDA device is visible" : ""));
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
    throw std::invalid_argument(
        fmt::format("{}: key 'seq_len': {}", setting_origin(spec, "seq_len"), e.what()));
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
        setting_origin(spec, "eval_fraction"), o.eval_fraction,
        counted(st.sequences + st.eval_sequences, "sequence"), spec.data, st.eval_sequences, st.sequences,
        st.eval_sequences == 0 && st.sequences > 0
            ? fmt::format(" (a fraction of at least {:g} holds one out, or give eval_data)",
                          1.0 / double(st.sequences))
            : std::string()));
  // text alone (no supervised example) too short for one window: no seq_len helps
  if (st.sequences == 0 && st.examples == 0)
    throw std::invalid_argument(fmt::format(
        "{}: its text makes {}, too few for one training sequence (an input and the token after it); "
        "expected more text",
        spec.data, counted(st.text_tokens, "token")));
  if (st.sequences == 0)
    throw std::invalid_argument(fmt::format(
        "{}: key 'seq_len': {} tokens leave no training target in any of the {} of {} (their prompts "
        "are longer); raise seq_len",
        setting_origin(spec, "seq_len"), spec.seq_len, counted(st.examples, "example"), spec.data));
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
          fmt::format("{}: key 'eval_data': {} holds no sequence with a target at seq_len {}",
                      setting_origin(spec, "eval_data"), path, spec.seq_len));
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
    throw std::invalid_argument(
        fmt::format("{}: key 'epochs': {:g} epochs of {} sequences are too many steps",
                    setting_origin(spec, "epochs"), *spec.epochs, n));
  spec.steps = int64_t(steps);
  const bool follows = spec.lr_schedule.total_steps == 0;
  if (follows) spec.lr_schedule.total_steps = spec.steps;
  if (spec.lr_schedule.total_steps < spec.lr_schedule.warmup_steps)  // any kind: the warmup ramps them all
    throw std::invalid_argument(fmt::format(
        "{}: key 'epochs': {:g} epochs of {} training sequences are {} steps of {} sequences, fewer than "
        "lr_schedule.warmup_steps {}",
        setting_origin(spec, "epochs"), *spec.epochs, n, spec.steps, per_step,
        spec.lr_schedule.warmup_steps));
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
  opt.capacity_origin = setting_origin(spec, "device_memory_gib") + ": key 'device_memory_gib'";
  opt.device.pcie_bytes_per_s = spec.pcie_gbps * 1e9;
  opt.device.dtype = parse_dtype(spec.compute_dtype);
  opt.device.f16_accumulation = spec.gemm_accumulate == "f16";
  opt.device.fp8 = spec.fp8;
  opt.device.fp8_weight_gradients = fp8_weight_gradients_on(spec);
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
    opt.plan = plan_from_json(spec.plan, layout.num_layers(), spec.workers,
                              setting_origin(spec, "plan") + ": key 'plan'");
  opt.trace = spec.trace;
  opt.watchdog_s = spec.watchdog_s;
  opt.trace_messages = spec.trace_messages;
  return opt;
}

namespace {
/// Bytes of one activation element: the CPU backend computes in fp32, the CUDA one in compute_dtype.
int64_t activation_elem_bytes(const TrainSpec& spec) {
  const bool cpu = spec.backend == "cpu" || (spec.backend == "auto" && cuda_device_count() == 0);
  return cpu ? 4 : int64_t(dtype_size(parse_dtype(spec.compute_dtype)));
}
}  // namespace

void check_batch_fits_host(const TrainSpec& spec, const ModelConfig& c, size_t available_bytes) {
  if (available_bytes == 0) return;
  const double available = double(available_bytes), L = double(spec.seq_len);
  const double token = 3 * sizeof(int32_t);                                        // ids, targets, positions
  const double act = double(c.hidden_size) * double(activation_elem_bytes(spec));  // one layer, per token
  const double one_sequence = L * (2 * token + act);
  if (one_sequence > available)
    throw std::invalid_argument(fmt::format(
        "{}: key 'seq_len': one sequence of {} tokens needs {} of host memory (its tokens and one layer's "
        "activations of hidden size {}), {} are available; lower seq_len",
        setting_origin(spec, "seq_len"), spec.seq_len, byte_text(one_sequence), c.hidden_size,
        byte_text(available)));
  const int64_t per_pass = spec.sequences_per_step / spec.accumulation;
  const int64_t per_micro = per_pass / spec.micro_batches;
  const double pass = double(per_pass) * L * token + double(per_micro) * L * act;
  if (pass > available)
    throw std::invalid_argument(fmt::format(
        "{}: key 'sequences_per_step': a pass of {} of {} tokens needs {} of host memory (the token "
        "batch and one layer's activations of a micro-batch of {}), {} are available; lower "
        "sequences_per_step or raise accumulation",
        setting_origin(spec, "sequences_per_step"), counted(per_pass, "sequence"), spec.seq_len,
        byte_text(pass), per_micro, byte_text(available)));
}

std::string warn_host_memory(const TrainSpec& spec, const ModelLayout& layout, int replicas) {
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
  run.accumulation = spec.accumulation;
  run.replicas = replicas;
  run.workers = spec.workers;
  run.pass_slots = SessionOptions{}.pass_slots;
  // absent: the session keeps the attention outputs only when they fit, so the need is without
  run.saved_attention = spec.save_attention.value_or(false);
  const bool cpu = spec.backend == "cpu" || (spec.backend == "auto" && cuda_device_count() == 0);
  run.elem_bytes = activation_elem_bytes(spec);
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
