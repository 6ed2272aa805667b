#include "trace/chrome_trace.hpp"

#include "base/atomic_file.hpp"
#include "base/json_text.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

namespace rp {
namespace {

/// "worker2" < "worker10": runs of digits compare by value, the rest byte by byte.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      const std::string da = a.substr(i, i2 - i), db = b.substr(j, j2 - j);
      const size_t za = da.find_first_not_of('0'), zb = db.find_first_not_of('0');
      const std::string va = za == std::string::npos ? "" : da.substr(za);
      const std::string vb = zb == std::string::npos ? "" : db.substr(zb);
      if (va.size() != vb.size()) return va.size() < vb.size();
      if (va != vb) return va < vb;
      i = i2;
      j = j2;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

std::string process_of(const std::string& track) {
  const size_t dot = track.find('.');
  return dot == std::string::npos ? std::string() : track.substr(0, dot);
}

/// A laid-out interval: whole nanoseconds and its lane.
struct Placed {
  int64_t b = 0, e = 0;
  int lane = 0;
};

/// Lanes of one track's intervals (indices into `placed`): each to the lowest lane whose last
/// interval ended at or before its start. Returns the number of lanes.
int assign_lanes(std::vector<Placed>& placed, std::vector<size_t> idx) {
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
    return std::tie(placed[x].b, placed[x].e) < std::tie(placed[y].b, placed[y].e);
  });
  std::vector<int64_t> lane_end;
  for (size_t i : idx) {
    size_t k = 0;
    while (k < lane_end.size() && lane_end[k] > placed[i].b) ++k;
    if (k == lane_end.size()) lane_end.push_back(0);
    lane_end[k] = placed[i].e;
    placed[i].lane = int(k);
  }
  return int(lane_end.size());
}

std::string lane_name(const std::string& track, int lane) {
  return lane == 0 ? track : fmt::format("{} #{}", track, lane + 1);
}

}  // namespace

namespace {
/// The members of a JSON text's top-level object with the kind of each value ('{' an object, '['
/// an array, 'v' anything else), read as the parser goes; `object` false for a text that is no
/// JSON object.
struct TopLevelMembers : nlohmann::json_sax<nlohmann::json> {
  std::map<std::string, char> members;
  bool object = false;
  int depth = 0;
  std::string at;  ///< the top-level key being read

  bool seen(char kind) {
    if (depth == 1) members[at] = kind;
    return depth > 0;  // a top-level value that is no object ends the parse
  }
  bool null() override { return seen('v'); }
  bool boolean(bool) override { return seen('v'); }
  bool number_integer(number_integer_t) override { return seen('v'); }
  bool number_unsigned(number_unsigned_t) override { return seen('v'); }
  bool number_float(number_float_t, const string_t&) override { return seen('v'); }
  bool string(string_t&) override { return seen('v'); }
  bool binary(binary_t&) override { return seen('v'); }
  bool start_object(std::size_t) override {
    if (depth == 0) object = true;
    else seen('{');
    ++depth;
    return true;
  }
  bool key(string_t& k) override {
    if (depth == 1) at = k;
    return true;
  }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override {
    if (!seen('[')) return false;
    ++depth;
    return true;
  }
  bool end_array() override { return --depth, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};
}  // namespace

bool is_written_trace(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  TopLevelMembers top;
  if (!in || !nlohmann::json::sax_parse(in, &top) || !top.object) return false;
  return top.members ==
         std::map<std::string, char>{{"traceEvents", '['}, {"displayTimeUnit", 'v'}, {"otherData", '{'}};
}

nlohmann::json read_trace_json(const std::string& path) {
  try {
    return parse_json_text(read_json_file(path), path);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
}

std::string base_track(const std::string& thread_name) {
  const size_t p = thread_name.rfind(" #");
  if (p == std::string::npos || p + 2 >= thread_name.size()) return thread_name;
  for (size_t k = p + 2; k < thread_name.size(); ++k)
    if (!std::isdigit(static_cast<unsigned char>(thread_name[k]))) return thread_name;
  return thread_name.substr(0, p);
}

nlohmann::json chrome_trace_json(const std::vector<TraceInterval>& intervals,
                                 const std::map<std::string, std::string>& info) {
  std::vector<Placed> placed(intervals.size());
  std::map<std::string, std::vector<size_t>> by_track;
  for (size_t i = 0; i < intervals.size(); ++i) {
    placed[i].b = std::llround(intervals[i].t0 * 1e9);
    placed[i].e = std::max(placed[i].b, int64_t(std::llround(intervals[i].t1 * 1e9)));
    by_track[intervals[i].track].push_back(i);
  }
  // processes and their tracks, in natural order
  std::map<std::string, int> lanes;
  for (auto& [track, idx] : by_track) lanes[track] = assign_lanes(placed, idx);
  std::vector<std::string> tracks;
  for (auto& [track, n] : lanes) tracks.push_back(track);
  std::stable_sort(tracks.begin(), tracks.end(), [](const std::string& x, const std::string& y) {
    const std::string px = process_of(x), py = process_of(y);
    if (px != py) return natural_less(px, py);
    return natural_less(x, y);
  });
  nlohmann::json evs = nlohmann::json::array();
  std::map<std::string, int> pid;
  std::map<std::pair<std::string, int>, int> tid;  // (track, lane) -> thread id
  for (const std::string& track : tracks) {
    const std::string proc = process_of(track);
    if (!pid.count(proc)) {
      const int p = int(pid.size()) + 1;
      pid[proc] = p;
      if (!proc.empty())
        evs.push_back(
            {{"ph", "M"}, {"name", "process_name"}, {"pid", p}, {"tid", 0}, {"args", {{"name", proc}}}});
    }
    for (int lane = 0; lane < lanes[track]; ++lane) {
      const int t = int(tid.size()) + 1;
      tid[{track, lane}] = t;
      evs.push_back({{"ph", "M"},
                     {"name", "thread_name"},
                     {"pid", pid[proc]},
                     {"tid", t},
                     {"args", {{"name", lane_name(track, lane)}}}});
    }
  }
  // slices by start, longer first, then by thread and recording order
  std::vector<size_t> order(intervals.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::vector<int> tid_of(intervals.size());
  for (size_t i = 0; i < intervals.size(); ++i) tid_of[i] = tid.at({intervals[i].track, placed[i].lane});
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return std::make_tuple(placed[x].b, -placed[x].e, tid_of[x]) <
           std::make_tuple(placed[y].b, -placed[y].e, tid_of[y]);
  });
  for (size_t i : order) {
    const TraceInterval& iv = intervals[i];
    nlohmann::json ev = {{"ph", "X"},
                         {"name", iv.label},
                         {"pid", pid.at(process_of(iv.track))},
                         {"tid", tid_of[i]},
                         {"ts", double(placed[i].b) / 1000.0},
                         {"dur", double(placed[i].e - placed[i].b) / 1000.0}};
    if (!iv.args.empty()) {
      nlohmann::json a = nlohmann::json::object();
      for (auto& [k, v] : iv.args) a[k] = v;
      ev["args"] = std::move(a);
    }
    const nlohmann::json where = {{"pid", ev["pid"]}, {"tid", ev["tid"]}, {"ts", ev["ts"]}};
    evs.push_back(std::move(ev));
    for (const auto& [flow, ph] : {std::pair{iv.flow_out, "s"}, std::pair{iv.flow_in, "f"}}) {
      if (flow < 0) continue;
      // label "send <type> -> <to>" / "recv <type> <- <from>": both ends are named <type>
      const size_t a = iv.label.find(' ') + 1, b = iv.label.find(' ', a);
      nlohmann::json f = {{"ph", ph}, {"cat", "message"}, {"name", iv.label.substr(a, b - a)}, {"id", flow}};
      f.update(where);
      if (*ph == 'f') f["bp"] = "e";
      evs.push_back(std::move(f));
    }
  }
  nlohmann::json other = nlohmann::json::object();
  for (auto& [k, v] : info) other[k] = v;
  return {{"traceEvents", std::move(evs)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

void write_trace_file(const std::string& path, const nlohmann::json& j) {
  write_file_atomically(path, [&](std::ostream& f) { f << j.dump() << '\n'; });
}

}  // namespace rp
