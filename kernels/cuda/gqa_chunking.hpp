// How many KV heads one pass of the expanded GQA attention backward handles
// (cudnn_attention.cpp). Host-only, no CUDA headers, so CPU tests check it directly.
//
// The expanded backward needs, per pass of g KV heads (g*r query heads), the expanded K, V,
// dK, dV, possibly packed softmax statistics, and cuDNN's workspace for a g*r-head graph:
// a cost that grows with g. A pass count n splits nkv heads into chunks of
// g(n) = ceil(nkv / n) heads (the last one smaller when n does not divide nkv), so only
// the distinct values of g(n) are candidates, and the best plan is the largest candidate
// whose chunk fits the scratch (fewest passes, each as large as the scratch allows).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace rp::cuda {

/// Returns the KV heads per chunk (1..nkv), or 0 when no chunk size fits.
/// `avail`: scratch bytes. `estimate_per_head`: a first guess of the bytes one KV head's
/// share costs (0: none), used only to choose where the search starts. `need(g)`: the exact
/// bytes a chunk of g KV heads needs, std::nullopt when that chunk cannot run at all (cuDNN
/// refused its graph; treated as not fitting); assumed non-decreasing in g. Every need()
/// call may build a cuDNN graph, so the search starts at the estimate and walks: to larger
/// chunks while they fit, to smaller ones until one fits (typically 1 or 2 calls).
inline int64_t plan_kv_chunk(int64_t nkv, size_t avail, size_t estimate_per_head,
                             const std::function<std::optional<size_t>(int64_t)>& need) {
  if (nkv <= 0) return 0;
  std::vector<int64_t> cand;  // distinct ceil(nkv / n) for n = 1..nkv, decreasing
  for (int64_t n = 1; n <= nkv; ++n) {
    const int64_t g = (nkv + n - 1) / n;
    if (cand.empty() || cand.back() != g) cand.push_back(g);
  }
  size_t i = 0;  // first candidate the estimate says fits (the last one when none does)
  if (estimate_per_head > 0)
    while (i + 1 < cand.size() && size_t(cand[i]) * estimate_per_head > avail) ++i;
  auto fits = [&](size_t j) {
    const std::optional<size_t> b = need(cand[j]);
    return b && *b <= avail;
  };
  if (fits(i)) {
    while (i > 0 && fits(i - 1)) --i;  // larger chunks while they fit
    return cand[i];
  }
  while (++i < cand.size())  // smaller chunks until one fits
    if (fits(i)) return cand[i];
  return 0;
}

}  // namespace rp::cuda
