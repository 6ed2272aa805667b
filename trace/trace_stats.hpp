// Analysis of a runtime trace (the Chrome trace JSON Tracer::write produces): per worker
// (GPU or virtual GPU), how busy the compute stream was, how long activation copies waited
// behind other traffic, how much copy time was hidden under compute, and bytes per stream.
// `roundpipe trace` prints it; tests use it to measure runs.
//
// Conventions: times in seconds, sizes in bytes, bandwidths in bytes per second.
// Tracks are named "worker<i>.<stream>" (compute, act_up, act_down, param_up, grad_down,
// tasks). A copy slice spans issue to completion; its args carry "bytes" and "queued_us"
// (time in the transfer actor's queue before issue).
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace rp {

struct TraceSlice {
  std::string track;  ///< e.g. "worker0.act_up"
  std::string name;   ///< slice label
  double t0 = 0, t1 = 0;
  std::map<std::string, double> args;
};

struct Trace {
  std::vector<TraceSlice> slices;
  std::map<std::string, std::string> info;  ///< "otherData" (run settings)
};

/// traceEvents[`index`] of `events` (the trace's "traceEvents" array), checked to be an object.
/// Throws std::runtime_error("traceEvents[<index>]: expected an object (an event), got ...").
const nlohmann::json& trace_event(const nlohmann::json& events, size_t index);
/// The string field `key` of `obj` (an event of traceEvents[`index`], or its "args" with
/// `prefix` "args."), or "" when absent. Throws std::runtime_error("traceEvents[<index>]: key
/// '<prefix><key>': expected a string, got ...") for another type (base/json_fields.hpp's reader).
std::string event_string(const nlohmann::json& obj, const char* key, size_t index, const char* prefix = "");
/// The integer field `key` (pid, tid) of event traceEvents[`index`], or 0 when absent. Throws
/// std::runtime_error("traceEvents[<index>]: key '<key>': expected an integer, got ...").
int64_t event_int(const nlohmann::json& e, const char* key, size_t index);

/// The largest |ts| and dur a trace may hold, in microseconds (about 127 years, so times since
/// 1970 pass too; ts + dur in nanoseconds fits an int64), and the largest args.bytes / args.queued_us (a
/// petabyte; what a trace sums stays finite and printable).
inline constexpr double kMaxTraceMicroseconds = 4e15;
inline constexpr double kMaxTraceArgument = 1e15;

/// The start and the duration in microseconds (ts, dur) of the complete ("X") event `e`, the
/// trace's traceEvents[`index`]. Throws std::runtime_error("traceEvents[<index>]: ...") when
/// either is not a number, dur is negative (a slice that would end before it starts) or either
/// is past kMaxTraceMicroseconds.
std::pair<double, double> complete_event_times(const nlohmann::json& e, size_t index);

/// Parses a Chrome trace object: "X" events (ts/dur in microseconds) named by "thread_name"
/// metadata events (tid -> track; the lanes "<track> #k" of chrome_trace.hpp join their
/// track; tracks without a name are called "tid<N>"). Throws
/// std::runtime_error when "traceEvents" is missing or an X event's ts/dur are not numbers or
/// its dur is negative (complete_event_times).
Trace parse_trace(const nlohmann::json& j);
/// Reads and parses a trace file. Throws std::runtime_error naming the file.
Trace read_trace(const std::string& path);

/// Order statistics of a sample (nearest-rank percentiles: p-th = the ceil(p/100 n)-th smallest).
struct Distribution {
  size_t n = 0;
  double max = 0, p50 = 0, p99 = 0, mean = 0;
};
/// Order statistics of `xs` (any unit; all zero with n = 0 for an empty sample).
Distribution distribution(std::vector<double> xs);

struct StreamStats {
  size_t copies = 0;
  double bytes = 0;
  double busy_s = 0;        ///< length of the union of its slices
  double hidden_s = 0;      ///< of which under compute-stream busy time
  double hidden_share = 0;  ///< hidden_s / busy_s (0 when idle)
};

struct WorkerStats {
  std::string worker;                          ///< "worker0"
  double wall_s = 0;                           ///< the analysed window (same for all workers)
  double compute_busy_s = 0;                   ///< union of compute slices in the window
  double utilisation = 0;                      ///< compute_busy_s / wall_s
  std::map<std::string, StreamStats> streams;  ///< by stream name (copy streams only)
  double copy_busy_s = 0;                      ///< union of all copy slices
  double copy_hidden_s = 0;                    ///< of which overlapped with compute busy time
  double hidden_share = 0;                     ///< copy_hidden_s / copy_busy_s
  double h2d_bytes_per_s = 0;                  ///< link bandwidth used to compute waits (given or estimated)
  double d2h_bytes_per_s = 0;
  double chunk_bytes = 0;  ///< the reference chunk (TraceStatsOptions::chunk_bytes)
  double chunk_s = 0;      ///< its time at h2d_bytes_per_s
  /// Activation uploads: latency = enqueue to completion (queued + in flight); queued = time
  /// in the transfer actor's queue; wait = time lost to other traffic = completion - max(enqueue,
  /// completion of the stream's previous activation copy) - own transfer time bytes /
  /// h2d_bytes_per_s, at least 0 (queueing behind the stream's own activations is not counted).
  Distribution act_up_latency, act_up_queued, act_up_wait;
  Distribution act_down_wait;          ///< the same for activation downloads, at d2h_bytes_per_s
  size_t act_up_waits_over_chunk = 0;  ///< activation uploads that waited longer than chunk_s
};

struct TraceStatsOptions {
  /// Start the window at the first slice of pass >= skip_passes (labels "... (pass N)"),
  /// leaving warm-up out; 0: the first slice of the trace. The window ends at the last slice.
  int skip_passes = 0;
  /// Link bandwidths for the waits; 0: estimate per worker and direction as the median of
  /// bytes/duration over its bulk copies (parameter uploads, gradient downloads), or over its
  /// activation copies when there are none.
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;
  /// The chunk that activation waits are compared with; 0: the trace's
  /// "transfer_chunk_bytes" setting when > 0, else the largest parameter-upload copy. Give it
  /// explicitly to compare a run without chunking against the same chunk.
  double chunk_bytes = 0;
};

/// Per-worker statistics, ordered by worker index. Copies count toward latencies when issued
/// inside the window; busy times are clipped to it.
std::vector<WorkerStats> trace_stats(const Trace& t, const TraceStatsOptions& o = {});

/// Human-readable report (one block per worker).
std::string format_trace_stats(const Trace& t, const std::vector<WorkerStats>& s);
/// The same as JSON.
nlohmann::json trace_stats_json(const Trace& t, const std::vector<WorkerStats>& s);

}  // namespace rp
