// Private: the state behind rp::Session, shared by actors/session.cpp (construction, the
// training calls) and actors/session_state.cpp (optimizer state save / load).
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <optional>

#include "actors/activation_spill.hpp"
#include "actors/frozen_tier.hpp"
#include "actors/messages.hpp"
#include "actors/pass_buffers.hpp"
#include "actors/reduce_wait.hpp"
#include "actors/run_progress.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/worker.hpp"
#include "base/output_folder.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/loss_scale.hpp"
#include "roundpipe/session.hpp"
#include "scheduler/disk_tier.hpp"
#include "scheduler/run_plan.hpp"
#include "trace/tracer.hpp"

namespace rp {

struct Session::Impl {
  ModelLayout layout;
  SessionOptions opt;
  IterationPlan plan;
  std::vector<std::vector<float>> master;
  std::vector<AdamWState> adam;
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<ParamStore> store;
  std::vector<std::unique_ptr<Layer>> layers;
  std::unique_ptr<Tracer> tracer;
  std::vector<std::unique_ptr<Device>> devices;  // destroyed after the actor system
  /// The disk tier's reader (SessionOptions::frozen_tier; null without it): destroyed before
  /// the devices its ring is pinned through, stopped once the actors are done.
  std::unique_ptr<FrozenTier> frozen_tier;
  FrozenTierReport tier_report;
  /// Where opt.frozen_tier puts the frozen groups (place_frozen_tier; empty `streamed`: no tier).
  struct TierPlacement {
    std::vector<char> streamed;           ///< per group: read from the tier's cache file
    double resident = 0;                  ///< frozen bytes kept in host memory
    std::optional<bool> saved_attention;  ///< host_budget_gib's choice (unset: the options')
    std::vector<char> from_source;        ///< per group: made by opt.frozen_source (not handed over)
  } tier_place;
  /// The activation spill (FrozenTierOptions::spill_layers; null without it): destroyed before
  /// the devices its staging buffers are pinned through, stopped once the actors are done.
  /// spill_mask[b]: layer b's saved inputs are in it (PassBuffers leave them out of host memory).
  std::unique_ptr<ActivationSpill> spill;
  std::vector<char> spill_mask;
  /// The folders the spill made for its file (deepest first): taken back when the session ends
  /// while they are empty (a cache file beside the spill keeps them).
  std::vector<std::string> spill_folders_made;
  MemoryEventCounters memory_events;  // the workers count into it
  RunProgress progress;               // the actors count into it (watchdog)
  ReduceWaitMeter reduce_wait;        // the shards time the replicas' sums into it
  /// Gradient sums the shards issued whose callback has not run (ShardOptions::sums_in_flight).
  std::shared_ptr<std::atomic<int64_t>> sums_in_flight = std::make_shared<std::atomic<int64_t>>(0);
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  SchedulerActor scheduler;
  std::vector<WorkerActor> workers;
  std::vector<ShardActor> shards;
  int64_t current_step = 0;
  int64_t first_step = 0;  // > 0 after load_optimizer_state: steps before it ran elsewhere
  int64_t passes_in_step = 0;
  int64_t next_eval = 0;  // id of the next evaluation pass
  int64_t waited_through = -1;
  std::mutex pin_mu;                        // pin() also runs on the scheduler's thread (re-planned buffers)
  std::vector<void*> pinned;                // host blocks pinned through devices[0]
  HostPinning pins;                         // the pin budget and what it let pin (under pin_mu)
  std::unordered_set<const void*> counted;  // buffers pin() has seen (under pin_mu)
  std::vector<std::shared_ptr<PassBuffers>> slots;
  bool resumed = false;          // load_optimizer_state succeeded
  bool saved_attention = false;  // decoders keep their attention output for backward
  std::string load_failed;       // non-empty: a load failed half-way; the session is unusable

  // Construction steps, in the order Session::Session runs them (actors/session.cpp); each
  // reads what the earlier ones set.
  /// One device per worker; resolves opt.backend "auto".
  void open_devices();
  /// opt.frozen_tier (actors/session_tier.cpp): checks its options and decides which frozen
  /// groups stream (resident_gib, or host_budget_gib with the process's resident memory less
  /// `held`, the caller's weights, which the session takes over) into tier_place; logs the
  /// budget's line (tier_report.budget_line, logged by log_budget_line). Throws
  /// std::invalid_argument naming the option.
  void place_frozen_tier(size_t held, const SessionInternals& internals,
                         const std::function<void(const std::string&)>& log);
  /// host_budget_gib's placement (place_frozen_tier): tier_place and tier_report.budget_line.
  void place_in_host_budget(size_t held, const SessionInternals& internals);
  /// Throws host_budget_gib's one-line refusal when placement `p` does not place the run (the
  /// least budget that would; a smaller ring_gib when one would do).
  void refuse_budget(const BudgetPlacement& p, double reserve, double margin, size_t staging) const;
  /// Logs tier_report.budget_line (none without a budget), on the CPU backend with the host
  /// memory of its virtual GPUs (`device_arena_bytes`, RunPlan's; 0: not planned, their capacity),
  /// which the budget does not hold.
  void log_budget_line(size_t device_arena_bytes, const std::function<void(const std::string&)>& log);
  /// What host_budget_gib's `room` (the budget less the process and margin) holds: the shared
  /// rule (scheduler/disk_tier.hpp place_host_budget) with the tier's ring (budget_ring),
  /// `staging` spill buffers per pool, and save_attention automatic when unset.
  BudgetPlacement place_budget(double room, size_t staging) const;
  /// The run's shape as the host budget's rule sees it.
  HostRun budget_run() const;
  /// The tier's read ring: its buffers (frozen_tier.ring_gib) x the largest frozen group.
  double budget_ring() const;
  /// The run plan (scheduler/run_plan.hpp) with the host memory the caller's weights already
  /// hold (`held`); sets `plan` and `saved_attention` and logs the uniform fallback's line.
  RunPlan plan_session(size_t held, const SessionInternals& internals,
                       const std::function<void(const std::string&)>& log);
  /// The parameter store (frozen groups stored, their fp32 freed), the masters, the layers.
  void take_weights_and_layers(std::vector<std::vector<float>> w,
                               std::vector<std::vector<uint8_t>>& frozen_storage);
  /// opt.frozen_tier (actors/session_tier.cpp): the frozen groups go to the cache file (or a
  /// valid one is reused), their host copies are freed, and the reader starts.
  void open_frozen_tier(const SessionInternals& internals,
                        const std::function<void(const std::string&)>& log);
  /// FrozenTierOptions::spill_layers (actors/session_spill.cpp): checks it, chooses the layers,
  /// turns saved attention off, and opens the spill file and its thread. Runs before the layers
  /// are made (they read saved_attention).
  void open_activation_spill(const SessionInternals& internals,
                             const std::function<void(const std::string&)>& log);
  void start_tracer();  ///< opt.trace only
  void start_actor_system();
  /// opt.loss_scaling: refused unless the devices compute in f16 (or the test knob allows it).
  void make_loss_scaler(const SessionInternals& internals);
  std::shared_ptr<Replanner> make_replanner(const RunPlan& run, const SessionInternals& internals) const;
  /// The scheduler's configuration with its pass slots; refuses a negative watchdog_s.
  SchedulerConfig scheduler_config(const RunPlan& run, const SessionInternals& internals,
                                   const std::function<void(const std::string&)>& log);
  /// Pins pass buffers, gradient slots, trainable then frozen weights within the pin budget.
  void pin_host_buffers(const std::vector<std::shared_ptr<PassBuffers>>& pass_slots,
                        const std::function<void(const std::string&)>& log);
  /// Spawns the optimizer shards into `shards`; returns each group's shard (frozen: -1).
  std::vector<int> spawn_shards(const SessionInternals& internals);
  /// Spawns one worker per device into `workers`.
  void spawn_workers(const std::vector<int>& shard_of, const SessionInternals& internals);

  /// Checks and submits one pass of the current step (positions: packed sequences, or null).
  /// eval >= 0: a forward-only evaluation pass with that id.
  void submit(const char* call, const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
              const std::vector<int32_t>* positions, int64_t eval);

  /// Throws std::logic_error naming `call` when a failed load left the state inconsistent.
  void check_usable(const char* call) const {
    if (!load_failed.empty())
      throw std::logic_error(std::string(call) +
                             ": this session's optimizer state is inconsistent after a failed "
                             "load_optimizer_state (" +
                             load_failed + "); create a new Session");
  }

  ~Impl() {
    if (sys) {
      // Work may still be in flight (a failed or stopped run): it must not hold the teardown,
      // so copies on the CPU backend's emulated link stop waiting for it.
      for (auto& d : devices) d->interrupt();
      // Everyone gets Shutdown from here too: a scheduler that died cannot relay it.
      caf::anon_send(scheduler, Shutdown{});
      for (auto& w : workers) caf::anon_send(w, Shutdown{});
      for (auto& s : shards) caf::anon_send(s, Shutdown{});
      sys->await_all_actors_done();
      if (frozen_tier) frozen_tier->stop();  // drops queued fetches (their callbacks hold workers)
      if (spill) spill->stop();              // the same for the spill's queued reads and writes
      // drop our handles first: a detached actor's thread ends only once its last
      // reference is gone, and ~actor_system waits for those threads
      shards.clear();
      workers.clear();
      scheduler = nullptr;
      sys.reset();
    }
    if (opt.replicas && *sums_in_flight > 0) end_replica_sums();
    for (auto& d : devices)
      for (int k = 0; k < kNumStreams; ++k) d->stream(StreamKind(k)).synchronize();
    if (!devices.empty())
      for (void* p : pinned) devices[0]->unpin_host(p);
    spill.reset();  // its file is unnamed (O_TMPFILE): nothing of it stays in the folders
    remove_empty_folders(spill_folders_made);
  }

  /// Teardown with gradient sums in flight (a run abandoned by a stop or a failure): the
  /// communication thread may still read and write the gradient slots, and the peers wait for
  /// sums this replica will never finish. Fails the replicas (Replicas::abort, naming this
  /// replica), after which the thread touches no buffer; should that not be confirmed, the
  /// parameter store is left allocated rather than freed under it.
  void end_replica_sums();

  /// Pins b when it fits what is left of pins.budget; else counts it as pageable.
  void pin(HostBytes& b, bool frozen = false) {
    std::lock_guard lk(pin_mu);
    if (b.size() == 0 || !counted.insert(b.data()).second) return;  // pass slots may share buffers
    if (b.size() > pins.budget - pins.pinned_bytes) {               // pinned_bytes never passes the budget
      pins.pageable_bytes += b.size();
      if (frozen) pins.pageable_frozen_bytes += b.size();
      return;
    }
    devices[0]->pin_host(b.data(), b.size());
    pinned.push_back(b.data());
    pins.pinned_bytes += b.size();
  }

  RuntimeInfo info() const {
    caf::scoped_actor self{*sys};
    RuntimeInfo out;
    std::string err;
    self->request(scheduler, caf::infinite, GetRuntimeInfo{})
        .receive([&](RuntimeInfo& r) { out = std::move(r); }, [&](caf::error& e) { err = error_text(e); });
    if (!err.empty()) throw RuntimeFailure("runtime: " + err);
    return out;
  }

  /// Group g's weights in fp32: the master of a trainable group, the dequantized storage of a
  /// frozen one (Session::group_weights_f32). Throws std::out_of_range for a bad g.
  std::vector<float> group_f32(int g) const;

  /// Step t's result, waiting at most `seconds` (< 0: as long as it takes): nullopt on
  /// timeout. Watches the scheduler while it waits: a scheduler that went down throws
  /// RuntimeFailure naming its exit reason instead of leaving the caller hanging.
  std::optional<StepResult> wait_step(int64_t t, double seconds) const;
  std::optional<EvalResult> wait_eval(int64_t id, double seconds) const;
  /// Sends `request` to the scheduler and waits for its `Reply` at most `seconds` (< 0: no
  /// limit); nullopt when it did not come in time (the request stays answered later, to no
  /// one). Throws RuntimeFailure when the scheduler goes down or answers with an error.
  template <class Reply, class Request>
  std::optional<Reply> await_answer(Request request, double seconds) const;
};

/// Checks the constructor's weights against `layout`: per group numel fp32 values, or for a
/// frozen group given in storage form (frozen_storage[g] non-empty) exactly storage_bytes bytes
/// and no fp32 values. Throws std::invalid_argument naming the group and what was expected.
/// With `source` (SessionOptions::frozen_source) a frozen group may come in neither form.
void check_session_weights(const ModelLayout& layout, const std::vector<std::vector<float>>& w,
                           const std::vector<std::vector<uint8_t>>& frozen_storage, bool source);
/// Refuses a frozen source without identity or fill (std::invalid_argument, "frozen_source: ...").
void check_frozen_source(const std::optional<FrozenSource>& source);
/// Per group: 1 for a frozen group given in neither form, which the frozen source makes (all 0
/// without one).
std::vector<char> groups_from_source(const ModelLayout& layout, const std::vector<std::vector<float>>& w,
                                     const std::vector<std::vector<uint8_t>>& frozen_storage, bool source);
/// Bytes of the caller's weights the constructor takes over (fp32 masters, frozen storage).
size_t held_weight_bytes(const ModelLayout& layout, const std::vector<std::vector<float>>& w,
                         const std::vector<std::vector<uint8_t>>& frozen_storage);
/// Writes every group's host copy into `store`: a trainable group's fp32 values cast to the
/// compute dtype; a frozen group's storage form, copied from frozen_storage[g] or quantized
/// (per tensor, kernels/weight_format.hpp) from w[g]. Frees what it consumed: frozen groups'
/// w[g] and every frozen_storage entry, so w keeps only the trainable groups' masters.
/// A frozen group given in neither form is made by `source` (may be null when none is), unless
/// streamed[g] (the tier's cache build asks the source then): its `lowp` stays empty.
void fill_store(const ModelLayout& layout, std::vector<std::vector<float>>& w,
                std::vector<std::vector<uint8_t>>& frozen_storage, ParamStore& store,
                const FrozenSource* source, const std::vector<char>& streamed);
/// Host bytes the disk tier keeps out of memory while training: the streamed groups' storage
/// bytes minus its ring's (0 without a tier, for a ring as large, or for options the tier will
/// refuse).
size_t frozen_tier_host_credit(const ModelLayout& layout, const SessionOptions& opt,
                               const std::vector<char>& streamed);
/// tail_interior_layers(L, plan)[b]: layer b lies inside the tail stage of `plan`, past its first
/// layer (forward and backward run at once there: no saved input is written for it).
std::vector<char> tail_interior_layers(int num_layers, const IterationPlan& plan);
/// The `n` layers whose saved inputs spill (FrozenTierOptions::spill_layers), ascending: first
/// the layers inside the tail (no I/O while the plan keeps them there; their host buffers go all
/// the same), then the lowest of 1..num_layers-1 that begin no forward stage and not the tail of
/// `plan` (whose input is uploaded right after it was written), then the lowest that do.
std::vector<int> choose_spill_layers(int num_layers, const IterationPlan& plan, int n);
/// Host buffers for the disk tier and the activation spill: 4096-aligned, page-locked through
/// `dev` where it lets them be (pageable otherwise: the copies are then slower, the results the same).
tier::HostAllocator pinned_allocator(Device& dev);
/// The fp32 values of frozen group `g` stored in `storage` (its storage form).
std::vector<float> dequantize_group(const ParamGroup& g, const void* storage);

}  // namespace rp
