#include "actors/tracer.hpp"

#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace rp {

void Tracer::interval(const std::string& track, std::string label, double t_begin, double t_end) {
  std::lock_guard lk(mu_);
  events_.push_back({track, std::move(label), t_begin, t_end});
}

size_t Tracer::size() const {
  std::lock_guard lk(mu_);
  return events_.size();
}

void Tracer::write(const std::string& path) const {
  std::lock_guard lk(mu_);
  nlohmann::json evs = nlohmann::json::array();
  std::map<std::string, int> tid;
  for (auto& e : events_) tid.emplace(e.track, 0);
  int n = 0;
  for (auto& [k, v] : tid) {
    v = ++n;
    evs.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", v}, {"args", {{"name", k}}}});
  }
  for (auto& e : events_)
    evs.push_back({{"ph", "X"}, {"name", e.label}, {"pid", 1}, {"tid", tid[e.track]},
                   {"ts", e.t0 * 1e6}, {"dur", (e.t1 - e.t0) * 1e6}});
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw std::runtime_error(path + ": cannot write trace");
    f << nlohmann::json{{"traceEvents", evs}, {"displayTimeUnit", "ms"}}.dump();
    if (!f) throw std::runtime_error(path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": rename failed");
}

}  // namespace rp
