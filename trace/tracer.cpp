#include "trace/tracer.hpp"

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
  nlohmann::json j;
  {
    std::lock_guard lk(mu_);
    j = chrome_trace_json(events_, info_);
  }
  write_trace_file(path, j);
}

}  // namespace rp
