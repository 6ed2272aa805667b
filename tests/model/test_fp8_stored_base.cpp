// A LoRA decoder over a base stored as fp8 with FP8 linears on (model/fp8_linear.hpp,
// LayerArgs::fp8_stored_base) on the CPU ops: the layer lists its dense linears as runnable
// from their stored codes, and the direct path (the stored codes and row scales in the FP8
// GEMM) against the old one (the dequantized weights requantized with one scale per tensor)
// and against the fp32 decoder on the dequantized weights: the two FP8 paths are close, and
// the direct one is at least as close to the fp32 reference in the output, the input gradient
// and the adapters' gradients (its weights are rounded once, when stored; the old path rounds
// them again onto a tensor-wide grid).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "model/layer_memory.hpp"
#include "tests/model/fp8_stored_util.hpp"

namespace rp {
namespace {

using namespace rp::test;

// How far the direct path may be from the fp32 reference (relative L2): the FP8 decoder's
// bounds against the compute-dtype decoder (tests/model/test_fp8_linear.cpp: 0.08 forward, 0.2
// backward on this tiny layer, where few terms per sum average the e4m3 rounding little).
constexpr double kForwardBound = 0.08, kBackwardBound = 0.2;
// How far the two FP8 paths may be apart: the old path's own error on these weights (rows 16x
// apart in magnitude, requantized onto one grid per tensor: 0.09 forward, up to 0.14 backward
// measured) plus the direct path's (up to 0.07), rounded up.
constexpr double kApartForward = 0.15, kApartBackward = 0.25;

struct Outputs {
  VecF y, dx, dadapter;
};

// One forward and one backward of `layer` on the base group `base` (raw bytes: fp32 values,
// or storage where the layer reads it) and the adapters, filling the FP8 cache first.
Outputs run_layer(Fp8StoredBase& f, const Layer& layer, std::vector<uint8_t> base, bool stored) {
  const MicroBatchShape s{2, 8};
  const int64_t T = s.tokens(), H = f.t.c.hidden_size;
  VecF x = ref::randn(size_t(T * H), 31), dy = ref::randn(size_t(T * H), 32, 0.1f);
  Outputs r{ref::nan_vec(size_t(T * H)), ref::nan_vec(size_t(T * H)),
            VecF(f.t.params[size_t(f.ag)].size(), 0.f)};
  std::vector<float> scratch(layer.scratch_bytes(s) / 4 + 1, std::nanf(""));
  std::vector<uint8_t> cache(layer.fp8_weight_bytes(true) + 16);
  LayerArgs a;
  a.ops = f.t.ops.get();
  a.shape = s;
  a.params = {base.data(), f.t.params[size_t(f.ag)].data()};
  a.grads = {nullptr, r.dadapter.data()};
  a.scratch = scratch.data();
  a.scratch_bytes = layer.scratch_bytes(s);
  a.fp8_weights = cache.data();
  a.fp8_weights_bytes = layer.fp8_weight_bytes(true);
  a.fp8_fill_weights = true;
  a.fp8_stored_base = stored;
  a.x = x.data();
  a.y = r.y.data();
  layer.forward(a);
  a.y = nullptr;
  a.dy = dy.data();
  a.dx = r.dx.data();
  layer.backward(a);
  return r;
}

std::vector<uint8_t> as_bytes(const VecF& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::unique_ptr<Layer> fp8_layer(const ModelLayout& m, bool fp8) {
  LayerOptions lo;
  lo.fp8 = fp8;
  return make_layer(m, Fp8StoredBase::kLayer, lo);
}

TEST(Fp8StoredBase, ListsItsDenseLinears) {
  Fp8StoredBase f;
  std::vector<int64_t> want;
  for (const char* n : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                        "gate_proj.weight", "up_proj.weight", "down_proj.weight"})
    want.push_back(f.t.tensor(Fp8StoredBase::kLayer, n).offset);
  EXPECT_EQ(fp8_layer(f.t.lay, true)->fp8_stored_tensors(), want);
  EXPECT_TRUE(fp8_layer(f.t.lay, false)->fp8_stored_tensors().empty()) << "FP8 linears off";
  LoraConfig q8 = fp8_base_lora();
  q8.base_format = WeightFormat::q8_0;
  EXPECT_TRUE(fp8_layer(make_layout(f.t.c, q8), true)->fp8_stored_tensors().empty()) << "a q8_0 base";
  // the storage form fits in the compute-dtype slot the uploader copies it into (2 bytes a weight)
  for (const TensorSpec& ts : f.t.lay.groups[size_t(Fp8StoredBase::kLayer)].tensors)
    if (ts.format == WeightFormat::fp8)
      EXPECT_LE(weight_format_bytes(ts.format, ts.numel(), weight_format_cols(ts.shape)),
                size_t(ts.numel()) * 2);
}

TEST(Fp8StoredBase, DirectPathCloseToTheOldAndAtLeastAsCloseToFp32) {
  Fp8StoredBase f;
  auto fp8 = fp8_layer(f.t.lay, true), plain = fp8_layer(f.t.lay, false);
  std::vector<uint8_t> stored = as_bytes(f.deq);
  f.put_stored(stored, 4, fp8->fp8_stored_tensors());
  const Outputs fp32 = run_layer(f, *plain, as_bytes(f.deq), false);
  const Outputs old = run_layer(f, *fp8, as_bytes(f.deq), false);
  const Outputs direct = run_layer(f, *fp8, stored, true);
  struct Part {
    const char* name;
    const VecF Outputs::*v;
    double bound, apart_bound;
  };
  for (const Part p : {Part{"y", &Outputs::y, kForwardBound, kApartForward},
                       Part{"dx", &Outputs::dx, kBackwardBound, kApartBackward},
                       Part{"adapter gradients", &Outputs::dadapter, kBackwardBound, kApartBackward}}) {
    const double e_old = ref::rel_err(old.*p.v, fp32.*p.v), e_direct = ref::rel_err(direct.*p.v, fp32.*p.v);
    const double apart = ref::rel_err(direct.*p.v, old.*p.v);
    std::printf("[ info ] fp8-stored base, %s: relative error to fp32 old %.4f, direct %.4f; apart %.4f\n",
                p.name, e_old, e_direct, apart);
    EXPECT_GT(apart, 1e-5) << p.name << ": the direct path is not taken";
    EXPECT_LT(apart, p.apart_bound) << p.name;
    EXPECT_LT(e_direct, p.bound) << p.name;
    EXPECT_LE(e_direct, e_old) << p.name << ": the direct path is farther from the fp32 reference";
  }
}

}  // namespace
}  // namespace rp
