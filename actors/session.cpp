#include "roundpipe/session.hpp"

#include <algorithm>
#include <numeric>
#include <cstdio>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/optimizer_shard.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/session_impl.hpp"
#include "actors/session_testing.hpp"
#include "actors/worker.hpp"
#include "base/checked_math.hpp"
#include "base/host_resources.hpp"
#include "scheduler/group_plan.hpp"

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

/// Device numbers of the analytic estimate for `backend` (SessionInternals::device_model).
DeviceModel default_device_model(const std::string& backend, const DeviceOptions& d, DType dt,
                                 int64_t mlp_chunk_tokens, bool saved_attention) {
  DeviceModel m;  // CUDA: the H200-like defaults of scheduler/cost_model.hpp
  if (backend == "cpu") {
    m.peak_flops = 50e9;  // a few cores of Eigen fp32 GEMM
    m.attention_efficiency = 0.3;
    m.mem_bandwidth = 10e9;
    m.pcie_bandwidth = d.pcie_bytes_per_s;  // 0: unthrottled copies, transfers free
  }
  m.elem_bytes = int64_t(dtype_size(dt));
  m.scratch_elem_bytes = int64_t(dtype_size(dt));
  m.mlp_chunk_tokens = mlp_chunk_tokens;
  m.saved_attention = saved_attention;
  return m;
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

Session::Session(const ModelLayout& layout, std::vector<std::vector<float>> w,
                 std::vector<std::vector<uint8_t>> frozen_storage, SessionOptions opt,
                 const SessionInternals& internals)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.layout = layout;
  I.opt = opt;
  if (opt.workers < 1) throw std::invalid_argument(fmt::format("workers must be >= 1, got {}", opt.workers));
  if (opt.micro_batches < 1)
    throw std::invalid_argument(fmt::format("micro_batches must be >= 1, got {}", opt.micro_batches));
  if (opt.micro.n_seq < 1 || opt.micro.seq_len < 2)
    throw std::invalid_argument("micro-batch shape must have n_seq >= 1 and seq_len >= 2");
  if (opt.pass_slots < 1) throw std::invalid_argument("pass_slots must be >= 1");
  check_session_weights(layout, w, frozen_storage);
  std::string backend = opt.backend;
  if (backend == "auto") backend = cuda_device_count() > 0 ? "cuda" : "cpu";
  I.opt.backend = backend;
  DeviceOptions dopt = opt.device;
  if (!opt.transfer_priorities) dopt.pcie_priorities = false;  // off means off on the emulated link too
  for (int i = 0; i < opt.workers; ++i) I.devices.push_back(make_device(backend, i, dopt));
  const DType dt = I.devices[0]->compute_dtype();

  // Host memory: optimizer state + low-precision copy + gradient slots + pass slots (one
  // worker: shared, PassBuffers), and the decoders' saved attention when it is on (automatic:
  // on when everything fits 90% of the available memory).
  bool saved_attention = false;
  size_t host_need = 0;  // bytes, before the CPU backend's virtual GPUs (checked with the plan below)
  size_t held = 0;       // of them, bytes the caller's weights already occupy
  {
    const auto& c = layout.config;
    // trainable groups: master, moments, low-precision copy, gradient slot; frozen: storage only
    size_t n = 0, frozen_bytes = 0;
    for (const auto& g : layout.groups) (g.frozen ? frozen_bytes : n) += size_t(g.frozen ? g.storage_bytes : g.numel);
    const size_t slots = opt.workers == 1 ? 1 : size_t(opt.pass_slots);
    // every product checked: a shape from user input must not wrap around to a small size
    const auto T = checked_bytes({size_t(opt.micro.n_seq), size_t(opt.micro.seq_len)});
    const auto act = T ? checked_bytes({*T, size_t(c.hidden_size), dtype_size(dt)}) : std::nullopt;
    const auto per_slot =
        act ? checked_bytes({size_t(opt.micro_batches), *act, size_t(2 * layout.num_layers())}) : std::nullopt;
    const auto attn = T ? checked_bytes({slots, size_t(opt.micro_batches), size_t(c.num_hidden_layers), *T,
                                         size_t(c.num_attention_heads),
                                         size_t(c.head_dim) * dtype_size(dt) + sizeof(float)})
                        : std::nullopt;
    // (+4: weight prediction's last update, staleness 1 only: optimizer/weight_prediction.hpp)
    const size_t last_update = opt.async && opt.async_weight_prediction ? 4 : 0;
    const auto state = checked_bytes({n, 4 /*m*/ + 4 /*v*/ + dtype_size(dt) + 4 /*grad*/ + last_update});
    const auto acts = per_slot ? checked_bytes({slots, *per_slot}) : std::nullopt;
    const auto weights = state ? checked_sum(*state, frozen_bytes) : std::nullopt;
    const auto base = weights && acts ? checked_sum(*weights, *acts) : std::nullopt;
    const auto with_attn = base && attn ? checked_sum(*base, *attn) : std::nullopt;
    // what the caller hands over is in memory already: fp32 masters move in, frozen storage is
    // copied group by group and freed as it goes
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      if (!frozen_storage.empty()) held += frozen_storage[g].size();
      if (!layout.groups[g].frozen && g < w.size()) held += w[g].size() * sizeof(float);
    }
    const size_t avail = host_available_bytes() > 0 ? host_available_bytes() + held : 0;
    saved_attention =
        opt.save_attention.value_or(with_attn && (avail == 0 || double(*with_attn) <= 0.9 * double(avail)));
    const auto need = saved_attention ? with_attn : base;
    if (!need || (avail > 0 && *need > avail))
      throw std::invalid_argument(fmt::format(
          "host memory: the session needs about {} (optimizer state, weights, gradients, {} pass slot(s) of "
          "activations{}) but only {} are available; lower seq_len or the sequences of a pass "
          "(sequences_per_step / accumulation: raise accumulation){}{}",
          need ? byte_text(double(*need)) : std::string("more than 2^64 bytes"), slots,
          saved_attention ? ", saved attention outputs" : "", byte_text(double(avail)),
          slots > 1 ? ", run one worker (workers 1: the passes share one slot)" : "",
          saved_attention ? ", or set save_attention to false" : ""));
    host_need = *need;
  }
  I.saved_attention = saved_attention;

  // The plan: explicit, or automatic from the analytic costs (FLOPs and bytes per layer) until
  // the profile has measured the real ones (scheduler/replan.hpp).
  std::function<void(const std::string&)> log = opt.profiling.log;
  if (!log) log = [](const std::string& line) { spdlog::info("{}", line); };
  DeviceModel dm = internals.device_model.value_or(
      default_device_model(backend, opt.device, dt, opt.mlp_chunk_tokens, saved_attention));
  dm.mlp_chunk_tokens = opt.mlp_chunk_tokens;  // what the layers do, whatever the numbers
  dm.saved_attention = saved_attention;
  lora_device_model(dm, layout);  // adapter scratch, no base weight gradients
  std::vector<LayerCost> analytic =
      layer_costs(estimate_layers(model_shape_from_config(layout.config), opt.micro.n_seq, opt.micro.seq_len, dm));
  apply_frozen_groups(analytic, layout, dt, dm.grad_elem_bytes);  // storage uploads, no gradients
  PartitionOptions po;
  po.gpus = opt.workers;
  po.micro_batches = opt.micro_batches;
  po.memory_cap = int64_t(I.devices[0]->capacity_bytes());
  po.pcie_bandwidth = dm.pcie_bandwidth;
  po.alloc_granule = int64_t(I.devices[0]->allocation_granule());
  if (opt.plan) {
    I.plan = *opt.plan;
  } else {
    try {
      I.plan = automatic_partition(analytic, po).plan;
    } catch (const std::runtime_error& e) {
      I.plan = make_default_plan(layout.num_layers(), opt.workers);
      log(fmt::format("automatic plan: the analytic costs cannot be partitioned under the memory cap ({}); "
                      "starting from the uniform plan {}",
                      e.what(), I.plan.summary()));
    }
  }
  validate_plan(I.plan, "plan");
  if (I.plan.num_layers != layout.num_layers())
    throw std::invalid_argument(fmt::format("plan has {} layers, the model has {}", I.plan.num_layers,
                                            layout.num_layers()));
  if (backend == "cpu") {
    // the CPU backend's virtual GPUs are host memory too: the plan's largest stage per worker
    size_t per_worker = 0;
    for (const Stage& st : I.plan.stages)
      per_worker =
          std::max(per_worker, size_t(std::max<int64_t>(0, estimate_stage(analytic, st, po).memory_bytes)));
    const size_t arenas = std::min(per_worker, I.devices[0]->capacity_bytes()) * size_t(opt.workers);
    const size_t avail = host_available_bytes() > 0 ? host_available_bytes() + held : 0;
    const auto total = checked_sum(host_need, arenas);
    if (!total || (avail > 0 && *total > avail))
      throw std::invalid_argument(fmt::format(
          "host memory: the session needs about {} ({} for optimizer state, weights, gradients and "
          "activations, {} for {} virtual GPUs running plan {}) but only {} are available; lower "
          "workers, micro_batches or the sequence length",
          total ? byte_text(double(*total)) : std::string("more than 2^64 bytes"),
          byte_text(double(host_need)), byte_text(double(arenas)), opt.workers, I.plan.summary(),
          byte_text(double(avail))));
  }
  I.store = std::make_unique<ParamStore>(layout, dt, /*allocate_frozen=*/false);
  fill_store(layout, w, frozen_storage, *I.store);  // frozen groups' fp32 values are freed here
  I.master = std::move(w);
  I.adam.resize(I.master.size());
  LayerOptions lo;
  lo.mlp_chunk_tokens = opt.mlp_chunk_tokens;
  lo.save_attention = saved_attention;
  lo.fp8 = opt.device.fp8;
  for (int l = 0; l < layout.num_layers(); ++l) I.layers.push_back(make_layer(I.layout, l, lo));
  if (opt.trace) {
    I.tracer = std::make_unique<Tracer>();
    I.tracer->set_info("backend", backend);
    I.tracer->set_info("workers", std::to_string(opt.workers));
    I.tracer->set_info("micro_batches", std::to_string(opt.micro_batches));
    I.tracer->set_info("transfer_priorities", opt.transfer_priorities ? "on" : "off");
    I.tracer->set_info("transfer_chunk_bytes", std::to_string(opt.transfer_chunk_bytes));
    I.tracer->enable_messages(opt.trace_messages);
    if (opt.trace_messages) I.tracer->set_info("messages", "on");
    if (backend == "cpu" && dopt.pcie_bytes_per_s > 0)
      I.tracer->set_info("pcie_bytes_per_s", fmt::format("{}", dopt.pcie_bytes_per_s));
  }

  I.cfg = std::make_unique<caf::actor_system_config>();
  register_protocol(*I.cfg);
  I.sys = std::make_unique<caf::actor_system>(*I.cfg);

  if (opt.loss_scaling) {
    if (dt != DType::f16 && !internals.allow_loss_scaling_any_dtype)
      throw std::invalid_argument(fmt::format("loss_scaling needs the f16 compute dtype, the {} backend computes in {} "
                                              "(bf16 and f32 do not need it)",
                                              backend, dtype_name(dt)));
    I.scaler = std::make_unique<LossScaler>(*opt.loss_scaling);
  }
  const bool guard = opt.max_grad_norm > 0 || opt.skip_nonfinite || opt.loss_scaling.has_value();
  SchedulerConfig sc;
  sc.plan = I.plan;
  sc.num_groups = int(layout.groups.size());
  sc.frozen = I.store->frozen;
  sc.guard = guard;
  sc.max_grad_norm = opt.max_grad_norm;
  sc.loss_scaler = I.scaler.get();
  sc.layout = &I.layout;
  {
    SimOptions sim;
    sim.bandwidth = StreamBandwidths::uniform(dm.pcie_bandwidth);
    sim.staleness = opt.async ? 1 : 0;
    sim.passes_in_flight = opt.pass_slots;
    sim.weight_buffers = po.weight_buffers;
    ReplanOptions ro;
    ro.automatic = !opt.plan && opt.profiling.replan && opt.profiling.enabled;
    ro.settle_rel_tol = opt.profiling.settle_rel_tol;
    ro.settle_min_samples = opt.profiling.settle_min_samples;
    ro.settle_max_samples = opt.profiling.settle_max_samples;
    ro.min_gain = opt.profiling.min_gain;
    Profile prof(layout.num_layers(), opt.micro.n_seq, opt.micro.seq_len);
    prof.device = I.devices[0]->name();
    sc.replanner = std::make_shared<Replanner>(std::move(prof), analytic, po, sim, ro);
    sc.replanner->set_planner(internals.planner);
  }
  sc.on_new_host_buffer = [impl = &I](HostBytes& b) { impl->pin(b); };
  sc.log = log;
  sc.staleness = opt.async ? 1 : 0;
  if (!(opt.watchdog_s >= 0))
    throw std::invalid_argument(fmt::format("watchdog_s must be >= 0 (0: off), got {}", opt.watchdog_s));
  sc.watchdog_s = opt.watchdog_s;
  sc.warn = opt.watchdog_log;
  if (!sc.warn) sc.warn = [](const std::string& line) { spdlog::warn("{}", line); };
  sc.progress = &I.progress;
  sc.faults = internals.faults;
  sc.tracer = I.tracer.get();
  for (int i = 0; i < opt.pass_slots; ++i)  // one worker runs stages in dealt order: passes share activations
    sc.pass_slots.push_back(std::make_shared<PassBuffers>(
        layout, I.plan, opt.micro_batches, opt.micro, dt,
        opt.workers == 1 && i > 0 ? sc.pass_slots[0]->activations : nullptr, saved_attention));
  // Pin the host buffers the copy streams touch (no-op on the CPU backend) within the pin
  // budget, those copied most often first: every pass's buffers, the gradient slots, the
  // trainable weights, then the frozen weights. The rest stays pageable.
  I.pins.budget = opt.pin_budget_bytes ? *opt.pin_budget_bytes : host_total_bytes() / 4 * 3;
  for (auto& pb : sc.pass_slots) {
    for (auto* v : {&pb->ids, &pb->targets, &pb->positions})
      for (auto& b : *v) I.pin(b);
    for (auto* vv : {&pb->x, &pb->dx, &pb->activations->attn_o, &pb->activations->attn_lse})
      for (auto& v : *vv)
        for (auto& b : v) I.pin(b);
  }
  for (auto& b : I.store->grad)
    if (b.data()) I.pin(b);  // frozen groups have no gradient slot
  for (bool frozen : {false, true})
    for (size_t g = 0; g < I.store->lowp.size(); ++g)
      if (bool(I.store->frozen[g]) == frozen) I.pin(I.store->lowp[g], frozen);
  if (I.pins.pageable_bytes > 0 && backend != "cpu")  // the CPU backend's copies are the same either way
    log(fmt::format("host memory: {} pinned for fast copies, {} left pageable ({} of it frozen weights) by the "
                    "pin budget of {} (pin_budget_gib); copies from pageable memory are slower",
                    byte_text(double(I.pins.pinned_bytes)), byte_text(double(I.pins.pageable_bytes)),
                    byte_text(double(I.pins.pageable_frozen_bytes)), byte_text(double(I.pins.budget))));
  I.slots = sc.pass_slots;
  I.scheduler = spawn_scheduler(*I.sys, std::move(sc));

  // Optimizer shards own disjoint groups (assign_shards: balanced by bytes, a group of a
  // shard's share or more alone).
  std::vector<int> up, gr;
  count_per_pass(layout, I.plan, up, gr);
  int nsh = opt.shards;
  if (nsh <= 0) nsh = std::clamp(int(std::thread::hardware_concurrency() / 2), 1, 4);
  const int trainable = int(std::count(I.store->frozen.begin(), I.store->frozen.end(), 0));
  nsh = std::clamp<int>(nsh, 1, std::max(trainable, 1));
  const std::vector<int> shard_of = assign_shards(layout, nsh);  // frozen groups: -1, no shard
  std::vector<std::vector<ShardGroup>> owned(nsh);
  for (size_t g = 0; g < layout.groups.size(); ++g)
    if (shard_of[g] >= 0)
      owned[size_t(shard_of[g])].push_back(ShardGroup{int(g), &I.master[g], &I.adam[g], up[g], gr[g]});
  // Optimizer threads (default: half the allowed cores) split over the shards, each shard's
  // pool pinned to neighbouring cores of one NUMA node where possible.
  const int total_threads = opt.optimizer_threads > 0
                                ? opt.optimizer_threads
                                : std::max(nsh, int(allowed_cpus().size()) / 2);
  const auto cpu_lists = cpus_for_pools(nsh, total_threads);
  std::vector<ShardActor> shards;
  for (int s = 0; s < nsh; ++s) {
    ShardOptions so{opt.async ? 1 : 0, opt.adam};
    so.threads = int(cpu_lists[size_t(s)].size());
    if (opt.pin_optimizer_threads) so.cpus = cpu_lists[size_t(s)];
    so.guard = guard;
    so.predict_weights = opt.async_weight_prediction;
    so.index = s;
    so.progress = &I.progress;
    so.faults = internals.faults;
    so.tracer = I.tracer.get();
    so.replicas = opt.replicas;
    if (opt.replicas && opt.replicas->size() > 1) {
      so.reduce_wait = &I.reduce_wait;
      so.sums_in_flight = I.sums_in_flight;
    }
    shards.push_back(spawn_optimizer_shard(*I.sys, std::move(owned[s]), I.store.get(), so, I.scheduler));
  }
  std::vector<WorkerActor> workers;
  for (int i = 0; i < opt.workers; ++i) {
    WorkerContext ctx;
    ctx.index = i;
    ctx.device = I.devices[i].get();
    ctx.layout = &I.layout;
    ctx.layers = &I.layers;
    ctx.store = I.store.get();
    for (size_t g = 0; g < layout.groups.size(); ++g)  // frozen groups: none (never requested)
      ctx.shard_of_group.push_back(shard_of[g] >= 0 ? shards[size_t(shard_of[g])] : ShardActor{});
    ctx.scheduler = I.scheduler;
    ctx.tracer = I.tracer.get();
    ctx.profile = opt.profiling.enabled;
    ctx.saved_attention = saved_attention;
    ctx.transfer.priorities = opt.transfer_priorities;
    ctx.transfer.chunk_bytes = opt.transfer_chunk_bytes;
    ctx.transfer.bulk_inflight = opt.transfer_bulk_inflight;
    ctx.memory_events = &I.memory_events;
    ctx.progress = &I.progress;
    ctx.faults = internals.faults;
    workers.push_back(spawn_worker(*I.sys, std::move(ctx)));
  }
  I.shards = shards;
  I.workers = workers;
  caf::anon_send(I.scheduler, SetPeers{workers, shards});
}

Session::~Session() = default;

void Session::forward_backward(const std::vector<int32_t>& ids, const std::vector<int32_t>& targets) {
  impl_->submit("forward_backward", ids, targets, nullptr, -1);
}

void Session::forward_backward(const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                               const std::vector<int32_t>& positions) {
  impl_->submit("forward_backward", ids, targets, &positions, -1);
}

int64_t Session::evaluate(const std::vector<int32_t>& ids, const std::vector<int32_t>& targets) {
  const int64_t id = impl_->next_eval;
  impl_->submit("evaluate", ids, targets, nullptr, id);
  return id;
}

int64_t Session::evaluate(const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                          const std::vector<int32_t>& positions) {
  const int64_t id = impl_->next_eval;
  impl_->submit("evaluate", ids, targets, &positions, id);
  return id;
}

EvalResult Session::wait_eval(int64_t id) { return *impl_->wait_eval(id, -1); }

std::optional<EvalResult> Session::wait_eval_for(int64_t id, double seconds) {
  if (!(seconds >= 0))
    throw std::invalid_argument(fmt::format("wait_eval_for: seconds must be >= 0, got {}", seconds));
  return impl_->wait_eval(id, seconds);
}

std::optional<EvalResult> Session::Impl::wait_eval(int64_t id, double seconds) const {
  if (id < 0 || id >= next_eval)
    throw std::invalid_argument(fmt::format("wait_eval({}): no such evaluation (ids 0..{} were given)", id,
                                            next_eval - 1));
  std::optional<EvalResult> out = await_answer<EvalResult>(WaitEval{id}, seconds);
  if (out && !out->error.empty()) throw RuntimeFailure(out->error);
  return out;
}

void Session::Impl::submit(const char* call, const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                           const std::vector<int32_t>* positions, int64_t eval) {
  Impl& I = *this;
  I.check_usable(call);
  const size_t n = size_t(I.opt.micro_batches * I.opt.micro.tokens());
  if (ids.size() != n || targets.size() != n)
    throw std::invalid_argument(fmt::format(
        "{}: expected {} ids and targets (micro_batches {} x n_seq {} x seq_len {}), got {} and {}", call, n, I.opt.micro_batches, I.opt.micro.n_seq, I.opt.micro.seq_len, ids.size(), targets.size()));
  const int64_t V = I.layout.config.vocab_size;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= V)
      throw std::invalid_argument(fmt::format("{}: token id {} at position {} is outside [0, {})", call, ids[i], i, V));
    if (targets[i] >= V)
      throw std::invalid_argument(fmt::format("{}: target {} at position {} is outside [0, {})", call, targets[i], i, V));
  }
  SubmitPass sp;
  sp.step = I.current_step;
  sp.ids = std::make_shared<const std::vector<int32_t>>(ids);
  sp.targets = std::make_shared<const std::vector<int32_t>>(targets);
  if (positions) {
    if (positions->size() != n)
      throw std::invalid_argument(fmt::format("{}: expected {} positions, got {}", call, n, positions->size()));
    const size_t L = size_t(I.opt.micro.seq_len);
    for (size_t i = 0; i < n; ++i)
      if ((*positions)[i] < 0 || size_t((*positions)[i]) > i % L)
        throw std::invalid_argument(fmt::format(
            "{}: position {} at token {} of its sequence (expected 0 <= position <= the token's index)", call,
            (*positions)[i], i % L));
    sp.positions = std::make_shared<const std::vector<int32_t>>(*positions);
  }
  sp.eval = eval;
  caf::anon_send(I.scheduler, std::move(sp));
  if (eval >= 0) I.next_eval++;
  else I.passes_in_step++;
}

int64_t Session::step(double lr) {
  Impl& I = *impl_;
  I.check_usable("step");
  if (I.passes_in_step == 0) throw std::logic_error("step() called without a forward_backward() pass in this step");
  caf::anon_send(I.scheduler, CloseStepRequest{I.current_step, lr});
  I.passes_in_step = 0;
  return I.current_step++;
}

int64_t Session::step(double lr, int64_t target_tokens) {
  Impl& I = *impl_;
  I.check_usable("step");
  if (I.passes_in_step == 0) throw std::logic_error("step() called without a forward_backward() pass in this step");
  if (target_tokens < 0)
    throw std::invalid_argument(fmt::format("step: target_tokens must be >= 0, got {}", target_tokens));
  caf::anon_send(I.scheduler, CloseStepRequest{I.current_step, lr, double(target_tokens)});
  I.passes_in_step = 0;
  return I.current_step++;
}

StepResult Session::wait(int64_t t) {
  StepResult r = *impl_->wait_step(t, -1);
  impl_->waited_through = std::max(impl_->waited_through, t);
  r.reduce_wait_s = impl_->reduce_wait.seconds(t);
  return r;
}

std::optional<StepResult> Session::wait_for(int64_t t, double seconds) {
  if (!(seconds >= 0))
    throw std::invalid_argument(fmt::format("wait_for: seconds must be >= 0, got {}", seconds));
  std::optional<StepResult> r = impl_->wait_step(t, seconds);
  if (r) impl_->waited_through = std::max(impl_->waited_through, t);
  if (r) r->reduce_wait_s = impl_->reduce_wait.seconds(t);  // every sum of step t is done
  return r;
}

std::optional<StepResult> Session::Impl::wait_step(int64_t t, double seconds) const {
  if (t < first_step || t >= current_step)
    throw std::invalid_argument(
        first_step > 0 ? fmt::format("wait({}): this session resumed at step {}; steps {}..{} are closed", t,
                                     first_step, first_step, current_step - 1)
                       : fmt::format("wait({}): only steps 0..{} are closed", t, current_step - 1));
  std::optional<StepResult> out = await_answer<StepResult>(WaitStep{t}, seconds);
  if (out && !out->error.empty()) throw RuntimeFailure(out->error);
  return out;
}

template <class Reply, class Request>
std::optional<Reply> Session::Impl::await_answer(Request request, double seconds) const {
  using Clock = std::chrono::steady_clock;
  const auto deadline = seconds < 0 ? Clock::time_point::max()
                                    : Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                         std::chrono::duration<double>(seconds));
  caf::scoped_actor self{*sys};
  self->monitor(scheduler);
  self->send(scheduler, std::move(request));  // the answer comes back as an ordinary message
  std::optional<Reply> out;
  std::string err;
  bool done = false;
  while (!done) {
    const auto left = deadline - Clock::now();
    const auto slice = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::clamp<Clock::duration>(left, Clock::duration::zero(), std::chrono::seconds(1)));
    self->receive(
        [&](Reply& r) {
          out = std::move(r);
          done = true;
        },
        [&](caf::down_msg& d) {
          err = "runtime: the scheduler stopped: " + error_text(d.reason);
          done = true;
        },
        [&](caf::error& e) {
          err = "runtime: " + error_text(e);
          done = true;
        },
        caf::after(slice) >> [&] { done = Clock::now() >= deadline; });
  }
  if (!err.empty()) throw RuntimeFailure(err);
  return out;
}

void Session::synchronize() {
  for (int64_t t = impl_->waited_through + 1; t < impl_->current_step; ++t) wait(t);
}

std::string Session::status() const {
  caf::scoped_actor self{*impl_->sys};
  std::string out, err;
  self->request(impl_->scheduler, std::chrono::seconds(10), GetStatus{})
      .receive([&](StatusReport& r) { out = std::move(r.text); },
               [&](caf::error& e) { err = error_text(e); });
  if (!err.empty()) throw RuntimeFailure("runtime: " + err);
  return out;
}

const std::vector<std::vector<float>>& Session::master_weights() const { return impl_->master; }
std::vector<float> Session::group_weights_f32(int g) const { return impl_->group_f32(g); }
IterationPlan Session::plan() const { return impl_->info().plan; }
const IterationPlan& Session::initial_plan() const { return impl_->plan; }
void Session::save_profile(const std::string& path) const { impl_->info().profile.save(path); }
std::vector<std::string> Session::replan_log() const { return impl_->info().replan_log; }
const ModelLayout& Session::layout() const { return impl_->layout; }
int64_t Session::steps_closed() const { return impl_->current_step; }
void Session::Impl::end_replica_sums() {
  Replicas* replicas = opt.replicas.get();
  const int64_t n = *sums_in_flight;
  if (replicas->failure().empty())
    replicas->abort(fmt::format("replica {} ended its session with {} gradient sum{} in flight", replicas->rank(),
                                n, n == 1 ? "" : "s"));
  if (*sums_in_flight > 0 && replicas->failure().empty()) {
    spdlog::error("replica {}: {} gradient sum{} still in flight at the end of the session and the replicas did "
                  "not confirm the abort; the gradient buffers are left allocated for the communication thread",
                  replicas->rank(), n, n == 1 ? "" : "s");
    (void)store.release();
  }
}

HostPinning Session::host_pinning() const {
  std::lock_guard lk(impl_->pin_mu);
  return impl_->pins;
}

MemoryEvents Session::memory_events() const {
  return {impl_->memory_events.start_waits.load(), impl_->memory_events.prefetch_refusals.load()};
}

size_t Session::peak_device_bytes() const {
  size_t p = 0;
  for (auto& d : impl_->devices) p = std::max(p, d->peak_bytes());
  return p;
}
std::string Session::device_name() const { return impl_->devices[0]->name(); }
const std::vector<AdamWState>& TestSession::optimizer_states() const { return impl().adam; }
LossScaler* TestSession::loss_scaler() { return impl().scaler.get(); }
Profile TestSession::profile() const { return impl().info().profile; }

void Session::write_trace(const std::string& path) const {
  if (!impl_->tracer) throw std::runtime_error("tracing was not enabled for this session");
  impl_->tracer->write(path);
}

}  // namespace rp
