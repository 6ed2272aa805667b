// CPU ops of mixture-of-experts blocks: routing, grouping by expert, the grouped linears and
// the weighted combine (kernels/ops.hpp documents each; model/moe_block.cpp uses them).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_ops.hpp"

namespace rp::cpu {
namespace {
const float* F(const void* p) { return static_cast<const float*>(p); }
float* F(void* p) { return static_cast<float*>(p); }

void check_offsets(const int32_t* off, int64_t E, const char* op) {
  require(off != nullptr && E >= 1, op, "offsets_host null or no experts");
  require(off[0] == 0, op, "offsets_host[0] must be 0");
  for (int64_t e = 0; e < E; ++e) require(off[e + 1] >= off[e], op, "offsets_host must not decrease");
}
}  // namespace

void CpuOps::moe_route(const void* logits, float* probs, int32_t* topk_idx, float* topk_w, float* stats,
                       int64_t T, int64_t E, int64_t k, bool norm_topk) {
  require(T >= 0 && E >= 1 && k >= 1 && k <= E, "moe_route", "need T >= 0 and 1 <= k <= E");
  const float* z = F(logits);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* zt = z + t * E;
    float* p = probs + t * E;
    const float mx = *std::max_element(zt, zt + E);
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += (p[e] = std::exp(zt[e] - mx));
    for (int64_t e = 0; e < E; ++e) p[e] = float(p[e] / s);
    std::iota(order.begin(), order.end(), 0);
    // the k largest, descending; equal values keep the lower index first
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += p[order[size_t(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[size_t(j)];
      topk_idx[t * k + j] = e;
      topk_w[t * k + j] = norm_topk ? p[e] / sum : p[e];
      if (stats) stats[e] += 1.0f;
    }
    if (stats)
      for (int64_t e = 0; e < E; ++e) stats[E + e] += p[e];
  }
}

void CpuOps::moe_route_bwd(const float* probs, const int32_t* topk_idx, const float* dw, const float* counts,
                           float aux_coef, void* dlogits, int64_t T, int64_t E, int64_t k, bool norm_topk) {
  require(T >= 0 && E >= 1 && k >= 1 && k <= E, "moe_route_bwd", "need T >= 0 and 1 <= k <= E");
  std::vector<float> dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* p = probs + t * E;
    const int32_t* idx = topk_idx + t * k;
    const float* g = dw + t * k;
    for (int64_t e = 0; e < E; ++e) dp[size_t(e)] = counts ? aux_coef * counts[e] : 0.0f;
    if (norm_topk) {  // w_j = p_j / S: dp_j += g_j / S - sum_i g_i p_i / S^2
      float S = 0, gp = 0;
      for (int64_t j = 0; j < k; ++j) {
        S += p[idx[j]];
        gp += g[j] * p[idx[j]];
      }
      for (int64_t j = 0; j < k; ++j) dp[size_t(idx[j])] += g[j] / S - gp / (S * S);
    } else {
      for (int64_t j = 0; j < k; ++j) dp[size_t(idx[j])] += g[j];
    }
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += double(p[e]) * dp[size_t(e)];
    float* dz = F(dlogits) + t * E;
    for (int64_t e = 0; e < E; ++e) dz[e] = p[e] * (dp[size_t(e)] - float(dot));
  }
}

void CpuOps::moe_sort(const int32_t* topk_idx, int32_t* offsets, int32_t* offsets_host, int32_t* row,
                      int32_t* token, int64_t T, int64_t E, int64_t k) {
  require(T >= 0 && E >= 1 && k >= 1, "moe_sort", "need T >= 0, E >= 1 and k >= 1");
  const int64_t R = T * k;
  std::vector<int32_t> next(size_t(E) + 1, 0);
  for (int64_t a = 0; a < R; ++a) {
    const int32_t e = topk_idx[a];
    if (e < 0 || e >= E) throw std::invalid_argument("moe_sort: expert index outside [0, E)");
    ++next[size_t(e) + 1];
  }
  for (int64_t e = 0; e < E; ++e) next[size_t(e) + 1] += next[size_t(e)];
  for (int64_t e = 0; e <= E; ++e) offsets[e] = offsets_host[e] = next[size_t(e)];
  for (int64_t a = 0; a < R; ++a) {
    const int32_t r = next[size_t(topk_idx[a])]++;
    row[a] = r;
    token[r] = int32_t(a / k);
  }
}

void CpuOps::moe_pad_rows(const int32_t* topk_idx, const int32_t* offsets_host, const int32_t* padded_host,
                          int32_t* offsets, int32_t* row, int32_t* token, int64_t T, int64_t E, int64_t k) {
  require(T >= 0 && E >= 1 && k >= 1, "moe_pad_rows", "need T >= 0, E >= 1 and k >= 1");
  for (int64_t e = 0; e < E; ++e)
    require(padded_host[e + 1] - padded_host[e] >= offsets_host[e + 1] - offsets_host[e], "moe_pad_rows",
            "a padded segment is shorter than its expert's rows");
  std::fill(token, token + padded_host[E], -1);
  for (int64_t a = 0; a < T * k; ++a) {
    const int32_t e = topk_idx[a];
    row[a] += padded_host[e] - offsets_host[e];
    token[row[a]] = int32_t(a / k);
  }
  std::copy(padded_host, padded_host + E + 1, offsets);
}

void CpuOps::moe_zero_pad_rows(void* x, const int32_t* token, int64_t R, int64_t H) {
  require(R >= 0 && H >= 0, "moe_zero_pad_rows", "negative dimension");
  for (int64_t r = 0; r < R; ++r)
    if (token[r] < 0) std::fill(F(x) + r * H, F(x) + (r + 1) * H, 0.0f);
}

void CpuOps::gather_rows(const void* x, const int32_t* token, void* xs, int64_t R, int64_t H) {
  require(R >= 0 && H >= 0, "gather_rows", "negative dimension");
  for (int64_t r = 0; r < R; ++r) {
    if (token[r] < 0) std::fill(F(xs) + r * H, F(xs) + (r + 1) * H, 0.0f);
    else std::memcpy(F(xs) + r * H, F(x) + int64_t(token[r]) * H, size_t(H) * sizeof(float));
  }
}

void CpuOps::moe_combine(const void* ys, const float* w, const int32_t* row, void* y, int64_t T, int64_t k,
                         int64_t H, bool accumulate) {
  require(T >= 0 && k >= 1 && H >= 0, "moe_combine", "bad dimensions");
  std::vector<float> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float* src = F(ys) + int64_t(row[t * k + j]) * H;
      const float wj = w[t * k + j];
      for (int64_t c = 0; c < H; ++c) acc[size_t(c)] += wj * src[c];
    }
    float* dst = F(y) + t * H;
    for (int64_t c = 0; c < H; ++c) dst[c] = accumulate ? dst[c] + acc[size_t(c)] : acc[size_t(c)];
  }
}

void CpuOps::moe_combine_bwd(const void* dy, const void* ys, const float* w, const int32_t* row, void* dys,
                             float* dw, int64_t T, int64_t k, int64_t H) {
  require(T >= 0 && k >= 1 && H >= 0, "moe_combine_bwd", "bad dimensions");
  for (int64_t t = 0; t < T; ++t) {
    const float* g = F(dy) + t * H;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      const float* src = F(ys) + r * H;
      float* d = F(dys) + r * H;
      const float wj = w[t * k + j];
      double dot = 0;
      for (int64_t c = 0; c < H; ++c) {
        d[c] = wj * g[c];
        dot += double(g[c]) * src[c];
      }
      dw[t * k + j] = float(dot);
    }
  }
}

void CpuOps::moe_gather_bwd(const void* dxs, const int32_t* row, void* dx, int64_t T, int64_t k, int64_t H,
                            bool accumulate) {
  require(T >= 0 && k >= 1 && H >= 0, "moe_gather_bwd", "bad dimensions");
  std::vector<float> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float* src = F(dxs) + int64_t(row[t * k + j]) * H;
      for (int64_t c = 0; c < H; ++c) acc[size_t(c)] += src[c];
    }
    float* dst = F(dx) + t * H;
    for (int64_t c = 0; c < H; ++c) dst[c] = accumulate ? dst[c] + acc[size_t(c)] : acc[size_t(c)];
  }
}

void CpuOps::grouped_linear_fwd(const void* x, const void* w, void* y, const int32_t* off, int64_t E,
                                int64_t K, int64_t N) {
  check_offsets(off, E, "grouped_linear_fwd");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n > 0) linear_fwd(F(x) + r0 * K, F(w) + e * N * K, F(y) + r0 * N, n, K, N);
  }
}

void CpuOps::grouped_linear_fwd_add(const void* x, const void* w, void* y, const int32_t* off, int64_t E,
                                    int64_t K, int64_t N, float alpha) {
  check_offsets(off, E, "grouped_linear_fwd_add");
  std::vector<float> t;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    t.resize(size_t(n * N));
    linear_fwd(F(x) + r0 * K, F(w) + e * N * K, t.data(), n, K, N);
    float* dst = F(y) + r0 * N;
    for (int64_t i = 0; i < n * N; ++i) dst[i] += alpha * t[size_t(i)];
  }
}

void CpuOps::grouped_linear_bwd_input(const void* dy, const void* w, void* dx, const int32_t* off, int64_t E,
                                      int64_t K, int64_t N, bool accumulate) {
  check_offsets(off, E, "grouped_linear_bwd_input");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n > 0) linear_bwd_input(F(dy) + r0 * N, F(w) + e * N * K, F(dx) + r0 * K, n, K, N, accumulate);
  }
}

void CpuOps::grouped_linear_bwd_weight(const void* dy, const void* x, void* dw, const int32_t* off, int64_t E,
                                       int64_t K, int64_t N) {
  check_offsets(off, E, "grouped_linear_bwd_weight");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n > 0) linear_bwd_weight(F(dy) + r0 * N, F(x) + r0 * K, F(dw) + e * N * K, n, K, N);
  }
}

}  // namespace rp::cpu
