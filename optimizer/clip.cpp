// Gradient clipping helpers (see clip.hpp). Fixed-size inner blocks keep the loops
// vectorisable by GCC at -O2 without reassociating floating-point sums.
#include "optimizer/clip.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "optimizer/adamw.hpp"
#include "optimizer/kernels.hpp"
#include "optimizer/thread_pool.hpp"

namespace rp {
namespace {
void check(const float* g, int64_t n, const char* fn) {
  if (n < 0) throw std::invalid_argument(fmt::format("{}: n = {} is negative", fn, n));
  if (n > 0 && !g) throw std::invalid_argument(fmt::format("{}: null pointer with n > 0", fn));
}
}  // namespace

namespace detail {
void sumsq_scalar(const float* __restrict g, int64_t n, double acc[16]) {
  constexpr int kLanes = 16;
  double a[kLanes];
  for (int j = 0; j < kLanes; ++j) a[j] = acc[j];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double x = g[i + j];
      a[j] += x * x;  // exact product: fused or not, the same sum
    }
  for (int j = 0; i < n; ++i, ++j) {
    const double x = g[i];
    a[j] += x * x;
  }
  for (int j = 0; j < kLanes; ++j) acc[j] = a[j];
}
}  // namespace detail

namespace {
// sum of one chunk, lanes added in order
double chunk_sum(detail::SumsqFn fn, const float* g, int64_t n) {
  double acc[16] = {};
  fn(g, n, acc);
  double s = 0;
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}
}  // namespace

double sum_of_squares(const float* __restrict g, int64_t n) {
  check(g, n, "sum_of_squares");
  const detail::SumsqFn fn = detail::sumsq_kernel(adamw_isa());
  double s = 0;
  for (int64_t i = 0; i < n; i += kSumsqChunk) s += chunk_sum(fn, g + i, std::min(kSumsqChunk, n - i));
  return s;
}

double sum_of_squares(const float* g, int64_t n, ThreadPool& pool) {
  check(g, n, "sum_of_squares");
  const int64_t chunks = (n + kSumsqChunk - 1) / kSumsqChunk;
  const int64_t by_size = (n + kMinElemsPerThread - 1) / kMinElemsPerThread;
  const int parts = int(std::min<int64_t>({int64_t(pool.size()), chunks, by_size}));
  if (parts <= 1) return sum_of_squares(g, n);
  const detail::SumsqFn fn = detail::sumsq_kernel(adamw_isa());
  std::vector<double> sums(size_t(chunks), 0.0);
  pool.run(parts, [&](int p) {
    for (int64_t c = chunks * p / parts, e = chunks * (p + 1) / parts; c < e; ++c) {
      const int64_t lo = c * kSumsqChunk;
      sums[size_t(c)] = chunk_sum(fn, g + lo, std::min(kSumsqChunk, n - lo));
    }
  });
  double s = 0;
  for (double x : sums) s += x;
  return s;
}

double clip_coefficient(double global_norm, double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    throw std::invalid_argument(
        fmt::format("clip_coefficient: max_norm = {} (need a finite value > 0)", max_norm));
  if (std::isnan(global_norm)) return global_norm;
  if (global_norm < 0)
    throw std::invalid_argument(fmt::format("clip_coefficient: global_norm = {} is negative", global_norm));
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
