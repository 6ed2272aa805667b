#include "trace/trace_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "trace/chrome_trace.hpp"
#include "trace/trace_stats.hpp"

namespace rp {
namespace {

using TrackKey = std::pair<int64_t, int64_t>;  // (pid, tid)

struct Slice {
  int64_t b = 0, e = 0;  // nanoseconds
  size_t index = 0;      // among the trace's complete events
};

int64_t to_ns(double us) { return std::llround(us * 1000.0); }

}  // namespace

std::string NestingReport::summary() const {
  if (ok()) return fmt::format("{} slices on {} tracks, nested or disjoint", slices, tracks);
  std::string s = fmt::format("{} of {} slices partly overlap another slice on their track ({} pairs)",
                              overlapping_slices, slices, overlapping_pairs);
  for (auto& x : examples)
    s += fmt::format("\n  {}: '{}' [{:.3f}, {:.3f}] us and '{}' [{:.3f}, {:.3f}] us", x.track, x.first,
                     x.first_start_us, x.first_end_us, x.second, x.second_start_us, x.second_end_us);
  return s;
}

NestingReport check_trace_nesting(const nlohmann::json& trace, size_t max_examples) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    throw std::runtime_error("not a Chrome trace: no \"traceEvents\" array");
  std::map<TrackKey, std::string> names;
  std::map<TrackKey, std::vector<Slice>> tracks;
  std::vector<std::string> slice_name;
  for (size_t i = 0; i < trace["traceEvents"].size(); ++i) {
    const nlohmann::json& e = trace_event(trace["traceEvents"], i);
    const TrackKey key{event_int(e, "pid", i), event_int(e, "tid", i)};
    const std::string ph = event_string(e, "ph", i);
    if (ph == "M" && event_string(e, "name", i) == "thread_name" && e.contains("args") &&
        e["args"].is_object())
      names[key] = event_string(e["args"], "name", i, "args.");
    if (ph != "X") continue;
    const auto [ts, dur] = complete_event_times(e, i);
    const int64_t b = to_ns(ts);
    tracks[key].push_back({b, b + to_ns(dur), slice_name.size()});
    slice_name.push_back(event_string(e, "name", i));
  }
  NestingReport r;
  r.slices = slice_name.size();
  r.tracks = tracks.size();
  std::set<size_t> bad;
  for (auto& [key, v] : tracks) {
    // by start, longer first: an interval nests in an earlier one or overlaps it partly
    std::sort(v.begin(), v.end(), [](const Slice& x, const Slice& y) {
      return x.b != y.b ? x.b < y.b : x.e != y.e ? x.e > y.e : x.index < y.index;
    });
    // the slices whose end lies after the current start, by end: those ending before the current
    // slice's end are the ones it partly overlaps (any open slice starts no later than it, and one
    // starting with it is no shorter), so each slice costs log n plus its overlaps, where a scan of
    // every open slice made stacked or repeated slices quadratic (300,000: minutes)
    std::multimap<int64_t, const Slice*> open;
    for (const Slice& s : v) {
      open.erase(open.begin(), open.upper_bound(s.b));
      for (auto it = open.begin(); it != open.end() && it->first < s.e; ++it) {
        const Slice* o = it->second;
        ++r.overlapping_pairs;
        bad.insert(o->index);
        bad.insert(s.index);
        if (r.examples.size() < max_examples) {
          auto nm = names.find(key);
          r.examples.push_back(
              {nm != names.end() ? nm->second : fmt::format("pid {} tid {}", key.first, key.second),
               slice_name[o->index], slice_name[s.index], o->b / 1e3, o->e / 1e3, s.b / 1e3, s.e / 1e3});
        }
      }
      open.emplace(s.e, &s);
    }
  }
  r.overlapping_slices = bad.size();
  return r;
}

NestingReport check_trace_nesting_file(const std::string& path, size_t max_examples) {
  const nlohmann::json j = read_trace_json(path);
  try {
    return check_trace_nesting(j, max_examples);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

}  // namespace rp
