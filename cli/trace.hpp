// `roundpipe trace FILE...`: reads runtime traces (SessionOptions::trace, `roundpipe train`
// with "trace": true, bench_throughput --trace) and prints per worker the compute-stream
// utilisation, activation-upload waits against one parameter chunk's time, the share of copy
// time hidden under compute and the bytes per stream (trace/trace_stats.hpp defines each), and
// whether every track's slices are nested or disjoint as Perfetto requires
// (trace/trace_check.hpp). See docs/architecture.md, "Traces".
#pragma once
#include <cstdio>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace rp {

struct TraceCommandOptions {
  std::vector<std::string> files;     ///< trace JSON files
  int skip_passes = 0;                ///< leave passes < N (warm-up) out of the statistics
  double chunk_bytes = 0;             ///< reference chunk for activation waits (0: from the trace)
  double h2d_gbps = 0, d2h_gbps = 0;  ///< link GB/s for the waits (0: estimated from the trace)
  std::string json_out;               ///< also write the statistics of every file as JSON
  bool force = false;                 ///< --force: json_out may replace an existing file
};

/// Registers the `trace` subcommand on `app`; it runs from its callback, prints errors as one
/// line "roundpipe: error: ..." and then exits with code 1 (CLI::RuntimeError).
void add_trace_command(CLI::App& app);

/// Prints the report of every file to `out` and writes o.json_out when given: an object keyed
/// by file, each holding trace_stats_json plus "tracks" (the nesting check's counts). Throws
/// std::runtime_error naming the file that cannot be read or written.
void run_trace(const TraceCommandOptions& o, std::FILE* out);

}  // namespace rp
