#include "scheduler/host_memory.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/counted.hpp"
#include "base/host_resources.hpp"
#include "kernels/weight_format.hpp"
#include "model/lora.hpp"

namespace rp {

namespace {

ModelLayout host_layout(const ModelConfig& c, const HostRun& run) {
  WeightFormat f = run.frozen.value_or(WeightFormat::bf16);
  if (f == WeightFormat::mxfp4 && c.num_experts == 0) f = WeightFormat::bf16;  // the experts' form only
  if (run.lora_r > 0) {
    LoraConfig lc;
    lc.r = run.lora_r;
    lc.alpha = double(run.lora_r);
    set_lora_targets(lc, run.lora_targets);
    lc.base_format = f;
    return make_layout(c, lc);
  }
  ModelLayout m = make_layout(c);
  if (run.frozen)
    for (int g = 0; g < int(m.groups.size()); ++g) freeze_group(m, g, f);
  return m;
}

}  // namespace

HostMemoryNeed host_memory_need(const ModelConfig& c, const HostRun& run) {
  return host_memory_need(host_layout(c, run), run);
}

HostMemoryNeed host_memory_need(const ModelLayout& m, const HostRun& run) {
  const ModelConfig& c = m.config;
  if (run.seq_len < 1 || run.sequences_per_micro < 1 || run.micro_batches < 1 || run.workers < 1 ||
      run.pass_slots < 1 || run.elem_bytes < 1)
    throw std::invalid_argument(
        fmt::format("host memory: expected a positive shape, got seq {} x {} sequences x {} micro-batches, "
                    "{} workers, {} "
                    "pass slots",
                    run.seq_len, run.sequences_per_micro, run.micro_batches, run.workers, run.pass_slots));
  HostMemoryNeed n;
  for (const ParamGroup& g : m.groups) {
    if (g.frozen) {
      n.frozen_params += g.numel;
      n.frozen += double(g.storage_bytes);
    } else {
      n.trainable_params += g.numel;
    }
  }
  const double p = double(n.trainable_params), e = double(run.elem_bytes);
  n.master = 4 * p;
  n.moments = 8 * p;
  n.weights = e * p;
  n.gradients = 4 * p;
  // one worker runs its stages in dealt order: its passes share one slot's activations
  const double slots = run.workers == 1 ? 1.0 : double(run.pass_slots);
  const double tokens = double(run.seq_len) * double(run.sequences_per_micro);
  const double act = tokens * double(c.hidden_size) * e;
  // the input of every layer past the first (L - 1) and two sets of boundary gradients (PassBuffers)
  n.activations = slots * double(run.micro_batches) * act * (double(m.num_layers()) + 1.0);
  if (run.saved_attention)
    n.attention = slots * double(run.micro_batches) * double(c.num_hidden_layers) * tokens *
                  double(c.num_attention_heads) * (double(c.head_dim) * e + 4.0);
  return n;
}

std::string host_memory_text(const HostMemoryNeed& n) {
  std::string s = fmt::format("{}", byte_text(n.total()));
  std::vector<std::string> parts;
  auto add = [&](double b, const char* what) {
    if (b > 0) parts.push_back(fmt::format("{} {}", byte_text(b), what));
  };
  add(n.master, "fp32 master weights");
  add(n.moments, "AdamW moments");
  add(n.weights, "low-precision copy");
  add(n.gradients, "gradients");
  add(n.frozen, "frozen base");
  add(n.activations, "activations");
  add(n.attention, "saved attention");
  std::string joined;
  for (const std::string& x : parts) joined += (joined.empty() ? "" : ", ") + x;
  return s + " (" + joined + ")";
}

namespace {

/// `j` as one line of JSON with a space after each ':' and ',' (as a user writes a spec).
std::string spaced(const nlohmann::ordered_json& j) {
  std::string out;
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      out += (out.empty() ? "" : ", ") + nlohmann::json(it.key()).dump() + ": " + spaced(it.value());
    return "{" + out + "}";
  }
  if (j.is_array()) {
    for (const auto& e : j) out += (out.empty() ? "" : ", ") + spaced(e);
    return "[" + out + "]";
  }
  return j.dump();
}

/// The plan flags and the spec's "lora" key of a LoRA run of rank `r` on `targets` (plan
/// --lora-targets entries or a layout's target names) over a base stored as `frozen` (none:
/// the model's own form, bf16 as planned).
std::string lora_how(int64_t r, const std::vector<std::string>& targets, std::optional<WeightFormat> frozen) {
  LoraConfig l;
  set_lora_targets(l, targets);
  nlohmann::ordered_json key = {{"r", r}};
  if (!l.target_modules.empty()) key["target_modules"] = l.target_modules;
  if (!l.target_parameters.empty()) key["target_parameters"] = l.target_parameters;
  if (frozen) key["base_format"] = weight_format_name(*frozen);
  std::string flags = fmt::format("plan --lora-r {}", r);
  if (targets != std::vector<std::string>{"all-linear"}) {
    std::string list;
    for (std::string t : targets) {
      if (t.rfind("mlp.experts", 0) == 0) t = t.substr(4);  // --lora-targets names them experts.<proj>
      list += (list.empty() ? "" : ",") + t;
    }
    flags += " --lora-targets " + list;
  }
  if (frozen) flags += fmt::format(" --frozen {}", weight_format_name(*frozen));
  return flags + "; spec: \"lora\": " + spaced(key);
}

/// `run` with `seqs` sequences per pass and the step's batch kept: min(M, seqs) micro-batches
/// of equal size and the accumulation that makes up the batch.
HostRun with_sequences_per_pass(const HostRun& run, int64_t seqs) {
  HostRun r = run;
  const int64_t batch = run.micro_batches * run.sequences_per_micro * run.accumulation;
  r.micro_batches = std::min(run.micro_batches, seqs);
  r.sequences_per_micro = seqs / r.micro_batches;
  r.accumulation = batch / seqs;
  return r;
}

/// The counts of sequences per pass below the current one that keep the step's batch: each
/// divides the sequences a replica runs per step, and is at most M or a multiple of M (equal
/// micro-batches); ascending, 1 first.
std::vector<int64_t> per_pass_candidates(const HostRun& run) {
  const int64_t per_pass = run.micro_batches * run.sequences_per_micro;
  const int64_t per_replica =
      per_pass * std::max<int64_t>(1, run.accumulation / std::max<int64_t>(1, run.replicas));
  std::vector<int64_t> out;
  const auto take = [&](int64_t s) {
    if (s < per_pass && (s <= run.micro_batches || s % run.micro_batches == 0)) out.push_back(s);
  };
  for (int64_t d = 1; d <= per_replica / d; ++d)
    if (per_replica % d == 0) {
      take(d);
      if (d != per_replica / d) take(per_replica / d);
    }
  std::sort(out.begin(), out.end());
  return out;
}

/// The fewer-sequences-per-pass change: the largest candidate count that fits (needs fall as
/// the count falls: bisection), or 1.
void add_fewer_per_pass(const HostRun& run, const std::function<double(const HostRun&)>& need_of, double cap,
                        const std::function<void(std::string, std::string, const HostRun&)>& add,
                        HostRun& all) {
  const std::vector<int64_t> c = per_pass_candidates(run);
  if (c.empty()) return;
  size_t lo = 0, hi = c.size();  // c[lo] is taken (1 when none fits); c[hi] does not fit
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    (need_of(with_sequences_per_pass(run, c[mid])) <= cap ? lo : hi) = mid;
  }
  const HostRun r = with_sequences_per_pass(run, c[lo]);
  const int64_t per_pass = run.micro_batches * run.sequences_per_micro, batch = per_pass * run.accumulation;
  add(fmt::format("{} per pass instead of {} (the batch of {} kept with accumulation {})",
                  counted(c[lo], "sequence"), per_pass, batch, r.accumulation),
      fmt::format("plan --micro {} --sequences-per-micro {}{}; spec: \"sequences_per_step\": {}, "
                  "\"micro_batches\": {}, \"accumulation\": {}",
                  r.micro_batches, r.sequences_per_micro,
                  r.replicas > 1 ? fmt::format(" --accumulation {}", r.accumulation / r.replicas) : "", batch,
                  r.micro_batches, r.accumulation),
      r);
  all.micro_batches = r.micro_batches;
  all.sequences_per_micro = r.sequences_per_micro;
  all.accumulation = r.accumulation;
}

}  // namespace

std::vector<HostMemoryChange> host_memory_alternatives(const ModelConfig& c, const HostRun& run,
                                                       double budget_bytes) {
  const double cap = kHostHeadroom * budget_bytes;
  const auto need_of = [&](const HostRun& r) { return host_memory_need(c, r).total(); };
  if (need_of(run) <= cap) return {};
  std::vector<HostMemoryChange> out;
  auto add = [&](std::string what, std::string how, const HostRun& r) {
    const double need = need_of(r);
    out.push_back({std::move(what), std::move(how), r, need, need <= cap});
  };
  HostRun all = run;  // every change at once
  if (run.lora_r == 0 && !run.frozen) {
    HostRun r = run;
    r.lora_r = 16;
    add("LoRA r=16 on all linear layers instead of full fine-tuning (bf16 base)",
        lora_how(16, r.lora_targets, std::nullopt), r);
    all.lora_r = 16;
  }
  const bool four_bit = run.frozen && (*run.frozen == WeightFormat::nf4 || *run.frozen == WeightFormat::q4_0);
  if (!four_bit) {
    HostRun r = run;
    r.lora_r = run.lora_r > 0 ? run.lora_r : 16;
    r.frozen = WeightFormat::nf4;
    add(fmt::format("LoRA r={} on a 4-bit (nf4) base{}", r.lora_r,
                    run.lora_r > 0 ? "" : " instead of full fine-tuning"),
        lora_how(r.lora_r, r.lora_targets, r.frozen), r);
    all.lora_r = r.lora_r;
    all.frozen = WeightFormat::nf4;
  }
  add_fewer_per_pass(run, need_of, cap, add, all);
  constexpr int64_t kShortest = 512;
  if (run.seq_len > kShortest) {
    HostRun r = run;
    while (r.seq_len / 2 >= kShortest && need_of(r) > cap) r.seq_len /= 2;
    if (r.seq_len != run.seq_len) {
      add(fmt::format("sequences of {} tokens instead of {}", r.seq_len, run.seq_len),
          fmt::format("plan --seq {}; spec: \"seq_len\": {}", r.seq_len, r.seq_len), r);
      all.seq_len = r.seq_len;
    }
  }
  if (run.saved_attention) {
    HostRun r = run;
    r.saved_attention = false;
    add("no saved attention (backward recomputes it)",
        "plan --no-save-attention; spec: \"save_attention\": false", r);
    all.saved_attention = false;
  }
  if (std::none_of(out.begin(), out.end(), [](const HostMemoryChange& x) { return x.fits; }) && all != run)
    add("all of the above together", "", all);
  return out;
}

}  // namespace rp
