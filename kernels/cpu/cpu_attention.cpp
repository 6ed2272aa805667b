// CPU ops, part 2: RoPE, causal GQA attention, chunked LM head + cross-entropy.
// GCC 12 reports false -Wmaybe-uninitialized inside Eigen's AVX-512 packet code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.hpp"

namespace rp::cpu {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using CMat = Eigen::Map<const RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;
using MMat = Eigen::Map<RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;
using MVec = Eigen::Map<Eigen::ArrayXf>;

const float* F(const void* p) { return static_cast<const float*>(p); }
float* F(void* p) { return static_cast<float*>(p); }

// cos/sin tables [L, D/2] for positions 0..L-1, both multiplied by `scale`.
void rope_tables(int64_t L, int64_t half, const float* inv_freq, float scale, std::vector<float>& c,
                 std::vector<float>& s) {
  c.resize(size_t(L * half));
  s.resize(size_t(L * half));
  for (int64_t p = 0; p < L; ++p)
    for (int64_t i = 0; i < half; ++i) {
      float a = float(p) * inv_freq[i];  // fp32 product, as HF's inv_freq @ position_ids
      c[size_t(p * half + i)] = std::cos(a) * scale;
      s[size_t(p * half + i)] = std::sin(a) * scale;
    }
}

void rope_apply(float* x, int64_t n_seq, int64_t L, int64_t heads, int64_t D, const float* inv_freq,
                float scale, bool transpose, int64_t rotary_dim) {
  require(n_seq >= 0 && L >= 0 && heads >= 0, "rope", "negative dimension");
  const int64_t half = rope_half(D, rotary_dim, "rope");
  std::vector<float> c, s;
  rope_tables(L, half, inv_freq, scale, c, s);
  const float sign = transpose ? -1.f : 1.f;
  for (int64_t t = 0; t < n_seq * L; ++t) {
    const float* ct = c.data() + (t % L) * half;
    const float* st = s.data() + (t % L) * half;
    for (int64_t hd = 0; hd < heads; ++hd) {
      float* x0 = x + (t * heads + hd) * D;
      float* x1 = x0 + half;
      for (int64_t i = 0; i < half; ++i) {
        float a = x0[i], b = x1[i], si = sign * st[i];
        x0[i] = a * ct[i] - b * si;
        x1[i] = b * ct[i] + a * si;
      }
    }
  }
}

void check_attn(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, void* scratch, const char* op) {
  require(n_seq >= 0 && L >= 0 && D > 0, op, "bad dimensions");
  require(nq > 0 && nkv > 0 && nq % nkv == 0, op, "nq must be a positive multiple of nkv");
  require(scratch != nullptr || n_seq * L == 0, op, "scratch is null");
}

}  // namespace

// ---- RoPE ----------------------------------------------------------------------

void CpuOps::rope_fwd(void* x, int64_t n_seq, int64_t seq_len, int64_t heads, int64_t D,
                      const float* inv_freq, float scale, int64_t rotary_dim) {
  rope_apply(F(x), n_seq, seq_len, heads, D, inv_freq, scale, false, rotary_dim);
}

void CpuOps::rope_bwd(void* dx, int64_t n_seq, int64_t seq_len, int64_t heads, int64_t D,
                      const float* inv_freq, float scale, int64_t rotary_dim) {
  rope_apply(F(dx), n_seq, seq_len, heads, D, inv_freq, scale, true, rotary_dim);
}

// ---- attention -----------------------------------------------------------------

void CpuOps::attention_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int64_t n_seq,
                           int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale, void* scratch) {
  check_attn(n_seq, L, nq, nkv, D, scratch, "attention_fwd");
  const int64_t rep = nq / nkv, ldq = nq * D, ldk = nkv * D;
  float* S = F(scratch);
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t h = 0; h < nq; ++h) {
      const int64_t kh = h / rep;
      CMat Q(F(q) + s * L * ldq + h * D, L, D, Eigen::OuterStride<>(ldq));
      CMat K(F(k) + s * L * ldk + kh * D, L, D, Eigen::OuterStride<>(ldk));
      CMat V(F(v) + s * L * ldk + kh * D, L, D, Eigen::OuterStride<>(ldk));
      MMat O(F(o) + s * L * ldq + h * D, L, D, Eigen::OuterStride<>(ldq));
      for (int64_t r0 = 0; r0 < L; r0 += kAttnBlock) {
        if (interrupted()) return;  // a teardown: the outputs are not used
        const int64_t nb = std::min(kAttnBlock, L - r0), r1 = r0 + nb;
        MMat Sb(S, nb, r1, Eigen::OuterStride<>(r1));
        Sb.noalias() = Q.middleRows(r0, nb) * K.topRows(r1).transpose();
        for (int64_t i = 0; i < nb; ++i) {
          const int64_t cnt = r0 + i + 1;  // causal: keys 0..row
          MVec row(S + i * r1, cnt);
          row *= scale;
          float m = row.maxCoeff();
          row = (row - m).exp();
          float sum = row.sum();
          row *= 1.0f / sum;
          std::fill(S + i * r1 + cnt, S + (i + 1) * r1, 0.f);
          if (lse) lse[(s * nq + h) * L + r0 + i] = m + std::log(sum);
        }
        O.middleRows(r0, nb).noalias() = Sb * V.topRows(r1);
      }
    }
}

void CpuOps::attention_bwd(const void* q, const void* k, const void* v, const void* o, const float* lse,
                           const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t L,
                           int64_t nq, int64_t nkv, int64_t D, float scale, void* scratch) {
  check_attn(n_seq, L, nq, nkv, D, scratch, "attention_bwd");
  require(lse != nullptr, "attention_bwd", "lse is null");
  const int64_t rep = nq / nkv, ldq = nq * D, ldk = nkv * D;
  fill(DType::f32, dk, n_seq * L * ldk, 0.f);
  fill(DType::f32, dv, n_seq * L * ldk, 0.f);
  float* P = F(scratch);
  float* dP = P + std::min(kAttnBlock, L) * L;
  std::vector<float> Di(size_t(std::min(kAttnBlock, L)));
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t h = 0; h < nq; ++h) {
      const int64_t kh = h / rep, qo = s * L * ldq + h * D, ko = s * L * ldk + kh * D;
      CMat Q(F(q) + qo, L, D, Eigen::OuterStride<>(ldq));
      CMat O(F(o) + qo, L, D, Eigen::OuterStride<>(ldq));
      CMat dO(F(dout) + qo, L, D, Eigen::OuterStride<>(ldq));
      CMat K(F(k) + ko, L, D, Eigen::OuterStride<>(ldk));
      CMat V(F(v) + ko, L, D, Eigen::OuterStride<>(ldk));
      MMat dQ(F(dq) + qo, L, D, Eigen::OuterStride<>(ldq));
      MMat dK(F(dk) + ko, L, D, Eigen::OuterStride<>(ldk));
      MMat dV(F(dv) + ko, L, D, Eigen::OuterStride<>(ldk));
      const float* lrow = lse + (s * nq + h) * L;
      for (int64_t r0 = 0; r0 < L; r0 += kAttnBlock) {
        if (interrupted()) return;  // a teardown: the gradients are not used
        const int64_t nb = std::min(kAttnBlock, L - r0), r1 = r0 + nb;
        MMat Pb(P, nb, r1, Eigen::OuterStride<>(r1));
        MMat dPb(dP, nb, r1, Eigen::OuterStride<>(r1));
        Pb.noalias() = Q.middleRows(r0, nb) * K.topRows(r1).transpose();
        for (int64_t i = 0; i < nb; ++i) {
          const int64_t cnt = r0 + i + 1;
          MVec row(P + i * r1, cnt);
          row = (row * scale - lrow[r0 + i]).exp();
          std::fill(P + i * r1 + cnt, P + (i + 1) * r1, 0.f);
          Di[size_t(i)] = dO.row(r0 + i).dot(O.row(r0 + i));
        }
        dV.topRows(r1).noalias() += Pb.transpose() * dO.middleRows(r0, nb);
        dPb.noalias() = dO.middleRows(r0, nb) * V.topRows(r1).transpose();
        for (int64_t i = 0; i < nb; ++i) {
          MVec pr(P + i * r1, r1), dpr(dP + i * r1, r1);
          pr = pr * (dpr - Di[size_t(i)]) * scale;  // dS (zero where masked)
        }
        dQ.middleRows(r0, nb).noalias() = Pb * K.topRows(r1);
        dK.topRows(r1).noalias() += Pb.transpose() * Q.middleRows(r0, nb);
      }
    }
}

// ---- LM head + cross-entropy ---------------------------------------------------

void CpuOps::lm_head_cross_entropy(const void* h, const void* w, const int32_t* targets, int64_t T, int64_t H,
                                   int64_t V, float* loss, void* dh, void* dw, void* scratch,
                                   float loss_scale, float softcap) {
  const char* op = "lm_head_cross_entropy";
  Ops::check_lm_head_ce_args(T, H, V, loss, scratch, loss_scale, softcap);
  for (int64_t t = 0; t < T; ++t)
    if (targets[t] >= V)
      throw std::out_of_range(std::string(op) + ": target " + std::to_string(targets[t]) + " at position " +
                              std::to_string(t) + " >= vocab " + std::to_string(V));
  const bool grad = dh != nullptr || dw != nullptr;
  float* Z = F(scratch);
  float* hb = Z + kCeChunk * V;
  float* dhb = hb + kCeChunk * H;
  int32_t* idx = reinterpret_cast<int32_t*>(dhb + kCeChunk * H);
  if (dh) fill(DType::f32, dh, T * H, 0.f);
  double total = 0;
  int64_t count = 0;
  std::vector<float> th(softcap > 0.f ? size_t(V) : 0);  // tanh(z / softcap) of one row
  for (int64_t t = 0; t < T;) {
    int64_t n = 0;
    for (; t < T && n < kCeChunk; ++t) {
      if (targets[t] < 0) continue;
      idx[n] = int32_t(t);
      std::memcpy(hb + n * H, F(h) + t * H, size_t(H) * sizeof(float));
      ++n;
    }
    if (n == 0) continue;
    gemm_nt(threads_, n, V, H, hb, H, F(w), H, Z, V, false);  // logits [n, V]
    for (int64_t i = 0; i < n; ++i) {
      MVec z(Z + i * V, V);
      if (softcap > 0.f) {  // zc = softcap * tanh(z / softcap); the softmax below is of zc
        MVec tv(th.data(), V);
        for (int64_t j = 0; j < V; ++j) tv[j] = std::tanh(z[j] / softcap);
        z = tv * softcap;
      }
      const int32_t tg = targets[idx[i]];
      const float zt = z[tg];
      const float m = z.maxCoeff();
      float sum;
      if (grad) {
        z = (z - m).exp();
        sum = z.sum();
        z *= 1.0f / sum;
        z[tg] -= 1.0f;                                               // dlogits = softmax - onehot
        if (softcap > 0.f) z *= 1.0f - MVec(th.data(), V).square();  // through the tanh
        if (loss_scale != 1.0f) z *= loss_scale;                     // d(loss_scale * loss) / dlogits (fp32)
      } else {
        sum = (z - m).exp().sum();
      }
      total += double(m) + std::log(double(sum)) - double(zt);
    }
    count += n;
    if (dh) {
      gemm_nn(threads_, n, H, V, Z, V, F(w), H, dhb, H, false);
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(F(dh) + int64_t(idx[i]) * H, dhb + i * H, size_t(H) * sizeof(float));
    }
    if (dw) gemm_tn(threads_, V, H, n, Z, V, hb, H, F(dw), H, true);
  }
  loss[0] = float(total);
  loss[1] = float(count);
}

}  // namespace rp::cpu
