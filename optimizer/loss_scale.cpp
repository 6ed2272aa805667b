#include "optimizer/loss_scale.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <istream>
#include <ostream>
#include <stdexcept>

#include <fmt/format.h>

#include "base/checksum.hpp"
#include "optimizer/clip.hpp"

namespace rp {
namespace {
// "RPLSCAL1" was the same record with an FNV-1a checksum
constexpr char kMagic[8] = {'R', 'P', 'L', 'S', 'C', 'A', 'L', '2'};

struct Record {  // serialised field by field, little-endian
  float scale, growth, backoff;
  int64_t interval, tracker, skipped, applied;
};
constexpr size_t kRecordBytes = 3 * 4 + 4 * 8;

void pack(const Record& r, unsigned char* b) {
  std::memcpy(b, &r.scale, 4);
  std::memcpy(b + 4, &r.growth, 4);
  std::memcpy(b + 8, &r.backoff, 4);
  std::memcpy(b + 12, &r.interval, 8);
  std::memcpy(b + 20, &r.tracker, 8);
  std::memcpy(b + 28, &r.skipped, 8);
  std::memcpy(b + 36, &r.applied, 8);
}
Record unpack(const unsigned char* b) {
  Record r;
  std::memcpy(&r.scale, b, 4);
  std::memcpy(&r.growth, b + 4, 4);
  std::memcpy(&r.backoff, b + 8, 4);
  std::memcpy(&r.interval, b + 12, 8);
  std::memcpy(&r.tracker, b + 20, 8);
  std::memcpy(&r.skipped, b + 28, 8);
  std::memcpy(&r.applied, b + 36, 8);
  return r;
}
}  // namespace

void LossScalerOptions::validate() const {
  auto bad = [](const char* f, double x, const char* want) {
    throw std::invalid_argument(fmt::format("LossScalerOptions.{} = {} is invalid ({})", f, x, want));
  };
  if (!(init_scale > 0) || !std::isfinite(init_scale))
    bad("init_scale", init_scale, "need a finite value > 0");
  if (!(growth_factor > 1) || !std::isfinite(growth_factor))
    bad("growth_factor", growth_factor, "need a finite value > 1");
  if (!(backoff_factor > 0 && backoff_factor < 1))
    bad("backoff_factor", backoff_factor, "need 0 < backoff_factor < 1");
  if (growth_interval < 1) bad("growth_interval", double(growth_interval), "need >= 1");
  if (!(min_scale > 0) || !std::isfinite(min_scale) || min_scale > init_scale)
    bad("min_scale", min_scale, "need a finite value > 0 and <= init_scale");
}

LossScaler::LossScaler(LossScalerOptions o) : opt_(o), scale_(o.init_scale) { opt_.validate(); }

bool LossScaler::update(bool found_inf, float scale_used) {
  if (found_inf) {
    const float backed = std::max(scale_used * opt_.backoff_factor, opt_.min_scale);
    if (backed < scale_) scale_ = backed;
    tracker_ = 0;
    ++skipped_;
    return false;
  }
  ++applied_;
  if (scale_used == scale_) {
    const int64_t successful = tracker_ + 1;
    if (successful == opt_.growth_interval) {
      const float grown = scale_ * opt_.growth_factor;
      if (std::isfinite(grown)) scale_ = grown;
      tracker_ = 0;
    } else {
      tracker_ = successful;
    }
  }
  return true;
}

size_t LossScaler::saved_bytes() { return 8 + kRecordBytes + 8; }

void LossScaler::save(std::ostream& os) const {
  unsigned char b[kRecordBytes];
  pack(Record{scale_, opt_.growth_factor, opt_.backoff_factor, opt_.growth_interval, tracker_, skipped_,
              applied_},
       b);
  os.write(kMagic, sizeof kMagic);
  os.write(reinterpret_cast<const char*>(b), kRecordBytes);
  const uint64_t h = checksum64(b, kRecordBytes);
  os.write(reinterpret_cast<const char*>(&h), 8);
  if (!os) throw std::runtime_error("LossScaler::save: write to the output stream failed");
}

void LossScaler::load(std::istream& is) {
  char magic[8];
  if (!is.read(magic, 8))
    throw std::runtime_error("LossScaler::load: truncated stream while reading the magic");
  if (std::memcmp(magic, kMagic, 8) != 0)
    throw std::runtime_error("LossScaler::load: not a loss scaler state (bad magic, expected \"RPLSCAL2\")");
  unsigned char b[kRecordBytes];
  uint64_t h;
  if (!is.read(reinterpret_cast<char*>(b), kRecordBytes) || !is.read(reinterpret_cast<char*>(&h), 8))
    throw std::runtime_error("LossScaler::load: truncated stream");
  if (h != checksum64(b, kRecordBytes))
    throw std::runtime_error("LossScaler::load: checksum mismatch (corrupted state)");
  const Record r = unpack(b);
  LossScalerOptions o = opt_;
  o.growth_factor = r.growth;
  o.backoff_factor = r.backoff;
  o.growth_interval = r.interval;
  o.init_scale = r.scale;
  o.min_scale = std::min(opt_.min_scale, r.scale);  // the configured floor is not state
  try {
    o.validate();
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("LossScaler::load: ") + e.what());
  }
  if (r.tracker < 0 || r.tracker >= r.interval || r.skipped < 0 || r.applied < 0)
    throw std::runtime_error(fmt::format("LossScaler::load: counters out of range (tracker {}, interval {})",
                                         r.tracker, r.interval));
  o.init_scale = opt_.init_scale;  // the configured initial scale is not state
  opt_ = o;
  scale_ = r.scale;
  tracker_ = r.tracker;
  skipped_ = r.skipped;
  applied_ = r.applied;
}

bool LossScaler::operator==(const LossScaler& o) const {
  return std::memcmp(&scale_, &o.scale_, 4) == 0 && tracker_ == o.tracker_ && skipped_ == o.skipped_ &&
         applied_ == o.applied_ && opt_.growth_factor == o.opt_.growth_factor &&
         opt_.backoff_factor == o.opt_.backoff_factor && opt_.growth_interval == o.opt_.growth_interval;
}

StepDecision decide_step(double total_sumsq, double base_scale, double max_norm, LossScaler* scaler,
                         float scale_used) {
  if (!(base_scale > 0) || !std::isfinite(base_scale))
    throw std::invalid_argument(fmt::format("decide_step: base_scale = {} (need finite, > 0)", base_scale));
  if (!(scale_used > 0) || !std::isfinite(scale_used))
    throw std::invalid_argument(fmt::format("decide_step: scale_used = {} (need finite, > 0)", scale_used));
  if (!scaler && scale_used != 1.f)
    throw std::invalid_argument(
        fmt::format("decide_step: scale_used = {} without a loss scaler", scale_used));
  StepDecision d;
  d.loss_scale = scale_used;
  const double unscale = base_scale / double(scale_used);
  d.skip = !std::isfinite(total_sumsq);
  if (scaler) scaler->update(d.skip, scale_used);
  if (d.skip) {
    d.grad_norm = total_sumsq;  // inf or NaN, as torch reports it
    d.clip_coef = 1;
    d.grad_scale = 0;
    return d;
  }
  d.grad_norm = std::sqrt(total_sumsq) * unscale;
  d.clip_coef = max_norm > 0 ? clip_coefficient(d.grad_norm, max_norm) : 1.0;
  d.grad_scale = float(unscale * d.clip_coef);
  return d;
}

StepNormReducer::StepNormReducer(int num_groups) : n_(num_groups) {
  if (num_groups < 1)
    throw std::invalid_argument(fmt::format("StepNormReducer: num_groups = {} (need >= 1)", num_groups));
}

bool StepNormReducer::add(int64_t step, int group, double sumsq) {
  if (group < 0 || group >= n_)
    throw std::invalid_argument(fmt::format("StepNormReducer: group {} outside [0, {})", group, n_));
  Partial& p = steps_[step];
  if (p.v.empty()) p.v.assign(size_t(n_), 0.0), p.have.assign(size_t(n_), 0);
  if (p.have[size_t(group)])
    throw std::invalid_argument(
        fmt::format("StepNormReducer: group {} reported twice for step {}", group, step));
  p.have[size_t(group)] = 1;
  p.v[size_t(group)] = sumsq;
  return ++p.count == n_;
}

double StepNormReducer::take(int64_t step) {
  auto it = steps_.find(step);
  if (it == steps_.end() || it->second.count != n_)
    throw std::logic_error(fmt::format("StepNormReducer: step {} is incomplete", step));
  double s = 0;
  for (double x : it->second.v) s += x;
  steps_.erase(it);
  return s;
}

}  // namespace rp
