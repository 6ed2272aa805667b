// Large tensors' conversions on the calling thread's pool (parallel_quantize.hpp).
#include "formats/parallel_quantize.hpp"

#include <algorithm>
#include <numeric>

#include "optimizer/thread_pool.hpp"

namespace rp {

int convert_threads() {
  static const int n = std::clamp(int(allowed_cpus().size()), 1, 16);
  return n;
}

void for_ranges_parallel(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  grain = std::max<int64_t>(grain, 1);
  const int64_t pieces_max = std::max<int64_t>(1, n / std::max(grain, kParallelConvertValues / 4));
  const int parts = n < kParallelConvertValues ? 1 : int(std::min<int64_t>(convert_threads(), pieces_max));
  if (parts <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  shared_pool(parts).run(parts, [&](int p) {
    int64_t lo = 0, hi = 0;
    split_range(n, parts, grain, p, lo, hi);
    if (hi > lo) fn(lo, hi);
  });
}

void quantize_weights_parallel(WeightFormat f, const float* src, void* dst, int64_t n, int64_t cols) {
  weight_format_bytes(f, n, cols);  // a bad block multiple throws here, as quantize_weights would
  if (f == WeightFormat::fp8 || cols <= 0 || n % cols != 0) return quantize_weights(f, src, dst, n, cols);
  auto* out = static_cast<char*>(dst);
  // whole rows and whole blocks (a block may straddle rows whose length it does not divide)
  for_ranges_parallel(n, std::lcm(cols, weight_format_block(f)), [&](int64_t lo, int64_t hi) {
    quantize_weights(f, src + lo, out + weight_format_bytes(f, lo, cols), hi - lo, cols);
  });
}

}  // namespace rp
