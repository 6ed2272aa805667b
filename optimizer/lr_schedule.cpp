// Learning-rate schedules (see lr_schedule.hpp).
#include "optimizer/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/json_fields.hpp"

namespace rp {

void LrSchedule::validate() const {
  auto fail = [](const std::string& msg) { throw std::invalid_argument("schedule." + msg); };
  if (kind != "constant" && kind != "linear" && kind != "cosine")
    fail(fmt::format("kind: unknown schedule '{}' (valid: constant, linear, cosine)", kind));
  if (!(lr >= 0) || !std::isfinite(lr)) fail(fmt::format("lr: {} (need a finite value >= 0)", lr));
  if (!(min_lr >= 0) || !(min_lr <= lr))
    fail(fmt::format("min_lr: {} (need 0 <= min_lr <= lr = {})", min_lr, lr));
  if (warmup_steps < 0) fail(fmt::format("warmup_steps: {} is negative", warmup_steps));
  if (kind != "constant") {
    if (total_steps <= 0)
      fail(fmt::format("total_steps: {} (a {} schedule needs total_steps > 0)", total_steps, kind));
    // named by warmup_steps: total_steps is the run's length, the warmup the likelier slip
    if (total_steps < warmup_steps)
      fail(fmt::format("warmup_steps: expected at most total_steps ({}), got {}", total_steps, warmup_steps));
  } else if (total_steps < 0) {
    fail(fmt::format("total_steps: {} is negative", total_steps));
  } else if (total_steps > 0 && total_steps < warmup_steps) {  // 0: a constant lr without a known end
    // the warmup ramps a constant schedule too: a run shorter than it never reaches lr
    fail(fmt::format("warmup_steps: expected at most total_steps ({}), got {}", total_steps, warmup_steps));
  }
}

double LrSchedule::at(int64_t step) const {
  const int64_t t = std::max<int64_t>(step, 0);
  if (t < warmup_steps) return lr * double(t) / double(std::max<int64_t>(1, warmup_steps));
  if (kind == "constant") return lr;
  const double span = double(std::max<int64_t>(1, total_steps - warmup_steps));
  const double p = std::clamp(double(t - warmup_steps) / span, 0.0, 1.0);
  const double f = kind == "linear" ? 1.0 - p : 0.5 * (1.0 + std::cos(std::numbers::pi * p));
  return min_lr + (lr - min_lr) * f;
}

LrSchedule LrSchedule::from_json(const nlohmann::json& j, const std::string& where) {
  auto fail = [&](const std::string& key, const std::string& msg) {
    throw std::invalid_argument(fmt::format("{}.{}: {}", where, key, msg));
  };
  if (!j.is_object())
    throw std::invalid_argument(fmt::format(
        "{}: expected an object with kind, lr, min_lr, warmup_steps, total_steps, got {}", where, j.dump()));
  static const std::set<std::string> keys = {"kind", "lr", "min_lr", "warmup_steps", "total_steps"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!keys.count(it.key()))
      fail(it.key(), fmt::format("unknown key{} (valid: kind, lr, min_lr, warmup_steps, total_steps)",
                                 did_you_mean(it.key(), keys, where + ".")));
  auto number = [&](const char* key) {
    const auto& v = j.at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      fail(key, fmt::format("expected a finite number >= 0, got {}", v.dump()));
    return v.get<double>();
  };
  auto count = [&](const char* key) {
    const auto& v = j.at(key);
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
    // accept integral floats such as 1e4, refuse fractions and negatives
    if (v.is_number_float() && v.get<double>() >= 0 && v.get<double>() < 9.2e18 &&
        std::floor(v.get<double>()) == v.get<double>())
      return int64_t(v.get<double>());
    fail(key, fmt::format("expected a non-negative integer, got {}", v.dump()));
    return int64_t(0);
  };
  LrSchedule s;
  if (j.contains("kind")) {
    if (!j["kind"].is_string()) fail("kind", fmt::format("expected a string, got {}", j["kind"].dump()));
    s.kind = j["kind"].get<std::string>();
    if (s.kind != "constant" && s.kind != "linear" && s.kind != "cosine")
      fail("kind", fmt::format("unknown schedule '{}' (valid: constant, linear, cosine)", s.kind));
  }
  if (!j.contains("lr")) fail("lr", "missing (required)");
  s.lr = number("lr");
  if (j.contains("min_lr")) s.min_lr = number("min_lr");
  if (j.contains("warmup_steps")) s.warmup_steps = count("warmup_steps");
  if (j.contains("total_steps")) s.total_steps = count("total_steps");
  try {
    s.validate();
  } catch (const std::invalid_argument& e) {
    // re-anchor "schedule.<key>: ..." at the caller's location
    std::string msg = e.what();
    throw std::invalid_argument(where + msg.substr(std::string("schedule").size()));
  }
  return s;
}

}  // namespace rp
