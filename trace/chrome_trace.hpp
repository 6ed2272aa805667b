// Chrome trace-event JSON (opens in Perfetto and chrome://tracing) from recorded intervals.
//
// The Trace Event Format requires the complete ("X") events of one thread track to be nested
// or disjoint; Perfetto drops a slice that partly overlaps another one on its track. Two
// intervals of one stream can partly overlap (a transfer actor keeps two copies in flight,
// each traced from issue to completion; a prefetched stage task starts before the previous
// one is done), so the writer lays each track out over numbered lanes:
//  - times are rounded to whole nanoseconds (what Perfetto keeps) before the layout, and
//    written as microseconds with three decimals, so the file shows exactly what was laid out;
//  - the intervals of one track, in order of (start, end, recording order), each go to the
//    lowest lane whose last interval has ended: every lane holds disjoint slices, and as few
//    lanes as the track's largest number of intervals open at once;
//  - lane 1 keeps the track's name, lane k > 1 is called "<track> #k" (base_track() undoes it);
//  - a track "<process>.<stream>" (e.g. "worker0.act_up") is a thread of process "<process>"
//    (one process per worker, in natural order: worker2 before worker10); a track without a
//    dot belongs to a nameless process. Processes and threads are numbered in sorted order,
//    thread ids are unique over the whole file.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace rp {

/// One recorded interval: [t0, t1] seconds (any common origin) on track `track`, shown with
/// `label` and numeric `args` (Chrome trace "args", e.g. {"bytes", 1048576}).
struct TraceInterval {
  std::string track, label;
  double t0 = 0, t1 = 0;
  std::vector<std::pair<std::string, double>> args;
  /// Flow arrows (a protocol message from the slice with flow_out = k to the one with
  /// flow_in = k): written as flow events "s" / "f" (cat "message", id k) bound to the slice.
  int64_t flow_out = -1, flow_in = -1;
};

/// The Chrome trace object: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": info}.
/// An interval with t1 < t0 is written with zero duration. An interval with a flow id is
/// followed by its flow event (same pid, tid and ts; the end binds to its enclosing slice,
/// "bp": "e"), so Perfetto draws an arrow from the sending slice to the receiving one.
nlohmann::json chrome_trace_json(const std::vector<TraceInterval>& intervals,
                                 const std::map<std::string, std::string>& info = {});

/// Writes `j` to `path` through a temporary file and a rename (base/atomic_file.hpp), so readers never see a
/// partial file. Throws std::runtime_error("<path>: ...").
void write_trace_file(const std::string& path, const nlohmann::json& j);

/// Whether the file `path` is a trace as write_trace_file writes chrome_trace_json's (`plan
/// --trace`, a run's trace.json): a JSON object of exactly traceEvents (an array),
/// displayTimeUnit and otherData (an object). Read without building the document (a trace can be
/// large); false for anything else, an unreadable file included.
bool is_written_trace(const std::string& path);

/// Reads and parses a JSON file (a trace). Throws std::runtime_error with one line naming it
/// when the file cannot be opened or is not JSON ("<path>:<line>:<column>: invalid JSON: ...",
/// base/json_text.hpp).
nlohmann::json read_trace_json(const std::string& path);

/// The track a thread name belongs to: "worker0.act_up #2" -> "worker0.act_up"; other names
/// are returned unchanged.
std::string base_track(const std::string& thread_name);

}  // namespace rp
