// `roundpipe plan`'s inputs read from text: byte sizes ("24GiB") and a model's shape from a
// folder, its config.json or a .gguf's metadata, and the checks of its flags' values (cli/plan.hpp).
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include "base/checked_math.hpp"
#include "base/json_text.hpp"
#include "base/output_folder.hpp"  // overlapping_input
#include "cli/command.hpp"
#include "cli/plan.hpp"
#include "cli/plan_disk.hpp"
#include "formats/gguf.hpp"
#include "kernels/weight_format.hpp"
#include "model/config.hpp"
#include "model/lora.hpp"
#include "roundpipe/spec.hpp"
#include "scheduler/gpu_presets.hpp"
#include "trace/chrome_trace.hpp"  // is_written_trace

namespace fs = std::filesystem;

namespace rp {

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    throw UsageError(fmt::format("{}: '{}' is not a byte size (e.g. 24GiB)", what, text));
  }
  std::string unit = s.substr(used);
  for (auto& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  double mul = 0;
  const char* prefixes = "kmgt";
  if (unit.empty() || unit == "b") {
    mul = 1;
  } else if (const char* p = std::strchr(prefixes, unit[0]); p && *p) {
    const int e = int(p - prefixes) + 1;
    const std::string rest = unit.substr(1);
    if (rest == "ib" || rest.empty()) mul = std::pow(1024.0, e);
    else if (rest == "b") mul = std::pow(1000.0, e);
  }
  // decimal only, as the real flags (std::stod also reads "0x10" as 16)
  if (!decimal_characters(std::string_view(s).substr(0, used)) || mul == 0 || !(v >= 0) ||
      !std::isfinite(v * mul) || v * mul > 9e18)
    throw UsageError(fmt::format("{}: '{}' is not a byte size (e.g. 24GiB, 512MB, 1e10)", what, text));
  return int64_t(std::llround(v * mul));
}

ModelShape load_model_shape(const std::string& path, std::string* description) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "config.json").string();
  if (!fs::exists(file, ec)) throw std::runtime_error(file + ": no such file");
  // the model's one description (ModelConfig), read by its own parsers; the shape is a view of it
  ModelConfig c;
  std::string kind;
  if (fs::path(file).extension() == ".gguf") {
    GgufFile g(file);
    c = config_from_gguf(g);
    kind = "gguf " + g.get_string("general.architecture");
  } else {
    try {
      c = load_config_file(file);  // dense, Qwen3-MoE ("qwen3_moe"), GPT-OSS, ...
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(e.what());
    }
    kind = c.architecture;
  }
  ModelShape m = model_shape_from_config(c);
  m.validate(file);
  // The partitioner searches every contiguous range of layers (O(L^2) candidates, each
  // memoised): 1024 decoder layers is 8x the deepest released dense model (126).
  if (m.num_layers > kMaxPlanLayers)
    throw std::runtime_error(
        fmt::format("{}: num_hidden_layers {} exceeds the {} decoder layers the planner "
                    "handles",
                    file, m.num_layers, kMaxPlanLayers));
  if (description) {
    const double total = double(c.num_parameters()), active = double(c.num_active_parameters());
    *description = fmt::format(
        "{} ({}): {} layers, hidden {}, {} q / {} kv heads x {}, {}vocab {}, "
        "{:.2f} B parameters",
        path, kind, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim,
        m.num_experts > 0 ? fmt::format("{} experts top-{} x FFN {} in {} sparse layers, ", m.num_experts,
                                        m.experts_per_token, m.moe_intermediate_size, m.num_moe_layers())
                          : fmt::format("FFN {}, ", m.intermediate_size),
        m.vocab_size, total / 1e9);
    if (m.num_experts > 0) *description += fmt::format(" in total, {:.2f} B active per token", active / 1e9);
  }
  return m;
}

namespace {
/// The flag's own JSON is a usage error (exit 2); a plan file's content, or a file that cannot
/// be read, is the file's fault (exit 1), as every other input file's.
[[noreturn]] void refuse_plan(bool inline_json, const std::string& what) {
  if (inline_json) throw UsageError(what);
  throw std::runtime_error(what);
}
}  // namespace

IterationPlan given_plan(const std::string& text, int num_layers, int gpus) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos)
    throw UsageError("--plan: expected a plan as JSON or a file holding one, got nothing");
  std::error_code ec;
  const JsonTextOptions in_flag{.unique_keys = true, .lines = false};
  // inline JSON: an object or a list, or any other JSON value that names no file
  bool inline_json = text[first] == '{' || text[first] == '[';
  if (!inline_json && !fs::exists(text, ec))
    inline_json = parse_json_value(text, "--plan", in_flag).has_value();
  const std::string where = inline_json ? "--plan" : text;
  nlohmann::json j;
  try {
    j = inline_json ? parse_json_text(text, where, in_flag)
                    : parse_json_text(read_json_file(text), where, {.unique_keys = true});
  } catch (const std::invalid_argument& e) {
    refuse_plan(inline_json, e.what());
  }
  const std::string expected =
      "expected a plan object ({\"forward\": [[0, 3], ...], \"tail\": [...], \"backward\": [...]}) or a spec "
      "with a \"plan\" key";
  if (!j.is_object()) refuse_plan(inline_json, fmt::format("{}: {}", where, expected));
  const bool spec = j.contains("plan");
  if (spec && !j["plan"].is_object())
    refuse_plan(inline_json, fmt::format("{}: key 'plan': expected an object, as in a spec", where));
  if (!spec && !j.empty()) {
    bool plan_keys = false;
    for (const char* k :
         {"forward", "tail", "backward", "forward_layers", "backward_layers", "tail_decoders"})
      plan_keys = plan_keys || j.contains(k);
    if (!plan_keys)
      refuse_plan(inline_json, fmt::format("{}: no \"plan\" key and no plan keys: {}", where, expected));
  }
  try {
    return plan_from_json(spec ? j["plan"] : j, num_layers, gpus, spec ? where + ": key 'plan'" : where);
  } catch (const std::invalid_argument& e) {
    refuse_plan(inline_json,
                fmt::format("{} (the model's layers are 0-{}: the embedding, {} decoders, the tail)",
                            e.what(), num_layers - 1, num_layers - 2));
  }
}

// the replay holds every iteration's events: ~25 KB and several ms each on a 48-layer model,
// so a million took minutes and over 8 GiB before it ended; the default (0) is at most
// 4 x 130 with a disk tier (default_iterations)
constexpr int kMaxIterations = 10000;

const std::string& plan_flag_expects(std::string_view flag) {
  static const std::map<std::string, std::string, std::less<>> expects = {
      {"--gpus", fmt::format("an integer in 1..{}", kMaxWorkers)},
      {"--seq", "an integer >= 1"},
      {"--micro", "an integer >= 1"},
      {"--sequences-per-micro", "an integer >= 1"},
      {"--peak-tflops", "a rate from 0.001 to 1e6 TFLOP/s"},
      {"--fp8-tflops", "0 (the preset's) or a rate from 0.001 to 1e6 TFLOP/s"},
      {"--hbm-gbps", "a rate from 0.001 to 1e6 GB/s"},
      {"--pcie-gbps", "0 (free) or a rate from 0.001 to 1e6 GB/s"},
      {"--iterations", fmt::format("0 (enough for whole deal cycles) to {}", kMaxIterations)},
      {"--mlp-chunk", "an integer >= 0 (0: 8192)"},
      {"--lora-r", fmt::format("0 (none) or an integer in 1..{}", LoraConfig::kMaxRank)},
      {"--nodes", "an integer >= 1"},
      {"--net-gbps", "a rate from 0.001 to 1e6 Gbit/s"},
      {"--net-latency-us", "0 to 1e6 microseconds"},
      {"--accumulation", "an integer >= 1"},
      {"--grouped-gemm-efficiency", "a fraction in [0.001, 1] (0: by --expert-gemm)"},
      {"--disk-gbps", "0 (off) or a rate from 0.001 to 1e6 GB/s"},
      {"--disk-write-gbps", "0 (the read rate) or a rate from 0.001 to 1e6 GB/s"},
      {"--host-budget-gib", fmt::format("0 (default) or 0.001 to {} GiB", kMaxHostGib)},
      {"--host-gib", fmt::format("0 (this machine's) or 0.001 to {} GiB", kMaxHostGib)},
      {"--disk-ring", "an integer >= 2 (the runtime's ring has at least two)"},
  };
  const auto it = expects.find(flag);
  if (it == expects.end()) throw std::logic_error(fmt::format("plan: no expectation for {}", flag));
  return it->second;
}

// "<flag>: expected <what it expects>, got <value>"
template <typename T>
static UsageError plan_flag_error(std::string_view flag, T value) {
  return UsageError(fmt::format("{}: expected {}, got {}", flag, plan_flag_expects(flag), value));
}

// --frozen's storage form (bf16 when not given); a UsageError for another name.
WeightFormat frozen_format(const PlanCommandOptions& o) {
  if (o.frozen.empty()) return WeightFormat::bf16;
  try {
    return parse_weight_format(o.frozen);
  } catch (const std::invalid_argument&) {
    throw UsageError(
        fmt::format("--frozen: expected f32, bf16, f16, q8_0, q4_0, nf4, mxfp4 or fp8, got '{}'", o.frozen));
  }
}

// --lora-r: 0 (no adapters) or a rank LoraConfig accepts; a larger one would overflow the
// parameter counts the plan forms from it.
void check_lora_r(int64_t r) {
  if (r < 0 || r > LoraConfig::kMaxRank) throw plan_flag_error("--lora-r", r);
}

// A rate, latency or size flag: in [lo, hi], or 0 when `zero_ok` (its default's meaning). Past
// hi the seconds and bytes printed overflow or lose all meaning ("inf TiB", a 300-digit number
// of ms; an infinite --net-latency-us gave "0 tokens/s"), below lo they round to nothing; a
// NaN is outside.
static void check_real(const char* flag, double v, double lo, double hi, bool zero_ok = false) {
  if (!((zero_ok && v == 0) || (v >= lo && v <= hi))) throw plan_flag_error(flag, v);
}

/// The flags' values, before the model loads: a UsageError naming the first one out of range.
void check_plan_options(const PlanCommandOptions& o) {
  if (o.gpus < 1 || o.gpus > kMaxWorkers) throw plan_flag_error("--gpus", o.gpus);
  if (o.seq_len < 1) throw plan_flag_error("--seq", o.seq_len);
  if (o.micro_batches < 1) throw plan_flag_error("--micro", o.micro_batches);
  if (o.sequences_per_micro < 1) throw plan_flag_error("--sequences-per-micro", o.sequences_per_micro);
  check_real("--peak-tflops", o.peak_tflops, 1e-3, 1e6);
  check_real("--fp8-tflops", o.fp8_tflops, 1e-3, 1e6, true);
  if (o.fp8 && !o.gpu.empty() && find_gpu_preset(o.gpu) &&
      !(achievable_rates(*find_gpu_preset(o.gpu)).fp8_tflops > 0) && !(o.fp8_tflops > 0))
    throw UsageError(
        fmt::format("--fp8: {} has no FP8 tensor cores (the runtime refuses \"fp8\": true there)", o.gpu));
  if ((o.fp8_wgrad || o.bf16_wgrad) && !o.fp8)
    throw UsageError(fmt::format("{} needs --fp8", o.fp8_wgrad ? "--fp8-wgrad" : "--bf16-wgrad"));
  if (o.fp8_wgrad && o.bf16_wgrad)
    throw UsageError(
        "--fp8-wgrad and --bf16-wgrad: expected one of them (with --fp8 the weight gradients are FP8 unless "
        "--bf16-wgrad)");
  if (o.fp8_wgrad && (o.lora_r > 0 || !o.frozen.empty()))  // as the spec refuses it with "lora"
    throw UsageError(fmt::format("--fp8-wgrad with {}: a frozen base computes no weight gradient",
                                 o.lora_r > 0 ? "--lora-r" : "--frozen"));
  check_real("--hbm-gbps", o.hbm_gbps, 1e-3, 1e6);
  check_real("--pcie-gbps", o.pcie_gbps, 1e-3, 1e6, true);
  check_real("--host-gib", o.host_gib, 1e-3, kMaxHostGib, true);
  if (o.iterations < 0 || o.iterations > kMaxIterations) throw plan_flag_error("--iterations", o.iterations);
  // below 0.001 of peak no GEMM library runs; such a value only prints absurd times
  if (!(o.grouped_gemm_efficiency == 0 ||
        (o.grouped_gemm_efficiency >= 0.001 && o.grouped_gemm_efficiency <= 1)))
    throw plan_flag_error("--grouped-gemm-efficiency", o.grouped_gemm_efficiency);
  if (o.mlp_chunk_tokens < 0)  // the spec's mlp_chunk_tokens rule; a negative one planned as 0 did
    throw plan_flag_error("--mlp-chunk", o.mlp_chunk_tokens);
  check_lora_r(o.lora_r);
  if (o.nodes < 1) throw plan_flag_error("--nodes", o.nodes);
  check_real("--net-gbps", o.net_gbps, 1e-3, 1e6);
  check_real("--net-latency-us", o.net_latency_us, 0, 1e6);
  if (o.accumulation < 1) throw plan_flag_error("--accumulation", o.accumulation);
  if (!checked_product({o.seq_len, o.sequences_per_micro, o.micro_batches}, int64_t(1) << 40))
    throw UsageError(
        fmt::format("--seq {} x --sequences-per-micro {} x --micro {}: more than 2^40 tokens per iteration",
                    o.seq_len, o.sequences_per_micro, o.micro_batches));

  if (o.max_seq && o.memory_cap.empty()) throw UsageError("--max-seq needs --memory-cap");
  if (const std::string in =
          o.trace.empty() ? std::string() : overlapping_input(o.trace, {o.model, o.profile, o.plan});
      !in.empty())
    throw UsageError(fmt::format(
        "--trace: '{}' is or lies inside the input '{}', which writing it would destroy; choose another file",
        o.trace, in));
  if (!o.trace.empty())
    check_new_output_file(o.trace, "--trace", o.force, {"a trace written by roundpipe", is_written_trace});
  if (!o.memory_cap.empty())
    parse_byte_size(o.memory_cap, "--memory-cap");  // bad values before the model loads
  frozen_format(o);
  disk_tier_of(o);  // the disk tier's flags
}

}  // namespace rp
