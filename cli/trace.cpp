#include "cli/trace.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/atomic_file.hpp"
#include "base/error_text.hpp"
#include "base/output_folder.hpp"
#include "base/utf8.hpp"
#include "cli/command.hpp"
#include "trace/chrome_trace.hpp"
#include "trace/trace_check.hpp"
#include "trace/trace_stats.hpp"

namespace rp {

namespace {
/// Whether `path` holds statistics as --json writes them: a JSON object (at most 64 MiB) of one
/// member per trace, each an object of exactly settings, workers and tracks.
bool is_trace_stats_file(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > (uint64_t(64) << 20)) return false;
  std::ifstream in(path, std::ios::binary);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || j.empty()) return false;
  for (const auto& [name, stats] : j.items())
    if (!stats.is_object() || stats.size() != 3 || !stats.contains("settings") ||
        !stats.contains("workers") || !stats.contains("tracks"))
      return false;
  return true;
}
}  // namespace

void run_trace(const TraceCommandOptions& o, std::FILE* out) {
  TraceStatsOptions so;
  so.skip_passes = o.skip_passes;
  so.chunk_bytes = o.chunk_bytes;
  so.h2d_bytes_per_s = o.h2d_gbps * 1e9;
  so.d2h_bytes_per_s = o.d2h_gbps * 1e9;
  // before reading anything: --json naming one of the traces replaced it with the statistics
  if (const std::string in = o.json_out.empty() ? std::string() : overlapping_input(o.json_out, o.files);
      !in.empty())
    throw UsageError(fmt::format(
        "--json: '{}' is or lies inside the input '{}', which writing it would destroy; choose another file",
        o.json_out, in));
  if (!o.json_out.empty())
    check_new_output_file(o.json_out, "--json", o.force,
                          {"statistics written by roundpipe trace --json", is_trace_stats_file});
  nlohmann::json all = nlohmann::json::object();
  for (const std::string& path : o.files) {
    const nlohmann::json j = read_trace_json(path);
    Trace t;
    NestingReport nest;
    try {
      t = parse_trace(j);
      nest = check_trace_nesting(j);
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ": " + e.what());
    }
    const std::vector<WorkerStats> s = trace_stats(t, so);
    fmt::print(out, "== {}\n{}", path, format_trace_stats(t, s));
    if (s.empty()) fmt::print(out, "  (no worker slices in the window)\n");
    fmt::print(out, "tracks: {}\n", nest.summary());
    if (!nest.ok())
      fmt::print(out,
                 "  (Perfetto drops such slices; traces written by this version give overlapping "
                 "intervals of one stream lanes of their own)\n");
    nlohmann::json js = trace_stats_json(t, s);
    js["tracks"] = {{"slices", nest.slices},
                    {"tracks", nest.tracks},
                    {"overlapping_slices", nest.overlapping_slices},
                    {"overlapping_pairs", nest.overlapping_pairs}};
    // keyed by the name as given; one that is not UTF-8 (JSON holds nothing else: dump() threw a
    // type_error naming no file) with those bytes written \xNN
    all[valid_utf8_prefix(path) == path.size() ? path : excerpt(path, path.size())] = std::move(js);
  }
  if (!o.json_out.empty())  // a failed write leaves no half-written file
    write_file_atomically(o.json_out, [&](std::ostream& f) { f << all.dump(2) << "\n"; });
}

void add_trace_command(CLI::App& app) {
  auto o = std::make_shared<TraceCommandOptions>();
  auto* c = app.add_subcommand("trace", "statistics of runtime traces, and a check of their track layout");
  c->add_option("files", o->files, "trace JSON files")->required();
  c->add_option("--skip-passes", o->skip_passes,
                "start the window at the first slice of this pass (warm-up out)")
      ->check(integer_check(0));
  c->add_option("--chunk-bytes", o->chunk_bytes,
                "compare activation waits with this chunk (0: the trace's transfer_chunk_bytes, else its "
                "largest parameter copy)")
      ->check(zero_or_range_check(1, 1e15, "0 (the trace's) or 1 to 1e15 bytes"));
  c->add_option("--h2d-gbps", o->h2d_gbps,
                "host-to-device GB/s for the waits (0: estimate from the bulk copies)")
      ->check(zero_or_range_check(1e-3, 1e6, "0 (estimate) or a rate from 0.001 to 1e6 GB/s"));
  c->add_option("--d2h-gbps", o->d2h_gbps, "device-to-host GB/s (0: estimate)")
      ->check(zero_or_range_check(1e-3, 1e6, "0 (estimate) or a rate from 0.001 to 1e6 GB/s"));
  c->add_option("--json", o->json_out,
                "also write the statistics of every trace as JSON (an existing file needs --force)");
  c->add_flag("--force", o->force, "with --json: replace an existing file");
  c->callback(reporting_errors([o] { run_trace(*o, stdout); }));
}

}  // namespace rp
