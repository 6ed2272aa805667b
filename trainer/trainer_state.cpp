#include "trainer/trainer_state.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "base/error_text.hpp"
#include "base/json_fields.hpp"
#include "base/json_text.hpp"
#include "base/output_folder.hpp"
#include "kernels/weight_format.hpp"
#include "model/fp8_linear.hpp"   // fp8_wgrad_reach
#include "scheduler/profile.hpp"  // linear_compute_name

namespace rp {
namespace {

constexpr const char* kFormat = "roundpipe-trainer-state";
constexpr int kVersion = 1;

nlohmann::json schedule_json(const LrSchedule& s) {
  return {{"kind", s.kind},
          {"lr", s.lr},
          {"min_lr", s.min_lr},
          {"warmup_steps", s.warmup_steps},
          {"total_steps", s.total_steps}};
}

nlohmann::json series_json(const RunSeries& r) {
  nlohmann::json cks = nlohmann::json::array();
  for (const SavedCheckpoint& c : r.checkpoints) {
    nlohmann::json files = nlohmann::json::object();
    for (const auto& [name, bytes] : c.files) files[name] = bytes;
    nlohmann::json e = {
        {"name", c.name}, {"step", c.step}, {"weights_xxh3", c.weights_xxh3}, {"files", files}};
    if (c.metric) e["metric"] = *c.metric;
    cks.push_back(e);
  }
  nlohmann::json j = {{"checkpoints", cks}};
  if (r.best)
    j["best"] = {
        {"name", r.best->name}, {"step", r.best->step}, {"metric", r.best->metric}, {"value", r.best->value}};
  nlohmann::json es = {{"bad_evals", r.early_stopping.bad_evals}};
  if (r.early_stopping.best) es["best"] = *r.early_stopping.best;
  j["early_stopping"] = es;
  return j;
}

/// A checkpoint name "checkpoint-<digits>" (or "final" when `final_ok`), never a path.
void require_checkpoint_name(const JsonFields& f, const char* key, const std::string& name, bool final_ok) {
  const bool numbered = name.rfind("checkpoint-", 0) == 0 && name.size() > 11 &&
                        name.find_first_not_of("0123456789", 11) == std::string::npos;
  if (!numbered && !(final_ok && name == "final")) f.fail(key, "a checkpoint name checkpoint-<n>", name);
}

RunSeries read_series(const JsonFields& f) {
  RunSeries r;
  const JsonFields s = f.nested("run_series");
  if (s.has("checkpoints")) {
    if (!s.at("checkpoints").is_array()) s.fail("checkpoints", "a list");
    for (const auto& e : s.at("checkpoints")) {
      if (!e.is_object()) s.fail("checkpoints", "a list of objects");
      const JsonFields c(e, f.where(), "run_series.checkpoints.", JsonFields::Error::runtime_error);
      SavedCheckpoint k;
      k.name = c.string("name");
      require_checkpoint_name(c, "name", k.name, false);
      k.step = c.integer("step", 1);
      k.weights_xxh3 = c.string("weights_xxh3");
      const nlohmann::json files = c.object("files");
      for (const auto& [name, bytes] : files.items()) {
        if (!bytes.is_number_unsigned() || name.empty() || name.find('/') != std::string::npos ||
            name == "." || name == "..")
          c.fail("files", "file names with their sizes in bytes");
        k.files[name] = bytes.get<uint64_t>();
      }
      if (c.has("metric")) k.metric = c.number("metric");
      r.checkpoints.push_back(std::move(k));
    }
  }
  if (s.has("best")) {
    const JsonFields b = s.nested("best");
    BestCheckpoint best;
    best.name = b.string("name");
    require_checkpoint_name(b, "name", best.name, true);
    best.step = b.integer("step", 1);
    best.metric = b.string("metric");
    best.value = b.number("value");
    r.best = best;
  }
  if (s.has("early_stopping")) {
    const JsonFields e = s.nested("early_stopping");
    r.early_stopping.bad_evals = e.integer("bad_evals", 0);
    if (e.has("best")) r.early_stopping.best = e.number("best");
  }
  return r;
}

}  // namespace

bool fp8_weight_gradients_run(const TrainSpec& spec, const ModelConfig* model) {
  return fp8_weight_gradients_on(spec) && (!model || fp8_wgrad_reach(*model).fp8_wgrad > 0);
}

TrainerState trainer_state_of(const TrainSpec& spec, int64_t step, int64_t data_position,
                              const ModelConfig* model) {
  TrainerState s;
  s.step = step;
  s.data_position = data_position;
  s.seed = spec.seed;
  s.sequences_per_step = spec.sequences_per_step;
  s.seq_len = spec.seq_len;
  s.async = spec.async;
  s.save_dtype = spec.save_dtype;
  s.compute_dtype = spec.compute_dtype;
  s.model = spec.model;
  s.data = spec.data;
  s.lr_schedule = schedule_json(spec.lr_schedule);
  s.packing = spec.packing;
  s.eval_fraction = spec.eval_data.empty() ? spec.eval_fraction : 0;
  if (spec.lora) s.base_format = weight_format_name(spec.lora->base_format);
  s.max_examples = spec.max_examples;
  s.chat_template = spec.chat_template;
  s.linear_compute = linear_compute_name(spec.fp8, fp8_weight_gradients_run(spec, model));
  return s;
}

nlohmann::json architecture_of(const ModelConfig& c) {
  return {{"model_type", c.architecture},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim},
          {"num_experts", c.num_experts},
          {"num_experts_per_tok", c.num_experts_per_tok},
          {"moe_intermediate_size", c.moe_intermediate_size}};
}

std::string architecture_difference(const nlohmann::json& saved, const nlohmann::json& now) {
  if (!saved.is_object()) return {};
  for (const auto& [key, value] : now.items())
    if (saved.contains(key) && saved.at(key) != value)
      return fmt::format("{} {} (the checkpoint's {})", key, value.dump(), excerpt(saved.at(key).dump()));
  return {};
}

nlohmann::json numerics_of(const ModelConfig& c) {
  return {{"rope_theta", c.rope_theta},
          {"rms_norm_eps", c.rms_norm_eps},
          {"attn_logit_softcapping", c.attn_logit_softcapping},
          {"final_logit_softcapping", c.final_logit_softcapping}};
}

std::vector<std::string> numerics_differences(const nlohmann::json& saved, const nlohmann::json& now) {
  std::vector<std::string> out;
  if (!saved.is_object()) return out;
  auto text = [](const std::string& key, const nlohmann::json& v) {
    if (!v.is_number()) return excerpt(v.dump());
    const double d = v.get<double>();
    return d == 0 && key.find("softcapping") != std::string::npos ? std::string("none")
                                                                  : fmt::format("{}", d);
  };
  for (const char* key :
       {"rope_theta", "rms_norm_eps", "attn_logit_softcapping", "final_logit_softcapping"}) {
    if (!saved.contains(key) || !now.contains(key) || saved.at(key) == now.at(key)) continue;
    out.push_back(
        fmt::format("{} {} (the checkpoint's {})", key, text(key, now.at(key)), text(key, saved.at(key))));
  }
  return out;
}

void write_trainer_state(const std::string& path, const TrainerState& s) {
  const nlohmann::json j = {{"format", kFormat},
                            {"version", kVersion},
                            {"step", s.step},
                            {"data_position", s.data_position},
                            {"seed", s.seed},
                            {"sequences_per_step", s.sequences_per_step},
                            {"seq_len", s.seq_len},
                            {"async", s.async},
                            {"save_dtype", s.save_dtype},
                            {"compute_dtype", s.compute_dtype},
                            {"model", s.model},
                            {"data", s.data},
                            {"lr_schedule", s.lr_schedule},
                            {"packing", s.packing},
                            {"eval_fraction", s.eval_fraction},
                            {"weights_xxh3", s.weights_xxh3},
                            {"base_format", s.base_format},
                            {"max_examples", s.max_examples.value_or(0)},
                            {"chat_template", s.chat_template.value_or("auto")},
                            {"linear_compute", s.linear_compute.value_or("bf16")},
                            {"model_config", s.model_config},
                            {"model_numerics", s.model_numerics},
                            {"run_series", series_json(s.series)},
                            {"optimizer_state", "optimizer_state.bin"}};
  std::ofstream f(path, std::ios::trunc);
  if (!f) throw std::runtime_error(fmt::format("{}: cannot write ({})", path, std::strerror(errno)));
  f << j.dump(2) << "\n";
  f.flush();
  if (!f) throw std::runtime_error(path + ": write failed (disk full?)");
}

TrainerState read_trainer_state(const std::string& path) {
  if (const std::string why = not_a_file_text(path); !why.empty())
    throw std::runtime_error(path + ": " + why);
  std::error_code ec;
  std::ifstream in(path);
  if (!in && std::filesystem::exists(path, ec))
    throw std::runtime_error(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  if (!in) {
    const std::string dir = std::filesystem::path(path).parent_path().string();
    throw std::runtime_error(
        fmt::format("{}: missing; {} is not a resumable checkpoint (resume from a checkpoint-<k>/ or final/ "
                    "folder written by "
                    "roundpipe train)",
                    path, dir.empty() ? std::string(".") : dir));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = parse_json_text(ss.str(), path);  // "<path>:<line>:<column>: invalid JSON: <reason>"
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  if (!j.is_object()) throw std::runtime_error(path + ": expected a JSON object");
  const JsonFields f(j, path, "", JsonFields::Error::runtime_error);
  f.require_value("format", kFormat);
  f.require_value("version", kVersion);
  TrainerState s;
  s.step = f.integer("step", 1);
  s.data_position = f.integer("data_position", 0);
  s.seed = f.unsigned_integer("seed");
  s.sequences_per_step = f.integer("sequences_per_step", 1);
  s.seq_len = f.integer("seq_len", 2);
  s.async = f.boolean("async");
  s.save_dtype = f.string("save_dtype");
  if (s.save_dtype != "f32" && s.save_dtype != "bf16" && s.save_dtype != "f16")
    f.fail("save_dtype", "\"f32\", \"bf16\" or \"f16\"");
  s.compute_dtype = f.string("compute_dtype");
  s.model = f.string("model");
  s.data = f.string("data");
  s.lr_schedule = f.object("lr_schedule");
  if (f.has("weights_xxh3")) s.weights_xxh3 = f.string("weights_xxh3");
  if (f.has("packing")) s.packing = f.boolean("packing");  // absent in earlier releases' files
  if (f.has("eval_fraction")) s.eval_fraction = f.number("eval_fraction");
  if (f.has("base_format")) s.base_format = f.string("base_format");
  if (f.has("max_examples"))
    s.max_examples = f.integer("max_examples", 0);  // absent in earlier releases' files
  if (f.has("chat_template")) s.chat_template = f.string("chat_template");
  if (f.has("linear_compute")) {  // absent in earlier releases' files
    s.linear_compute = f.string("linear_compute");
    if (*s.linear_compute != "bf16" && *s.linear_compute != "fp8" && *s.linear_compute != "fp8+wgrad")
      f.fail("linear_compute", "\"bf16\", \"fp8\" or \"fp8+wgrad\"");
  }
  if (f.has("model_config") && !f.at("model_config").is_null()) s.model_config = f.object("model_config");
  if (f.has("model_numerics") && !f.at("model_numerics").is_null())  // absent in earlier releases' files
    s.model_numerics = f.object("model_numerics");
  if (f.has("run_series")) s.series = read_series(f);  // absent in earlier releases' files
  return s;
}

std::vector<std::string> resume_differences(const TrainerState& saved_state, const TrainSpec& spec,
                                            const ModelConfig* model) {
  std::vector<std::string> out;
  const TrainerState now = trainer_state_of(spec, saved_state.step, saved_state.data_position, model);
  TrainerState saved = saved_state;  // earlier releases recorded "fp8+wgrad" where no linear took them
  if (model && saved.linear_compute == "fp8+wgrad" && fp8_wgrad_reach(*model).fp8_wgrad == 0)
    saved.linear_compute = "fp8";
  if (saved.seed != now.seed)
    out.push_back(fmt::format("seed {} (saved run {}): the data order differs", now.seed, saved.seed));
  if (saved.sequences_per_step != now.sequences_per_step)
    out.push_back(fmt::format("sequences_per_step {} (saved run {})", now.sequences_per_step,
                              saved.sequences_per_step));
  if (saved.seq_len != now.seq_len)
    out.push_back(fmt::format("seq_len {} (saved run {}): the sequences differ", now.seq_len, saved.seq_len));
  if (saved.async != now.async)
    out.push_back(fmt::format("the {} optimizer (saved run: {})", now.async ? "async" : "sync",
                              saved.async ? "async" : "sync"));
  if (saved.lr_schedule != now.lr_schedule)
    out.push_back(
        fmt::format("lr_schedule {} (saved run {})", now.lr_schedule.dump(), saved.lr_schedule.dump()));
  if (saved.data != now.data) out.push_back(fmt::format("data '{}' (saved run '{}')", now.data, saved.data));
  if (saved.packing != now.packing)
    out.push_back(fmt::format("packing {} (saved run {}): the sequences differ", now.packing, saved.packing));
  if (saved.eval_fraction != now.eval_fraction)
    out.push_back(fmt::format("eval_fraction {} (saved run {}): the training sequences differ",
                              now.eval_fraction, saved.eval_fraction));
  if (saved.max_examples && saved.max_examples != now.max_examples)
    out.push_back(fmt::format("max_examples {} (saved run {}): other examples are drawn", *now.max_examples,
                              *saved.max_examples));
  if (saved.chat_template && saved.chat_template != now.chat_template)
    out.push_back(fmt::format("chat_template '{}' (saved run '{}'): the sequences differ", *now.chat_template,
                              *saved.chat_template));
  if (!saved.base_format.empty() && saved.base_format != now.base_format)
    out.push_back(fmt::format("base_format {} (saved run {}): the adapters continue on other frozen weights",
                              now.base_format.empty() ? "none (full fine-tuning)" : now.base_format,
                              saved.base_format));
  if (saved.linear_compute && saved.linear_compute != now.linear_compute)
    out.push_back(fmt::format(
        "linear layers in {} (saved run {}; spec keys \"fp8\" and \"fp8_weight_gradients\"): the GEMMs round "
        "differently from here on",
        *now.linear_compute, *saved.linear_compute));
  if (saved.compute_dtype != now.compute_dtype)
    out.push_back(fmt::format("compute_dtype {} (saved run {})", now.compute_dtype, saved.compute_dtype));
  return out;
}

}  // namespace rp
