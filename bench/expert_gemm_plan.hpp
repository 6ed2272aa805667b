// Host-side plans of bench_expert_gemm's expert layouts (no CUDA): the experts bucketed by row
// count for one padded pointer-array batch per bucket and the padded row offsets of that layout
// (the runtime's rule, kernels/moe_buckets.hpp), and the rows every expert shares (the split
// variant's common batch).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/moe_buckets.hpp"

namespace rp::bench {

using Bucket = ExpertBucket;  // kernels/moe_buckets.hpp, the runtime's rule (Ops::moe_pad)
using rp::bucket_experts;
using rp::check_buckets;
using rp::padded_rows;

// The fewest rows of an expert with rows (0 when none has any).
inline int32_t common_rows(const std::vector<int32_t>& off) {
  int32_t m = 0;
  bool any = false;
  for (size_t e = 0; e + 1 < off.size(); ++e) {
    const int32_t n = off[e + 1] - off[e];
    if (n > 0) m = any ? std::min(m, n) : n, any = true;
  }
  return m;
}

}  // namespace rp::bench
