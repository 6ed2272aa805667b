// Shared by the optimizer tests: an independent double-precision textbook AdamW / Adam
// (Kingma & Ba 2015 Alg. 1; Loshchilov & Hutter 2019 Alg. 2), with "magnitude"
// accumulators bounding the fp32 rounding error of each quantity, and an element-wise
// comparison at relative 1e-6 that reports the first mismatch as a string (fast enough
// for millions of elements, unlike one gtest assertion per element).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "optimizer/adamw.hpp"

namespace adam_ref {

struct Ref {
  std::vector<double> w, m, v, vmax, wabs, mabs, vabs;
  int64_t t = 0;

  explicit Ref(const std::vector<float>& w0)
      : w(w0.begin(), w0.end()),
        m(w0.size()),
        v(w0.size()),
        vmax(w0.size()),
        wabs(w0.size()),
        mabs(w0.size()),
        vabs(w0.size()) {
    for (size_t i = 0; i < w0.size(); ++i) wabs[i] = std::fabs(w[i]);
  }

  /// grad: raw gradients; scale: grad_scale.
  void step(const float* grad, double scale, const rp::AdamWOptions& o, double lr) {
    ++t;
    const double bc1 = 1 - std::pow(o.beta1, double(t));
    const double bc2 = 1 - std::pow(o.beta2, double(t));
    for (size_t i = 0; i < w.size(); ++i) {
      double g = double(grad[i]) * scale;
      if (o.maximize) g = -g;
      double gabs = std::fabs(g);
      if (!o.decoupled) {
        g += o.weight_decay * w[i];
        gabs += o.weight_decay * std::fabs(w[i]);
      } else {
        w[i] -= lr * o.weight_decay * w[i];
      }
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      mabs[i] = o.beta1 * mabs[i] + (1 - o.beta1) * gabs;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      vabs[i] = o.beta2 * vabs[i] + (1 - o.beta2) * gabs * gabs;
      double vh = v[i];
      if (o.amsgrad) {
        vmax[i] = std::max(vmax[i], v[i]);
        vh = vmax[i];
      }
      const double mhat = m[i] / bc1, vhat = vh / bc2;
      const double upd = lr * mhat / (std::sqrt(vhat) + o.eps);
      w[i] -= upd;
      wabs[i] += std::fabs(upd) + 2 * lr * mabs[i] / bc1 / (std::sqrt(vhat) + o.eps) +
                 lr * o.weight_decay * std::fabs(w[i]);
    }
  }
};

constexpr double kRel = 1e-6;
constexpr double kDenorm = std::numeric_limits<float>::denorm_min();

/// Element-wise check of (w, st) against the reference; "" when every element is within
/// relative 1e-6 (of the sum of |terms|), else a description of the first failure.
inline std::string compare(const float* w, const rp::AdamWState& st, const Ref& r,
                           const rp::AdamWOptions& o) {
  if (st.step != r.t) return "step " + std::to_string(st.step) + " != " + std::to_string(r.t);
  for (size_t i = 0; i < r.w.size(); ++i) {
    auto fail = [&](const char* what, double got, double want) {
      return std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(got) + ", reference " +
             std::to_string(want);
    };
    if (!(std::fabs(w[i] - r.w[i]) <= kRel * (std::fabs(r.w[i]) + r.wabs[i]) + 1e-30))
      return fail("w", w[i], r.w[i]);
    if (!(std::fabs(st.m[i] - r.m[i]) <= kRel * (std::fabs(r.m[i]) + r.mabs[i]) + 1e-38))
      return fail("m", st.m[i], r.m[i]);
    if (!(std::fabs(st.v[i] - r.v[i]) <= kRel * r.vabs[i] + 64 * kDenorm)) return fail("v", st.v[i], r.v[i]);
    if (o.amsgrad &&
        !(std::fabs(st.vmax[i] - r.vmax[i]) <= kRel * r.vmax[i] + 64 * kDenorm + kRel * r.vabs[i]))
      return fail("vmax", st.vmax[i], r.vmax[i]);
  }
  return "";
}

/// Every option combination: decoupled x amsgrad x maximize x weight decay {0, 0.1}.
inline std::vector<rp::AdamWOptions> all_combos() {
  std::vector<rp::AdamWOptions> out;
  for (int bits = 0; bits < 16; ++bits) {
    rp::AdamWOptions o;
    o.lr = 1e-3;
    o.decoupled = bits & 1;
    o.amsgrad = bits & 2;
    o.maximize = bits & 4;
    o.weight_decay = (bits & 8) ? 0.1 : 0.0;
    out.push_back(o);
  }
  return out;
}

inline std::string name(const rp::AdamWOptions& o) {
  return std::string(o.decoupled ? "AdamW" : "Adam(L2)") + (o.amsgrad ? " amsgrad" : "") +
         (o.maximize ? " maximize" : "") + " wd=" + std::to_string(o.weight_decay);
}

}  // namespace adam_ref
