// Checks the Trace Event Format's rule for complete ("X") events: on one thread track
// (pid, tid) any two slices are nested or disjoint. A slice that partly overlaps another
// one on its track (a.start < b.start < a.end < b.end) is dropped or mis-nested by Perfetto.
//
// Times are compared as Perfetto keeps them: ts and dur (microseconds) each rounded to whole
// nanoseconds, end = ts + dur. Slices that only touch (a.end == b.start) are disjoint.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rp {

/// Two slices of one track that partly overlap (first starts earlier).
struct SliceOverlap {
  std::string track;          ///< thread name ("pid P tid T" without one)
  std::string first, second;  ///< slice names
  double first_start_us = 0, first_end_us = 0, second_start_us = 0, second_end_us = 0;
};

struct NestingReport {
  size_t slices = 0;              ///< complete events
  size_t tracks = 0;              ///< distinct (pid, tid) holding them
  size_t overlapping_slices = 0;  ///< slices partly overlapping at least one other on their track
  size_t overlapping_pairs = 0;
  std::vector<SliceOverlap> examples;  ///< the first pairs found, by track and start time
  bool ok() const { return overlapping_pairs == 0; }
  /// "N slices on M tracks, nested or disjoint" or the count plus the examples, one per line.
  std::string summary() const;
};

/// Checks a Chrome trace object. Keeps at most `max_examples` pairs. Throws
/// std::runtime_error when "traceEvents" is missing or a complete event lacks numeric ts/dur or
/// has a negative dur (complete_event_times).
NestingReport check_trace_nesting(const nlohmann::json& trace, size_t max_examples = 5);
/// The same for a trace file. Throws std::runtime_error naming the file.
NestingReport check_trace_nesting_file(const std::string& path, size_t max_examples = 5);

}  // namespace rp
