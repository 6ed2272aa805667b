// Host-side RoPE inverse-frequency tables (shared by both backends; see kernels/ops.hpp).
// Formulas: transformers/modeling_rope_utils.py (_compute_default_rope_parameters,
// _compute_linear_scaling_rope_parameters, _compute_llama3_parameters,
// _compute_yarn_parameters, _compute_longrope_parameters); YaRN: Peng et al. 2023, arXiv
// 2309.00071; LongRoPE: Ding et al. 2024, arXiv 2402.13753.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "kernels/ops.hpp"
#include "kernels/rope_tables.hpp"

namespace rp {

namespace {
[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("rope_frequencies: " + what); }
}  // namespace

RopeTable rope_frequencies(const RopeParams& p) {
  const int64_t D = p.head_dim;
  if (D <= 0 || D % 2 != 0) bad("head_dim must be even and positive");
  if (!(p.theta > 0)) bad("rope_theta must be > 0");
  const int64_t half = D / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[size_t(i)] = std::pow(p.theta, -double(2 * i) / double(D));
  RopeTable out;
  out.attention_scaling = 1.0f;
  const double pi = 3.14159265358979323846;
  if (p.type == "default") {
  } else if (p.type == "linear") {
    if (!(p.factor > 0)) bad("linear: factor must be > 0");
    for (auto& f : inv) f /= p.factor;
  } else if (p.type == "llama3") {
    if (!(p.factor > 0)) bad("llama3: factor must be > 0");
    if (p.original_max_position_embeddings <= 0) bad("llama3: original_max_position_embeddings must be > 0");
    if (!(p.high_freq_factor > p.low_freq_factor)) bad("llama3: need high_freq_factor > low_freq_factor");
    const double old_ctx = double(p.original_max_position_embeddings);
    const double low_wl = old_ctx / p.low_freq_factor, high_wl = old_ctx / p.high_freq_factor;
    for (auto& f : inv) {
      const double wl = 2 * pi / f;
      if (wl > low_wl) {
        f = f / p.factor;          // low frequency: interpolate
      } else if (wl >= high_wl) {  // medium: smooth blend
        const double s = (old_ctx / wl - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
        f = (1 - s) * f / p.factor + s * f;
      }  // high frequency: unchanged
    }
  } else if (p.type == "yarn") {
    if (!(p.factor > 0)) bad("yarn: factor must be > 0");
    const double orig = double(p.original_max_position_embeddings > 0 ? p.original_max_position_embeddings
                                                                      : p.max_position_embeddings);
    if (!(orig > 0)) bad("yarn: need original_max_position_embeddings or max_position_embeddings");
    auto corr_dim = [&](double rot) {
      return double(D) * std::log(orig / (rot * 2 * pi)) / (2 * std::log(p.theta));
    };
    double low = corr_dim(p.beta_fast), high = corr_dim(p.beta_slow);
    if (p.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, double(D - 1));
    if (low == high) high += 0.001;  // as transformers: prevent a singular ramp
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      const double extrap_w = 1.0 - ramp;
      const double f = inv[size_t(i)];
      inv[size_t(i)] = (f / p.factor) * (1 - extrap_w) + f * extrap_w;
    }
    double af = p.attention_factor;
    if (af == 0) af = p.factor <= 1 ? 1.0 : 0.1 * std::log(p.factor) + 1.0;
    out.attention_scaling = float(af);
  } else if (p.type == "longrope") {
    bad("longrope has two tables: rope_tables() makes them");
  } else {
    bad("unsupported rope type '" + p.type + "' (default, linear, llama3, yarn, longrope)");
  }
  out.inv_freq.resize(size_t(half));
  for (int64_t i = 0; i < half; ++i) out.inv_freq[size_t(i)] = float(inv[size_t(i)]);
  return out;
}

namespace {
// transformers' _compute_longrope_parameters for one factor list `ext` (`key` names it)
RopeTable longrope_table(const RopeParams& p, const std::vector<double>& ext, const char* key) {
  const int64_t D = p.head_dim, half = D / 2;
  if (int64_t(ext.size()) != half)
    bad(fmt::format("longrope: {} must have head_dim/2 = {} entries, got {}", key, half, ext.size()));
  RopeTable t;
  t.inv_freq.resize(size_t(half));
  for (int64_t i = 0; i < half; ++i) {
    const double e = ext[size_t(i)];
    if (!(e > 0) || !std::isfinite(e))
      bad(fmt::format("longrope: {}[{}] must be a positive finite number, got {}", key, i, e));
    t.inv_freq[size_t(i)] = float(1.0 / (e * std::pow(p.theta, double(2 * i) / double(D))));
  }
  const double orig = double(p.original_max_position_embeddings);
  const double factor = p.factor > 0 ? p.factor : double(p.max_position_embeddings) / orig;
  double af = p.attention_factor;
  if (af == 0 && factor > 1 && orig < 2)
    bad("longrope: deriving attention_factor needs original_max_position_embeddings > 1");
  if (af == 0) af = factor <= 1 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(orig));
  t.attention_scaling = float(af);
  return t;
}
}  // namespace

RopeTables rope_tables(const RopeParams& p, const LongRopeFactors& lr) {
  RopeTables t;
  if (p.type != "longrope") {
    t.short_table = rope_frequencies(p);
    return t;
  }
  if (p.head_dim <= 0 || p.head_dim % 2 != 0) bad("head_dim must be even and positive");
  if (!(p.theta > 0)) bad("rope_theta must be > 0");
  if (p.original_max_position_embeddings <= 0) bad("longrope: original_max_position_embeddings must be > 0");
  if (!(p.factor >= 0) || !std::isfinite(p.factor)) bad("longrope: factor must be >= 0 (0: derived)");
  if (!(p.attention_factor >= 0) || !std::isfinite(p.attention_factor))
    bad("longrope: attention_factor must be >= 0 (0: derived)");
  t.short_table = longrope_table(p, lr.short_factor, "short_factor");
  t.long_table = longrope_table(p, lr.long_factor, "long_factor");
  t.original_max_position_embeddings = p.original_max_position_embeddings;
  return t;
}

}  // namespace rp
