// The adapter half of a LoRA linear (model/lora_linear.hpp).
#include "model/lora_linear.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "kernels/dropout_hash.hpp"
#include "model/layer_memory.hpp"

namespace rp {

static_assert(size_t(kLoraModules) == kAdaptedLinears, "one kept-u slot per adaptable linear");

std::array<LoraLinear, kLoraModules> lora_linears(const ModelLayout& m, int layer) {
  std::array<LoraLinear, kLoraModules> out{};
  const int ag = m.adapter_group(layer);
  if (!m.lora || ag < 0) return out;
  const ParamGroup& g = m.groups.at(size_t(ag));
  for (int k = 0; k < kLoraModules; ++k) {
    const auto mod = LoraModule(k);
    LoraLinear& l = out[size_t(k)];
    l.module = k;
    if (!lora_targets(*m.lora, mod) || !lora_module_exists(m.config, layer - 1, mod)) continue;
    const auto [in, o] = lora_module_dims(m.config, mod);
    l.in = in;
    l.out = o;
    l.r = m.lora->r;
    const std::string p = fmt::format("model.layers.{}.{}.", layer - 1, lora_module_path(mod));
    const int ia = g.find(p + "lora_A.weight"), ib = g.find(p + "lora_B.weight");
    if (ia < 0 || ib < 0)
      throw std::invalid_argument(
          fmt::format("make_layer: adapter group '{}' lacks {}lora_A/B.weight", g.name, p));
    const TensorSpec &ta = g.tensors[size_t(ia)], &tb = g.tensors[size_t(ib)];
    if (ta.shape != std::vector<int64_t>{l.r, in} || tb.shape != std::vector<int64_t>{o, l.r})
      throw std::invalid_argument(
          fmt::format("make_layer: {}lora_A/B.weight: expected [{}, {}] and [{}, {}]", p, l.r, in, o, l.r));
    l.a_off = ta.offset;
    l.b_off = tb.offset;
  }
  return out;
}

uint64_t lora_dropout_seed(uint64_t lora_seed, int64_t dropout_id, int layer) {
  return mix64(mix64(mix64(lora_seed) ^ uint64_t(dropout_id)) + uint64_t(layer));
}

namespace {

const void* param_at(const LoraCall& c, int64_t off) {
  return static_cast<const char*>(c.params) + off * int64_t(dtype_size(c.ops->dtype()));
}
void* grad_at(const LoraCall& c, int64_t off) {
  return static_cast<char*>(c.grads) + off * int64_t(dtype_size(c.ops->grad_dtype()));
}
uint64_t module_seed(const LoraCall& c, const LoraLinear& l) { return mix64(c.seed + uint64_t(l.module)); }

// drop(x) in c.xbuf, or x itself without dropout.
const void* adapter_input(const LoraCall& c, const LoraLinear& l, const void* x, int64_t n, int64_t row0) {
  if (c.dropout <= 0.f) return x;
  if (!c.xbuf) throw std::invalid_argument("lora: dropout without an input buffer in the scratch");
  c.ops->dropout(x, c.xbuf, n, l.in, c.dropout, module_seed(c, l), row0);
  return c.xbuf;
}

// u = s * xd A^T into `u` ([n, r]): the GEMM scales its fp32 sum
void low_rank_input(const LoraCall& c, const LoraLinear& l, const void* xd, void* u, int64_t n) {
  c.ops->linear_fwd(xd, param_at(c, l.a_off), u, n, l.in, l.r, c.scaling);
}

// The module's slot of c.u_keep (null without one).
void* kept_u(const LoraCall& c, const LoraLinear& l, int64_t n) {
  if (!c.u_keep) return nullptr;
  if (n > c.u_rows) throw std::invalid_argument("lora: more rows than the kept-u slots hold");
  return static_cast<char*>(c.u_keep) + l.module * c.u_rows * l.r * int64_t(dtype_size(c.ops->dtype()));
}

}  // namespace

namespace {

// The base GEMM y (+)= x W^T, or y = residual + x W^T: in FP8 with f8, else in the compute dtype.
void base_fwd(Ops& ops, const Fp8Linear* f8, const void* x, const void* w, void* y, int64_t n, int64_t in,
              int64_t out, bool accumulate, const void* residual = nullptr) {
  if (f8) return fp8_linear_fwd(ops, *f8, x, y, n, in, out, accumulate, residual);
  if (residual) return ops.linear_fwd_residual(x, w, residual, y, n, in, out);
  if (accumulate) return ops.linear_fwd_add(x, w, y, n, in, out, 1.0f);
  ops.linear_fwd(x, w, y, n, in, out);
}
// The base GEMM dx (+)= dy W: in FP8 with f8, else in the compute dtype.
void base_bwd_input(Ops& ops, const Fp8Linear* f8, const void* dy, const void* w, void* dx, int64_t n,
                    int64_t in, int64_t out, bool accumulate) {
  if (f8) return fp8_linear_bwd_input(ops, *f8, dy, dx, n, in, out, accumulate);
  ops.linear_bwd_input(dy, w, dx, n, in, out, accumulate);
}

}  // namespace

void adapted_linear_fwd(Ops& ops, const LoraCall& c, const LoraLinear& l, const void* x, const void* w,
                        void* y, int64_t n, int64_t in, int64_t out, int64_t row0, const Fp8Linear* f8,
                        const void* residual) {
  if (!l.on() || n <= 0) return base_fwd(ops, f8, x, w, y, n, in, out, false, residual);
  if (l.in != in || l.out != out)
    throw std::invalid_argument(
        fmt::format("lora: adapter of [{}, {}] on a linear of [{}, {}]", l.out, l.in, out, in));
  void* kept = kept_u(c, l, n);
  void* u = kept ? kept : c.ax;
  low_rank_input(c, l, adapter_input(c, l, x, n, row0), u, n);
  if (residual)
    ops.linear_fwd_residual(u, param_at(c, l.b_off), residual, y, n, l.r, l.out);  // y = r + u B^T
  else ops.linear_fwd(u, param_at(c, l.b_off), y, n, l.r, l.out);                  // y = u B^T
  base_fwd(ops, f8, x, w, y, n, in, out, true);                                    // y += x W^T
}

void lora_backward(const LoraCall& c, const LoraLinear& l, const void* x, const void* dy, void* dx, int64_t n,
                   int64_t row0, bool accumulate, bool reuse_u) {
  if (!l.on() || n <= 0) return;
  Ops& o = *c.ops;
  const DType dt = o.dtype();
  const void* xd = adapter_input(c, l, x, n, row0);
  void* u = reuse_u ? kept_u(c, l, n) : nullptr;
  if (!u) {
    u = c.ax;
    low_rank_input(c, l, xd, u, n);
  }
  if (c.grads) o.linear_bwd_weight(dy, u, grad_at(c, l.b_off), n, l.r, l.out);          // dB += dy^T u
  o.linear_bwd_input(dy, param_at(c, l.b_off), c.ax, n, l.r, l.out, false, c.scaling);  // g = s dy B
  if (c.grads) o.linear_bwd_weight(c.ax, xd, grad_at(c, l.a_off), n, l.in, l.r);        // dA += g^T xd
  if (c.dropout > 0.f) {  // xd is read no more: its buffer takes g A, masked like the forward
    o.linear_bwd_input(c.ax, param_at(c, l.a_off), c.xbuf, n, l.in, l.r, false);
    if (accumulate) {
      o.dropout(c.xbuf, c.xbuf, n, l.in, c.dropout, module_seed(c, l), row0);
      o.add_into(dt, dx, dt, c.xbuf, n * l.in, 1.0f);
    } else {
      o.dropout(c.xbuf, dx, n, l.in, c.dropout, module_seed(c, l), row0);
    }
  } else {
    o.linear_bwd_input(c.ax, param_at(c, l.a_off), dx, n, l.in, l.r, accumulate);
  }
}

void adapted_linear_bwd_input(Ops& ops, const LoraCall& c, const LoraLinear& l, const void* x, const void* dy,
                              const void* w, void* dx, int64_t n, int64_t in, int64_t out, bool accumulate,
                              int64_t row0, bool reuse_u, const Fp8Linear* f8) {
  if (!l.on() || n <= 0) return base_bwd_input(ops, f8, dy, w, dx, n, in, out, accumulate);
  lora_backward(c, l, x, dy, dx, n, row0, accumulate, reuse_u);
  base_bwd_input(ops, f8, dy, w, dx, n, in, out, true);
}

namespace {

void* at(void* base, int64_t elems, DType t) {
  return static_cast<char*>(base) + elems * int64_t(dtype_size(t));
}

// [A_1; ...; A_G] into c.a_cat
void stack_a(const LoraCall& c, std::span<const LoraLinear* const> ls) {
  const DType dt = c.ops->dtype();
  int64_t row = 0;
  for (const LoraLinear* l : ls) {
    c.ops->copy(dt, at(c.a_cat, row * l->in, dt), param_at(c, l->a_off), l->r * l->in);
    row += l->r;
  }
}

// Where the siblings' u [n, G r] lives: from the first module's kept-u slot on (the G slots
// are consecutive), else in c.ax.
void* siblings_u(const LoraCall& c, const LoraLinear& first, int64_t n) {
  void* kept = kept_u(c, first, n);
  return kept ? kept : c.ax;
}

}  // namespace

bool lora_siblings_fuse(const LoraCall& c, std::span<const LoraLinear* const> ls) {
  if (!c.ops || !c.a_cat || c.dropout > 0.f || ls.size() < 2 || int64_t(ls.size()) > kMaxLoraSiblings)
    return false;
  if (c.grads && (!c.da_cat || !c.u_keep)) return false;
  const LoraLinear& first = *ls[0];
  for (size_t i = 0; i < ls.size(); ++i) {
    const LoraLinear& l = *ls[i];
    if (!l.on() || l.in != first.in || l.r != first.r || l.module != first.module + int(i)) return false;
  }
  return int64_t(ls.size()) * first.r * first.in <= c.cat_elems;
}

void adapted_siblings_fwd(Ops& ops, const LoraCall& c, std::span<const SiblingLinear> s, const void* x,
                          int64_t n, int64_t in, int64_t row0) {
  std::array<const LoraLinear*, kMaxLoraSiblings> ls{};
  const size_t G = std::min(s.size(), ls.size());
  for (size_t i = 0; i < G; ++i) ls[i] = s[i].lora;
  if (n <= 0 || s.size() > ls.size() || !lora_siblings_fuse(c, std::span(ls.data(), G))) {
    for (const SiblingLinear& f : s)
      adapted_linear_fwd(ops, c, *f.lora, x, f.w, f.y, n, in, f.out, row0, f.f8);
    return;
  }
  const int64_t r = ls[0]->r, ld = int64_t(G) * r;
  for (const SiblingLinear& f : s)
    if (f.lora->in != in || f.lora->out != f.out)
      throw std::invalid_argument(fmt::format("lora: adapter of [{}, {}] on a linear of [{}, {}]",
                                              f.lora->out, f.lora->in, f.out, in));
  stack_a(c, std::span(ls.data(), G));
  void* u = siblings_u(c, *ls[0], n);
  ops.linear_fwd(x, c.a_cat, u, n, in, ld, c.scaling);  // u = s x A^T, [n, G r]
  for (size_t i = 0; i < G; ++i) {
    const SiblingLinear& f = s[i];
    ops.linear_fwd_ld(at(u, int64_t(i) * r, ops.dtype()), ld, param_at(c, f.lora->b_off), f.y, n, r,
                      f.out);                              // y_i = u_i B_i^T
    base_fwd(ops, f.f8, x, f.w, f.y, n, in, f.out, true);  // y_i += x W_i^T
  }
}

void lora_siblings_backward(const LoraCall& c, std::span<const LoraLinear* const> ls,
                            std::span<const void* const> dy, const void* x, void* dx, int64_t n,
                            bool accumulate, bool reuse_u) {
  if (!lora_siblings_fuse(c, ls) || dy.size() != ls.size())
    throw std::invalid_argument("lora: these adapters do not run as one in this call");
  if (n <= 0) return;
  Ops& o = *c.ops;
  const DType dt = o.dtype(), gt = o.grad_dtype();
  const int64_t G = int64_t(ls.size()), r = ls[0]->r, in = ls[0]->in, ld = G * r;
  stack_a(c, ls);
  if (c.grads) {
    void* u = kept_u(c, *ls[0], n);
    if (!reuse_u) o.linear_fwd(x, c.a_cat, u, n, in, ld, c.scaling);
    for (int64_t i = 0; i < G; ++i)  // dB_i += dy_i^T u_i
      o.linear_bwd_weight_ld(dy[size_t(i)], at(u, i * r, dt), ld, grad_at(c, ls[size_t(i)]->b_off), n, r,
                             ls[size_t(i)]->out);
  }
  for (int64_t i = 0; i < G; ++i)  // g_i = s dy_i B_i, side by side in ax
    o.linear_bwd_input_ld(dy[size_t(i)], param_at(c, ls[size_t(i)]->b_off), at(c.ax, i * r, dt), ld, n, r,
                          ls[size_t(i)]->out, c.scaling);
  if (c.grads) {  // dA = g^T x for all G at once, then into each module's gradient
    o.fill(gt, c.da_cat, ld * in, 0.f);
    o.linear_bwd_weight(c.ax, x, c.da_cat, n, in, ld);
    for (int64_t i = 0; i < G; ++i)
      o.add_into(gt, grad_at(c, ls[size_t(i)]->a_off), gt, at(c.da_cat, i * r * in, gt), r * in, 1.0f);
  }
  o.linear_bwd_input(c.ax, c.a_cat, dx, n, in, ld, accumulate);  // dx (+)= g A
}

}  // namespace rp
