// CPU ops, part 3: packed sequences (RoPE at given positions, attention restricted to each
// example) and KV-cache attention for generation. Row by row, fp32: the reference twin of
// kernels/cuda/cuda_packed.cu (RoPE) and kernels/cuda/cuda_attention_rows.cu (attention).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.hpp"

namespace rp::cpu {
namespace {

using Vec = Eigen::Map<const Eigen::VectorXf>;
using MVec = Eigen::Map<Eigen::VectorXf>;
const float* F(const void* p) { return static_cast<const float*>(p); }
float* F(void* p) { return static_cast<float*>(p); }

void rope_at(float* x, const int32_t* pos, int64_t T, int64_t heads, int64_t D, const float* inv_freq,
             float scale, bool transpose, int64_t rotary_dim) {
  require(T >= 0 && heads >= 0, "rope_at", "negative dimension");
  const int64_t half = rope_half(D, rotary_dim, "rope_at");
  require(T == 0 || pos != nullptr, "rope_at", "pos is null");
  const float sign = transpose ? -1.f : 1.f;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    require(pos[t] >= 0, "rope_at", "negative position");
    for (int64_t i = 0; i < half; ++i) {
      const float a = float(pos[t]) * inv_freq[i];  // as rope_fwd: fp32 product
      c[size_t(i)] = std::cos(a) * scale;
      s[size_t(i)] = sign * std::sin(a) * scale;
    }
    for (int64_t hd = 0; hd < heads; ++hd) {
      float* x0 = x + (t * heads + hd) * D;
      float* x1 = x0 + half;
      for (int64_t i = 0; i < half; ++i) {
        const float a = x0[i], b = x1[i];
        x0[i] = a * c[size_t(i)] - b * s[size_t(i)];
        x1[i] = b * c[size_t(i)] + a * s[size_t(i)];
      }
    }
  }
}

/// First key of query t of a sequence whose positions start at `p`.
int64_t first_key(const int32_t* p, int64_t t, const char* op) {
  require(p[t] >= 0 && p[t] <= t, op, "positions must satisfy 0 <= pos[t] <= t within each sequence");
  return t - p[t];
}

void check_shape(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, const char* op) {
  require(n_seq >= 0 && L >= 0 && D > 0, op, "bad dimensions");
  require(nq > 0 && nkv > 0 && nq % nkv == 0, op, "nq must be a positive multiple of nkv");
}

/// Softmax of q . k_j * scale over keys [lo, hi] into p (size hi-lo+1); returns the lse.
float softmax_row(const float* q, const float* k, int64_t ldk, int64_t lo, int64_t hi, int64_t D, float scale,
                  std::vector<float>& p) {
  p.resize(size_t(hi - lo + 1));
  const Vec qv(q, D);
  float m = -INFINITY;
  for (int64_t j = lo; j <= hi; ++j) {
    p[size_t(j - lo)] = qv.dot(Vec(k + j * ldk, D)) * scale;
    m = std::max(m, p[size_t(j - lo)]);
  }
  float sum = 0.f;
  for (float& x : p) sum += (x = std::exp(x - m));
  for (float& x : p) x /= sum;
  return m + std::log(sum);
}

}  // namespace

void CpuOps::rope_fwd_at(void* x, const int32_t* pos, int64_t T, int64_t heads, int64_t D,
                         const float* inv_freq, float scale, int64_t rotary_dim) {
  rope_at(F(x), pos, T, heads, D, inv_freq, scale, false, rotary_dim);
}

void CpuOps::rope_bwd_at(void* dx, const int32_t* pos, int64_t T, int64_t heads, int64_t D,
                         const float* inv_freq, float scale, int64_t rotary_dim) {
  rope_at(F(dx), pos, T, heads, D, inv_freq, scale, true, rotary_dim);
}

void CpuOps::attention_fwd_packed(const void* q, const void* k, const void* v, void* o, float* lse,
                                  const int32_t* pos, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv,
                                  int64_t D, float scale, void*) {
  const char* op = "attention_fwd_packed";
  check_shape(n_seq, L, nq, nkv, D, op);
  require(n_seq * L == 0 || pos != nullptr, op, "pos is null");
  const int64_t rep = nq / nkv, ldq = nq * D, ldk = nkv * D;
  std::vector<float> p;
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t t = 0; t < L; ++t) {
      const int64_t lo = first_key(pos + s * L, t, op);
      for (int64_t h = 0; h < nq; ++h) {
        const float* kb = F(k) + s * L * ldk + (h / rep) * D;
        const float* vb = F(v) + s * L * ldk + (h / rep) * D;
        const float l = softmax_row(F(q) + (s * L + t) * ldq + h * D, kb, ldk, lo, t, D, scale, p);
        MVec out(F(o) + (s * L + t) * ldq + h * D, D);
        out.setZero();
        for (int64_t j = lo; j <= t; ++j) out += p[size_t(j - lo)] * Vec(vb + j * ldk, D);
        if (lse) lse[(s * nq + h) * L + t] = l;
      }
    }
}

void CpuOps::attention_bwd_packed(const void* q, const void* k, const void* v, const void* o,
                                  const float* lse, const void* dout, const int32_t* pos, void* dq, void* dk,
                                  void* dv, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D,
                                  float scale, void*) {
  const char* op = "attention_bwd_packed";
  check_shape(n_seq, L, nq, nkv, D, op);
  require(n_seq * L == 0 || (pos != nullptr && lse != nullptr), op, "pos or lse is null");
  const int64_t rep = nq / nkv, ldq = nq * D, ldk = nkv * D;
  fill(DType::f32, dk, n_seq * L * ldk, 0.f);
  fill(DType::f32, dv, n_seq * L * ldk, 0.f);
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t t = 0; t < L; ++t) {
      const int64_t lo = first_key(pos + s * L, t, op);
      for (int64_t h = 0; h < nq; ++h) {
        const int64_t qo = (s * L + t) * ldq + h * D, ko = s * L * ldk + (h / rep) * D;
        const Vec qv(F(q) + qo, D), dov(F(dout) + qo, D);
        const float Di = dov.dot(Vec(F(o) + qo, D));
        const float l = lse[(s * nq + h) * L + t];
        MVec dqv(F(dq) + qo, D);
        dqv.setZero();
        for (int64_t j = lo; j <= t; ++j) {
          const Vec kj(F(k) + ko + j * ldk, D), vj(F(v) + ko + j * ldk, D);
          const float pj = std::exp(qv.dot(kj) * scale - l);
          const float ds = pj * (dov.dot(vj) - Di) * scale;
          MVec(F(dv) + ko + j * ldk, D) += pj * dov;
          MVec(F(dk) + ko + j * ldk, D) += ds * qv;
          dqv += ds * kj;
        }
      }
    }
}

void CpuOps::attention_decode(const void* q, const void* k_cache, const void* v_cache, void* o, int64_t past,
                              int64_t n, int64_t nq, int64_t nkv, int64_t D, float scale) {
  const char* op = "attention_decode";
  check_shape(1, n, nq, nkv, D, op);
  require(past >= 0, op, "negative past");
  const int64_t rep = nq / nkv, ldq = nq * D, ldk = nkv * D;
  std::vector<float> p;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < nq; ++h) {
      const float* kb = F(k_cache) + (h / rep) * D;
      const float* vb = F(v_cache) + (h / rep) * D;
      softmax_row(F(q) + i * ldq + h * D, kb, ldk, 0, past + i, D, scale, p);
      MVec out(F(o) + i * ldq + h * D, D);
      out.setZero();
      for (int64_t j = 0; j <= past + i; ++j) out += p[size_t(j)] * Vec(vb + j * ldk, D);
    }
}

}  // namespace rp::cpu
