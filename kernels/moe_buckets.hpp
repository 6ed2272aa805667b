// The padded expert layout of a mixture-of-experts block (Ops::moe_pad; kernels/ops.hpp): the
// experts are sorted by row count and cut into buckets whose padding is bounded, every expert
// of a bucket padded to the bucket's largest count m, so that each bucket's products run as one
// pointer-array batch of equal shapes (cublasGemmBatchedEx) instead of one grouped call with a
// shape per expert. Host code only, shared by both backends and bench_expert_gemm.
//
// m is the bucket's largest count, not rounded up: the batched GEMM's operands stay 16-byte
// aligned for any m as long as K and N are multiples of 8 (every expert's first row starts at
// row0 * K elements), and rounding m up to a multiple of 8 would add up to 7 rows per expert
// (7 E rows in all, beyond the bound of padded_rows_bound) for no alignment gain.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace rp {

/// Largest padding of a bucket as a fraction of its rows (Ops::moe_pad; bench_expert_gemm
/// measured 3 to 20 buckets at this bound on uniform and skewed routing).
constexpr double kExpertPadFraction = 0.06;

/// Experts whose products run as one batch of `m` rows each (an expert with fewer rows is padded).
struct ExpertBucket {
  int32_t m = 0;
  std::vector<int32_t> experts;
};

/// The experts with rows of the offsets `off` [E+1], sorted by row count (largest first, ties
/// by index), cut greedily into buckets: a bucket takes the next expert while its padding (sum
/// over the bucket of m - count, m its largest count) stays at most `max_pad` of the bucket's
/// rows (experts * m).
inline std::vector<ExpertBucket> bucket_experts(const std::vector<int32_t>& off, double max_pad) {
  const int32_t E = int32_t(off.size()) - 1;
  std::vector<int32_t> order;
  for (int32_t e = 0; e < E; ++e)
    if (off[size_t(e + 1)] > off[size_t(e)]) order.push_back(e);
  auto count = [&](int32_t e) { return int64_t(off[size_t(e + 1)] - off[size_t(e)]); };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return count(a) > count(b); });
  std::vector<ExpertBucket> out;
  int64_t real = 0;
  for (int32_t e : order) {
    if (!out.empty()) {
      ExpertBucket& b = out.back();
      const int64_t rows = int64_t(b.experts.size() + 1) * b.m;
      if (double(rows - real - count(e)) <= max_pad * double(rows)) {
        b.experts.push_back(e);
        real += count(e);
        continue;
      }
    }
    out.push_back(ExpertBucket{int32_t(count(e)), {e}});
    real = count(e);
  }
  return out;
}

/// The first row of each expert [E] in the padded layout of `buckets`: experts in index order,
/// expert e's segment as long as its bucket's m (none for an expert without rows), so the rows
/// between its count and m are padding. `total` receives the layout's row count.
inline std::vector<int64_t> padded_rows(const std::vector<int32_t>& off,
                                        const std::vector<ExpertBucket>& buckets, int64_t& total) {
  const size_t E = off.size() - 1;
  std::vector<int64_t> seg(E, 0), row0(E, 0);
  for (const ExpertBucket& b : buckets)
    for (int32_t e : b.experts) seg[size_t(e)] = b.m;
  total = 0;
  for (size_t e = 0; e < E; ++e) row0[e] = total, total += seg[e];
  return row0;
}

/// The padded offsets [E+1] of `off` under `max_pad` (bucket_experts, then padded_rows):
/// expert e's segment is [result[e], result[e+1]), its off[e+1] - off[e] real rows first.
inline std::vector<int32_t> padded_offsets(const std::vector<int32_t>& off, double max_pad) {
  int64_t total = 0;
  const std::vector<int64_t> row0 = padded_rows(off, bucket_experts(off, max_pad), total);
  std::vector<int32_t> out(off.size());
  for (size_t e = 0; e + 1 < off.size(); ++e) out[e] = int32_t(row0[e]);
  out.back() = int32_t(total);
  return out;
}

/// At least the rows of any padded layout of R real rows under `max_pad` (in [0, 1)): every
/// bucket's rows times 1 - max_pad are at most its real rows, so the layout holds at most
/// R / (1 - max_pad) rows (one more for the rounding of the bucket test's doubles).
inline int64_t padded_rows_bound(int64_t R, double max_pad) {
  if (R <= 0) return 0;
  return int64_t(std::ceil(double(R) / (1.0 - max_pad))) + 1;
}

/// Routing spread a planner assumes for the padded layout (expected_bucket_count): the least and
/// the most used expert's rows as multiples of the even share, as random-weight Qwen3-30B-A3B runs
/// on the H200 reported them (bench_throughput's "experts: least used 0.54, most used 1.55").
constexpr double kRoutingLeastShare = 0.54, kRoutingMostShare = 1.55;

/// The buckets bucket_experts makes of `rows` routed rows over `experts` experts whose counts
/// spread evenly from least to most times the even share (rows / experts): what a planner
/// expects, since it cannot know the routing. 0 without rows or experts; 1 when there are no
/// more rows than experts (a short micro-batch's rows land one per expert, one bucket of m 1).
inline int64_t expected_bucket_count(double rows, int64_t experts, double least = kRoutingLeastShare,
                                     double most = kRoutingMostShare, double max_pad = kExpertPadFraction) {
  if (!(rows > 0) || experts < 1) return 0;
  if (rows <= double(experts)) return 1;
  // the count depends on the spread, not the scale: a share past 2^30 rows in all is scaled down
  const double even = std::min(rows / double(experts), 1e9 / (double(experts) * std::max(1.0, most)));
  std::vector<int32_t> off(size_t(experts) + 1, 0);
  for (int64_t e = 0; e < experts; ++e) {
    const double share = experts == 1 ? 1.0 : least + (most - least) * double(e) / double(experts - 1);
    const double n = std::max(1.0, std::round(even * share));
    off[size_t(e) + 1] = off[size_t(e)] + int32_t(std::min(n, 1e9));
  }
  return int64_t(bucket_experts(off, max_pad).size());
}

/// What is wrong with `buckets` as a bucketing of `off` under `max_pad` (empty when nothing):
/// every expert with rows in exactly one bucket, none without; each bucket's m its largest count
/// and its padding at most max_pad of its rows.
inline std::string check_buckets(const std::vector<int32_t>& off, const std::vector<ExpertBucket>& buckets,
                                 double max_pad) {
  const size_t E = off.size() - 1;
  std::vector<int> seen(E, 0);
  for (size_t i = 0; i < buckets.size(); ++i) {
    const ExpertBucket& b = buckets[i];
    int64_t real = 0, most = 0;
    for (int32_t e : b.experts) {
      if (e < 0 || size_t(e) >= E)
        return "bucket " + std::to_string(i) + " names expert " + std::to_string(e);
      const int64_t n = off[size_t(e) + 1] - off[size_t(e)];
      if (n == 0 || seen[size_t(e)]++ > 0)
        return "expert " + std::to_string(e) + " is in a bucket twice or has no rows";
      real += n, most = std::max(most, n);
    }
    const int64_t rows = int64_t(b.experts.size()) * b.m;
    if (b.experts.empty() || most != b.m || double(rows - real) > max_pad * double(rows))
      return "bucket " + std::to_string(i) + " (m " + std::to_string(b.m) + ", " + std::to_string(real) +
             " real rows of " + std::to_string(rows) + ") breaks its m or padding bound";
  }
  for (size_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e] && seen[e] == 0) return "expert " + std::to_string(e) + " has rows but no bucket";
  return "";
}

}  // namespace rp
