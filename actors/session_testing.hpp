// What the runtime's own tests need of rp::Session beyond the public API: knobs that only
// tests set (SessionInternals) and a view of the internals they check (TestSession). Not
// installed; embedding programs use roundpipe/session.hpp.
#pragma once
#include <optional>
#include <vector>

#include "actors/activation_spill.hpp"
#include "actors/fault_injection.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/loss_scale.hpp"
#include "roundpipe/session.hpp"
#include "scheduler/cost_model.hpp"
#include "scheduler/profile.hpp"
#include "scheduler/replan.hpp"
#include "tier/direct_reader.hpp"

namespace rp {

struct SessionInternals {
  /// Accept loss_scaling with an f32/bf16 compute dtype, so the loss-scaling path can be
  /// exercised on the CPU backend (f32) without a GPU.
  bool allow_loss_scaling_any_dtype = false;
  /// Replaces the partitioner at re-plan time (Replanner::Planner).
  Replanner::Planner planner;
  /// Device numbers of the analytic estimate (FLOPs and bytes per layer) that chooses the
  /// initial automatic plan. Default: DeviceModel{} (an H200) on CUDA, a few-core CPU on the
  /// CPU backend; elem_bytes follow the compute dtype, pcie_bandwidth the CPU-backend throttle.
  std::optional<DeviceModel> device_model;
  /// Make one device op, copy or optimizer job throw (actors/fault_injection.hpp).
  FaultInjection faults;
  /// Fails reads of the disk tier's cache file (SessionOptions::frozen_tier; tier::fail_nth_read).
  tier::ReadFault frozen_tier_fault;
  /// Bytes FrozenTierOptions::host_budget_gib sets aside before the session's own buffers
  /// (default: the process's resident memory less the caller's weights, plus a margin), so a
  /// test's budget means the same whatever the test process holds.
  std::optional<double> host_budget_reserve;
  /// Fails reads or writes of the activation spill (FrozenTierOptions::spill_layers; fail_nth_spill_read).
  SpillFault spill_fault;
  /// Staging buffers of the activation spill per worker and direction (0: the default, 4).
  size_t spill_staging = 0;
  /// SessionOptions::early_gradients' GradsFinal messages go out after the micro-batch's
  /// ComputeDone instead of before it (the latest order a stream's callbacks allow: the task
  /// has retired, or finished and gone, when they arrive).
  bool late_grads_final = false;
};

/// While alive, sessions built through the public constructor (e.g. by rp::Trainer) get
/// these injected failures. One at a time; tests only.
class ScopedFaultInjection {
 public:
  explicit ScopedFaultInjection(FaultInjection f);
  ~ScopedFaultInjection();
  ScopedFaultInjection(const ScopedFaultInjection&) = delete;
  ScopedFaultInjection& operator=(const ScopedFaultInjection&) = delete;
};

/// SessionOptions plus the test knobs.
struct TestSessionOptions : SessionOptions, SessionInternals {};

/// A Session built with test knobs, and the internals tests compare.
class TestSession : public Session {
 public:
  TestSession(const ModelLayout& layout, std::vector<std::vector<float>> group_weights,
              const SessionOptions& opt)
      : Session(layout, std::move(group_weights), opt, SessionInternals{}) {}
  TestSession(const ModelLayout& layout, std::vector<std::vector<float>> group_weights,
              const TestSessionOptions& opt)
      : Session(layout, std::move(group_weights), static_cast<const SessionOptions&>(opt),
                static_cast<const SessionInternals&>(opt)) {}

  /// AdamW state per parameter group (consistent after synchronize()).
  const std::vector<AdamWState>& optimizer_states() const;
  /// The loss scaler (null without loss_scaling); read it after synchronize().
  LossScaler* loss_scaler();
  /// A snapshot of the measured per-layer profile (series empty while nothing was measured
  /// or profiling is off). Throws RuntimeFailure when the runtime cannot be asked.
  Profile profile() const;
};

}  // namespace rp
