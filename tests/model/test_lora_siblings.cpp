// Adapters that read one input (q/k/v, gate/up) run as one (model/lora_linear.hpp's siblings):
// the same outputs, input gradient and adapter gradients as the adapters one by one, on the CPU
// backend, and the rules of when they may run as one.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "model/layer_memory.hpp"
#include "model/lora_linear.hpp"
#include "tests/kernels/ref_ops.hpp"

namespace rp {
namespace {

using ref::VecF;

// Three adapted linears on one input of width `in` (outputs 24, 8, 8: q, k, v of a GQA layer),
// their adapter group laid out as the layout does (A, B of each module in turn), base weights,
// and the buffers a decoder's scratch would give.
struct Siblings {
  static constexpr int64_t n = 13, in = 16, r = 4;
  std::array<int64_t, 3> outs{24, 8, 8};
  std::unique_ptr<Ops> ops = make_cpu_ops(2);
  std::array<LoraLinear, 3> l{};
  VecF params, grads;
  std::array<VecF, 3> w;
  VecF x = ref::randn(size_t(n * in), 3);
  VecF ax = VecF(size_t(n * 3 * r)), u_keep = VecF(size_t(kAdaptedLinears * n * r));
  VecF a_cat = VecF(size_t(3 * r * in)), da_cat = VecF(size_t(3 * r * in));

  Siblings() {
    int64_t off = 0;
    for (int i = 0; i < 3; ++i) {
      l[size_t(i)] = LoraLinear{i, in, outs[size_t(i)], r, off, off + r * in};
      off += r * in + outs[size_t(i)] * r;
      w[size_t(i)] = ref::randn(size_t(outs[size_t(i)] * in), 10 + uint32_t(i));
    }
    params = ref::randn(size_t(off), 1);
    grads = ref::randn(size_t(off), 2);
  }
  // A call as a decoder's backward makes it; `fused`: with the stacked-A buffers.
  LoraCall call(bool fused, bool backward = true) {
    LoraCall c;
    c.ops = ops.get();
    c.params = params.data();
    c.grads = backward ? grads.data() : nullptr;
    c.scaling = 1.5f;
    c.ax = ax.data();
    if (backward) {
      c.u_keep = u_keep.data();
      c.u_rows = n;
    }
    if (fused) {
      c.a_cat = a_cat.data();
      c.da_cat = backward ? da_cat.data() : nullptr;
      c.cat_elems = int64_t(a_cat.size());
    }
    return c;
  }
  std::array<const LoraLinear*, 3> ptrs() const { return {&l[0], &l[1], &l[2]}; }
  // y_i of adapted_siblings_fwd (or of adapted_linear_fwd one by one when the call cannot fuse)
  std::array<VecF, 3> forward(const LoraCall& c) {
    std::array<VecF, 3> y;
    std::array<SiblingLinear, 3> s;
    for (size_t i = 0; i < 3; ++i) {
      y[i] = ref::nan_vec(size_t(n * outs[i]));
      s[i] = {&l[i], w[i].data(), y[i].data(), outs[i], nullptr};
    }
    adapted_siblings_fwd(*ops, c, s, x.data(), n, in, 0);
    return y;
  }
};

TEST(LoraSiblings, ForwardEqualsTheAdaptersOneByOne) {
  Siblings a, b;
  const LoraCall one = a.call(false), fused = b.call(true);
  ASSERT_FALSE(lora_siblings_fuse(one, a.ptrs()));
  ASSERT_TRUE(lora_siblings_fuse(fused, b.ptrs()));
  const auto ya = a.forward(one), yb = b.forward(fused);
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(ref::rel_err(yb[i], ya[i]), 1e-6) << "module " << i;
  // the kept u: module i's [n, r] slot one by one, the i-th column block of [n, 3r] as one
  for (size_t i = 0; i < 3; ++i)
    for (int64_t t = 0; t < Siblings::n; ++t)
      for (int64_t q = 0; q < Siblings::r; ++q)
        EXPECT_NEAR(b.u_keep[size_t(t * 3 * Siblings::r + int64_t(i) * Siblings::r + q)],
                    a.u_keep[size_t((int64_t(i) * Siblings::n + t) * Siblings::r + q)], 1e-5);
  // a forward call (no gradients, no kept u) computes u in ax
  Siblings c;
  const auto yc = c.forward(c.call(true, false));
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(ref::rel_err(yc[i], ya[i]), 1e-6) << "module " << i;
}

TEST(LoraSiblings, BackwardEqualsTheAdaptersOneByOne) {
  for (bool reuse_u : {true, false})
    for (bool accumulate : {false, true})
      for (bool with_grads : {true, false}) {
        Siblings a, b;
        LoraCall one = a.call(false), fused = b.call(true);
        a.forward(one);  // the recompute leaves u in the kept slots
        b.forward(fused);
        if (!with_grads) one.grads = fused.grads = nullptr;
        std::array<VecF, 3> dy;
        for (size_t i = 0; i < 3; ++i) dy[i] = ref::randn(size_t(Siblings::n * a.outs[i]), 20 + uint32_t(i));
        const VecF dx0 = ref::randn(size_t(Siblings::n * Siblings::in), 30);
        VecF dxa = accumulate ? dx0 : ref::nan_vec(dx0.size()), dxb = dxa;
        for (size_t i = 0; i < 3; ++i)
          lora_backward(one, a.l[i], a.x.data(), dy[i].data(), dxa.data(), Siblings::n, 0,
                        accumulate || i > 0, reuse_u);
        const std::array<const void*, 3> dys{dy[0].data(), dy[1].data(), dy[2].data()};
        lora_siblings_backward(fused, b.ptrs(), dys, b.x.data(), dxb.data(), Siblings::n, accumulate,
                               reuse_u);
        const std::string what = std::string(reuse_u ? "kept u" : "u again") + (accumulate ? ", dx +=" : "") +
                                 (with_grads ? "" : ", no gradients");
        EXPECT_LT(ref::rel_err(dxb, dxa), 1e-6) << what;
        EXPECT_LT(ref::rel_err(b.grads, a.grads), 1e-6) << what;  // dA and dB of each module
        if (!with_grads) {
          EXPECT_EQ(b.grads, Siblings().grads) << what;  // untouched
        } else {
          EXPECT_GT(ref::rel_err(b.grads, Siblings().grads), 1e-3) << what;  // and they moved
        }
      }
}

TEST(LoraSiblings, RunAsOneOnlyWhereEveryRuleHolds) {
  Siblings s;
  const auto p = s.ptrs();
  const LoraCall ok = s.call(true);
  EXPECT_TRUE(lora_siblings_fuse(ok, p));
  EXPECT_TRUE(lora_siblings_fuse(ok, std::span(p.data() + 1, 2)));  // k, v
  EXPECT_FALSE(lora_siblings_fuse(ok, std::span(p.data(), 1)));     // one alone
  const std::array<const LoraLinear*, 2> qv{&s.l[0], &s.l[2]};
  EXPECT_FALSE(lora_siblings_fuse(ok, qv));  // not consecutive modules
  LoraCall c = ok;
  c.dropout = 0.1f;  // each module draws its own mask
  EXPECT_FALSE(lora_siblings_fuse(c, p));
  c = ok;
  c.da_cat = nullptr;  // a backward without room for dA
  EXPECT_FALSE(lora_siblings_fuse(c, p));
  c.grads = nullptr;  // ... needs none without gradients
  EXPECT_TRUE(lora_siblings_fuse(c, p));
  c = ok;
  c.u_keep = nullptr;
  EXPECT_FALSE(lora_siblings_fuse(c, p));
  c = ok;
  c.cat_elems = 3 * Siblings::r * Siblings::in - 1;  // the stacked A does not fit
  EXPECT_FALSE(lora_siblings_fuse(c, p));
  Siblings t;
  t.l[1].r = 2;  // another rank
  EXPECT_FALSE(lora_siblings_fuse(t.call(true), t.ptrs()));
  t = Siblings();
  t.l[2].a_off = -1;  // a module without an adapter
  EXPECT_FALSE(lora_siblings_fuse(t.call(true), t.ptrs()));
  // the backward refuses siblings that cannot run as one
  VecF dx(size_t(Siblings::n * Siblings::in));
  const std::array<const void*, 3> dys{dx.data(), dx.data(), dx.data()};
  EXPECT_THROW(lora_siblings_backward(s.call(false), p, dys, s.x.data(), dx.data(), Siblings::n, false, true),
               std::invalid_argument);
  EXPECT_THROW(lora_siblings_backward(ok, p, std::span(dys.data(), 2), s.x.data(), dx.data(), Siblings::n,
                                      false, true),
               std::invalid_argument);
}

}  // namespace
}  // namespace rp
