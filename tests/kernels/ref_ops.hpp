// Naive scalar reference implementations (plain loops, double precision) of the ops in
// kernels/ops.hpp, written independently of the Eigen code, plus test helpers.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

namespace rp::ref {

using VecD = std::vector<double>;
using VecF = std::vector<float>;

inline VecF randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  VecF v(n);
  for (auto& x : v) x = d(g);
  return v;
}
inline VecF nan_vec(size_t n) { return VecF(n, std::numeric_limits<float>::quiet_NaN()); }
inline VecD to_d(const VecF& v) { return VecD(v.begin(), v.end()); }

/// ||a-b|| / max(||b||, tiny); fails on NaN in a.
inline double rel_err(const VecF& a, const VecD& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}
inline double rel_err(const VecF& a, const VecF& b) { return rel_err(a, to_d(b)); }

// ---- forward references -----------------------------------------------------------

/// y[M,N] = x[M,K] W[N,K]^T
inline VecD linear(const VecD& x, const VecD& w, int64_t M, int64_t K, int64_t N) {
  VecD y(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[size_t(m * K + k)] * w[size_t(n * K + k)];
      y[size_t(m * N + n)] = s;
    }
  return y;
}

inline VecD rmsnorm(const VecD& x, const VecD& w, int64_t R, int64_t n, double eps) {
  VecD y(x.size());
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < n; ++j) ss += x[size_t(r * n + j)] * x[size_t(r * n + j)];
    double inv = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t j = 0; j < n; ++j) y[size_t(r * n + j)] = x[size_t(r * n + j)] * inv * w[size_t(j)];
  }
  return y;
}

/// HF apply_rotary_pos_emb: x*cos + rotate_half(x)*sin, cos/sin = cat(f, f) * scale,
/// f = position * inv_freq (position restarts per sequence). Partial rotary (Phi3's
/// apply_rotary_pos_emb, rotary_dim R = cos width): x[..., :R] rotates that way,
/// x[..., R:] is concatenated unchanged. R 0: D.
inline VecD rope(const VecD& x, int64_t n_seq, int64_t L, int64_t heads, int64_t D, const VecF& inv_freq,
                 double scale, int64_t R = 0) {
  VecD y(x);
  if (R == 0) R = D;
  const int64_t h = R / 2;
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t p = 0; p < L; ++p)
      for (int64_t hd = 0; hd < heads; ++hd) {
        const double* xi = x.data() + ((s * L + p) * heads + hd) * D;
        double* yi = y.data() + ((s * L + p) * heads + hd) * D;
        for (int64_t j = 0; j < R; ++j) {
          double ang = double(p) * double(inv_freq[size_t(j % h)]);
          double rot = j < h ? -xi[j + h] : xi[j - h];  // rotate_half
          yi[j] = xi[j] * std::cos(ang) * scale + rot * std::sin(ang) * scale;
        }
      }
  return y;
}

/// Causal GQA attention; returns o and fills lse [n_seq, nq, L] if given.
inline VecD attention(const VecD& q, const VecD& k, const VecD& v, int64_t n_seq, int64_t L, int64_t nq,
                      int64_t nkv, int64_t D, double scale, VecD* lse = nullptr) {
  VecD o(q.size(), 0.0);
  if (lse) lse->assign(size_t(n_seq * nq * L), 0.0);
  const int64_t rep = nq / nkv;
  std::vector<double> sc(static_cast<size_t>(L));
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t h = 0; h < nq; ++h)
      for (int64_t i = 0; i < L; ++i) {
        const double* qi = q.data() + ((s * L + i) * nq + h) * D;
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          const double* kj = k.data() + ((s * L + j) * nkv + h / rep) * D;
          double d = 0;
          for (int64_t e = 0; e < D; ++e) d += qi[e] * kj[e];
          sc[size_t(j)] = d * scale;
          mx = std::max(mx, sc[size_t(j)]);
        }
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) z += std::exp(sc[size_t(j)] - mx);
        if (lse) (*lse)[size_t((s * nq + h) * L + i)] = mx + std::log(z);
        double* oi = o.data() + ((s * L + i) * nq + h) * D;
        for (int64_t j = 0; j <= i; ++j) {
          double p = std::exp(sc[size_t(j)] - mx) / z;
          const double* vj = v.data() + ((s * L + j) * nkv + h / rep) * D;
          for (int64_t e = 0; e < D; ++e) oi[e] += p * vj[e];
        }
      }
  return o;
}

/// The attention variants of kernels/ops.hpp (AttentionVariant), densely: the causal scores
/// s = q k^T * scale, soft-capped to cap * tanh(s / cap) when cap > 0 (Gemma 2), masked to the
/// last `window` keys when window > 0 and to the packed example of `pos` (query t of sequence
/// s sees keys j >= t - pos[s*L+t]) when given, and the sink logit sinks[h] (unscaled) as one
/// more softmax column when given (GPT-OSS). o [n_seq*L, nq, D], lse [n_seq, nq, L] (natural
/// log, the sink included).
struct VariantOut {
  VecD o, lse;
};
inline VariantOut attention_variant(const VecD& q, const VecD& k, const VecD& v, int64_t n_seq, int64_t L,
                                    int64_t nq, int64_t nkv, int64_t D, double scale, int64_t window,
                                    const std::vector<int32_t>* pos, const VecD* sinks, double cap) {
  VariantOut r{VecD(size_t(n_seq * L * nq * D), 0.0), VecD(size_t(n_seq * nq * L), 0.0)};
  const double ninf = -std::numeric_limits<double>::infinity();
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t h = 0; h < nq; ++h) {
      const int64_t kh = h / (nq / nkv);
      for (int64_t t = 0; t < L; ++t) {
        VecD z(size_t(L + 1), ninf);  // the keys, then the sink
        for (int64_t j = 0; j <= t; ++j) {
          if (window > 0 && j <= t - window) continue;
          if (pos && j < t - (*pos)[size_t(s * L + t)]) continue;
          double dotp = 0;
          for (int64_t d = 0; d < D; ++d)
            dotp += q[size_t(((s * L + t) * nq + h) * D + d)] * k[size_t(((s * L + j) * nkv + kh) * D + d)];
          z[size_t(j)] = cap > 0 ? cap * std::tanh(dotp * scale / cap) : dotp * scale;
        }
        if (sinks) z[size_t(L)] = (*sinks)[size_t(h)];
        const double m = *std::max_element(z.begin(), z.end());
        double sum = 0;
        for (double& x : z) sum += (x = std::exp(x - m));
        r.lse[size_t((s * nq + h) * L + t)] = m + std::log(sum);
        for (int64_t j = 0; j < L; ++j)
          for (int64_t d = 0; d < D; ++d)
            r.o[size_t(((s * L + t) * nq + h) * D + d)] +=
                z[size_t(j)] / sum * v[size_t(((s * L + j) * nkv + kh) * D + d)];
      }
    }
  return r;
}

// ---- expanded GQA backward helpers (CPU twins of kernels/cuda's k_gqa_expand_kv and
// k_gqa_group_sum)

/// The KV head of each query head [h0, h0+hc): out[t, i, :] = x[t, (h0 + i) / r, :] for
/// x [T, nkv, D]; out [T, hc, D].
inline VecF gqa_expand(const VecF& x, int64_t T, int64_t nkv, int64_t h0, int64_t hc, int64_t r, int64_t D) {
  VecF out(size_t(T * hc * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < hc; ++i)
      for (int64_t d = 0; d < D; ++d)
        out[size_t((t * hc + i) * D + d)] = x[size_t((t * nkv + (h0 + i) / r) * D + d)];
  return out;
}

/// Sums of consecutive groups of m heads: out[t, g, :] = sum_{j<m} in[t, g*m + j, :] for
/// in [T, G*m, D], in double; out [T, G, D].
inline VecD gqa_group_sum(const VecF& in, int64_t T, int64_t G, int64_t m, int64_t D) {
  VecD out(size_t(T * G * D), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t d = 0; d < D; ++d)
          out[size_t((t * G + g) * D + d)] += in[size_t(((t * G + g) * m + j) * D + d)];
  return out;
}

/// gelu(g, approximate="tanh") * u (HF GemmaMLP with gelu_pytorch_tanh).
inline VecD geglu(const VecD& g, const VecD& u) {
  VecD h(g.size());
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  for (size_t i = 0; i < g.size(); ++i)
    h[i] = 0.5 * g[i] * (1.0 + std::tanh(k * (g[i] + 0.044715 * g[i] * g[i] * g[i]))) * u[i];
  return h;
}

inline VecD swiglu(const VecD& g, const VecD& u) {
  VecD h(g.size());
  for (size_t i = 0; i < g.size(); ++i) h[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return h;
}

/// Unchunked: full logits [T, V], summed CE over targets >= 0; returns {sum, count}.
inline std::pair<double, int64_t> cross_entropy(const VecD& h, const VecD& w, const std::vector<int32_t>& tg,
                                                int64_t T, int64_t H, int64_t V) {
  VecD z = linear(h, w, T, H, V);
  double sum = 0;
  int64_t cnt = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (tg[size_t(t)] < 0) continue;
    double mx = -1e300;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, z[size_t(t * V + j)]);
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(z[size_t(t * V + j)] - mx);
    sum += mx + std::log(s) - z[size_t(t * V + tg[size_t(t)])];
    ++cnt;
  }
  return {sum, cnt};
}

// ---- gradient checking --------------------------------------------------------------

/// Central differences of f at x (double), at `samples` random coordinates (all when
/// samples >= x.size()); compares with `analytic` (d f / d x from the op under test).
/// Fails the test when the relative error of the sampled vectors exceeds tol.
inline void check_grad(const std::function<double(const VecD&)>& f, VecD x, const VecF& analytic,
                       size_t samples, double tol, const char* what, uint32_t seed = 7) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<size_t> idx;
  if (samples >= x.size()) {
    for (size_t i = 0; i < x.size(); ++i) idx.push_back(i);
  } else {
    std::mt19937 g(seed);
    std::uniform_int_distribution<size_t> d(0, x.size() - 1);
    for (size_t i = 0; i < samples; ++i) idx.push_back(d(g));
  }
  VecF a;
  VecD num;
  for (size_t i : idx) {
    const double x0 = x[i], h = 1e-5 * std::max(1.0, std::abs(x0));
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    num.push_back((fp - fm) / (2 * h));
    a.push_back(analytic[i]);
  }
  double e = rel_err(a, num);
  EXPECT_LT(e, tol) << what << ": relative error of the gradient " << e;
}

/// sum_i y[i] * r[i]
inline double dot(const VecD& y, const VecF& r) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * double(r[i]);
  return s;
}

}  // namespace rp::ref
