#include "trace/tracer.hpp"

#include <string>

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

namespace {
// Marker slices of a message: 1 us long, so the flow events bind to them.
constexpr double kMarker = 1e-6;

std::string identity(const std::string& type, const Tracer::MessageKey& key) {
  std::string s = type;
  for (auto& [k, v] : key) s += "," + k + "=" + std::to_string(v);
  return s;
}

std::vector<std::pair<std::string, double>> args_of(const Tracer::MessageKey& key) {
  std::vector<std::pair<std::string, double>> a;
  for (auto& [k, v] : key) a.emplace_back(k, double(v));
  return a;
}
}  // namespace

void Tracer::sent(const std::string& from, const std::string& to, const std::string& type,
                  const MessageKey& key) {
  const double t = now();
  std::lock_guard lk(mu_);
  const int64_t id = next_flow_++;
  in_flight_[identity(type, key)].push_back(id);
  TraceInterval iv{from + ".messages", "send " + type + " -> " + to, t, t + kMarker, args_of(key)};
  iv.flow_out = id;
  events_.push_back(std::move(iv));
}

void Tracer::received(const std::string& to, const std::string& from, const std::string& type,
                      const MessageKey& key) {
  const double t = now();
  std::lock_guard lk(mu_);
  TraceInterval iv{to + ".messages", "recv " + type + (from.empty() ? "" : " <- " + from), t, t + kMarker,
                   args_of(key)};
  auto it = in_flight_.find(identity(type, key));
  if (it != in_flight_.end()) {
    iv.flow_in = it->second.front();
    it->second.erase(it->second.begin());
    if (it->second.empty()) in_flight_.erase(it);
  }
  events_.push_back(std::move(iv));
}

size_t Tracer::messages_in_flight() const {
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (auto& [k, v] : in_flight_) n += v.size();
  return n;
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
  nlohmann::json j;
  {
    std::lock_guard lk(mu_);
    j = chrome_trace_json(events_, info_);
  }
  write_trace_file(path, j);
}

}  // namespace rp
