// Reads traces written by the runtime (SessionOptions::trace, bench_throughput --trace,
// `roundpipe train` with "trace": true) and prints per worker: compute-stream utilisation,
// activation-upload waits (max, p50, p99) against one parameter chunk's time, the share of
// copy time hidden under compute, and bytes per stream (actors/trace_stats.hpp defines each).
//
//   bench_trace_stats TRACE.json [TRACE2.json ...] [--skip-passes N] [--h2d-gbps X]
//                     [--d2h-gbps X] [--chunk-bytes N] [--json OUT.json]
// Exit code 1 when a trace cannot be read, 2 on usage errors.
// A bench tool rather than a `roundpipe` subcommand: it reads benchmark traces and travels in
// the GPU bundle next to bench_throughput (device_session.sh DO_PRIO=1); the analysis is a
// library (actors/trace_stats.hpp) that tests use too and a subcommand could call later.
#include <cstdio>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "actors/trace_stats.hpp"

int main(int argc, char** argv) {
  CLI::App app{"RoundPipe trace statistics"};
  std::vector<std::string> paths;
  std::string json_out;
  rp::TraceStatsOptions o;
  double h2d = 0, d2h = 0;
  app.add_option("traces", paths, "trace JSON files")->required();
  app.add_option("--skip-passes", o.skip_passes, "start the window at the first slice of this pass (warm-up out)");
  app.add_option("--h2d-gbps", h2d, "host-to-device GB/s for the waits (0: estimate from the bulk copies)");
  app.add_option("--d2h-gbps", d2h, "device-to-host GB/s (0: estimate)");
  app.add_option("--chunk-bytes", o.chunk_bytes,
                 "compare activation waits with this chunk (0: the trace's transfer_chunk_bytes, else its "
                 "largest parameter copy)");
  app.add_option("--json", json_out, "also write the statistics of every trace as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  o.h2d_bytes_per_s = h2d * 1e9;
  o.d2h_bytes_per_s = d2h * 1e9;
  nlohmann::json all = nlohmann::json::object();
  for (auto& p : paths) {
    try {
      rp::Trace t = rp::read_trace(p);
      auto s = rp::trace_stats(t, o);
      std::printf("== %s\n%s", p.c_str(), rp::format_trace_stats(t, s).c_str());
      if (s.empty()) std::printf("  (no worker slices in the window)\n");
      all[p] = rp::trace_stats_json(t, s);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_trace_stats: error: %s\n", e.what());
      return 1;
    }
  }
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << all.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "bench_trace_stats: error: %s: write failed\n", json_out.c_str());
      return 1;
    }
  }
  return 0;
}
