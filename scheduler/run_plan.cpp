#include "scheduler/run_plan.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "base/checked_math.hpp"
#include "base/counted.hpp"
#include "base/host_resources.hpp"
#include "scheduler/gpu_presets.hpp"
#include "scheduler/profile.hpp"
#include "scheduler/replan.hpp"

namespace rp {

DeviceModel backend_device_model(const std::string& backend, double cpu_link_bytes_per_s, DType compute,
                                 bool fp8, bool fp8_wgrad, bool expert_padded) {
  DeviceModel m;  // CUDA: the H200-like defaults of scheduler/cost_model.hpp
  if (backend == "cpu") {
    m.peak_flops = 50e9;  // a few cores of Eigen fp32 GEMM
    m.attention_efficiency = 0.3;
    m.mem_bandwidth = 10e9;
    m.pcie_bandwidth = cpu_link_bytes_per_s;  // 0: unthrottled copies, transfers free
    m.bucketed_call_seconds = 0;              // the CPU's grouped linears launch nothing
  }
  m.elem_bytes = int64_t(dtype_size(compute));
  m.scratch_elem_bytes = int64_t(dtype_size(compute));
  if (fp8) m.fp8_flops = kFp8SpeedupH200 * m.peak_flops;
  m.fp8_weight_gradients = fp8 && fp8_wgrad;
  m.expert_padded = expert_padded;
  if (expert_padded) m.grouped_gemm_efficiency = kBucketedGemmEfficiency;
  return m;
}

namespace {

// Host memory: optimizer state + low-precision copy + gradient slots + pass slots (one
// worker: shared, PassBuffers), and the decoders' saved attention when it is on (automatic:
// on when everything fits 90% of the available memory). Sets r.saved_attention and
// r.host_bytes; throws when the need is over the budget.
void plan_host_memory(const RunPlanInputs& in, const HostBudget& h, RunPlan& r) {
  const ModelLayout& layout = *in.layout;
  const auto& c = layout.config;
  const size_t dt = dtype_size(in.compute);
  // trainable groups: master, moments, low-precision copy, gradient slot; frozen: storage only
  size_t n = 0, frozen_bytes = 0;
  for (const auto& g : layout.groups)
    (g.frozen ? frozen_bytes : n) += size_t(g.frozen ? g.storage_bytes : g.numel);
  const size_t slots = in.workers == 1 ? 1 : size_t(h.pass_slots);
  // every product checked: a shape from user input must not wrap around to a small size
  const auto T = checked_bytes({size_t(in.micro.n_seq), size_t(in.micro.seq_len)});
  const auto act = T ? checked_bytes({*T, size_t(c.hidden_size), dt}) : std::nullopt;
  const auto per_slot =
      act ? checked_bytes({size_t(in.micro_batches), *act, size_t(layout.num_layers() + 1)}) : std::nullopt;
  const auto attn =
      T ? checked_bytes({slots, size_t(in.micro_batches), size_t(c.num_hidden_layers), *T,
                         size_t(c.num_attention_heads), size_t(c.head_dim) * dt + sizeof(float)})
        : std::nullopt;
  // (+4: weight prediction's last update, staleness 1 only: optimizer/weight_prediction.hpp)
  const size_t last_update = h.weight_prediction ? 4 : 0;
  const auto state = checked_bytes({n, 4 /*m*/ + 4 /*v*/ + dt + 4 /*grad*/ + last_update});
  const auto acts = per_slot ? checked_bytes({slots, *per_slot}) : std::nullopt;
  const auto weights = state ? checked_sum(*state, frozen_bytes) : std::nullopt;
  const auto base = weights && acts ? checked_sum(*weights, *acts) : std::nullopt;
  const auto with_attn = base && attn ? checked_sum(*base, *attn) : std::nullopt;
  const size_t avail = h.available_bytes;
  r.saved_attention =
      in.save_attention.value_or(with_attn && (avail == 0 || double(*with_attn) <= 0.9 * double(avail)));
  const auto need = r.saved_attention ? with_attn : base;
  if (!need || (avail > 0 && *need > avail))
    throw std::invalid_argument(fmt::format(
        "host memory: the session needs about {} (optimizer state, weights, gradients, {} of "
        "activations{}) but only {} are available; lower seq_len or the sequences of a pass "
        "(sequences_per_step / accumulation: raise accumulation){}{}",
        need ? byte_text(double(*need)) : std::string("more than 2^64 bytes"), counted(slots, "pass slot"),
        r.saved_attention ? ", saved attention outputs" : "", byte_text(double(avail)),
        slots > 1 ? ", run one worker (workers 1: the passes share one slot)" : "",
        r.saved_attention ? ", or set save_attention to false" : ""));
  r.host_bytes = *need;
}

// The CPU backend's virtual GPUs are host memory too: the plan's largest stage per worker.
void check_device_arenas(const RunPlanInputs& in, const HostBudget& h, RunPlan& r) {
  size_t per_worker = 0;
  for (const Stage& st : r.plan.stages)
    per_worker = std::max(
        per_worker, size_t(std::max<int64_t>(0, estimate_stage(r.analytic, st, r.partition).memory_bytes)));
  r.device_arena_bytes =
      std::min(per_worker, size_t(std::max<int64_t>(0, in.device_capacity))) * size_t(in.workers);
  const size_t avail = h.available_bytes;
  const auto total = checked_sum(r.host_bytes, r.device_arena_bytes);
  if (!total || (avail > 0 && *total > avail))
    throw std::invalid_argument(
        fmt::format("host memory: the session needs about {} ({} for optimizer state, weights, gradients and "
                    "activations, {} for {} virtual GPUs running plan {}) but only {} are available; lower "
                    "workers, micro_batches or the sequence length",
                    total ? byte_text(double(*total)) : std::string("more than 2^64 bytes"),
                    byte_text(double(r.host_bytes)), byte_text(double(r.device_arena_bytes)), in.workers,
                    r.plan.summary(), byte_text(double(avail))));
}

}  // namespace

RunPlan plan_run(const RunPlanInputs& in) {
  if (!in.layout) throw std::invalid_argument("plan_run: no model layout");
  if (in.workers < 1 || in.micro_batches < 1 || in.micro.n_seq < 1 || in.micro.seq_len < 1)
    throw std::invalid_argument(
        fmt::format("plan_run: expected a positive shape, got {} workers, {} micro-batches "
                    "of {} x {} tokens",
                    in.workers, in.micro_batches, in.micro.n_seq, in.micro.seq_len));
  const ModelLayout& layout = *in.layout;
  RunPlan r;
  if (in.host) plan_host_memory(in, *in.host, r);
  else r.saved_attention = in.save_attention.value_or(true);

  // The analytic costs (FLOPs and bytes per layer), until the profile has measured the real
  // ones (scheduler/replan.hpp).
  r.device = in.device;
  r.device.mlp_chunk_tokens = in.mlp_chunk_tokens;  // what the layers do, whatever the numbers
  r.device.saved_attention = r.saved_attention;
  lora_device_model(r.device, layout);  // adapter scratch, no base weight gradients
  r.analytic = layer_costs(
      estimate_layers(model_shape_from_config(layout.config), in.micro.n_seq, in.micro.seq_len, r.device));
  apply_frozen_groups(r.analytic, layout, in.compute,
                      r.device.grad_elem_bytes);  // storage uploads, no gradients
  r.costs = r.analytic;
  if (in.profile) {
    r.costs = in.profile->apply(r.analytic);
    apply_frozen_groups(r.costs, layout, in.compute, r.device.grad_elem_bytes);
  }

  r.partition.gpus = in.workers;
  r.partition.micro_batches = in.micro_batches;
  r.partition.memory_cap = in.device_capacity;
  r.partition.pcie_bandwidth = r.device.pcie_bandwidth;
  r.partition.alloc_granule = in.alloc_granule;
  if (in.plan) {
    r.plan = *in.plan;
  } else if (!in.uniform_fallback) {
    r.automatic = automatic_partition(r.costs, r.partition);
    r.plan = r.automatic->plan;
  } else {
    try {
      r.automatic = automatic_partition(r.costs, r.partition);
      r.plan = r.automatic->plan;
    } catch (const std::runtime_error& e) {
      r.plan = make_default_plan(layout.num_layers(), in.workers);
      r.log_line = fmt::format(
          "automatic plan: the analytic costs cannot be partitioned under the memory cap ({}); "
          "starting from the uniform plan {}",
          e.what(), r.plan.summary());
    }
  }
  validate_plan(r.plan, "plan");
  if (r.plan.num_layers != layout.num_layers())
    throw std::invalid_argument(
        fmt::format("plan has {} layers, the model has {}", r.plan.num_layers, layout.num_layers()));
  if (in.host && in.host->device_arenas_on_host) check_device_arenas(in, *in.host, r);
  return r;
}

}  // namespace rp
