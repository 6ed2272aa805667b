// Optimizer state files of rp::Session: save_optimizer_state / load_optimizer_state. The
// file format is formats/optimizer_state.hpp's; this is the runtime's side: which buffers are
// saved, the checks against the session, and continuing at the loaded step.
#include <cstring>

#include <fmt/format.h>

#include "actors/session_impl.hpp"
#include "formats/optimizer_state.hpp"

namespace rp {
namespace {

std::string describe(const AdamWOptions& o) {
  return fmt::format("betas ({}, {}), eps {}, weight_decay {}, {}{}{}", o.beta1, o.beta2, o.eps,
                     o.weight_decay, o.decoupled ? "decoupled (AdamW)" : "L2 (Adam)",
                     o.amsgrad ? ", amsgrad" : "", o.maximize ? ", maximize" : "");
}

bool same_except_lr(const AdamWOptions& a, const AdamWOptions& b) {
  return a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps && a.weight_decay == b.weight_decay &&
         a.decoupled == b.decoupled && a.amsgrad == b.amsgrad && a.maximize == b.maximize;
}

/// Asks `who` (scheduler or shard) and waits for the answer; throws std::runtime_error.
template <class Reply, class Handle, class Msg>
Reply ask(caf::actor_system& sys, const Handle& who, Msg msg, const char* what) {
  caf::scoped_actor self{sys};
  Reply out{};
  std::string err;
  self->request(who, caf::infinite, std::move(msg))
      .receive([&](Reply& r) { out = std::move(r); }, [&](caf::error& e) { err = error_text(e); });
  if (!err.empty()) throw std::runtime_error(fmt::format("{}: the runtime refused it ({})", what, err));
  return out;
}

}  // namespace

void Session::save_optimizer_state(const std::string& path, bool include_master) {
  Impl& I = *impl_;
  I.check_usable("save_optimizer_state");
  if (I.passes_in_step != 0 || I.waited_through != I.current_step - 1)
    throw std::logic_error(
        "save_optimizer_state: steps are in flight; call it between steps, after synchronize() and before "
        "the next "
        "forward_backward()");
  const int staleness = I.opt.async ? 1 : 0;
  const int64_t N = I.current_step;
  OptimizerStateView v;
  if (I.scaler) {
    v.header.loss_scales =
        ask<LossScales>(*I.sys, I.scheduler, LossScalesFrom{N}, "save_optimizer_state").scales;
    if (v.header.loss_scales.size() != size_t(staleness + 1))
      throw std::logic_error(fmt::format(
          "save_optimizer_state: the loss scales of steps {}..{} are not decided", N, N + staleness));
  }
  v.header.steps = N;
  v.header.async = staleness == 1;
  v.header.has_master = include_master;
  v.header.has_lowp = staleness == 1 && N > 0;  // sync: the copy is the master, rounded
  v.header.has_scaler = I.scaler != nullptr;
  v.header.lowp_dtype = I.store->dtype;
  v.layout = &I.layout;
  v.adam = &I.adam;
  v.adam_options = &I.opt.adam;
  v.master = &I.master;
  for (auto& b : I.store->lowp) v.lowp.push_back(b.data());
  v.scaler = I.scaler.get();
  write_optimizer_state(path, v);
}

OptimizerStateInfo Session::load_optimizer_state(const std::string& path) {
  Impl& I = *impl_;
  I.check_usable("load_optimizer_state");
  if (I.current_step != 0 || I.passes_in_step != 0 || I.resumed)
    throw std::logic_error(
        "load_optimizer_state: call it once, on a new session, before the first forward_backward()");
  // ---- header: everything is checked before the session changes -----------------
  OptimizerStateReader r(path);
  const auto& h = r.header();
  r.check_groups(I.layout);
  if (h.has_scaler != bool(I.scaler))
    r.fail(
        h.has_scaler
            ? "the state holds a loss scaler but this session has no loss scaling (fp16); enable it to resume"
            : "the state has no loss scaler but this session uses loss scaling; resume without it");
  const int staleness = I.opt.async ? 1 : 0;
  const int64_t N = h.steps;

  // ---- payload: written straight into the session; a failure now poisons it -------
  bool modified = false;
  auto load_groups = [&] {
    const DType dt = I.store->dtype;
    for (size_t g = 0; g < I.layout.groups.size(); ++g) {
      const auto& grp = I.layout.groups[g];
      if (grp.frozen) continue;  // not in the file: never updated, its storage is the constructor's
      AdamWState st;
      AdamWOptions o;
      r.read_adam(grp, st, o);
      if (!same_except_lr(o, I.opt.adam))
        r.fail(fmt::format(
            "group '{}': saved with {}, this session uses {}; resume with the same optimizer settings",
            grp.name, describe(o), describe(I.opt.adam)));
      modified = true;
      I.adam[g] = std::move(st);
      if (h.has_master) r.read_master(grp, I.master[g].data());
      // sync: the stored copy is the master's, recast below (read and checked only)
      if (h.has_lowp) r.read_lowp(grp, staleness == 0 ? nullptr : I.store->lowp[g].data(), dt);
      // without a stored copy (sync state, or a sync session) the copy is the master, rounded
      if (!h.has_lowp || staleness == 0)
        cast_f32_to(I.master[g].data(), I.store->lowp[g].data(), grp.numel, dt);
    }
  };
  try {
    load_groups();
    if (h.has_scaler) r.read_scaler(*I.scaler);
    r.finish();
    // ---- continue at step N: the scales of steps N..N+staleness, the file's, adapted when
    // the mode changed
    std::vector<float> next_scales;
    if (I.scaler) {
      next_scales = h.loss_scales;
      next_scales.resize(size_t(staleness + 1), I.scaler->scale());
      if (staleness == 0) next_scales = {I.scaler->scale()};
    }
    ask<Ack>(*I.sys, I.scheduler, ResumeAt{N, next_scales}, path.c_str());
    for (auto& sh : I.shards) ask<Ack>(*I.sys, sh, ResumeAt{N, {}}, path.c_str());
  } catch (const std::exception& e) {
    if (modified) I.load_failed = e.what();
    throw;
  }
  I.current_step = N;
  I.first_step = N;
  I.waited_through = N - 1;
  I.resumed = true;
  return OptimizerStateInfo{N, h.has_master, h.async};
}

}  // namespace rp
