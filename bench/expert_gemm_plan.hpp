// Host-side plans of bench_expert_gemm's expert layouts (no CUDA): the experts bucketed by row
// count for one padded pointer-array batch per bucket, the padded row offsets of that layout,
// and the rows every expert shares (the split variant's common batch).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace rp::bench {

// Experts whose products run as one batch of `m` rows each (an expert with fewer rows is padded).
struct Bucket {
  int32_t m = 0;
  std::vector<int32_t> experts;
};

// The experts with rows of the offsets `off` [E+1], sorted by row count (largest first), cut
// greedily into buckets: a bucket takes the next expert while its padding (sum over the bucket
// of m - count, m its largest count) stays at most `max_pad` of the bucket's rows (count * m).
inline std::vector<Bucket> bucket_experts(const std::vector<int32_t>& off, double max_pad) {
  const int32_t E = int32_t(off.size()) - 1;
  std::vector<int32_t> order;
  for (int32_t e = 0; e < E; ++e)
    if (off[size_t(e + 1)] > off[size_t(e)]) order.push_back(e);
  auto count = [&](int32_t e) { return int64_t(off[size_t(e + 1)] - off[size_t(e)]); };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return count(a) > count(b); });
  std::vector<Bucket> out;
  int64_t real = 0;
  for (int32_t e : order) {
    if (!out.empty()) {
      Bucket& b = out.back();
      const int64_t rows = int64_t(b.experts.size() + 1) * b.m;
      if (double(rows - real - count(e)) <= max_pad * double(rows)) {
        b.experts.push_back(e);
        real += count(e);
        continue;
      }
    }
    out.push_back(Bucket{int32_t(count(e)), {e}});
    real = count(e);
  }
  return out;
}

// The first row of each expert [E] in the padded layout of `buckets`: experts in index order,
// expert e's segment as long as its bucket's m (none for an expert without rows), so the rows
// between its count and m are padding. `total` receives the layout's row count.
inline std::vector<int64_t> padded_rows(const std::vector<int32_t>& off, const std::vector<Bucket>& buckets,
                                        int64_t& total) {
  const size_t E = off.size() - 1;
  std::vector<int64_t> seg(E, 0), row0(E, 0);
  for (const Bucket& b : buckets)
    for (int32_t e : b.experts) seg[size_t(e)] = b.m;
  total = 0;
  for (size_t e = 0; e < E; ++e) row0[e] = total, total += seg[e];
  return row0;
}

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

// What is wrong with `buckets` as a bucketing of `off` under `max_pad` (empty when nothing):
// every expert with rows in exactly one bucket, none without; each bucket's m its largest count
// and its padding at most max_pad of its rows.
inline std::string check_buckets(const std::vector<int32_t>& off, const std::vector<Bucket>& buckets,
                                 double max_pad) {
  const size_t E = off.size() - 1;
  std::vector<int> seen(E, 0);
  for (size_t i = 0; i < buckets.size(); ++i) {
    const Bucket& b = buckets[i];
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

}  // namespace rp::bench
