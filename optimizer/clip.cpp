// Gradient clipping helpers (see clip.hpp). Fixed-size inner blocks keep the loops
// vectorisable by GCC at -O2 without reassociating floating-point sums.
#include "optimizer/clip.hpp"

#include <bit>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {
namespace {
void check(const float* g, int64_t n, const char* fn) {
  if (n < 0) throw std::invalid_argument(fmt::format("{}: n = {} is negative", fn, n));
  if (n > 0 && !g) throw std::invalid_argument(fmt::format("{}: null pointer with n > 0", fn));
}
}  // namespace

double sum_of_squares(const float* __restrict g, int64_t n) {
  check(g, n, "sum_of_squares");
  constexpr int kLanes = 16;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double x = g[i + j];
      acc[j] += x * x;
    }
  for (int j = 0; i < n; ++i, ++j) {
    const double x = g[i];
    acc[j] += x * x;
  }
  double s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

double clip_coefficient(double global_norm, double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    throw std::invalid_argument(
        fmt::format("clip_coefficient: max_norm = {} (need a finite value > 0)", max_norm));
  if (std::isnan(global_norm)) return global_norm;
  if (global_norm < 0)
    throw std::invalid_argument(
        fmt::format("clip_coefficient: global_norm = {} is negative", global_norm));
  const double c = max_norm / (global_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

bool all_finite(const float* __restrict g, int64_t n) {
  check(g, n, "all_finite");
  constexpr int64_t kBlock = 256;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    uint32_t bad = 0;
    for (int64_t j = 0; j < kBlock; ++j)
      bad |= uint32_t((std::bit_cast<uint32_t>(g[i + j]) & 0x7f800000u) == 0x7f800000u);
    if (bad) return false;
  }
  for (; i < n; ++i)
    if ((std::bit_cast<uint32_t>(g[i]) & 0x7f800000u) == 0x7f800000u) return false;
  return true;
}

}  // namespace rp
