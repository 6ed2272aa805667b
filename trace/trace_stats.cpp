#include "trace/trace_stats.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <regex>
#include <stdexcept>

#include <fmt/format.h>

#include "base/error_text.hpp"
#include "base/json_fields.hpp"
#include "trace/chrome_trace.hpp"

namespace rp {
namespace {

using Iv = std::pair<double, double>;

/// Sorted, disjoint union of intervals.
std::vector<Iv> merge(std::vector<Iv> v) {
  std::sort(v.begin(), v.end());
  std::vector<Iv> out;
  for (auto& iv : v) {
    if (iv.second <= iv.first) continue;
    if (!out.empty() && iv.first <= out.back().second)
      out.back().second = std::max(out.back().second, iv.second);
    else out.push_back(iv);
  }
  return out;
}

double length(const std::vector<Iv>& u) {
  double s = 0;
  for (auto& iv : u) s += iv.second - iv.first;
  return s;
}

/// Length of the intersection of two unions (both from merge()).
double overlap(const std::vector<Iv>& a, const std::vector<Iv>& b) {
  double s = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) s += hi - lo;
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// The digits of a slice or track name as a number, or `fallback` when they are out of range
/// (a corrupted or foreign trace's name: never an exception without the file's name).
template <class T>
T number_of(const std::string& digits, T fallback) {
  T v{};
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  return ec == std::errc() && end == digits.data() + digits.size() ? v : fallback;
}

double bytes_of(const TraceSlice& s) {
  auto it = s.args.find("bytes");
  if (it != s.args.end()) return it->second;
  static const std::regex re(R"(copy (\d+) B)");
  std::smatch m;
  return std::regex_search(s.name, m, re) ? number_of(m[1].str(), 0.0) : 0.0;
}

double queued_of(const TraceSlice& s) {
  auto it = s.args.find("queued_us");
  return it == s.args.end() ? 0.0 : it->second * 1e-6;
}

int pass_of(const std::string& name) {
  static const std::regex re(R"(\(pass (\d+)\))");
  std::smatch m;
  return std::regex_search(name, m, re) ? number_of(m[1].str(), -1) : -1;
}

const char* kCopyStreams[] = {"act_up", "act_down", "param_up", "grad_down"};

}  // namespace

const nlohmann::json& trace_event(const nlohmann::json& events, size_t index) {
  const nlohmann::json& e = events[index];
  if (!e.is_object())
    throw std::runtime_error(
        fmt::format("traceEvents[{}]: expected an object (an event), got {}", index, excerpt(e.dump())));
  return e;
}

std::string event_string(const nlohmann::json& obj, const char* key, size_t index, const char* prefix) {
  std::string out;
  JsonFields(obj, fmt::format("traceEvents[{}]", index), prefix, JsonFields::Error::runtime_error)
      .optional(key, out);
  return out;
}

int64_t event_int(const nlohmann::json& e, const char* key, size_t index) {
  int64_t out = 0;
  JsonFields(e, fmt::format("traceEvents[{}]", index), "", JsonFields::Error::runtime_error)
      .optional(key, out);
  return out;
}

std::pair<double, double> complete_event_times(const nlohmann::json& e, size_t index) {
  if (!e.contains("ts") || !e.contains("dur") || !e["ts"].is_number() || !e["dur"].is_number())
    throw std::runtime_error(fmt::format(
        "traceEvents[{}]: a complete event (ph \"X\") without numeric ts/dur: {}", index, excerpt(e.dump())));
  const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
  if (dur < 0)
    throw std::runtime_error(
        fmt::format("traceEvents[{}]: key 'dur': expected a duration >= 0 (microseconds), got {}", index,
                    e["dur"].dump()));
  // times in nanoseconds must fit an int64 with room for ts + dur (the nesting check's unit)
  for (const auto& [key, v] : {std::pair{"ts", ts}, std::pair{"dur", dur}})
    if (!(std::fabs(v) <= kMaxTraceMicroseconds))
      throw std::runtime_error(fmt::format(
          "traceEvents[{}]: key '{}': expected microseconds within +-{:g} (about 127 years), got {}", index,
          key, kMaxTraceMicroseconds, excerpt(e[key].dump())));
  return {ts, dur};
}

Trace parse_trace(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    throw std::runtime_error("not a Chrome trace: no \"traceEvents\" array");
  Trace t;
  std::map<int64_t, std::string> names;
  const nlohmann::json& events = j["traceEvents"];
  for (size_t i = 0; i < events.size(); ++i) {
    const nlohmann::json& e = trace_event(events, i);
    if (event_string(e, "ph", i) == "M" && event_string(e, "name", i) == "thread_name" &&
        e.contains("args") && e["args"].is_object())
      names[event_int(e, "tid", i)] = event_string(e["args"], "name", i, "args.");
  }
  for (size_t i = 0; i < events.size(); ++i) {
    const nlohmann::json& e = events[i];
    if (event_string(e, "ph", i) != "X") continue;
    const auto [ts, dur] = complete_event_times(e, i);
    TraceSlice s;
    const int64_t tid = event_int(e, "tid", i);
    auto it = names.find(tid);
    s.track = it != names.end() ? base_track(it->second) : fmt::format("tid{}", tid);
    s.name = event_string(e, "name", i);
    s.t0 = ts * 1e-6;
    s.t1 = s.t0 + dur * 1e-6;
    if (e.contains("args") && e["args"].is_object())
      for (auto a = e["args"].begin(); a != e["args"].end(); ++a)
        if (a.value().is_number()) {
          const double v = a.value().get<double>();
          // the arguments summed into figures: bytes of a copy, queueing microseconds
          if ((a.key() == "bytes" || a.key() == "queued_us") && !(v >= 0 && v <= kMaxTraceArgument))
            throw std::runtime_error(
                fmt::format("traceEvents[{}]: key 'args.{}': expected a number from 0 to {:g}, got {}", i,
                            a.key(), kMaxTraceArgument, excerpt(a.value().dump())));
          s.args[a.key()] = v;
        }
    t.slices.push_back(std::move(s));
  }
  if (j.contains("otherData") && j["otherData"].is_object())
    for (auto a = j["otherData"].begin(); a != j["otherData"].end(); ++a)
      t.info[a.key()] = a.value().is_string() ? a.value().get<std::string>() : a.value().dump();
  return t;
}

Trace read_trace(const std::string& path) {
  const nlohmann::json j = read_trace_json(path);
  try {
    return parse_trace(j);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

Distribution distribution(std::vector<double> xs) {
  Distribution d;
  d.n = xs.size();
  if (xs.empty()) return d;
  std::sort(xs.begin(), xs.end());
  auto rank = [&](double p) {
    return xs[size_t(std::max(1.0, std::ceil(p / 100.0 * double(xs.size())))) - 1];
  };
  d.max = xs.back();
  d.p50 = rank(50);
  d.p99 = rank(99);
  double s = 0;
  for (double x : xs) s += x;
  d.mean = s / double(xs.size());
  return d;
}

namespace {

using Streams = std::map<std::string, std::vector<const TraceSlice*>>;  // one worker's, by stream

/// The analysed window [w0, w1] of a trace.
struct Window {
  double w0 = 0, w1 = 0;
  Iv clip(const TraceSlice& s) const { return {std::max(s.t0, w0), std::min(s.t1, w1)}; }
};

std::vector<const TraceSlice*> slices_of(const Streams& streams, const char* k) {
  auto it = streams.find(k);
  return it == streams.end() ? std::vector<const TraceSlice*>{} : it->second;
}

/// Compute busy time and utilisation, and per copy stream and over all copies the busy time
/// and its share hidden under compute, within the window.
void busy_times(const Streams& streams, const Window& w, WorkerStats& ws) {
  std::vector<Iv> comp_iv;
  for (auto* s : slices_of(streams, "compute")) comp_iv.push_back(w.clip(*s));
  const auto compute = merge(comp_iv);
  ws.compute_busy_s = length(compute);
  ws.utilisation = ws.wall_s > 0 ? ws.compute_busy_s / ws.wall_s : 0;
  std::vector<Iv> all_copies;
  for (const char* k : kCopyStreams) {
    auto ss = slices_of(streams, k);
    if (ss.empty()) continue;
    StreamStats st;
    std::vector<Iv> iv;
    for (auto* s : ss) {
      iv.push_back(w.clip(*s));
      if (s->t0 >= w.w0) {
        st.copies++;
        st.bytes += bytes_of(*s);
      }
    }
    all_copies.insert(all_copies.end(), iv.begin(), iv.end());
    const auto u = merge(iv);
    st.busy_s = length(u);
    st.hidden_s = overlap(u, compute);
    st.hidden_share = st.busy_s > 0 ? st.hidden_s / st.busy_s : 0;
    ws.streams[k] = st;
  }
  const auto cu = merge(all_copies);
  ws.copy_busy_s = length(cu);
  ws.copy_hidden_s = overlap(cu, compute);
  ws.hidden_share = ws.copy_busy_s > 0 ? ws.copy_hidden_s / ws.copy_busy_s : 0;
}

/// Link bandwidth of one direction: the median bytes/s of the `bulk` stream's copies, or of
/// the `act` stream's when there are none.
double estimate_bandwidth(const Streams& streams, const char* bulk, const char* act) {
  std::vector<double> r;
  for (const char* k : {bulk, act}) {
    for (auto* s : slices_of(streams, k))
      if (s->t1 > s->t0 && bytes_of(*s) > 0) r.push_back(bytes_of(*s) / (s->t1 - s->t0));
    if (!r.empty()) break;
  }
  return median(r);
}

/// The chunk activation waits are compared with (TraceStatsOptions::chunk_bytes).
double reference_chunk(const Trace& t, const Streams& streams, const TraceStatsOptions& o) {
  double chunk = o.chunk_bytes;
  if (chunk <= 0 && t.info.count("transfer_chunk_bytes")) {
    // the run's own setting, as the trace recorded it: a number of bytes, bounded as --chunk-bytes
    const std::string& v = t.info.at("transfer_chunk_bytes");
    const char* end = v.data() + v.size();
    const auto r = std::from_chars(v.data(), end, chunk);
    // (0: the run moved whole tensors, no chunks; the largest parameter copy stands in below)
    if (r.ec != std::errc() || r.ptr != end || !(chunk >= 0 && chunk <= kMaxTraceArgument))
      throw std::runtime_error(fmt::format(
          "otherData: key 'transfer_chunk_bytes': expected a number of bytes from 0 to {:g}, got {}",
          kMaxTraceArgument, excerpt(v)));
  }
  if (chunk <= 0)
    for (auto* s : slices_of(streams, "param_up")) chunk = std::max(chunk, bytes_of(*s));
  return chunk;
}

/// Waits of stream k's copies issued in the window (WorkerStats::act_up_wait), at bandwidth
/// `bw`; their latencies and queueing times go to `lat` and `q` when given.
std::vector<double> copy_waits(const Streams& streams, const char* k, double bw, double w0,
                               std::vector<double>* lat, std::vector<double>* q) {
  std::vector<double> wv;
  auto ss = slices_of(streams, k);
  std::sort(ss.begin(), ss.end(), [](auto* a, auto* b) { return a->t1 < b->t1; });
  double prev_done = -std::numeric_limits<double>::infinity();
  for (auto* s : ss) {
    const double enq = s->t0 - queued_of(*s), latency = s->t1 - enq;
    const double start = std::max(enq, prev_done);  // the stream's previous activation copy is done
    prev_done = s->t1;
    if (s->t0 < w0) continue;
    const double own = bw > 0 ? bytes_of(*s) / bw : 0;
    wv.push_back(std::max(0.0, s->t1 - start - own));
    if (lat) lat->push_back(latency);
    if (q) q->push_back(queued_of(*s));
  }
  return wv;
}

}  // namespace

std::vector<WorkerStats> trace_stats(const Trace& t, const TraceStatsOptions& o) {
  Window win{std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  for (auto& s : t.slices) {
    win.w1 = std::max(win.w1, s.t1);
    if (o.skip_passes <= 0 || pass_of(s.name) >= o.skip_passes) win.w0 = std::min(win.w0, s.t0);
  }
  if (!(win.w0 < win.w1)) return {};

  // slices by worker and stream
  std::map<int, Streams> by;
  static const std::regex track_re(R"(worker(\d+)\.(\w+))");
  for (auto& s : t.slices) {
    std::smatch m;
    // a worker number past int's range is no worker of ours: its track is left out
    if (std::regex_match(s.track, m, track_re) && number_of(m[1].str(), -1) >= 0)
      by[number_of(m[1].str(), -1)][m[2]].push_back(&s);
  }
  std::vector<WorkerStats> out;
  for (auto& [w, streams] : by) {
    WorkerStats ws;
    ws.worker = fmt::format("worker{}", w);
    ws.wall_s = win.w1 - win.w0;
    busy_times(streams, win, ws);
    ws.h2d_bytes_per_s =
        o.h2d_bytes_per_s > 0 ? o.h2d_bytes_per_s : estimate_bandwidth(streams, "param_up", "act_up");
    ws.d2h_bytes_per_s =
        o.d2h_bytes_per_s > 0 ? o.d2h_bytes_per_s : estimate_bandwidth(streams, "grad_down", "act_down");
    ws.chunk_bytes = reference_chunk(t, streams, o);
    ws.chunk_s = ws.h2d_bytes_per_s > 0 ? ws.chunk_bytes / ws.h2d_bytes_per_s : 0;
    std::vector<double> lat, q;
    auto up = copy_waits(streams, "act_up", ws.h2d_bytes_per_s, win.w0, &lat, &q);
    ws.act_up_latency = distribution(lat);
    ws.act_up_queued = distribution(q);
    ws.act_up_wait = distribution(up);
    for (double x : up)
      if (x > ws.chunk_s) ws.act_up_waits_over_chunk++;
    ws.act_down_wait =
        distribution(copy_waits(streams, "act_down", ws.d2h_bytes_per_s, win.w0, nullptr, nullptr));
    out.push_back(std::move(ws));
  }
  return out;
}

namespace {
std::string ms(const Distribution& d) {
  return fmt::format("n {:5}  max {:8.3f}  p50 {:8.3f}  p99 {:8.3f} ms", d.n, d.max * 1e3, d.p50 * 1e3,
                     d.p99 * 1e3);
}
nlohmann::json dist_json(const Distribution& d) {
  return {{"n", d.n}, {"max_s", d.max}, {"p50_s", d.p50}, {"p99_s", d.p99}, {"mean_s", d.mean}};
}
}  // namespace

std::string format_trace_stats(const Trace& t, const std::vector<WorkerStats>& s) {
  std::string out;
  if (!t.info.empty()) {
    out += "settings:";
    for (auto& [k, v] : t.info) out += fmt::format(" {}={}", k, v);
    out += "\n";
  }
  for (auto& w : s) {
    out += fmt::format("{}: window {:.3f} s, compute busy {:.3f} s, utilisation {:.1f}%\n", w.worker,
                       w.wall_s, w.compute_busy_s, 100 * w.utilisation);
    out += fmt::format("  copies: busy {:.3f} s, hidden under compute {:.3f} s = {:.1f}%\n", w.copy_busy_s,
                       w.copy_hidden_s, 100 * w.hidden_share);
    for (auto& [k, st] : w.streams)
      out += fmt::format("  {:<9} {:6} copies {:10.1f} MiB  busy {:8.3f} s  hidden {:5.1f}%\n", k, st.copies,
                         st.bytes / double(1 << 20), st.busy_s, 100 * st.hidden_share);
    out += fmt::format("  link: h2d {:.2f} GB/s, d2h {:.2f} GB/s; one chunk {:.1f} MiB = {:.3f} ms\n",
                       w.h2d_bytes_per_s * 1e-9, w.d2h_bytes_per_s * 1e-9, w.chunk_bytes / double(1 << 20),
                       w.chunk_s * 1e3);
    out += "  act_up latency  " + ms(w.act_up_latency) + "\n";
    out += "  act_up queued   " + ms(w.act_up_queued) + "\n";
    out += "  act_up wait     " + ms(w.act_up_wait) +
           fmt::format("  ({} longer than one chunk)\n", w.act_up_waits_over_chunk);
    out += "  act_down wait   " + ms(w.act_down_wait) + "\n";
  }
  return out;
}

nlohmann::json trace_stats_json(const Trace& t, const std::vector<WorkerStats>& s) {
  nlohmann::json ws = nlohmann::json::array();
  for (auto& w : s) {
    nlohmann::json streams = nlohmann::json::object();
    for (auto& [k, st] : w.streams)
      streams[k] = {{"copies", st.copies},
                    {"bytes", st.bytes},
                    {"busy_s", st.busy_s},
                    {"hidden_share", st.hidden_share}};
    ws.push_back({{"worker", w.worker},
                  {"wall_s", w.wall_s},
                  {"compute_busy_s", w.compute_busy_s},
                  {"utilisation", w.utilisation},
                  {"copy_busy_s", w.copy_busy_s},
                  {"hidden_share", w.hidden_share},
                  {"streams", streams},
                  {"h2d_bytes_per_s", w.h2d_bytes_per_s},
                  {"d2h_bytes_per_s", w.d2h_bytes_per_s},
                  {"chunk_bytes", w.chunk_bytes},
                  {"chunk_s", w.chunk_s},
                  {"act_up_latency", dist_json(w.act_up_latency)},
                  {"act_up_queued", dist_json(w.act_up_queued)},
                  {"act_up_wait", dist_json(w.act_up_wait)},
                  {"act_up_waits_over_chunk", w.act_up_waits_over_chunk},
                  {"act_down_wait", dist_json(w.act_down_wait)}});
  }
  nlohmann::json info = nlohmann::json::object();
  for (auto& [k, v] : t.info) info[k] = v;
  return {{"settings", info}, {"workers", ws}};
}

}  // namespace rp
