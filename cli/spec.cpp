#include "cli/spec.hpp"

#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include <limits>

#include "data/chat_template.hpp"

namespace rp {
namespace {

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& expected,
                      const nlohmann::json& got) {
  throw std::invalid_argument(
      fmt::format("{}: key '{}': expected {}, got {}", where, key, expected, got.dump()));
}

void check_keys(const nlohmann::json& j, const std::set<std::string>& known, const std::string& where,
                const std::string& prefix) {
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) {
      std::string list;
      for (auto& k : known) list += (list.empty() ? "" : ", ") + k;
      throw std::invalid_argument(
          fmt::format("{}: unknown key '{}{}' (known keys: {})", where, prefix, it.key(), list));
    }
}

template <class T>
void get(const nlohmann::json& j, const char* key, T& out, const std::string& where, const std::string& prefix = "") {
  if (!j.contains(key)) return;
  const auto& v = j[key];
  const std::string k = prefix + key;
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) bad(where, k, "true or false", v);
    out = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) bad(where, k, "an integer", v);
    if constexpr (std::is_signed_v<T>) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<T>::max()))
        bad(where, k, fmt::format("an integer <= {}", std::numeric_limits<T>::max()), v);
    } else {
      if (!v.is_number_unsigned()) bad(where, k, "an integer >= 0", v);
    }
    out = v.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) bad(where, k, "a number", v);
    out = v.get<T>();
  } else {
    if (!v.is_string()) bad(where, k, "a string", v);
    out = v.get<std::string>();
  }
}

}  // namespace

TrainSpec spec_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw std::invalid_argument(where + ": expected a JSON object at the top level");
  check_keys(j,
             {"model", "data", "chat_template", "seq_len", "sequences_per_step", "micro_batches", "accumulation",
              "steps", "max_examples", "optimizer", "lr_schedule", "backend", "workers", "async", "plan", "device_memory_gib",
              "pcie_gbps", "transfer_priorities", "transfer_chunk_bytes", "output_dir", "save_every", "save_dtype", "trace",
              "seed", "log_every", "compute_dtype", "loss_scaling", "resume_from", "comment"},
             where, "");
  TrainSpec s;
  s.source = where;
  if (!j.contains("model")) throw std::invalid_argument(where + ": missing key 'model' (a .gguf file or HF directory)");
  if (!j.contains("data")) throw std::invalid_argument(where + ": missing key 'data' (a .jsonl or .txt file, or a directory)");
  get(j, "model", s.model, where);
  get(j, "data", s.data, where);
  get(j, "chat_template", s.chat_template, where);
  get(j, "seq_len", s.seq_len, where);
  get(j, "max_examples", s.max_examples, where);
  if (s.max_examples < 0) bad(where, "max_examples", "an integer >= 0", s.max_examples);
  get(j, "sequences_per_step", s.sequences_per_step, where);
  get(j, "micro_batches", s.micro_batches, where);
  get(j, "accumulation", s.accumulation, where);
  get(j, "steps", s.steps, where);
  get(j, "backend", s.backend, where);
  get(j, "workers", s.workers, where);
  get(j, "async", s.async, where);
  get(j, "device_memory_gib", s.device_memory_gib, where);
  get(j, "pcie_gbps", s.pcie_gbps, where);
  get(j, "transfer_priorities", s.transfer_priorities, where);
  get(j, "transfer_chunk_bytes", s.transfer_chunk_bytes, where);
  get(j, "output_dir", s.output_dir, where);
  get(j, "save_every", s.save_every, where);
  get(j, "save_dtype", s.save_dtype, where);
  get(j, "trace", s.trace, where);
  get(j, "seed", s.seed, where);
  get(j, "log_every", s.log_every, where);
  get(j, "compute_dtype", s.compute_dtype, where);
  if (s.compute_dtype != "bf16" && s.compute_dtype != "f16") bad(where, "compute_dtype", "\"bf16\" or \"f16\"", s.compute_dtype);
  get(j, "resume_from", s.resume_from, where);
  if (j.contains("resume_from") && s.resume_from.empty()) bad(where, "resume_from", "a checkpoint folder", j["resume_from"]);
  if (s.compute_dtype == "f16") s.loss_scaling = LossScalerOptions{};
  if (j.contains("loss_scaling")) {
    const auto& l = j["loss_scaling"];
    if (l.is_boolean()) {
      s.loss_scaling = l.get<bool>() ? std::optional<LossScalerOptions>(LossScalerOptions{}) : std::nullopt;
    } else if (l.is_object()) {
      check_keys(l, {"init_scale", "growth_factor", "backoff_factor", "growth_interval"}, where, "loss_scaling.");
      LossScalerOptions o;
      get(l, "init_scale", o.init_scale, where, "loss_scaling.");
      get(l, "growth_factor", o.growth_factor, where, "loss_scaling.");
      get(l, "backoff_factor", o.backoff_factor, where, "loss_scaling.");
      get(l, "growth_interval", o.growth_interval, where, "loss_scaling.");
      try {
        o.validate();
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(fmt::format("{}: key 'loss_scaling': {}", where, e.what()));
      }
      s.loss_scaling = o;
    } else {
      bad(where, "loss_scaling", "true, false or an object {init_scale, growth_factor, backoff_factor, growth_interval}", l);
    }
    if (s.loss_scaling && s.compute_dtype != "f16")
      throw std::invalid_argument(fmt::format(
          "{}: key 'loss_scaling': needs \"compute_dtype\": \"f16\" (bf16 and the CPU backend's f32 do not overflow)",
          where));
  }
  if (j.contains("plan")) s.plan = j["plan"];
  if (j.contains("optimizer")) {
    const auto& o = j["optimizer"];
    if (!o.is_object()) bad(where, "optimizer", "an object", o);
    check_keys(o, {"lr", "betas", "eps", "weight_decay", "amsgrad", "decoupled", "max_grad_norm"}, where,
               "optimizer.");
    get(o, "max_grad_norm", s.max_grad_norm, where, "optimizer.");
    if (s.max_grad_norm < 0) bad(where, "optimizer.max_grad_norm", "a number >= 0", s.max_grad_norm);
    get(o, "lr", s.adam.lr, where, "optimizer.");
    get(o, "eps", s.adam.eps, where, "optimizer.");
    get(o, "weight_decay", s.adam.weight_decay, where, "optimizer.");
    get(o, "amsgrad", s.adam.amsgrad, where, "optimizer.");
    get(o, "decoupled", s.adam.decoupled, where, "optimizer.");
    if (o.contains("betas")) {
      const auto& b = o["betas"];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number())
        bad(where, "optimizer.betas", "two numbers [beta1, beta2]", b);
      s.adam.beta1 = b[0].get<double>();
      s.adam.beta2 = b[1].get<double>();
    }
  }
  nlohmann::json sched = j.contains("lr_schedule") ? j["lr_schedule"] : nlohmann::json::object();
  if (!sched.is_object()) bad(where, "lr_schedule", "an object", sched);
  if (!sched.contains("lr")) sched["lr"] = s.adam.lr;
  if (!sched.contains("total_steps")) sched["total_steps"] = s.steps;
  s.lr_schedule = LrSchedule::from_json(sched, where + ": lr_schedule");

  auto positive = [&](const char* k, int64_t v) {
    if (v < 1) bad(where, k, "an integer >= 1", v);
  };
  positive("seq_len", s.seq_len);
  positive("sequences_per_step", s.sequences_per_step);
  positive("micro_batches", s.micro_batches);
  positive("accumulation", s.accumulation);
  positive("steps", s.steps);
  positive("workers", s.workers);
  positive("log_every", s.log_every);
  if (s.seq_len < 2) bad(where, "seq_len", "an integer >= 2", s.seq_len);
  if (s.sequences_per_step % (s.micro_batches * s.accumulation) != 0)
    throw std::invalid_argument(fmt::format(
        "{}: key 'sequences_per_step': {} is not divisible by micro_batches x accumulation = {}", where,
        s.sequences_per_step, s.micro_batches * s.accumulation));
  if (s.backend != "auto" && s.backend != "cpu" && s.backend != "cuda")
    bad(where, "backend", "\"auto\", \"cpu\" or \"cuda\"", s.backend);
  if (s.save_dtype != "f32" && s.save_dtype != "bf16" && s.save_dtype != "f16")
    bad(where, "save_dtype", "\"f32\", \"bf16\" or \"f16\"", s.save_dtype);
  if (s.device_memory_gib <= 0) bad(where, "device_memory_gib", "a number > 0", s.device_memory_gib);
  if (s.pcie_gbps < 0) bad(where, "pcie_gbps", "a number >= 0", s.pcie_gbps);
  if (s.transfer_chunk_bytes != 0 && s.transfer_chunk_bytes < (int64_t(1) << 16))
    bad(where, "transfer_chunk_bytes", "0 (no chunking) or at least 65536 bytes", s.transfer_chunk_bytes);
  if (s.save_every < 0) bad(where, "save_every", "an integer >= 0", s.save_every);
  if (s.output_dir.empty()) bad(where, "output_dir", "a non-empty path", s.output_dir);
  if (s.chat_template != "auto") {
    try {
      parse_chat_template_name(s.chat_template);
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("{}: key 'chat_template': {}", where, e.what()));
    }
  }
  try {
    validate(s.adam);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: key 'optimizer': {}", where, e.what()));
  }
  return s;
}

TrainSpec load_spec(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::invalid_argument(path + ": cannot open the spec file");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is the offset of the error; report line and column.
    std::string text = ss.str();
    size_t pos = std::min<size_t>(e.byte ? e.byte - 1 : 0, text.size());
    size_t line = 1 + std::count(text.begin(), text.begin() + pos, '\n');
    size_t col = pos - (text.rfind('\n', pos ? pos - 1 : 0) == std::string::npos ? 0 : text.rfind('\n', pos ? pos - 1 : 0) + 1) + 1;
    throw std::invalid_argument(fmt::format("{}:{}:{}: invalid JSON", path, line, col));
  }
  return spec_from_json(j, path);
}

}  // namespace rp
