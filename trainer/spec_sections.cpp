// The spec's sub-objects (trainer/spec_sections.hpp): "frozen_tier", "loss_scaling",
// "optimizer" and "lora" with "adapter" and "merge_adapters"; trainer/spec.cpp reads the rest.
#include "trainer/spec_sections.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/weight_format.hpp"
#include "roundpipe/adapter.hpp"

namespace rp {

// "frozen_tier": {"path": "...", "ring_gib": G, "resident_gib": R, "host_budget_gib": B, "spill_layers": N}
// (SessionOptions::frozen_tier).
void read_frozen_tier(const JsonFields& f, TrainSpec& s) {
  if (!f.has("frozen_tier")) return;
  if (!f.at("frozen_tier").is_object())
    f.fail("frozen_tier",
           "an object {\"path\": cache file, \"ring_gib\": G, \"resident_gib\": R, \"host_budget_gib\": B, "
           "\"spill_layers\": N}");
  const JsonFields t = f.nested("frozen_tier");
  t.allow_only({"path", "ring_gib", "resident_gib", "host_budget_gib", "spill_layers"});
  TrainSpec::FrozenTier ft;
  if (!t.has("path")) t.fail("path", "the path of the tier's cache file (required when frozen_tier is set)");
  ft.path = t.string("path");
  if (ft.path.empty()) t.fail("path", "a non-empty path of the tier's cache file", ft.path);
  // a NUL would cut the path short at the system call; a line break would split every log line
  if (std::any_of(ft.path.begin(), ft.path.end(), [](char c) { return c == '\0' || c == '\n' || c == '\r'; }))
    t.fail("path", "a path without NUL or line-break characters", ft.path);
  // checked here, before the model loads, rather than when the cache opens
  if (ft.path[0] == '~')
    t.fail("path", "a path without a leading '~' (only a shell expands it; write the full path)", ft.path);
  std::error_code ec;
  if (ft.path.back() == '/' || std::filesystem::is_directory(ft.path, ec))
    t.fail("path", "the path of a cache file, not of a folder", ft.path);
  t.optional("ring_gib", ft.ring_gib);
  if (!(ft.ring_gib >= 0 && ft.ring_gib <= double(1 << 20)))
    t.fail("ring_gib", "a number >= 0 and <= 1048576 (GiB; 0: two buffers)", ft.ring_gib);
  t.optional("resident_gib", ft.resident_gib);
  if (!(ft.resident_gib >= 0 && ft.resident_gib <= double(1 << 20)))
    t.fail("resident_gib", "a number >= 0 and <= 1048576 (GiB of the base kept in host memory)",
           ft.resident_gib);
  t.optional("host_budget_gib", ft.host_budget_gib);
  if (!(ft.host_budget_gib >= 0 && ft.host_budget_gib <= double(1 << 20)))
    t.fail("host_budget_gib", "a number >= 0 and <= 1048576 (GiB the whole run may hold; 0: no budget)",
           ft.host_budget_gib);
  if (ft.host_budget_gib > 0 && ft.resident_gib > 0)
    t.fail("host_budget_gib", "no resident_gib beside it (the budget decides what stays resident)",
           ft.host_budget_gib);
  // the model's layer count is not known yet: the session checks the upper end (its decoder layers
  // + 1: every runtime layer but the embedding, the head included, has a saved input)
  t.optional("spill_layers", ft.spill_layers);
  if (ft.spill_layers < 0 || ft.spill_layers > (1 << 20))
    t.fail("spill_layers", "an integer >= 0 and <= 1048576 (layers whose saved inputs go to disk; 0: none)",
           ft.spill_layers);
  s.frozen_tier = ft;
}

void read_loss_scaling(const JsonFields& f, TrainSpec& s) {
  if (s.compute_dtype == "f16") s.loss_scaling = LossScalerOptions{};
  if (!f.has("loss_scaling")) return;
  const auto& l = f.at("loss_scaling");
  if (l.is_boolean()) {
    s.loss_scaling = l.get<bool>() ? std::optional<LossScalerOptions>(LossScalerOptions{}) : std::nullopt;
  } else if (l.is_object()) {
    const JsonFields lf = f.nested("loss_scaling");
    lf.allow_only({"init_scale", "growth_factor", "backoff_factor", "growth_interval", "min_scale"});
    LossScalerOptions o;
    lf.optional("init_scale", o.init_scale);
    lf.optional("growth_factor", o.growth_factor);
    lf.optional("backoff_factor", o.backoff_factor);
    lf.optional("growth_interval", o.growth_interval);
    lf.optional("min_scale", o.min_scale);
    try {
      o.validate();
    } catch (const std::invalid_argument& e) {
      f.fail_with(fmt::format("key 'loss_scaling': {}", e.what()));
    }
    s.loss_scaling = o;
  } else {
    f.fail(
        "loss_scaling",
        "true, false or an object {init_scale, growth_factor, backoff_factor, growth_interval, min_scale}");
  }
  if (s.loss_scaling && s.compute_dtype != "f16")
    f.fail_with(
        "key 'loss_scaling': needs \"compute_dtype\": \"f16\" (bf16 and the CPU backend's f32 do not "
        "overflow)");
}

void read_optimizer(const JsonFields& f, TrainSpec& s) {
  if (f.has("optimizer")) {
    if (!f.at("optimizer").is_object()) f.fail("optimizer", "an object");
    const JsonFields o = f.nested("optimizer");
    o.allow_only({"lr", "betas", "eps", "weight_decay", "amsgrad", "decoupled", "max_grad_norm"});
    o.optional("max_grad_norm", s.max_grad_norm);
    if (s.max_grad_norm < 0) o.fail("max_grad_norm", "a number >= 0", s.max_grad_norm);
    o.optional("lr", s.adam.lr);
    o.optional("eps", s.adam.eps);
    o.optional("weight_decay", s.adam.weight_decay);
    o.optional("amsgrad", s.adam.amsgrad);
    o.optional("decoupled", s.adam.decoupled);
    if (o.has("betas")) {
      const auto& b = o.at("betas");
      if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number())
        o.fail("betas", "two numbers [beta1, beta2]");
      s.adam.beta1 = b[0].get<double>();
      s.adam.beta2 = b[1].get<double>();
      if (!(s.adam.beta1 >= 0 && s.adam.beta1 < 1 && s.adam.beta2 >= 0 && s.adam.beta2 < 1))
        o.fail("betas", "two numbers [beta1, beta2], each >= 0 and < 1", json_text_of(b));
    }
    // the optimizer's own checks name its fields; a spec's error names the spec's keys
    if (!(s.adam.lr >= 0) || !std::isfinite(s.adam.lr)) o.fail("lr", "a finite number >= 0", s.adam.lr);
    if (!(s.adam.eps >= 0) || !std::isfinite(s.adam.eps)) o.fail("eps", "a finite number >= 0", s.adam.eps);
    if (!(s.adam.weight_decay >= 0) || !std::isfinite(s.adam.weight_decay))
      o.fail("weight_decay", "a finite number >= 0", s.adam.weight_decay);
  }
  nlohmann::json sched = f.has("lr_schedule") ? f.at("lr_schedule") : nlohmann::json::object();
  if (!sched.is_object()) f.fail("lr_schedule", "an object");
  // the schedule's lr and total_steps default to optimizer.lr and steps: an error in a value
  // the schedule inherited names the key the spec wrote
  const bool own_lr = sched.contains("lr"), own_total = sched.contains("total_steps");
  if (!own_lr) sched["lr"] = s.adam.lr;
  // with epochs the steps are known once the data is: total_steps 0 follows them (a stand-in
  // passes the schedule's checks here; the run checks the derived steps against warmup_steps)
  if (!own_total)
    sched["total_steps"] = s.epochs
                               ? nlohmann::json(std::max<int64_t>(1, sched.value("warmup_steps", int64_t(0))))
                               : nlohmann::json(s.steps);
  try {
    s.lr_schedule = LrSchedule::from_json(sched, "lr_schedule");
  } catch (const std::invalid_argument& e) {
    // "lr_schedule.<key>: <what>" -> "<where>: key '<the spec's key>': <what>"
    const std::string msg = e.what();
    const size_t colon = msg.find(": ");
    std::string key = colon == std::string::npos ? "lr_schedule" : msg.substr(0, colon);
    std::string what = colon == std::string::npos ? msg : msg.substr(colon + 2);
    if (key == "lr_schedule.lr" && !own_lr) key = f.has("optimizer") ? "optimizer.lr" : "lr_schedule.lr";
    if (key == "lr_schedule.total_steps" && !own_total) key = "steps";
    // a warmup longer than the run is compared with the steps the schedule inherited
    const std::string total = "total_steps (";
    if (key == "lr_schedule.warmup_steps" && !own_total && what.find(total) != std::string::npos)
      what.replace(what.find(total), total.size(), "steps (");
    f.fail_with(fmt::format("key '{}': {}", key, what));
  }
  if (s.epochs && !own_total) s.lr_schedule.total_steps = 0;
}

const char* kTargetsExpected =
    "a non-empty list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or \"all-linear\"";
const char* kModulesExpected = "a list of \"embed_tokens\", \"lm_head\"";
const char* kParametersExpected = "a list of \"mlp.experts.gate_up_proj\", \"mlp.experts.down_proj\"";

namespace {
// The JSON array of strings at `key`; anything else is refused as `expected`.
std::vector<std::string> string_list(const JsonFields& f, const std::string& key, const char* expected) {
  const auto& a = f.at(key);
  if (!a.is_array()) f.fail(key, expected);
  std::vector<std::string> out;
  for (const auto& e : a) {
    if (!e.is_string()) f.fail(key, expected);
    out.push_back(e.get<std::string>());
  }
  return out;
}
}  // namespace

/// The rules of a LoraConfig, for a spec file and a spec built in code alike; `f` carries the
/// prefix "lora." so the messages name the nested key.
void check_lora(const JsonFields& f, const LoraConfig& l) {
  if (l.r < 1 || l.r > LoraConfig::kMaxRank)
    f.fail("r", fmt::format("an integer in 1..{}", LoraConfig::kMaxRank), l.r);
  if (!(l.alpha > 0) || !std::isfinite(l.alpha)) f.fail("alpha", "a finite number > 0", l.alpha);
  if (!(l.dropout >= 0 && l.dropout < 1)) f.fail("dropout", "a number in [0, 1)", l.dropout);
  // the experts alone (target_parameters) leave target_modules empty, as PEFT's target_modules=None
  if (l.target_modules.empty() && l.target_parameters.empty())
    f.fail("target_modules", kTargetsExpected, l.target_modules);
  for (const auto& p : l.target_parameters)
    if (p != "mlp.experts.gate_up_proj" && p != "mlp.experts.down_proj" && p != "gate_up_proj" &&
        p != "down_proj")
      f.fail("target_parameters", kParametersExpected, l.target_parameters);
  if (!l.target_parameters.empty() && l.dropout != 0)
    f.fail("dropout", "0 with target_parameters (expert adapters take no dropout, as PEFT's)", l.dropout);
  for (const auto& m : l.target_modules) {
    const bool known = m == "all-linear" || m == "q_proj" || m == "k_proj" || m == "v_proj" ||
                       m == "o_proj" || m == "gate_proj" || m == "up_proj" || m == "down_proj";
    if (!known || (m == "all-linear" && l.target_modules.size() != 1))
      f.fail("target_modules", kTargetsExpected, l.target_modules);
  }
  for (const auto& m : l.modules_to_save)
    if (m != "embed_tokens" && m != "lm_head") f.fail("modules_to_save", kModulesExpected, l.modules_to_save);
}

/// "lora" (LoRA settings), "adapter" and "merge_adapters".
void read_lora(const JsonFields& f, TrainSpec& s) {
  f.optional("adapter", s.adapter);
  if (f.has("adapter") && s.adapter.empty()) f.fail("adapter", "a PEFT adapter folder");
  f.optional("merge_adapters", s.merge_adapters);
  if (f.has("lora")) {
    const JsonFields l = f.nested("lora");
    l.allow_only({"r", "alpha", "dropout", "target_modules", "target_parameters", "use_rslora",
                  "modules_to_save", "seed", "base_format"});
    LoraConfig c;
    c.seed = s.seed;
    l.optional("r", c.r);
    l.optional("alpha", c.alpha);
    l.optional("dropout", c.dropout);
    l.optional("use_rslora", c.use_rslora);
    l.optional("seed", c.seed);
    if (l.has("target_modules")) {
      const auto& t = l.at("target_modules");
      if (t.is_string()) {
        c.target_modules = {t.get<std::string>()};
      } else if (t.is_array()) {
        c.target_modules.clear();
        for (const auto& e : t) {
          if (!e.is_string()) l.fail("target_modules", kTargetsExpected);
          c.target_modules.push_back(e.get<std::string>());
        }
      } else {
        l.fail("target_modules", kTargetsExpected);
      }
    }
    if (l.has("target_parameters")) {
      c.target_parameters = string_list(l, "target_parameters", kParametersExpected);
      // only the experts: no target_modules unless the spec names them (an empty list names no
      // expert parameter and leaves the default modules)
      if (!l.has("target_modules") && !c.target_parameters.empty()) c.target_modules.clear();
    }
    if (l.has("modules_to_save")) c.modules_to_save = string_list(l, "modules_to_save", kModulesExpected);
    s.lora_base_format_from_model = !l.has("base_format");
    if (std::string fmt_name; l.optional("base_format", fmt_name)) {
      try {
        c.base_format = parse_weight_format(fmt_name);
      } catch (const std::exception&) {
        l.fail("base_format",
               "\"bf16\", \"f16\", \"f32\", \"q8_0\", \"q4_0\", \"nf4\", \"mxfp4\" or \"fp8\"");
      }
    }
    check_lora(l, c);
    s.lora = c;
  } else if (!s.adapter.empty()) {
    s.lora_base_format_from_model = true;  // the adapter's settings: its base keeps its own dtype
  }
  if (s.merge_adapters && !s.lora && s.adapter.empty())
    f.fail("merge_adapters",
           "false without \"lora\" or \"adapter\" (a full fine-tuning's final/ is already merged)", true);
}

}  // namespace rp
