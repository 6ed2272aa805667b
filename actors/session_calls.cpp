// The calls of a running rp::Session: submitting micro-batch sets (forward_backward,
// evaluate), closing steps, waiting for their results (each wait is a request to the scheduler
// actor, answered as an ordinary message) and the read-only views of the run (plan, weights,
// memory events, trace). Construction and teardown are session.cpp's.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/session_impl.hpp"
#include "actors/session_testing.hpp"
#include "roundpipe/session.hpp"

namespace rp {
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
    throw std::invalid_argument(
        fmt::format("wait_eval({}): no such evaluation (ids 0..{} were given)", id, next_eval - 1));
  std::optional<EvalResult> out = await_answer<EvalResult>(WaitEval{id}, seconds);
  if (out && !out->error.empty()) throw RuntimeFailure(out->error);
  return out;
}

void Session::Impl::submit(const char* call, const std::vector<int32_t>& ids,
                           const std::vector<int32_t>& targets, const std::vector<int32_t>* positions,
                           int64_t eval) {
  Impl& I = *this;
  I.check_usable(call);
  const size_t n = size_t(I.opt.micro_batches * I.opt.micro.tokens());
  if (ids.size() != n || targets.size() != n)
    throw std::invalid_argument(fmt::format(
        "{}: expected {} ids and targets (micro_batches {} x n_seq {} x seq_len {}), got {} and {}", call, n,
        I.opt.micro_batches, I.opt.micro.n_seq, I.opt.micro.seq_len, ids.size(), targets.size()));
  const int64_t V = I.layout.config.vocab_size;
  int64_t target_tokens = 0;  // counted here, on the caller's thread (SubmitPass::target_tokens)
  for (size_t i = 0; i < n; ++i) {
    target_tokens += targets[i] >= 0;
    if (ids[i] < 0 || ids[i] >= V)
      throw std::invalid_argument(
          fmt::format("{}: token id {} at position {} is outside [0, {})", call, ids[i], i, V));
    if (targets[i] >= V)
      throw std::invalid_argument(
          fmt::format("{}: target {} at position {} is outside [0, {})", call, targets[i], i, V));
  }
  SubmitPass sp;
  sp.step = I.current_step;
  sp.ids = std::make_shared<const std::vector<int32_t>>(ids);
  sp.targets = std::make_shared<const std::vector<int32_t>>(targets);
  if (positions) {
    if (positions->size() != n)
      throw std::invalid_argument(
          fmt::format("{}: expected {} positions, got {}", call, n, positions->size()));
    const size_t L = size_t(I.opt.micro.seq_len);
    for (size_t i = 0; i < n; ++i)
      if ((*positions)[i] < 0 || size_t((*positions)[i]) > i % L)
        throw std::invalid_argument(fmt::format(
            "{}: position {} at token {} of its sequence (expected 0 <= position <= the token's index)", call,
            (*positions)[i], i % L));
    sp.positions = std::make_shared<const std::vector<int32_t>>(*positions);
  }
  sp.eval = eval;
  sp.target_tokens = double(target_tokens);
  caf::anon_send(I.scheduler, std::move(sp));
  if (eval >= 0) I.next_eval++;
  else I.passes_in_step++;
}

int64_t Session::step(double lr) {
  Impl& I = *impl_;
  I.check_usable("step");
  if (I.passes_in_step == 0)
    throw std::logic_error("step() called without a forward_backward() pass in this step");
  caf::anon_send(I.scheduler, CloseStepRequest{I.current_step, lr});
  I.passes_in_step = 0;
  return I.current_step++;
}

int64_t Session::step(double lr, int64_t target_tokens) {
  Impl& I = *impl_;
  I.check_usable("step");
  if (I.passes_in_step == 0)
    throw std::logic_error("step() called without a forward_backward() pass in this step");
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
    replicas->abort(fmt::format("replica {} ended its session with {} gradient sum{} in flight",
                                replicas->rank(), n, n == 1 ? "" : "s"));
  if (*sums_in_flight > 0 && replicas->failure().empty()) {
    spdlog::error(
        "replica {}: {} gradient sum{} still in flight at the end of the session and the replicas did "
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
