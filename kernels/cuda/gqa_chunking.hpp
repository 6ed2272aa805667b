// How many query heads one pass of the expanded GQA attention backward handles
// (cudnn_attention.cpp). Host-only, no CUDA headers, so CPU tests check it directly.
//
// The expanded backward needs, per pass of hc query heads, the expanded K, V, dK, dV, possibly
// packed softmax statistics and fp32 dK/dV accumulators, and cuDNN's workspace for an hc-head
// graph: a cost that grows with hc. A pass covers either whole KV heads (hc = g*r for g KV
// heads; nkv heads in n passes of g(n) = ceil(nkv / n) KV heads, the last one smaller) or,
// when not even one KV head fits, part of one KV head (each KV head's r query heads in m
// passes of ceil(r / m) heads, the last one smaller). So only these pass sizes are
// candidates, and the best plan is the largest candidate that fits the scratch (fewest
// passes, each as large as the scratch allows).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace rp::cuda {

/// The candidate pass sizes (query heads) for nkv KV heads of r query heads each, largest
/// first: g*r for the distinct ceil(nkv / n), n = 1..nkv, then the distinct ceil(r / m) < r,
/// m = 2..r. Empty when nkv or r is not positive.
inline std::vector<int64_t> gqa_pass_sizes(int64_t nkv, int64_t r) {
  std::vector<int64_t> c;
  if (nkv <= 0 || r <= 0) return c;
  for (int64_t n = 1; n <= nkv; ++n) {
    const int64_t h = (nkv + n - 1) / n * r;
    if (c.empty() || c.back() != h) c.push_back(h);
  }
  for (int64_t m = 2; m <= r; ++m) {
    const int64_t h = (r + m - 1) / m;
    if (c.back() != h) c.push_back(h);
  }
  return c;
}

/// Returns the query heads per pass (one of gqa_pass_sizes), or 0 when none fits.
/// `avail`: scratch bytes. `estimate_per_head`: a first guess of the bytes one query head's
/// share costs (0: none), used only to choose where the search starts. `need(hc)`: the exact
/// bytes a pass of hc query heads needs, std::nullopt when it cannot run at all (cuDNN refused
/// its graph; treated as not fitting); assumed non-decreasing in hc. Every need() call may
/// build a cuDNN graph, so the search starts at the estimate and walks: to larger passes
/// while they fit, to smaller ones until one fits (typically 1 or 2 calls).
inline int64_t plan_gqa_pass(int64_t nkv, int64_t r, size_t avail, size_t estimate_per_head,
                             const std::function<std::optional<size_t>(int64_t)>& need) {
  const std::vector<int64_t> cand = gqa_pass_sizes(nkv, r);
  if (cand.empty()) return 0;
  size_t i = 0;  // first candidate the estimate says fits (the last one when none does)
  if (estimate_per_head > 0)
    while (i + 1 < cand.size() && size_t(cand[i]) * estimate_per_head > avail) ++i;
  auto fits = [&](size_t j) {
    const std::optional<size_t> b = need(cand[j]);
    return b && *b <= avail;
  };
  if (fits(i)) {
    while (i > 0 && fits(i - 1)) --i;  // larger passes while they fit
    return cand[i];
  }
  while (++i < cand.size())  // smaller passes until one fits
    if (fits(i)) return cand[i];
  return 0;
}

}  // namespace rp::cuda
