// Experiment specs (roundpipe/spec.hpp): parsing and checking; docs/spec.md lists the keys.
#include "roundpipe/spec.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include "base/checked_math.hpp"
#include "base/error_text.hpp"
#include "base/json_fields.hpp"
#include "base/json_text.hpp"
#include "base/utf8.hpp"
#include "data/chat_template.hpp"
#include "kernels/weight_format.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/plan.hpp"
#include "trainer/spec_data.hpp"
#include "trainer/spec_sections.hpp"

namespace rp {

namespace {

// fp16 accumulation of the linears' GEMMs (docs/gpu.md): only on fp16 storage.
void check_expert_gemm(const JsonFields& f, const TrainSpec& s) {
  if (s.expert_gemm != "grouped" && s.expert_gemm != "bucketed")
    f.fail("expert_gemm", "\"grouped\" or \"bucketed\"", s.expert_gemm);
}
void check_gemm_accumulate(const JsonFields& f, const TrainSpec& s) {
  if (s.gemm_accumulate != "f32" && s.gemm_accumulate != "f16")
    f.fail("gemm_accumulate", "\"f32\" or \"f16\"", s.gemm_accumulate);
  if (s.gemm_accumulate == "f16" && s.compute_dtype != "f16")
    f.fail_with(
        "key 'gemm_accumulate': \"f16\" needs \"compute_dtype\": \"f16\" (bf16 tensor cores accumulate in "
        "fp32 only)");
}

void check_base_model_id(const JsonFields& f, const TrainSpec& s) {
  if (!s.base_model_id.empty() && !is_hub_model_id(s.base_model_id))
    f.fail("base_model_id", "a Hugging Face model id \"owner/name\" (letters, digits, '-', '_', '.')",
           s.base_model_id);
}

/// The model, the training and evaluation data and their shape.
void read_data_keys(const JsonFields& f, TrainSpec& s) {
  f.optional("model", s.model);
  f.optional("base_model_id", s.base_model_id);
  check_base_model_id(f, s);
  read_data_key(f, s);
  check_recorded_paths(f, s);
  f.optional("chat_template", s.chat_template);
  f.optional("seq_len", s.seq_len);
  f.optional("max_examples", s.max_examples);
  f.optional("packing", s.packing);
  f.optional("overwrite_output_dir", s.overwrite_output_dir);
  read_eval_data_key(f, s);
  f.optional("eval_fraction", s.eval_fraction);
  if (!(s.eval_fraction >= 0 && s.eval_fraction < 1))
    f.fail("eval_fraction", "a number in [0, 1)", s.eval_fraction);
  if (!s.eval_data.empty() && s.eval_fraction > 0)
    f.fail_with("keys 'eval_data' and 'eval_fraction': give one or the other");
  f.optional("eval_every", s.eval_every);
  if (s.eval_every < 0) f.fail("eval_every", "an integer >= 0", s.eval_every);
  if (s.max_examples < 0) f.fail("max_examples", "an integer >= 0", s.max_examples);
}

/// The batch and how long to train.
void read_batch_keys(const JsonFields& f, TrainSpec& s) {
  f.optional("sequences_per_step", s.sequences_per_step);
  f.optional("micro_batches", s.micro_batches);
  f.optional("accumulation", s.accumulation);
  f.optional("steps", s.steps);
  if (s.steps < 1) f.fail("steps", "an integer >= 1", s.steps);  // before the schedule inherits it
  if (double e = 0; f.optional("epochs", e)) {
    if (f.has("steps")) f.fail_with("keys 'steps' and 'epochs': give one or the other");
    s.epochs = e;
  }
}

/// The devices, the pipeline and its memory.
void read_runtime_keys(const JsonFields& f, TrainSpec& s) {
  f.optional("backend", s.backend);
  f.optional("workers", s.workers);
  f.optional("async", s.async);
  f.optional("async_compensation", s.async_compensation);
  f.optional("device_memory_gib", s.device_memory_gib);
  f.optional("pcie_gbps", s.pcie_gbps);
  f.optional("transfer_priorities", s.transfer_priorities);
  f.optional("transfer_chunk_bytes", s.transfer_chunk_bytes);
  if (bool v = false; f.optional("save_attention", v)) s.save_attention = v;
  f.optional("mlp_chunk_tokens", s.mlp_chunk_tokens);
  if (s.mlp_chunk_tokens < 0) f.fail("mlp_chunk_tokens", "an integer >= 0 (0: 8192)", s.mlp_chunk_tokens);
  if (double v = 0; f.optional("pin_budget_gib", v)) s.pin_budget_gib = v;
}

/// What the run writes and logs: checkpoints, the best model, traces, metrics, the sample prompt;
/// and the seed.
void read_output_keys(const JsonFields& f, TrainSpec& s) {
  f.optional("output_dir", s.output_dir);
  f.optional("save_every", s.save_every);
  f.optional("save_dtype", s.save_dtype);
  f.optional("save_total_limit", s.save_total_limit);
  f.optional("metric_for_best_model", s.metric_for_best_model);
  f.optional("greater_is_better", s.greater_is_better);
  f.optional("load_best_model_at_end", s.load_best_model_at_end);
  if (f.has("early_stopping")) {
    if (!f.at("early_stopping").is_object())
      f.fail("early_stopping", "an object {\"patience\": N, \"threshold\": t}");
    const JsonFields e = f.nested("early_stopping");
    e.allow_only({"patience", "threshold"});
    TrainSpec::EarlyStopping es;
    e.optional("patience", es.patience);
    e.optional("threshold", es.threshold);
    s.early_stopping = es;
  }
  f.optional("trace", s.trace);
  f.optional("trace_messages", s.trace_messages);
  s.trace = s.trace || s.trace_messages;
  f.optional("tensorboard", s.tensorboard);
  if (f.has("metrics_jsonl")) {
    const auto& m = f.at("metrics_jsonl");
    if (m.is_boolean()) s.metrics_jsonl = m.get<bool>() ? std::optional<std::string>("") : std::nullopt;
    else if (m.is_string() && !m.get<std::string>().empty()) s.metrics_jsonl = m.get<std::string>();
    else f.fail("metrics_jsonl", "true (output_dir/metrics.jsonl), false or a file path");
  }
  f.optional("sample_prompt", s.sample_prompt);
  // tokenized and printed as text (generate --chat refuses the same); a --set value is raw bytes
  if (const size_t ok = valid_utf8_prefix(s.sample_prompt); ok != s.sample_prompt.size())
    f.fail("sample_prompt",
           fmt::format("UTF-8 text (byte 0x{:02x} at offset {} is not)",
                       static_cast<unsigned char>(s.sample_prompt[ok]), ok),
           s.sample_prompt);
  f.optional("seed", s.seed);
  f.optional("log_every", s.log_every);
}

/// An explicit "fp8_weight_gradients": true needs a full fine-tuning run (a frozen base computes
/// no weight gradient) with "fp8". Checked once "lora" and "adapter" are read, the LoRA conflict
/// first, so fixing the first refusal does not lead into the second.
void check_fp8_weight_gradients(const JsonFields& f, const TrainSpec& s) {
  if (!s.fp8_weight_gradients.value_or(false)) return;
  if (s.lora || !s.adapter.empty())
    f.fail("fp8_weight_gradients",
           "false with \"lora\" or \"adapter\" (a frozen base computes no weight gradient; the adapters' "
           "stay bf16)",
           true);
  if (!s.fp8)
    f.fail_with(
        "key 'fp8_weight_gradients': needs \"fp8\": true (it moves the FP8 linears' weight gradients "
        "to FP8 as well)");
}

/// Number formats: the compute dtype, GEMM accumulation, FP8 and the experts' GEMMs.
void read_compute_keys(const JsonFields& f, TrainSpec& s) {
  f.optional("compute_dtype", s.compute_dtype);
  if (s.compute_dtype != "bf16" && s.compute_dtype != "f16")
    f.fail("compute_dtype", "\"bf16\" or \"f16\"", s.compute_dtype);
  f.optional("gemm_accumulate", s.gemm_accumulate);
  check_gemm_accumulate(f, s);
  f.optional("fp8", s.fp8);
  if (s.fp8 && s.compute_dtype != "bf16")
    f.fail_with(
        "key 'fp8': needs \"compute_dtype\": \"bf16\" (the FP8 linears quantize bf16 activations; f16 is not "
        "supported)");
  if (s.fp8 && s.gemm_accumulate != "f32")
    f.fail_with("key 'fp8': the FP8 GEMMs accumulate in fp32; drop \"gemm_accumulate\": \"f16\"");
  if (bool v = false; f.optional("fp8_weight_gradients", v)) s.fp8_weight_gradients = v;
  f.optional("fp8_stored_direct", s.fp8_stored_direct);
  if (s.fp8_stored_direct && !s.fp8)
    f.fail_with(
        "key 'fp8_stored_direct': needs \"fp8\": true (it runs an fp8 base's FP8 linears from its codes)");
  f.optional("expert_gemm", s.expert_gemm);
  check_expert_gemm(f, s);
}

/// The stages themselves are checked against the model once it is open; {} (which once meant
/// the uniform default plan) and a non-object are refused before anything loads.
void check_plan_shape(const JsonFields& f, const TrainSpec& s) {
  if (!s.plan.is_null() && (!s.plan.is_object() || s.plan.empty()))
    f.fail("plan",
           "an object with \"forward\", \"tail\" and \"backward\" stages, or one or more of "
           "\"forward_layers\", \"backward_layers\", \"tail_decoders\" (leave it out for the automatic plan)",
           s.plan);
  try {  // what needs no model: its keys, forms and counts
    check_plan_json(s.plan, "key 'plan'");
  } catch (const std::invalid_argument& e) {
    f.fail_with(e.what());
  }
}

/// Resuming, watchdogs, non-finite steps, replicas and an explicit plan.
void read_run_control_keys(const JsonFields& f, TrainSpec& s) {
  f.optional("resume_from", s.resume_from);
  f.optional("watchdog_s", s.watchdog_s);
  f.optional("stop_timeout_s", s.stop_timeout_s);
  f.optional("nonfinite", s.nonfinite);
  if (s.nonfinite != "stop" && s.nonfinite != "skip")
    f.fail("nonfinite", "\"stop\" or \"skip\"", s.nonfinite);
  f.optional("max_skipped_steps", s.max_skipped_steps);
  f.optional("mpi", s.mpi);
  f.optional("replica_timeout_s", s.replica_timeout_s);
  if (f.has("resume_from") && s.resume_from.empty()) f.fail("resume_from", "a checkpoint folder");
  if (f.has("plan")) s.plan = f.at("plan");
  check_plan_shape(f, s);  // here too, so that an error of a --set value names the setting
}

void read_scalars(const JsonFields& f, TrainSpec& s) {
  read_data_keys(f, s);
  read_batch_keys(f, s);
  read_runtime_keys(f, s);
  read_output_keys(f, s);
  read_compute_keys(f, s);
  read_run_control_keys(f, s);
}

/// Every product of counts the runtime forms is checked before it is formed: a product that
/// wraps around used to divide by zero (SIGFPE) or size a buffer wrongly.
void check_products(const JsonFields& f, const TrainSpec& s) {
  const auto per_step = checked_product({s.micro_batches, s.accumulation});
  if (!per_step || s.sequences_per_step % *per_step != 0)
    f.fail_with(fmt::format(
        "key 'sequences_per_step': {} is not divisible by micro_batches x accumulation = {} x {}{}",
        s.sequences_per_step, s.micro_batches, s.accumulation,
        per_step ? fmt::format(" = {}", *per_step) : ""));
  // tokens of a step (and of any pass or micro-batch, which are smaller): 2^40 leaves room for
  // the byte counts of its activations, which the host-memory check computes
  if (!checked_product({s.sequences_per_step, s.seq_len}, int64_t(1) << 40))
    f.fail_with(fmt::format("key 'seq_len': {} tokens x {} sequences per step exceeds 2^40 tokens per step",
                            s.seq_len, s.sequences_per_step));
  // the data position after the last step (trainer_state.json)
  if (!checked_product({s.steps, s.sequences_per_step}))
    f.fail_with(fmt::format("key 'steps': {} steps x {} sequences per step overflows a 64-bit count", s.steps,
                            s.sequences_per_step));
}

/// The keys that manage a run's checkpoints and its end: save_total_limit, the best
/// checkpoint's metric, load_best_model_at_end, early_stopping and epochs. Both need
/// evaluations where they look (as Hugging Face's Trainer requires).
void check_run_management(const JsonFields& f, const TrainSpec& s) {
  if (s.epochs && !(*s.epochs > 0 && *s.epochs <= 1e6))
    f.fail("epochs", "a number > 0 and <= 1000000 (passes over the training data)", *s.epochs);
  if (s.save_total_limit < 0)
    f.fail("save_total_limit", "an integer >= 0 (0 = keep every checkpoint)", s.save_total_limit);
  const std::string& m = s.metric_for_best_model;
  if (m != "eval_loss" && m != "eval_perplexity" && m != "loss" && m != "perplexity")
    f.fail("metric_for_best_model", "\"eval_loss\" or \"eval_perplexity\" (or \"loss\", \"perplexity\")", m);
  if (s.greater_is_better)
    f.fail("greater_is_better", fmt::format("false for \"{}\" (it falls as the model improves)", m), true);
  const bool eval = !s.eval_data.empty() || s.eval_fraction > 0;
  if (s.load_best_model_at_end) {
    if (!eval)
      f.fail_with(
          "key 'load_best_model_at_end': needs evaluation data (\"eval_data\" or \"eval_fraction\") to "
          "rank the checkpoints");
    if (s.save_every <= 0 || s.eval_every <= 0 || s.save_every % s.eval_every != 0)
      f.fail_with(
          fmt::format("key 'load_best_model_at_end': needs an evaluation at every save: save_every ({}) a "
                      "multiple of eval_every ({}), both > 0",
                      s.save_every, s.eval_every));
  }
  if (s.early_stopping) {
    static const nlohmann::json none = nlohmann::json::object();
    const JsonFields e(none, f.where(), "early_stopping.");
    if (s.early_stopping->patience < 1)
      e.fail("patience", "an integer >= 1 (evaluations without improvement)", s.early_stopping->patience);
    if (!(s.early_stopping->threshold >= 0) || !std::isfinite(s.early_stopping->threshold))
      e.fail("threshold", "a finite number >= 0 (the least improvement that counts)",
             s.early_stopping->threshold);
    if (!eval)
      f.fail_with("key 'early_stopping': needs evaluation data (\"eval_data\" or \"eval_fraction\")");
    if (s.eval_every <= 0)
      f.fail_with(
          "key 'early_stopping': needs eval_every > 0 (it decides at each evaluation; 0 evaluates after "
          "the last step only)");
  }
  // an evaluation schedule with nothing to evaluate would pass without a word
  if (s.eval_every > 0 && !eval)
    f.fail_with(fmt::format(
        "key 'eval_every': {} needs evaluation data (\"eval_data\" or \"eval_fraction\"); without it "
        "nothing is evaluated: give one, or set eval_every to 0",
        s.eval_every));
}

void check_ranges(const JsonFields& f, const TrainSpec& s) {
  auto positive = [&](const char* k, int64_t v) {
    if (v < 1) f.fail(k, "an integer >= 1", v);
  };
  if (s.async_compensation != "none" && s.async_compensation != "predict")
    f.fail("async_compensation", "\"none\" or \"predict\"", s.async_compensation);
  if (s.async_compensation == "predict" && !s.async)
    f.fail("async_compensation",
           "\"none\" with \"async\": false (it compensates the async optimizer's staleness)",
           s.async_compensation);
  positive("seq_len", s.seq_len);
  positive("sequences_per_step", s.sequences_per_step);
  positive("micro_batches", s.micro_batches);
  positive("accumulation", s.accumulation);
  positive("steps", s.steps);
  // GPUs of one process (more machines are replicas under mpirun); far beyond any host
  if (s.workers < 1 || s.workers > kMaxWorkers)
    f.fail("workers", fmt::format("an integer in 1..{}", kMaxWorkers), s.workers);
  positive("log_every", s.log_every);
  positive("max_skipped_steps", s.max_skipped_steps);
  if (s.seq_len < 2) f.fail("seq_len", "an integer >= 2", s.seq_len);
  check_products(f, s);
  check_run_management(f, s);
  if (s.backend != "auto" && s.backend != "cpu" && s.backend != "cuda")
    f.fail("backend", "\"auto\", \"cpu\" or \"cuda\"", s.backend);
  if (s.save_dtype != "f32" && s.save_dtype != "bf16" && s.save_dtype != "f16")
    f.fail("save_dtype", "\"f32\", \"bf16\" or \"f16\"", s.save_dtype);
  // 2^20 GiB (1 PiB) per device: beyond any GPU or host, and its bytes still fit a size_t
  if (!(s.device_memory_gib > 0) || !(s.device_memory_gib <= double(1 << 20)))
    f.fail("device_memory_gib", "a number > 0 and <= 1048576 (GiB per device)", s.device_memory_gib);
  if (!(s.pcie_gbps >= 0) || !std::isfinite(s.pcie_gbps))
    f.fail("pcie_gbps", "a finite number >= 0", s.pcie_gbps);
  if (s.pin_budget_gib && !(*s.pin_budget_gib >= 0 && *s.pin_budget_gib <= double(1 << 20)))
    f.fail("pin_budget_gib", "a number >= 0 and <= 1048576 (GiB)", *s.pin_budget_gib);
  if (s.transfer_chunk_bytes != 0 && s.transfer_chunk_bytes < (int64_t(1) << 16))
    f.fail("transfer_chunk_bytes", "0 (no chunking) or at least 65536 bytes", s.transfer_chunk_bytes);
  if (s.save_every < 0) f.fail("save_every", "an integer >= 0", s.save_every);
  if (!(s.watchdog_s >= 0)) f.fail("watchdog_s", "a number of seconds >= 0 (0 = off)", s.watchdog_s);
  if (!(s.stop_timeout_s >= 0)) f.fail("stop_timeout_s", "a number of seconds >= 0", s.stop_timeout_s);
  if (s.mpi != "auto" && s.mpi != "on" && s.mpi != "off") f.fail("mpi", "\"auto\", \"on\" or \"off\"", s.mpi);
  if (!(s.replica_timeout_s > 0) || !std::isfinite(s.replica_timeout_s))
    f.fail("replica_timeout_s", "a finite number of seconds > 0", s.replica_timeout_s);
  if (s.output_dir.empty()) f.fail("output_dir", "a non-empty path", s.output_dir);
  if (s.chat_template != "auto" && s.chat_template != "jinja") {
    try {
      parse_chat_template_name(s.chat_template);
    } catch (const std::exception& e) {
      f.fail_with(fmt::format("key 'chat_template': {}", e.what()));
    }
  }
  try {
    validate(s.adam);
  } catch (const std::invalid_argument& e) {
    f.fail_with(fmt::format("key 'optimizer': {}", e.what()));
  }
}

}  // namespace

namespace {
/// Hugging Face TrainingArguments (and TRL) names of spec keys: a spec written with one of them,
/// or a near miss of one, is told the key it means.
const std::map<std::string, std::string> kHuggingFaceNames = {
    {"learning_rate", "optimizer.lr"},
    {"weight_decay", "optimizer.weight_decay"},
    {"max_grad_norm", "optimizer.max_grad_norm"},
    {"adam_epsilon", "optimizer.eps"},
    {"adam_beta1", "optimizer.betas"},
    {"adam_beta2", "optimizer.betas"},
    {"warmup_steps", "lr_schedule.warmup_steps"},
    {"lr_scheduler_type", "lr_schedule.kind"},
    {"num_train_epochs", "epochs"},
    {"max_steps", "steps"},
    {"gradient_accumulation_steps", "accumulation"},
    {"logging_steps", "log_every"},
    {"save_steps", "save_every"},
    {"eval_steps", "eval_every"},
    {"max_seq_length", "seq_len"},
    {"max_length", "seq_len"},
    {"model_name_or_path", "model"},
};
}  // namespace

TrainSpec spec_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw std::invalid_argument(where + ": expected a JSON object at the top level");
  const JsonFields f(j, where);
  f.allow_only({"model",
                "base_model_id",
                "data",
                "lora",
                "adapter",
                "merge_adapters",
                "chat_template",
                "seq_len",
                "sequences_per_step",
                "micro_batches",
                "accumulation",
                "steps",
                "max_examples",
                "packing",
                "eval_data",
                "eval_fraction",
                "eval_every",
                "optimizer",
                "lr_schedule",
                "backend",
                "workers",
                "async",
                "async_compensation",
                "plan",
                "device_memory_gib",
                "pcie_gbps",
                "transfer_priorities",
                "transfer_chunk_bytes",
                "save_attention",
                "mlp_chunk_tokens",
                "pin_budget_gib",
                "frozen_tier",
                "output_dir",
                "overwrite_output_dir",
                "save_every",
                "save_dtype",
                "trace",
                "trace_messages",
                "tensorboard",
                "metrics_jsonl",
                "sample_prompt",
                "seed",
                "log_every",
                "compute_dtype",
                "gemm_accumulate",
                "fp8",
                "fp8_weight_gradients",
                "fp8_stored_direct",
                "expert_gemm",
                "loss_scaling",
                "resume_from",
                "watchdog_s",
                "stop_timeout_s",
                "nonfinite",
                "max_skipped_steps",
                "mpi",
                "replica_timeout_s",
                "comment",
                "epochs",
                "save_total_limit",
                "metric_for_best_model",
                "greater_is_better",
                "load_best_model_at_end",
                "early_stopping"},
               kHuggingFaceNames, "Hugging Face");
  if (!f.has("model"))
    throw std::invalid_argument(where + ": missing key 'model' (a .gguf file or HF directory)");
  if (!f.has("data"))
    throw std::invalid_argument(where + ": missing key 'data' (a .jsonl or .txt file, or a directory)");
  TrainSpec s;
  s.source = where;
  read_scalars(f, s);
  read_frozen_tier(f, s);
  // Hugging Face names its metrics with and without the "eval_" prefix
  if (s.metric_for_best_model == "loss" || s.metric_for_best_model == "perplexity")
    s.metric_for_best_model = "eval_" + s.metric_for_best_model;
  read_loss_scaling(f, s);
  read_optimizer(f, s);
  read_lora(f, s);
  check_fp8_weight_gradients(f, s);
  check_ranges(f, s);
  return s;
}

void validate_spec(const TrainSpec& s) {
  const nlohmann::json none = nlohmann::json::object();
  const JsonFields f(none, s.source);
  if (s.nonfinite != "stop" && s.nonfinite != "skip")
    f.fail("nonfinite", "\"stop\" or \"skip\"", s.nonfinite);
  if (s.compute_dtype != "bf16" && s.compute_dtype != "f16")
    f.fail("compute_dtype", "\"bf16\" or \"f16\"", s.compute_dtype);
  check_gemm_accumulate(f, s);
  check_expert_gemm(f, s);
  check_base_model_id(f, s);
  if (s.max_examples < 0) f.fail("max_examples", "an integer >= 0", s.max_examples);
  if (s.max_grad_norm < 0 || !std::isfinite(s.max_grad_norm))
    f.fail("max_grad_norm", "a finite number >= 0", s.max_grad_norm);
  check_ranges(f, s);
  if (s.lora) check_lora(JsonFields(none, s.source, "lora."), *s.lora);
  if (s.merge_adapters && !s.lora && s.adapter.empty())
    f.fail("merge_adapters", "false without \"lora\" or \"adapter\"", true);
  check_fp8_weight_gradients(f, s);
  check_plan_shape(f, s);
  try {
    LrSchedule sched = s.lr_schedule;  // with epochs, total_steps 0 follows the derived steps
    if (s.epochs && sched.total_steps == 0) sched.total_steps = std::max<int64_t>(1, sched.warmup_steps);
    sched.validate();
    if (s.loss_scaling) s.loss_scaling->validate();
  } catch (const std::invalid_argument& e) {
    f.fail_with(e.what());
  }
}

bool fp8_weight_gradients_on(const TrainSpec& s) {
  return s.fp8 && s.fp8_weight_gradients.value_or(!s.lora && s.adapter.empty());
}

}  // namespace rp
