// Trace recorder: stream operations and stage tasks as intervals on named tracks,
// written as Chrome trace-event JSON (opens in Perfetto / chrome://tracing; the track
// layout is chrome_trace.hpp's).
//
// A plain mutex-guarded recorder rather than an actor: stream callbacks record from
// device threads at high frequency, and a message per interval would perturb the
// schedule it is meant to show. Disabled tracers cost one branch per call site.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "trace/chrome_trace.hpp"

namespace rp {

class Tracer {
 public:
  Tracer() : t0_(std::chrono::steady_clock::now()) {}
  /// Seconds since the tracer was created.
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  /// Records [t_begin, t_end] seconds on track `track` (e.g. "vgpu0.compute").
  void interval(const std::string& track, std::string label, double t_begin, double t_end);
  /// The same with numeric arguments shown on the slice (Chrome trace "args"), e.g. a copy's
  /// {"bytes", 1048576}, {"queued_us", 12.5}.
  void interval(const std::string& track, std::string label, double t_begin, double t_end,
                std::vector<std::pair<std::string, double>> args);
  /// Protocol messages (SessionOptions::trace_messages): off unless enabled; callers check
  /// messages() first so a run without them pays one branch.
  void enable_messages(bool on) { messages_ = on; }
  bool messages() const { return messages_; }
  /// Message `type` from actor `from` to actor `to` was sent now (tracks "<actor>.messages",
  /// e.g. "worker0", "shard1", "scheduler"), identified by `key` (e.g. {"group", 3}, {"step",
  /// 7}, {"pass", 9}, {"stage", 2}, {"mb", 1}), which the slices show as args. The matching
  /// received() call (same type and key; identical messages, e.g. two workers' requests for
  /// one group and step, pair first sent, first received) completes a flow arrow from the
  /// send slice to the receive slice. `to` / `from` only label the slices ("" = not known
  /// to that side).
  using MessageKey = std::vector<std::pair<std::string, int64_t>>;
  void sent(const std::string& from, const std::string& to, const std::string& type, const MessageKey& key);
  void received(const std::string& to, const std::string& from, const std::string& type,
                const MessageKey& key);
  /// Sent messages not (yet) received.
  size_t messages_in_flight() const;

  /// Records a run-wide setting (written under the trace's "otherData", e.g.
  /// "transfer_priorities" = "on"); a later call with the same key replaces the value.
  void set_info(const std::string& key, std::string value);
  /// Writes all recorded intervals to `path` as chrome_trace_json (temp file + rename).
  /// Throws std::runtime_error.
  void write(const std::string& path) const;
  /// Number of intervals recorded so far.
  size_t size() const;

 private:
  std::chrono::steady_clock::time_point t0_;
  mutable std::mutex mu_;
  std::vector<TraceInterval> events_;
  std::map<std::string, std::string> info_;
  bool messages_ = false;
  int64_t next_flow_ = 0;
  std::map<std::string, std::vector<int64_t>> in_flight_;  // message identity -> flow ids, oldest first
};

}  // namespace rp
