// CPU ops: what GPT-OSS adds (HF transformers GptOssForCausalLM, modeling_gpt_oss.py):
// attention with a sliding window and per-head sink logits (Xiao et al. 2023, "Efficient
// Streaming Language Models with Attention Sinks"; HF eager_attention_forward concatenates
// the sink as one more logit column, softmaxes, and drops that column), per-expert biases,
// and the clamped SwiGLU of GptOssExperts; and Gemma 2's soft-capped scores (HF Gemma2
// eager_attention_forward: cap * tanh(s / cap) before the mask). Row by row, fp32: the
// reference twin of kernels/cuda/cuda_attention_variant.cu and the GPT-OSS kernels of
// cuda_elementwise.
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

bool is_plain(const Ops::AttentionVariant& var) {
  return var.window == 0 && var.sinks == nullptr && var.softcap == 0.f;
}

void check_variant(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D,
                   const Ops::AttentionVariant& var, const char* op) {
  require(n_seq >= 0 && L >= 0 && D > 0, op, "bad dimensions");
  require(nq > 0 && nkv > 0 && nq % nkv == 0, op, "nq must be a positive multiple of nkv");
  require(var.window >= 0, op, "negative window");
  Ops::check_softcap(var.softcap, op);
}

/// First key query t of a sequence may see: the example's start (t - pos[t]) when packed,
/// and the window's start (t - window + 1) when windowed.
int64_t first_key(const Ops::AttentionVariant& var, const int32_t* pos, int64_t t, const char* op) {
  int64_t lo = 0;
  if (pos) {
    require(pos[t] >= 0 && pos[t] <= t, op, "positions must satisfy 0 <= pos[t] <= t within each sequence");
    lo = t - pos[t];
  }
  if (var.window > 0) lo = std::max(lo, t - var.window + 1);
  return lo;
}

/// p[j-lo] = exp(s_j - lse) over keys [lo, hi], s_j = soft_cap(q.k_j*scale, cap); returns lse,
/// which includes the sink logit exp(sink) when has_sink.
float softmax_row(const float* q, const float* k, int64_t ldk, int64_t lo, int64_t hi, int64_t D, float scale,
                  float cap, bool has_sink, float sink, std::vector<float>& p) {
  p.resize(size_t(hi - lo + 1));
  const Vec qv(q, D);
  float m = has_sink ? sink : -INFINITY;
  for (int64_t j = lo; j <= hi; ++j) {
    p[size_t(j - lo)] = Ops::soft_cap(qv.dot(Vec(k + j * ldk, D)) * scale, cap);
    m = std::max(m, p[size_t(j - lo)]);
  }
  float sum = has_sink ? std::exp(sink - m) : 0.f;
  for (float& x : p) sum += (x = std::exp(x - m));
  for (float& x : p) x /= sum;
  return m + std::log(sum);
}

}  // namespace

void CpuOps::attention_fwd_v(const void* q, const void* k, const void* v, void* o, float* lse, int64_t n_seq,
                             int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale,
                             const AttentionVariant& var, void* scratch) {
  const char* op = "attention_fwd_v";
  check_variant(n_seq, L, nq, nkv, D, var, op);
  if (is_plain(var)) {
    if (var.pos) return attention_fwd_packed(q, k, v, o, lse, var.pos, n_seq, L, nq, nkv, D, scale, scratch);
    return attention_fwd(q, k, v, o, lse, n_seq, L, nq, nkv, D, scale, scratch);
  }
  const int64_t rep = nq / nkv, ldq = nq * D, ldk = nkv * D;
  const float* sinks = F(var.sinks);
  std::vector<float> p;
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t t = 0; t < L; ++t) {
      const int64_t lo = first_key(var, var.pos ? var.pos + s * L : nullptr, t, op);
      for (int64_t h = 0; h < nq; ++h) {
        const float* kb = F(k) + s * L * ldk + (h / rep) * D;
        const float* vb = F(v) + s * L * ldk + (h / rep) * D;
        const float l = softmax_row(F(q) + (s * L + t) * ldq + h * D, kb, ldk, lo, t, D, scale, var.softcap,
                                    sinks != nullptr, sinks ? sinks[h] : 0.f, p);
        MVec out(F(o) + (s * L + t) * ldq + h * D, D);
        out.setZero();
        for (int64_t j = lo; j <= t; ++j) out += p[size_t(j - lo)] * Vec(vb + j * ldk, D);
        if (lse) lse[(s * nq + h) * L + t] = l;
      }
    }
}

void CpuOps::attention_bwd_v(const void* q, const void* k, const void* v, const void* o, const float* lse,
                             const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t L,
                             int64_t nq, int64_t nkv, int64_t D, float scale, const AttentionVariant& var,
                             void* scratch) {
  const char* op = "attention_bwd_v";
  check_variant(n_seq, L, nq, nkv, D, var, op);
  require(n_seq * L == 0 || lse != nullptr, op, "lse is null");
  require(var.dsinks == nullptr || var.sinks != nullptr, op, "dsinks without sinks");
  if (is_plain(var)) {
    if (var.pos)
      return attention_bwd_packed(q, k, v, o, lse, dout, var.pos, dq, dk, dv, n_seq, L, nq, nkv, D, scale,
                                  scratch);
    return attention_bwd(q, k, v, o, lse, dout, dq, dk, dv, n_seq, L, nq, nkv, D, scale, scratch);
  }
  const int64_t rep = nq / nkv, ldq = nq * D, ldk = nkv * D;
  const float* sinks = F(var.sinks);
  float* dsinks = F(var.dsinks);
  fill(DType::f32, dk, n_seq * L * ldk, 0.f);
  fill(DType::f32, dv, n_seq * L * ldk, 0.f);
  std::vector<double> dsink(size_t(nq), 0.0);
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t t = 0; t < L; ++t) {
      const int64_t lo = first_key(var, var.pos ? var.pos + s * L : nullptr, t, op);
      for (int64_t h = 0; h < nq; ++h) {
        const int64_t qo = (s * L + t) * ldq + h * D, ko = s * L * ldk + (h / rep) * D;
        const Vec qv(F(q) + qo, D), dov(F(dout) + qo, D);
        const float Di = dov.dot(Vec(F(o) + qo, D));
        const float l = lse[(s * nq + h) * L + t];
        if (sinks) dsink[size_t(h)] -= double(std::exp(sinks[h] - l)) * Di;
        MVec dqv(F(dq) + qo, D);
        dqv.setZero();
        for (int64_t j = lo; j <= t; ++j) {
          const Vec kj(F(k) + ko + j * ldk, D), vj(F(v) + ko + j * ldk, D);
          const float raw = qv.dot(kj) * scale, cap = var.softcap;
          // soft-capping: s = cap * tanh(raw / cap), ds/draw = 1 - tanh^2
          const float th = cap > 0.f ? std::tanh(raw / cap) : 0.f;
          const float pj = std::exp((cap > 0.f ? cap * th : raw) - l);
          const float ds = pj * (dov.dot(vj) - Di) * (cap > 0.f ? 1.f - th * th : 1.f) * scale;
          MVec(F(dv) + ko + j * ldk, D) += pj * dov;
          MVec(F(dk) + ko + j * ldk, D) += ds * qv;
          dqv += ds * kj;
        }
      }
    }
  if (dsinks)
    for (int64_t h = 0; h < nq; ++h) dsinks[h] += float(dsink[size_t(h)]);
}

void CpuOps::attention_decode_v(const void* q, const void* k_cache, const void* v_cache, void* o,
                                int64_t past, int64_t n, int64_t nq, int64_t nkv, int64_t D, float scale,
                                const AttentionVariant& var) {
  const char* op = "attention_decode_v";
  check_variant(1, n, nq, nkv, D, var, op);
  require(past >= 0, op, "negative past");
  require(var.pos == nullptr && var.dsinks == nullptr, op, "pos and dsinks must be null");
  const int64_t rep = nq / nkv, ldq = nq * D, ldk = nkv * D;
  const float* sinks = F(var.sinks);
  std::vector<float> p;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = past + i, lo = var.window > 0 ? std::max<int64_t>(0, t - var.window + 1) : 0;
    for (int64_t h = 0; h < nq; ++h) {
      const float* kb = F(k_cache) + (h / rep) * D;
      const float* vb = F(v_cache) + (h / rep) * D;
      softmax_row(F(q) + i * ldq + h * D, kb, ldk, lo, t, D, scale, var.softcap, sinks != nullptr,
                  sinks ? sinks[h] : 0.f, p);
      MVec out(F(o) + i * ldq + h * D, D);
      out.setZero();
      for (int64_t j = lo; j <= t; ++j) out += p[size_t(j - lo)] * Vec(vb + j * ldk, D);
    }
  }
}

// ---- per-expert bias -------------------------------------------------------------

namespace {
void check_groups(const int32_t* off, int64_t E, int64_t N, const char* op) {
  require(E >= 1 && N >= 0, op, "bad dimensions");
  require(off != nullptr && off[0] >= 0, op, "offsets_host must start at a row >= 0");
  for (int64_t e = 0; e < E; ++e) require(off[e + 1] >= off[e], op, "offsets_host must not decrease");
}
}  // namespace

void CpuOps::grouped_bias_fwd(void* y, const void* b, const int32_t* off, int64_t E, int64_t N) {
  check_groups(off, E, N, "grouped_bias_fwd");
  for (int64_t e = 0; e < E; ++e) {
    const Vec be(F(b) + e * N, N);
    for (int64_t r = off[e]; r < off[e + 1]; ++r) MVec(F(y) + r * N, N) += be;
  }
}

void CpuOps::grouped_bias_bwd(const void* dy, void* db, const int32_t* off, int64_t E, int64_t N) {
  check_groups(off, E, N, "grouped_bias_bwd");
  for (int64_t e = 0; e < E; ++e) {
    MVec dbe(F(db) + e * N, N);
    for (int64_t r = off[e]; r < off[e + 1]; ++r) dbe += Vec(F(dy) + r * N, N);
  }
}

// ---- clamped SwiGLU (HF GptOssExperts._apply_gate) ----------------------------------

void CpuOps::swiglu_clamped_fwd(const void* g, const void* u, void* h, int64_t n, float alpha, float limit) {
  require(n >= 0, "swiglu_clamped_fwd", "negative size");
  for (int64_t i = 0; i < n; ++i) {
    const float gc = std::min(F(g)[i], limit), uc = std::clamp(F(u)[i], -limit, limit);
    const float s = 1.f / (1.f + std::exp(-alpha * gc));
    F(h)[i] = (uc + 1.f) * (gc * s);
  }
}

void CpuOps::swiglu_clamped_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n,
                                float alpha, float limit) {
  require(n >= 0, "swiglu_clamped_bwd", "negative size");
  for (int64_t i = 0; i < n; ++i) {
    const float gi = F(g)[i], ui = F(u)[i], d = F(dh)[i];
    const float gc = std::min(gi, limit), uc = std::clamp(ui, -limit, limit);
    const float s = 1.f / (1.f + std::exp(-alpha * gc));
    F(dg)[i] = gi < limit ? d * (uc + 1.f) * (s + alpha * gc * s * (1.f - s)) : 0.f;
    F(du)[i] = (ui > -limit && ui < limit) ? d * gc * s : 0.f;
  }
}

}  // namespace rp::cpu
