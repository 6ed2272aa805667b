#include "roundpipe/session.hpp"

#include <algorithm>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/optimizer_shard.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/session_impl.hpp"
#include "actors/session_testing.hpp"
#include "actors/worker.hpp"
#include "base/counted.hpp"
#include "base/host_resources.hpp"
#include "model/fp8_linear.hpp"  // fp8_wgrad_reach
#include "scheduler/group_plan.hpp"
#include "scheduler/run_plan.hpp"

namespace rp {

namespace {

/// Testing only: failures injected into sessions built without SessionInternals (a Trainer's).
std::mutex g_faults_mu;
FaultInjection g_faults;

std::unique_ptr<Device> make_device(const std::string& backend, int i, const DeviceOptions& d) {
  if (backend == "cpu") return make_cpu_device(i, d);
  if (backend == "cuda") {
    int n = cuda_device_count();
    if (n == 0) throw DeviceError("backend 'cuda' was requested but no CUDA device is visible");
    return make_cuda_device(i % n, d);
  }
  throw std::invalid_argument("unknown backend '" + backend + "' (expected cpu, cuda or auto)");
}

/// The inputs of the session's run plan (scheduler/run_plan.hpp), host memory still unknown:
/// the analytic device numbers of its backend (or SessionInternals::device_model), the first
/// device's capacity and allocation granule, automatic plans falling back to the uniform plan.
RunPlanInputs session_plan_inputs(const ModelLayout& layout, const SessionOptions& opt,
                                  const SessionInternals& internals, const Device& dev) {
  RunPlanInputs in;
  in.layout = &layout;
  in.micro = opt.micro;
  in.micro_batches = opt.micro_batches;
  in.workers = opt.workers;
  in.compute = dev.compute_dtype();
  const DeviceOptions& d = opt.device;
  in.device = internals.device_model.value_or(backend_device_model(
      opt.backend, d.pcie_bytes_per_s, in.compute, d.fp8, d.fp8_weight_gradients, d.expert_gemm_bucketed));
  in.mlp_chunk_tokens = opt.mlp_chunk_tokens;
  in.device_capacity = int64_t(dev.capacity_bytes());
  in.alloc_granule = int64_t(dev.allocation_granule());
  in.plan = opt.plan;
  in.uniform_fallback = true;
  in.save_attention = opt.save_attention;
  in.host = HostBudget{opt.pass_slots, opt.async && opt.async_weight_prediction, 0, opt.backend == "cpu"};
  return in;
}

}  // namespace

ScopedFaultInjection::ScopedFaultInjection(FaultInjection f) {
  std::lock_guard lk(g_faults_mu);
  g_faults = std::move(f);
}
ScopedFaultInjection::~ScopedFaultInjection() {
  std::lock_guard lk(g_faults_mu);
  g_faults = FaultInjection{};
}

namespace {
SessionInternals default_internals() {
  SessionInternals in;
  std::lock_guard lk(g_faults_mu);
  in.faults = g_faults;
  return in;
}
}  // namespace

Session::Session(const ModelLayout& layout, std::vector<std::vector<float>> w, SessionOptions opt)
    : Session(layout, std::move(w), {}, std::move(opt), default_internals()) {}

Session::Session(const ModelLayout& layout, std::vector<std::vector<float>> w,
                 std::vector<std::vector<uint8_t>> frozen_storage, SessionOptions opt)
    : Session(layout, std::move(w), std::move(frozen_storage), std::move(opt), default_internals()) {}

Session::Session(const ModelLayout& layout, std::vector<std::vector<float>> w, SessionOptions opt,
                 const SessionInternals& internals)
    : Session(layout, std::move(w), {}, std::move(opt), internals) {}

namespace {

void check_options(const SessionOptions& opt) {
  if (opt.workers < 1) throw std::invalid_argument(fmt::format("workers must be >= 1, got {}", opt.workers));
  if (opt.micro_batches < 1)
    throw std::invalid_argument(fmt::format("micro_batches must be >= 1, got {}", opt.micro_batches));
  if (opt.micro.n_seq < 1 || opt.micro.seq_len < 2)
    throw std::invalid_argument("micro-batch shape must have n_seq >= 1 and seq_len >= 2");
  if (opt.pass_slots < 1) throw std::invalid_argument("pass_slots must be >= 1");
}

bool guarded_steps(const SessionOptions& opt) {
  return opt.max_grad_norm > 0 || opt.skip_nonfinite || opt.loss_scaling.has_value();
}

}  // namespace

// Construction steps of Session::Session, in order (actors/session_impl.hpp). Each reads what
// the earlier ones set and throws std::invalid_argument (one line) for what it refuses.

// One device per worker on the backend ("auto": CUDA when a device is visible), which
// opt.backend then names.
void Session::Impl::open_devices() {
  std::string& backend = opt.backend;
  if (backend == "auto") backend = cuda_device_count() > 0 ? "cuda" : "cpu";
  DeviceOptions dopt = opt.device;
  if (!opt.transfer_priorities) dopt.pcie_priorities = false;  // off means off on the emulated link too
  for (int i = 0; i < opt.workers; ++i) devices.push_back(make_device(backend, i, dopt));
}

// The run plan (scheduler/run_plan.hpp): saved attention and the host memory it needs
// (checked), the analytic costs, and the plan: explicit, or automatic from the analytic
// costs until the profile has measured the real ones (scheduler/replan.hpp).
RunPlan Session::Impl::plan_session(size_t held, const SessionInternals& internals,
                                    const std::function<void(const std::string&)>& log) {
  // what the caller hands over is in memory already: fp32 masters move in, frozen storage is
  // copied group by group and freed as it goes
  RunPlanInputs rin = session_plan_inputs(layout, opt, internals, *devices[0]);
  if (tier_place.saved_attention) rin.save_attention = tier_place.saved_attention;
  rin.host->available_bytes = host_available_bytes() > 0 ? host_available_bytes() + held : 0;
  // the plan counts frozen groups as resident: with the disk tier only its ring stays
  if (rin.host->available_bytes > 0)
    rin.host->available_bytes += frozen_tier_host_credit(layout, opt, tier_place.streamed);
  RunPlan run = plan_run(rin);
  if (!run.log_line.empty()) log(run.log_line);
  saved_attention = run.saved_attention;
  plan = run.plan;
  return run;
}

// The parameter store (frozen groups' fp32 values are freed as they are stored), the fp32
// masters, and one layer object per compute layer.
void Session::Impl::take_weights_and_layers(std::vector<std::vector<float>> w,
                                            std::vector<std::vector<uint8_t>>& frozen_storage) {
  tier_place.from_source = groups_from_source(layout, w, frozen_storage, opt.frozen_source.has_value());
  store = std::make_unique<ParamStore>(layout, devices[0]->compute_dtype(), /*allocate_frozen=*/false);
  fill_store(layout, w, frozen_storage, *store, opt.frozen_source ? &*opt.frozen_source : nullptr,
             tier_place.streamed);
  master = std::move(w);
  adam.resize(master.size());
  LayerOptions lo;
  lo.mlp_chunk_tokens = opt.mlp_chunk_tokens;
  lo.save_attention = saved_attention;
  lo.fp8 = opt.device.fp8;
  lo.fp8_weight_gradients = opt.device.fp8_weight_gradients;
  lo.fp8_stored_direct = opt.device.fp8_stored_direct, lo.expert_padded = opt.device.expert_gemm_bucketed;
  for (int l = 0; l < layout.num_layers(); ++l) layers.push_back(make_layer(layout, l, lo));
}

void Session::Impl::start_tracer() {
  if (!opt.trace) return;
  tracer = std::make_unique<Tracer>();
  tracer->set_info("backend", opt.backend);
  tracer->set_info("workers", std::to_string(opt.workers));
  tracer->set_info("micro_batches", std::to_string(opt.micro_batches));
  tracer->set_info("transfer_priorities", opt.transfer_priorities ? "on" : "off");
  tracer->set_info("transfer_chunk_bytes", std::to_string(opt.transfer_chunk_bytes));
  tracer->enable_messages(opt.trace_messages);
  if (opt.trace_messages) tracer->set_info("messages", "on");
  if (opt.backend == "cpu" && opt.device.pcie_bytes_per_s > 0)
    tracer->set_info("pcie_bytes_per_s", fmt::format("{}", opt.device.pcie_bytes_per_s));
}

void Session::Impl::start_actor_system() {
  cfg = std::make_unique<caf::actor_system_config>();
  register_protocol(*cfg);
  sys = std::make_unique<caf::actor_system>(*cfg);
}

void Session::Impl::make_loss_scaler(const SessionInternals& internals) {
  if (!opt.loss_scaling) return;
  const DType dt = devices[0]->compute_dtype();
  if (dt != DType::f16 && !internals.allow_loss_scaling_any_dtype)
    throw std::invalid_argument(
        fmt::format("loss_scaling needs the f16 compute dtype, the {} backend computes in {} "
                    "(bf16 and f32 do not need it)",
                    opt.backend, dtype_name(dt)));
  scaler = std::make_unique<LossScaler>(*opt.loss_scaling);
}

// The re-planner: the analytic costs and partition options of the run plan, until the
// profile settles.
std::shared_ptr<Replanner> Session::Impl::make_replanner(const RunPlan& run,
                                                         const SessionInternals& internals) const {
  SimOptions sim;
  sim.bandwidth = StreamBandwidths::uniform(run.device.pcie_bandwidth);
  sim.staleness = opt.async ? 1 : 0;
  sim.passes_in_flight = opt.pass_slots;
  sim.weight_buffers = run.partition.weight_buffers;
  ReplanOptions ro;
  ro.automatic = !opt.plan && opt.profiling.replan && opt.profiling.enabled;
  ro.settle_rel_tol = opt.profiling.settle_rel_tol;
  ro.settle_min_samples = opt.profiling.settle_min_samples;
  ro.settle_max_samples = opt.profiling.settle_max_samples;
  ro.min_gain = opt.profiling.min_gain;
  Profile prof(layout.num_layers(), opt.micro.n_seq, opt.micro.seq_len);
  prof.device = devices[0]->name();
  // what the decoder layers run (LayerOptions): FP8 weight gradients only in full fine-tuning and
  // where some linear's input width allows them
  const bool fp8_wgrad = opt.device.fp8 && opt.device.fp8_weight_gradients && !layout.lora &&
                         fp8_wgrad_reach(layout.config).fp8_wgrad > 0;
  prof.linear_compute = linear_compute_name(opt.device.fp8, fp8_wgrad);
  auto r = std::make_shared<Replanner>(std::move(prof), run.analytic, run.partition, sim, ro);
  r->set_planner(internals.planner);
  return r;
}

SchedulerConfig Session::Impl::scheduler_config(const RunPlan& run, const SessionInternals& internals,
                                                const std::function<void(const std::string&)>& log) {
  SchedulerConfig sc;
  sc.plan = plan;
  sc.num_groups = int(layout.groups.size());
  sc.frozen = store->frozen;
  sc.guard = guarded_steps(opt);
  sc.max_grad_norm = opt.max_grad_norm;
  sc.loss_scaler = scaler.get();
  sc.layout = &layout;
  sc.replanner = make_replanner(run, internals);
  sc.on_new_host_buffer = [impl = this](HostBytes& b) { impl->pin(b); };
  sc.log = log;
  sc.staleness = opt.async ? 1 : 0;
  if (!(opt.watchdog_s >= 0))
    throw std::invalid_argument(fmt::format("watchdog_s must be >= 0 (0: off), got {}", opt.watchdog_s));
  sc.watchdog_s = opt.watchdog_s;
  sc.warn = opt.watchdog_log;
  if (!sc.warn) sc.warn = [](const std::string& line) { spdlog::warn("{}", line); };
  sc.progress = &progress;
  sc.faults = internals.faults;
  sc.tracer = tracer.get();
  for (int i = 0; i < opt.pass_slots; ++i)  // one worker runs stages in dealt order: passes share activations
    sc.pass_slots.push_back(std::make_shared<PassBuffers>(
        layout, plan, opt.micro_batches, opt.micro, devices[0]->compute_dtype(),
        opt.workers == 1 && i > 0 ? sc.pass_slots[0]->activations : nullptr, saved_attention, spill_mask));
  for (int i = 0; i < opt.pass_slots; ++i)
    sc.pass_slots[size_t(i)]->activations->spill_set = opt.workers == 1 ? 0 : i;
  return sc;
}

// Pin the host buffers the copy streams touch (no-op on the CPU backend) within the pin
// budget, those copied most often first: every pass's buffers, the gradient slots, the
// trainable weights, then the frozen weights. The rest stays pageable.
void Session::Impl::pin_host_buffers(const std::vector<std::shared_ptr<PassBuffers>>& pass_slots,
                                     const std::function<void(const std::string&)>& log) {
  pins.budget = opt.pin_budget_bytes ? *opt.pin_budget_bytes : host_total_bytes() / 4 * 3;
  for (auto& pb : pass_slots) {
    for (auto* v : {&pb->ids, &pb->targets, &pb->positions})
      for (auto& b : *v) pin(b);
    for (auto* vv : {&pb->x, &pb->dx, &pb->activations->attn_o, &pb->activations->attn_lse})
      for (auto& v : *vv)
        for (auto& b : v) pin(b);
  }
  for (auto& b : store->grad)
    if (b.data()) pin(b);  // frozen groups have no gradient slot
  for (bool frozen : {false, true})
    for (size_t g = 0; g < store->lowp.size(); ++g)
      if (bool(store->frozen[g]) == frozen) pin(store->lowp[g], frozen);
  if (pins.pageable_bytes > 0 && opt.backend != "cpu")  // the CPU backend's copies are the same either way
    log(fmt::format(
        "host memory: {} pinned for fast copies, {} left pageable ({} of it frozen weights) by the "
        "pin budget of {} (pin_budget_gib); copies from pageable memory are slower",
        byte_text(double(pins.pinned_bytes)), byte_text(double(pins.pageable_bytes)),
        byte_text(double(pins.pageable_frozen_bytes)), byte_text(double(pins.budget))));
}

// Optimizer shards own disjoint groups (assign_shards: balanced by bytes, a group of a
// shard's share or more alone). Returns each group's shard (frozen groups: -1, no shard).
std::vector<int> Session::Impl::spawn_shards(const SessionInternals& internals) {
  std::vector<int> up, gr;
  count_per_pass(layout, plan, up, gr);
  int nsh = opt.shards;
  if (nsh <= 0) nsh = std::clamp(int(std::thread::hardware_concurrency() / 2), 1, 4);
  const int trainable = int(std::count(store->frozen.begin(), store->frozen.end(), 0));
  nsh = std::clamp<int>(nsh, 1, std::max(trainable, 1));
  const std::vector<int> shard_of = assign_shards(layout, nsh);
  std::vector<std::vector<ShardGroup>> owned(nsh);
  for (size_t g = 0; g < layout.groups.size(); ++g)
    if (shard_of[g] >= 0)
      owned[size_t(shard_of[g])].push_back(ShardGroup{int(g), &master[g], &adam[g], up[g], gr[g]});
  // Optimizer threads (default: half the allowed cores) split over the shards, each shard's
  // pool pinned to neighbouring cores of one NUMA node where possible.
  const int total_threads =
      opt.optimizer_threads > 0 ? opt.optimizer_threads : std::max(nsh, int(allowed_cpus().size()) / 2);
  const auto cpu_lists = cpus_for_pools(nsh, total_threads);
  for (int s = 0; s < nsh; ++s) {
    ShardOptions so{opt.async ? 1 : 0, opt.adam};
    so.threads = int(cpu_lists[size_t(s)].size());
    if (opt.pin_optimizer_threads) so.cpus = cpu_lists[size_t(s)];
    so.guard = guarded_steps(opt);
    so.predict_weights = opt.async_weight_prediction;
    so.index = s;
    so.progress = &progress;
    so.faults = internals.faults;
    so.tracer = tracer.get();
    so.replicas = opt.replicas;
    if (opt.replicas && opt.replicas->size() > 1) {
      so.reduce_wait = &reduce_wait;
      so.sums_in_flight = sums_in_flight;
    }
    shards.push_back(spawn_optimizer_shard(*sys, std::move(owned[s]), store.get(), so, scheduler));
  }
  return shard_of;
}

void Session::Impl::spawn_workers(const std::vector<int>& shard_of, const SessionInternals& internals) {
  for (int i = 0; i < opt.workers; ++i) {
    WorkerContext ctx;
    ctx.index = i;
    ctx.device = devices[i].get();
    ctx.layout = &layout;
    ctx.layers = &layers;
    ctx.store = store.get();
    for (size_t g = 0; g < layout.groups.size(); ++g)  // frozen groups: none (never requested)
      ctx.shard_of_group.push_back(shard_of[g] >= 0 ? shards[size_t(shard_of[g])] : ShardActor{});
    ctx.scheduler = scheduler;
    ctx.tracer = tracer.get();
    ctx.profile = opt.profiling.enabled;
    ctx.saved_attention = saved_attention;
    ctx.early_gradients = opt.early_gradients;
    ctx.capacity_origin = opt.capacity_origin;
    ctx.late_grads_final = internals.late_grads_final;
    ctx.transfer.priorities = opt.transfer_priorities;
    ctx.transfer.chunk_bytes = opt.transfer_chunk_bytes;
    ctx.transfer.bulk_inflight = opt.transfer_bulk_inflight;
    ctx.memory_events = &memory_events;
    ctx.progress = &progress;
    ctx.faults = internals.faults;
    ctx.frozen_tier = frozen_tier.get();
    ctx.spill = spill.get();
    workers.push_back(spawn_worker(*sys, std::move(ctx)));
  }
}

Session::Session(const ModelLayout& layout, std::vector<std::vector<float>> w,
                 std::vector<std::vector<uint8_t>> frozen_storage, SessionOptions opt,
                 const SessionInternals& internals)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.layout = layout;
  I.opt = std::move(opt);
  check_options(I.opt);
  check_frozen_source(I.opt.frozen_source);
  check_session_weights(layout, w, frozen_storage, I.opt.frozen_source.has_value());
  I.open_devices();
  std::function<void(const std::string&)> log = I.opt.profiling.log;
  if (!log) log = [](const std::string& line) { spdlog::info("{}", line); };
  const size_t held = held_weight_bytes(layout, w, frozen_storage);
  I.place_frozen_tier(held, internals, log);
  const RunPlan run = [&] {
    try {
      return I.plan_session(held, internals, log);
    } catch (...) {
      I.log_budget_line(0, log);  // the budget's line still explains a refused plan
      throw;
    }
  }();
  I.log_budget_line(run.device_arena_bytes, log);
  I.open_activation_spill(internals, log);
  I.take_weights_and_layers(std::move(w), frozen_storage);
  I.open_frozen_tier(internals, log);
  I.start_tracer();
  I.start_actor_system();
  I.make_loss_scaler(internals);
  SchedulerConfig sc = I.scheduler_config(run, internals, log);
  I.pin_host_buffers(sc.pass_slots, log);
  I.slots = sc.pass_slots;
  I.scheduler = spawn_scheduler(*I.sys, std::move(sc));
  const std::vector<int> shard_of = I.spawn_shards(internals);
  I.spawn_workers(shard_of, internals);
  caf::anon_send(I.scheduler, SetPeers{I.workers, I.shards});
}

Session::~Session() = default;

}  // namespace rp
