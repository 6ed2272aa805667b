#include "scheduler/profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/atomic_file.hpp"
#include "base/json_fields.hpp"
#include "base/json_text.hpp"

namespace rp {

const char* linear_compute_name(bool fp8, bool fp8_weight_gradients) {
  return !fp8 ? "bf16" : fp8_weight_gradients ? "fp8+wgrad" : "fp8";
}

const char* profile_kind_name(ProfileKind k) {
  switch (k) {
    case ProfileKind::forward: return "forward";
    case ProfileKind::recompute: return "recompute";
    case ProfileKind::backward: return "backward";
    case ProfileKind::tail: return "tail";
  }
  return "?";
}

ProfileKind profile_kind_from_name(const std::string& s) {
  for (ProfileKind k :
       {ProfileKind::forward, ProfileKind::recompute, ProfileKind::backward, ProfileKind::tail})
    if (s == profile_kind_name(k)) return k;
  throw std::invalid_argument(
      fmt::format("unknown profile kind '{}' (forward, recompute, backward, tail)", s));
}

// ---- SmoothedTime ----------------------------------------------------------------

SmoothedTime::SmoothedTime(double beta) : beta_(beta) {}

void SmoothedTime::add(double x) {
  if (seen_++ == 0) return;  // drop the first sample
  const double before = value();
  m_ = beta_ * m_ + (1 - beta_) * x;
  ++kept_;
  const double after = value();
  last_change_ = kept_ < 2 ? 1.0 : (after > 0 ? std::fabs(after - before) / after : 0.0);
  // a change from a time to a subnormal one overflows: still finite, as the reader requires
  if (!std::isfinite(last_change_)) last_change_ = std::numeric_limits<double>::max();
}

double SmoothedTime::value() const {
  if (kept_ == 0) return 0;
  const double corr = 1 - std::pow(beta_, double(kept_));
  return corr > 0 ? m_ / corr : m_;
}

nlohmann::json SmoothedTime::to_json() const {
  return {{"seconds", value()}, {"m", m_}, {"kept", kept_}, {"seen", seen_}, {"last_change", last_change_}};
}

namespace {

/// A sample or an estimate rounds a few ulps above the bound it was kept within (an EMA of
/// samples all at kProfileMaxSeconds): the reader allows that much.
bool within_seconds(double x) { return x >= 0 && x <= kProfileMaxSeconds * (1 + 1e-9); }

std::string seconds_range() { return fmt::format("a number of seconds in [0, {:g}]", kProfileMaxSeconds); }

/// The integer `key` of `f` in [min, max] ("expected an integer in [min, max]<why>").
int64_t integer_in(const JsonFields& f, const char* key, int64_t min, int64_t max,
                   const std::string& why = "") {
  const auto& v = f.at(key);
  // a parsed integer >= 0 is unsigned: one beyond int64_t is out of range before it is read as one
  const bool ok = v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(max)) &&
                  v.get<int64_t>() >= min && v.get<int64_t>() <= max;
  if (!ok) f.fail(key, fmt::format("an integer in [{}, {}]{}", min, max, why));
  return v.get<int64_t>();
}

}  // namespace

SmoothedTime SmoothedTime::from_json(const JsonFields& f, double beta) {
  if (!f.json().is_object()) f.fail_with("expected an object");
  f.allow_only({"seconds", "m", "kept", "seen", "last_change"});  // "seconds": written for a reader
  SmoothedTime s(beta);
  s.m_ = f.number("m");
  if (!within_seconds(s.m_)) f.fail("m", seconds_range());
  s.kept_ = integer_in(f, "kept", 0, kProfileMaxSamples);
  s.seen_ = integer_in(f, "seen", s.kept_, kProfileMaxSamples, " (at least kept)");
  s.last_change_ = f.number("last_change");
  if (!(std::isfinite(s.last_change_) && s.last_change_ >= 0)) f.fail("last_change", "a finite number >= 0");
  if (f.has("seconds") && !(f.at("seconds").is_number() && within_seconds(f.at("seconds").get<double>())))
    f.fail("seconds", seconds_range());
  // the estimate divides m by 1 - beta^kept: a small m of few samples can still be out of range
  if (!within_seconds(s.value()))
    f.fail("m",
           fmt::format("{} once bias-corrected (m / (1 - beta^kept) = {:g})", seconds_range(), s.value()));
  return s;
}

SmoothedTime& LayerProfile::series(ProfileKind k) {
  switch (k) {
    case ProfileKind::forward: return fwd;
    case ProfileKind::recompute: return recompute;
    case ProfileKind::backward: return bwd;
    case ProfileKind::tail: return tail;
  }
  return fwd;
}
const SmoothedTime& LayerProfile::series(ProfileKind k) const {
  return const_cast<LayerProfile*>(this)->series(k);
}

// ---- Profile -----------------------------------------------------------------------

Profile::Profile(int num_layers, int64_t n_seq, int64_t seq_len, double beta)
    : n_seq_(n_seq), seq_len_(seq_len), beta_(beta) {
  if (num_layers < 3)
    throw std::invalid_argument(
        fmt::format("profile: a model has at least 3 compute layers, got {}", num_layers));
  if (n_seq < 1 || seq_len < 1 || n_seq > kProfileMaxTokens / seq_len)
    throw std::invalid_argument(fmt::format(
        "profile: micro-batch shape must be positive and at most 2^40 tokens, got {} x {}", n_seq, seq_len));
  if (!(beta >= 0 && beta < 1))
    throw std::invalid_argument(fmt::format("profile: beta must be in [0, 1), got {}", beta));
  layers_.assign(size_t(num_layers), LayerProfile(beta));
}

void Profile::record(int layer, ProfileKind kind, double seconds) {
  if (layer < 0 || layer >= num_layers())
    throw std::invalid_argument(fmt::format("profile: layer {} out of range [0, {})", layer, num_layers()));
  if (!(seconds >= 0 && seconds <= kProfileMaxSeconds))
    throw std::invalid_argument(
        fmt::format("profile: layer {}: {} time {} is not a number of seconds in [0, {:g}]", layer,
                    profile_kind_name(kind), seconds, kProfileMaxSeconds));
  layers_[size_t(layer)].series(kind).add(seconds);
}

void Profile::record_memory(int layer, int64_t weight_bytes, int64_t grad_bytes, int64_t scratch_peak_bytes) {
  if (layer < 0 || layer >= num_layers())
    throw std::invalid_argument(fmt::format("profile: layer {} out of range [0, {})", layer, num_layers()));
  if (std::max({weight_bytes, grad_bytes, scratch_peak_bytes}) > kProfileMaxBytes)
    throw std::invalid_argument(fmt::format("profile: layer {}: {} / {} / {} bytes, more than 1 TiB", layer,
                                            weight_bytes, grad_bytes, scratch_peak_bytes));
  auto& l = layers_[size_t(layer)];
  if (weight_bytes >= 0) l.weight_bytes = weight_bytes;
  if (grad_bytes >= 0) l.grad_bytes = grad_bytes;
  if (scratch_peak_bytes >= 0) l.scratch_peak_bytes = std::max(l.scratch_peak_bytes, scratch_peak_bytes);
}

const LayerProfile& Profile::layer(int l) const {
  if (l < 0 || l >= num_layers())
    throw std::invalid_argument(fmt::format("profile: layer {} out of range [0, {})", l, num_layers()));
  return layers_[size_t(l)];
}

bool Profile::settled(double rel_tol, int64_t min_samples) const {
  if (layers_.empty()) return false;
  auto ok = [&](const SmoothedTime& s) { return s.kept() >= min_samples && s.last_change() <= rel_tol; };
  const int n = num_layers();
  for (int l = 0; l + 1 < n; ++l) {
    const auto& p = layers_[size_t(l)];
    if (!(ok(p.fwd) && ok(p.bwd)) && !ok(p.tail)) return false;
  }
  return ok(layers_.back().tail);
}

std::vector<LayerCost> Profile::apply(const std::vector<LayerCost>& analytic) const {
  if (int(analytic.size()) != num_layers())
    throw std::invalid_argument(
        fmt::format("profile has {} layers, the model {}", num_layers(), analytic.size()));
  const int n = num_layers();
  auto is_dec = [n](int l) { return l > 0 && l < n - 1; };
  auto bwd_of = [](const LayerProfile& p) { return p.bwd.value() + p.recompute.value(); };
  // calibration ratio per (kind, decoder-or-not): sum(measured) / sum(analytic)
  double num[2][2] = {{0, 0}, {0, 0}}, den[2][2] = {{0, 0}, {0, 0}};
  for (int l = 0; l < n; ++l) {
    const auto& p = layers_[size_t(l)];
    const int g = is_dec(l);
    if (p.fwd.has_value()) num[0][g] += p.fwd.value(), den[0][g] += analytic[size_t(l)].fwd;
    if (p.bwd.has_value()) num[1][g] += bwd_of(p), den[1][g] += analytic[size_t(l)].bwd;
  }
  auto ratio = [&](int k, int g) { return den[k][g] > 0 && num[k][g] > 0 ? num[k][g] / den[k][g] : 1.0; };
  std::vector<LayerCost> out = analytic;
  for (int l = 0; l < n; ++l) {
    const auto& p = layers_[size_t(l)];
    const LayerCost& a = analytic[size_t(l)];
    LayerCost& c = out[size_t(l)];
    const int g = is_dec(l);
    c.fwd = p.fwd.has_value() ? p.fwd.value() : a.fwd * ratio(0, g);
    c.bwd = p.bwd.has_value() ? bwd_of(p) : a.bwd * ratio(1, g);
    if (p.tail.has_value()) {
      c.tail = p.tail.value();
    } else {
      const double fb = a.fwd + a.bwd;
      c.tail = fb > 0 ? a.tail * (c.fwd + c.bwd) / fb : a.tail;
    }
    if (p.weight_bytes >= 0) c.weight_bytes = p.weight_bytes;
    if (p.grad_bytes >= 0) c.grad_bytes = p.grad_bytes;
    if (p.scratch_peak_bytes >= 0) c.scratch_bytes = p.scratch_peak_bytes;
  }
  return out;
}

nlohmann::json Profile::to_json() const {
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < num_layers(); ++l) {
    const auto& p = layers_[size_t(l)];
    nlohmann::json o = {{"layer", l}};
    for (ProfileKind k :
         {ProfileKind::forward, ProfileKind::recompute, ProfileKind::backward, ProfileKind::tail})
      if (p.series(k).seen() > 0) o[profile_kind_name(k)] = p.series(k).to_json();
    if (p.weight_bytes >= 0) o["weight_bytes"] = p.weight_bytes;
    if (p.grad_bytes >= 0) o["grad_bytes"] = p.grad_bytes;
    if (p.scratch_peak_bytes >= 0) o["scratch_peak_bytes"] = p.scratch_peak_bytes;
    layers.push_back(std::move(o));
  }
  nlohmann::json j = {
      {"format", "roundpipe-profile"}, {"version", 1},  {"device", device},           {"n_seq", n_seq_},
      {"seq_len", seq_len_},           {"beta", beta_}, {"layers", std::move(layers)}};
  if (!linear_compute.empty()) j["linear_compute"] = linear_compute;
  return j;
}

namespace {

/// One layer's keys into `lp` (Profile::from_json's errors; `w` is "<where>: layer <l>").
void read_layer(const nlohmann::json& o, int l, const std::string& where, const std::string& w,
                const JsonKeyLines* lines, double beta, LayerProfile& lp) {
  if (!o.is_object())
    throw std::invalid_argument(w + ": expected an object with \"layer\": " + std::to_string(l));
  const std::string pointer = fmt::format("/layers/{}", l);
  JsonFields lf(o, w);
  lf.with_lines(lines, where, pointer);
  lf.allow_only({"layer", "forward", "recompute", "backward", "tail", "weight_bytes", "grad_bytes",
                 "scratch_peak_bytes"});
  if (!lf.has("layer") || lf.at("layer") != l) lf.fail("layer", std::to_string(l));
  for (ProfileKind k :
       {ProfileKind::forward, ProfileKind::recompute, ProfileKind::backward, ProfileKind::tail}) {
    const char* name = profile_kind_name(k);
    if (!lf.has(name)) continue;
    JsonFields sf(lf.at(name), w + "." + name);
    sf.with_lines(lines, where, json_key_pointer(pointer, name));
    if (!lf.at(name).is_object()) lf.fail(name, "an object");
    lp.series(k) = SmoothedTime::from_json(sf, beta);
  }
  auto bytes = [&](const char* k, int64_t& dst) {
    if (lf.has(k)) dst = integer_in(lf, k, 0, kProfileMaxBytes, " (at most 1 TiB)");
  };
  bytes("weight_bytes", lp.weight_bytes);
  bytes("grad_bytes", lp.grad_bytes);
  bytes("scratch_peak_bytes", lp.scratch_peak_bytes);
}

}  // namespace

Profile Profile::from_json(const nlohmann::json& j, const std::string& where, const JsonKeyLines* lines) {
  if (!j.is_object()) throw std::invalid_argument(where + ": expected a JSON object");
  JsonFields f(j, where);
  f.with_lines(lines, where, "");
  // every key to_json writes, and no other: a misspelt one would otherwise drop what it holds
  f.allow_only({"format", "version", "device", "n_seq", "seq_len", "beta", "layers", "linear_compute"});
  f.require_value("format", "roundpipe-profile");
  f.require_value("version", 1);
  const int64_t n_seq = integer_in(f, "n_seq", 1, kProfileMaxTokens);
  const int64_t seq_len =
      integer_in(f, "seq_len", 1, kProfileMaxTokens / n_seq, " (n_seq x seq_len at most 2^40)");
  const double beta = f.number("beta");
  if (!(beta >= 0 && beta < 1)) f.fail("beta", "a number in [0, 1)");
  const auto& layers = f.array("layers");
  if (layers.size() < 3)
    f.fail("layers", "a list of at least 3 layers (embedding, decoders, tail)", layers.size());
  Profile p(int(layers.size()), n_seq, seq_len, beta);
  f.optional("device", p.device);
  if (f.has("linear_compute")) {  // absent in files written before it was recorded
    p.linear_compute = f.string("linear_compute");
    if (p.linear_compute != "bf16" && p.linear_compute != "fp8" && p.linear_compute != "fp8+wgrad")
      f.fail("linear_compute", "\"bf16\", \"fp8\" or \"fp8+wgrad\"", p.linear_compute);
  }
  for (int l = 0; l < p.num_layers(); ++l)
    read_layer(layers[size_t(l)], l, where, fmt::format("{}: layer {}", where, l), lines, p.beta_,
               p.layers_[size_t(l)]);
  return p;
}

void Profile::save(const std::string& path) const {
  const std::string text = to_json().dump(1) + "\n";
  write_file_atomically(path, [&](std::ostream& f) { f << text; });
}

Profile Profile::load(const std::string& path) {
  // a pipe or device would block the open or never end the read: only a file is read
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found)
    throw std::runtime_error(path + ": cannot open (no such file)");
  if (!ec && st.type() != std::filesystem::file_type::regular)
    throw std::runtime_error(path + ": expected a profile file, found a folder, device or pipe");
  nlohmann::json j;
  JsonKeyLines lines;  // a value refused after parsing is named with its line
  try {
    // "<path>:<line>:<column>: invalid JSON: ..." as the spec and config readers say it
    j = parse_json_text(read_json_file(path), path, {.unique_keys = true, .key_lines = &lines});
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  try {
    return from_json(j, path, &lines);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
}

}  // namespace rp
