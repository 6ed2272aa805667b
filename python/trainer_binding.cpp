// rp::Trainer for Python: the spec (a JSON text or file plus dotted settings), run() with the
// GIL released, Python callbacks that re-acquire it, SIGINT as a clean stop, and plain dicts
// for the reports. python/roundpipe/__init__.py wraps it as roundpipe.Trainer.
#include "python/bindings.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "roundpipe/spec.hpp"
#include "roundpipe/trainer.hpp"

namespace py = pybind11;

namespace rp::python {
namespace {

/// The dict a Python on_step / on_eval callback receives.
py::dict step_dict(const StepReport& r) {
  py::dict d;
  d["step"] = r.step;
  d["total_steps"] = r.total_steps;
  d["first_step"] = r.first_step;
  d["epoch"] = r.epoch;
  d["loss"] = r.loss;
  d["lr"] = r.lr;
  d["grad_norm"] = r.grad_norm;
  d["tokens"] = r.tokens;
  d["target_tokens"] = r.target_tokens;
  d["tokens_per_s"] = r.tokens_per_s;
  d["loss_scale"] = r.loss_scale;
  d["skipped"] = r.skipped;
  d["elapsed_s"] = r.elapsed_s;
  d["eta_s"] = r.eta_s;
  d["mfu"] = r.mfu;
  d["reduce_wait_s"] = r.reduce_wait_s;
  d["replica"] = r.replica;
  d["evaluated"] = r.evaluated;
  if (r.evaluated) {
    d["eval_loss"] = r.eval_loss;
    d["eval_perplexity"] = r.eval_perplexity;
    d["eval_tokens"] = r.eval_tokens;
  }
  if (r.experts > 0) {
    d["experts"] = r.experts;
    d["aux_loss"] = r.aux_loss;
    d["expert_load_min"] = r.expert_load_min;
    d["expert_load_max"] = r.expert_load_max;
  }
  return d;
}

py::dict result_dict(const TrainResult& r) {
  py::dict d;
  d["first_step"] = r.first_step;
  d["steps_done"] = r.steps_done;
  d["total_steps"] = r.total_steps;
  d["stopped"] = r.stopped;
  d["steps_abandoned"] = r.steps_abandoned;
  d["skipped_steps"] = r.skipped_steps;
  d["checkpoint"] = r.checkpoint;
  d["latest_checkpoint"] = r.latest_checkpoint;
  d["metrics"] = r.metrics;
  d["seconds"] = r.seconds;
  d["peak_device_bytes"] = r.peak_device_bytes;
  d["plan"] = r.plan;
  d["sample_before"] = r.sample_before;
  d["sample_after"] = r.sample_after;
  d["replica"] = r.replica;
  d["replicas"] = r.replicas;
  d["early_stopped"] = r.early_stopped;
  d["early_stop_reason"] = r.early_stop_reason;
  d["best_checkpoint"] = r.best_checkpoint;
  d["best_metric"] = r.best_metric;
  d["best_step"] = r.best_step;
  d["final_step"] = r.final_step;
  return d;
}

/// What one run() shares with its callbacks and the SIGINT handler. The Python objects are
/// touched only with the GIL held; the callbacks capture a pointer to this (no py::object is
/// copied while the GIL is released).
struct RunState {
  py::object on_ready, on_step, on_eval, on_checkpoint;
  StopToken stop;
  std::atomic<bool> interrupted{false};
  std::exception_ptr python_error;  ///< the first exception a callback raised
};

/// A callback's Python exception stops the run like stop() does (the steps in flight finish
/// and are saved) and is raised again once run() returned; later callbacks are not called.
void call(RunState& st, const py::object& f, const py::object& arg) {
  if (f.is_none()) return;
  py::gil_scoped_acquire gil;
  if (st.python_error) return;
  try {
    if (arg) f(arg);
    else f();
  } catch (py::error_already_set&) {
    st.python_error = std::current_exception();
    st.stop.request_stop();
  }
}

std::atomic<RunState*> g_sigint_run{nullptr};

void write_err(const char* s) { [[maybe_unused]] auto n = ::write(2, s, std::strlen(s)); }

/// SIGINT during run(): the CLI's first Ctrl-C (stop after the steps in flight and save them).
/// A second one only says so: the kernel of a notebook is not killed, and the stop is bounded
/// by the spec's stop_timeout_s anyway.
void on_sigint(int) {
  const int saved_errno = errno;
  if (RunState* st = g_sigint_run.load()) {
    st->interrupted = true;
    if (st->stop.request_stop())
      write_err(
          "\nroundpipe: interrupted: stopping after the steps in flight and saving them as a checkpoint\n");
    else
      write_err(
          "\nroundpipe: already stopping (waiting at most the spec's stop_timeout_s for the steps in "
          "flight)\n");
  }
  errno = saved_errno;
}

/// SIGINT stops `st` while alive; the previous handler (Python's) is put back after, and so is
/// the run it stopped: a run started from another run's callback hands Ctrl-C back to the outer
/// one when it ends.
class SigintStops {
 public:
  explicit SigintStops(RunState& st) : outer_(g_sigint_run.exchange(&st)) {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &prev_);
  }
  ~SigintStops() {
    ::sigaction(SIGINT, &prev_, nullptr);
    g_sigint_run = outer_;
  }
  SigintStops(const SigintStops&) = delete;
  SigintStops& operator=(const SigintStops&) = delete;

 private:
  RunState* outer_;
  struct sigaction prev_ {};
};

/// settings: (dotted key, JSON text) pairs, as `roundpipe train --set KEY=VALUE` takes them.
std::vector<SpecSetting> to_settings(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::vector<SpecSetting> out;
  for (const auto& [key, value] : pairs) out.push_back({key, value, false, "overrides['" + key + "']"});
  return out;
}

class PyTrainer {
 public:
  /// `json_text` empty: `source` is a spec file; else the spec's JSON text and `source` the name
  /// errors use.
  PyTrainer(const std::string& source, const std::string& json_text,
            const std::vector<std::pair<std::string, std::string>>& settings) {
    const std::vector<SpecSetting> s = to_settings(settings);
    if (json_text.empty()) {
      spec_ = load_spec(source, s);
      return;
    }
    nlohmann::json j = nlohmann::json::parse(json_text);
    if (!j.is_object())
      throw std::invalid_argument(source + ": expected a JSON object (a spec), got " +
                                  json_text.substr(0, 80));
    spec_ = spec_from_json(std::move(j), source, s);
  }

  const TrainSpec& spec() const { return spec_; }
  bool stop() const { return current_ ? current_->stop.request_stop() : false; }

  py::dict run(py::object on_ready, py::object on_step, py::object on_eval, py::object on_checkpoint,
               bool handle_sigint) {
    if (current_) throw std::logic_error("Trainer.run: this trainer is already running");
    RunState st;
    st.on_ready = std::move(on_ready);
    st.on_step = std::move(on_step);
    st.on_eval = std::move(on_eval);
    st.on_checkpoint = std::move(on_checkpoint);
    TrainerCallbacks cb;
    RunState* s = &st;
    cb.on_ready = [s] { call(*s, s->on_ready, py::object()); };
    cb.on_step = [s](const StepReport& r) {
      if (s->on_step.is_none() && (s->on_eval.is_none() || !r.evaluated)) return;
      py::gil_scoped_acquire gil;
      const py::dict d = step_dict(r);
      call(*s, s->on_step, d);
      if (r.evaluated) call(*s, s->on_eval, d);
    };
    cb.on_checkpoint = [s](const CheckpointReport& r) {
      if (s->on_checkpoint.is_none()) return;
      py::gil_scoped_acquire gil;
      py::dict d;
      d["dir"] = r.dir;
      d["step"] = r.step;
      d["seconds"] = r.seconds;
      call(*s, s->on_checkpoint, d);
    };
    current_ = &st;
    std::optional<SigintStops> sigint;
    if (handle_sigint) sigint.emplace(st);
    TrainResult res;
    std::exception_ptr failure;
    {
      py::gil_scoped_release nogil;
      try {
        res = Trainer(spec_).run(cb, st.stop);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    sigint.reset();
    current_ = nullptr;
    if (st.python_error) std::rethrow_exception(st.python_error);
    if (failure) std::rethrow_exception(failure);
    py::dict d = result_dict(res);
    d["interrupted"] = st.interrupted.load();
    return d;
  }

 private:
  TrainSpec spec_;
  RunState* current_ = nullptr;
};

}  // namespace

void bind_trainer(py::module_& m) {
  py::class_<PyTrainer>(m, "_Trainer")
      .def(py::init<const std::string&, const std::string&,
                    const std::vector<std::pair<std::string, std::string>>&>(),
           py::arg("source"), py::arg("json_text"), py::arg("settings"))
      .def("run", &PyTrainer::run, py::arg("on_ready"), py::arg("on_step"), py::arg("on_eval"),
           py::arg("on_checkpoint"), py::arg("handle_sigint"))
      .def("stop", &PyTrainer::stop)
      .def_property_readonly("output_dir", [](const PyTrainer& t) { return t.spec().output_dir; })
      .def_property_readonly("steps", [](const PyTrainer& t) { return t.spec().steps; })
      .def_property_readonly("source", [](const PyTrainer& t) { return t.spec().source; });
}

}  // namespace rp::python
