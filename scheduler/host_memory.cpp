#include "scheduler/host_memory.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

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

// The largest value v in [lo, start] with fits(v) by bisection (needs fall as v falls), or lo.
template <class Fits>
int64_t largest_fitting(int64_t lo, int64_t start, Fits fits) {
  if (fits(start)) return start;
  int64_t a = lo, b = start;  // b does not fit
  if (!fits(a)) return lo;
  while (b - a > 1) {
    const int64_t mid = a + (b - a) / 2;
    (fits(mid) ? a : b) = mid;
  }
  return a;
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
        "plan --lora-r 16; spec: \"lora\": {\"r\": 16, \"target_modules\": [\"all-linear\"]}", r);
    all.lora_r = 16;
  }
  const bool four_bit = run.frozen && (*run.frozen == WeightFormat::nf4 || *run.frozen == WeightFormat::q4_0);
  if (!four_bit) {
    HostRun r = run;
    r.lora_r = run.lora_r > 0 ? run.lora_r : 16;
    r.frozen = WeightFormat::nf4;
    add(fmt::format("LoRA r={} on a 4-bit (nf4) base{}", r.lora_r,
                    run.lora_r > 0 ? "" : " instead of full fine-tuning"),
        fmt::format("plan --lora-r {} --frozen nf4; spec: \"lora\": {{\"r\": {}, \"base_format\": \"nf4\"}}",
                    r.lora_r, r.lora_r),
        r);
    all.lora_r = r.lora_r;
    all.frozen = WeightFormat::nf4;
  }
  // fewer sequences per pass: fewer micro-batches first, then fewer sequences in each
  const int64_t per_pass = run.micro_batches * run.sequences_per_micro;
  if (per_pass > 1) {
    auto with = [&](HostRun r, int64_t seqs) {
      r.micro_batches = std::min(run.micro_batches, seqs);
      r.sequences_per_micro = std::max<int64_t>(1, seqs / r.micro_batches);
      return r;
    };
    const int64_t seqs =
        largest_fitting(1, per_pass - 1, [&](int64_t s) { return need_of(with(run, s)) <= cap; });
    const HostRun r = with(run, seqs);
    add(fmt::format("{} per pass instead of {} (keep the batch with more accumulation)",
                    counted(r.micro_batches * r.sequences_per_micro, "sequence"), per_pass),
        fmt::format(
            "plan --micro {} --sequences-per-micro {}; spec: micro_batches {} and sequences_per_step / "
            "accumulation = {}",
            r.micro_batches, r.sequences_per_micro, r.micro_batches, r.micro_batches * r.sequences_per_micro),
        r);
    all.micro_batches = r.micro_batches;
    all.sequences_per_micro = r.sequences_per_micro;
  }
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
