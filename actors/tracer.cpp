#include "actors/tracer.hpp"

#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace rp {

void Tracer::interval(const std::string& track, std::string label, double t_begin, double t_end) {
  std::lock_guard lk(mu_);
  events_.push_back({track, std::move(label), t_begin, t_end, {}});
}

void Tracer::interval(const std::string& track, std::string label, double t_begin, double t_end,
                      std::vector<std::pair<std::string, double>> args) {
  std::lock_guard lk(mu_);
  events_.push_back({track, std::move(label), t_begin, t_end, std::move(args)});
}

void Tracer::set_info(const std::string& key, std::string value) {
  std::lock_guard lk(mu_);
  info_[key] = std::move(value);
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
  for (auto& e : events_) {
    nlohmann::json ev = {{"ph", "X"}, {"name", e.label}, {"pid", 1}, {"tid", tid[e.track]},
                         {"ts", e.t0 * 1e6}, {"dur", (e.t1 - e.t0) * 1e6}};
    if (!e.args.empty()) {
      nlohmann::json a = nlohmann::json::object();
      for (auto& [k, v] : e.args) a[k] = v;
      ev["args"] = std::move(a);
    }
    evs.push_back(std::move(ev));
  }
  nlohmann::json other = nlohmann::json::object();
  for (auto& [k, v] : info_) other[k] = v;
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw std::runtime_error(path + ": cannot write trace");
    f << nlohmann::json{{"traceEvents", evs}, {"displayTimeUnit", "ms"}, {"otherData", other}}.dump();
    if (!f) throw std::runtime_error(path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": rename failed");
}

}  // namespace rp
