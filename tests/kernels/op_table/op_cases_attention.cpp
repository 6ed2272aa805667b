// Op-table cases of causal GQA attention: Qwen3-1.7B's heads (16 query / 8 KV, head_dim 128)
// at 8192 and 65536 tokens through each CUDA implementation (cuda_backend.hpp: 0 the default
// choice, 2 / 3 our flash configurations, 4 cuDNN), 32 query heads at 1..16 query heads per KV
// head (cuDNN's expanded and native GQA backward, our flash kernels), and GPT-OSS's variants
// (8 x 4096 tokens, 64 / 8 heads, head_dim 64: sliding window 128, attention sinks, the tensor-
// core and the row kernels). FLOPs count the visible keys: 4*D*nq per (query row, key) forward,
// 2.5x that backward. A backward case's o and lse come from the forward on the same backend.
#include <cmath>
#include <string>

#include "tests/kernels/op_table/op_table.hpp"
#ifdef RP_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace rp::optable {

namespace {

constexpr Kind C = Kind::compute, F32 = Kind::f32;

struct Att {
  int64_t S, L, nq, nkv, D, window = 0;
  bool sinks = false;
  float softcap = 0;  ///< attention logit soft-cap (Gemma 2), 0: none
};

// CUDA knobs of one variant (-1: leave): implementation, GQA backward mode, scratch multiple.
struct Knobs {
  int impl = -1, gqa = -1, scratch_x = 1;
};

void apply(OpCase& c, const Knobs& k, const Att& a) {
#ifdef RP_HAVE_CUDA
  const size_t contract = Ops::attention_scratch_bytes(a.S, a.L, a.nq, a.nkv, a.D);
  c.cuda_on = [k, contract](Ops& o) {
    if (k.impl >= 0) cuda::set_attention_impl(o, k.impl);
    if (k.gqa >= 0) cuda::set_attention_gqa(o, k.gqa);
    if (k.scratch_x > 1) cuda::set_attention_scratch_bytes(o, size_t(k.scratch_x) * contract);
  };
  c.cuda_off = [](Ops& o) {
    cuda::set_attention_impl(o, 0);
    cuda::set_attention_gqa(o, 0);
    cuda::set_attention_scratch_bytes(o, 0);
  };
  if (k.impl == 4)
    c.cuda_unavailable = [] {
      return cuda::cudnn_attention_available() ? std::string() : std::string("cuDNN attention not available");
    };
#else
  (void)c, (void)k, (void)a;
#endif
}

double visible_keys(const Att& a) {
  const double L = double(a.L), w = double(a.window);
  return a.window ? w * L - w * (w - 1) / 2 : L * (L + 1) / 2;
}

// Forward and backward cases of attention a, names prefix_fwd / prefix_bwd (one of them when
// only is "fwd" or "bwd").
void add_att(std::vector<OpCase>& v, const std::string& prefix, const Att& a, const Knobs& k,
             const std::string& only, int reps) {
  const int64_t T = a.S * a.L;
  const float scale = float(1.0 / std::sqrt(double(a.D)));
  const bool variant = a.window > 0 || a.sinks || a.softcap > 0;
  const std::string sh = std::to_string(a.S) + "x" + std::to_string(a.L) + " " + std::to_string(a.nq) + "/" +
                         std::to_string(a.nkv) + " heads D=" + std::to_string(a.D) +
                         (a.window ? " window=" + std::to_string(a.window) : "") +
                         (a.sinks ? " +sinks" : "") +
                         (a.softcap > 0 ? " softcap=" + std::to_string(int(a.softcap)) : "");
  const size_t sb = size_t(k.scratch_x) * Ops::attention_scratch_bytes(a.S, a.L, a.nq, a.nkv, a.D);
  const double fl = 4.0 * double(a.D) * double(a.nq) * double(a.S) * visible_keys(a);
  // 0 q, 1 k, 2 v, 3 dout, 4 sinks, 5 o, 6 lse, 7 dq, 8 dk, 9 dv, 10 dsinks, 11 scratch
  auto tensors = [&](bool bwd) {
    std::vector<Tensor> t = {
        input("q", C, T * a.nq * a.D),
        input("k", C, T * a.nkv * a.D),
        input("v", C, T * a.nkv * a.D),
        input("dout", C, T * a.nq * a.D),
        input("sinks", C, a.nq),
        bwd ? derived("o", C, T * a.nq * a.D) : output("o", C, T * a.nq * a.D),
        bwd ? derived("lse", F32, a.S * a.nq * a.L) : output("lse", F32, a.S * a.nq * a.L),
        output("dq", C, T * a.nq * a.D),
        output("dk", C, T * a.nkv * a.D),
        output("dv", C, T * a.nkv * a.D),
        inout("dsinks", F32, a.nq, constant(0.f)),
        scratch("scratch", sb)};
    if (!bwd) t[3].n = t[7].n = t[8].n = t[9].n = 0;  // unused by the forward
    if (!bwd || !a.sinks) t[10].n = 0;
    if (!a.sinks) t[4].n = 0;
    return t;
  };
  auto var = [a](const Buffers& b) {
    Ops::AttentionVariant x;
    x.window = a.window;
    x.sinks = a.sinks ? b[4] : nullptr;
    x.dsinks = a.sinks ? b[10] : nullptr;
    x.softcap = a.softcap;
    return x;
  };
  auto fwd = [=](Ops& o, const Buffers& b) {
    if (variant)
      o.attention_fwd_v(b[0], b[1], b[2], b[5], b.f(6), a.S, a.L, a.nq, a.nkv, a.D, scale, var(b), b[11]);
    else o.attention_fwd(b[0], b[1], b[2], b[5], b.f(6), a.S, a.L, a.nq, a.nkv, a.D, scale, b[11]);
  };
  if (only != "bwd") {
    OpCase f{prefix + "_fwd", variant ? "attention_fwd_v" : "attention_fwd", sh};
    f.tensors = tensors(false);
    f.run = fwd;
    f.flops = fl;
    f.bound = Bound::gemm_bf16;
    f.reps = reps;
    apply(f, k, a);
    v.push_back(f);
  }
  if (only != "fwd") {
    OpCase bw{prefix + "_bwd", variant ? "attention_bwd_v" : "attention_bwd", sh};
    bw.tensors = tensors(true);
    bw.prepare = fwd;
    bw.run = [=](Ops& o, const Buffers& b) {
      if (variant)
        o.attention_bwd_v(b[0], b[1], b[2], b[5], b.f(6), b[3], b[7], b[8], b[9], a.S, a.L, a.nq, a.nkv, a.D,
                          scale, var(b), b[11]);
      else
        o.attention_bwd(b[0], b[1], b[2], b[5], b.f(6), b[3], b[7], b[8], b[9], a.S, a.L, a.nq, a.nkv, a.D,
                        scale, b[11]);
    };
    bw.flops = 2.5 * fl;
    bw.bound = Bound::gemm_bf16;
    bw.nmse = 1e-3;  // bf16 dq / dk / dv summed over many keys
    bw.reps = reps;
    apply(bw, k, a);
    v.push_back(bw);
  }
}

// The expanded-GQA helpers of the cuDNN backward (cuda_backend.hpp): K and V repeated to every
// query head, and the gradients summed back over each group of r heads. Their CPU twins are
// the same index maps as row copies and additions.
void add_gqa_helpers(std::vector<OpCase>& v, int64_t L, int64_t nq, int64_t D, int64_t r) {
  const int64_t nkv = nq / r;
  const std::string sh = "L=" + std::to_string(L) + " " + std::to_string(nq) + "/" + std::to_string(nkv) +
                         " heads D=" + std::to_string(D);
  OpCase e{"gqa_expand_kv_r" + std::to_string(r), "gqa_expand_kv", sh};
  e.tensors = {input("k", C, L * nkv * D), input("v", C, L * nkv * D), output("ke", C, L * nq * D),
               output("ve", C, L * nq * D)};
  e.twin = [=](Ops& o, const Buffers& b) {
    const size_t es = dtype_size(o.dtype());
    for (int i = 0; i < 2; ++i)
      for (int64_t t = 0; t < L; ++t)
        for (int64_t h = 0; h < nq; ++h)
          o.copy(o.dtype(), b.u(2 + i) + size_t((t * nq + h) * D) * es,
                 b.u(i) + size_t((t * nkv + h / r) * D) * es, D);
  };
  OpCase g{"gqa_group_sum_r" + std::to_string(r), "gqa_group_sum", sh};
  g.tensors = {input("dke", C, L * nq * D), input("dve", C, L * nq * D), output("dk", C, L * nkv * D),
               output("dv", C, L * nkv * D)};
  g.twin = [=](Ops& o, const Buffers& b) {
    const size_t es = dtype_size(o.dtype());
    for (int i = 0; i < 2; ++i) {
      o.fill(o.dtype(), b[2 + i], L * nkv * D, 0.f);
      for (int64_t t = 0; t < L; ++t)
        for (int64_t h = 0; h < nq; ++h)
          o.add_into(o.dtype(), b.u(2 + i) + size_t((t * nkv + h / r) * D) * es, o.dtype(),
                     b.u(i) + size_t((t * nq + h) * D) * es, D);
    }
  };
#ifdef RP_HAVE_CUDA
  e.run = [=](Ops& o, const Buffers& b) {
    cuda::gqa_expand_kv(o, b[0], b[1], b[2], b[3], L, nkv, 0, nq, r, D);
  };
  g.run = [=](Ops& o, const Buffers& b) {
    cuda::gqa_group_sum(o, o.dtype(), b[0], b[1], o.dtype(), b[2], b[3], nkv * D, L, nkv, r, D, false);
  };
#else
  e.run = e.twin;
  g.run = g.twin;
#endif
  v.push_back(e);
  v.push_back(g);
}

}  // namespace

void add_attention_cases(std::vector<OpCase>& v, Size s) {
  const bool big = s == Size::bench;
  // Qwen3-1.7B heads at one sequence of 8192 (test: 96) and 65536 (test: 160) tokens
  // test sizes keep the head dims (the tensor-core kernels take 64 and 128 only)
  const int64_t nq = big ? 16 : 4, nkv = big ? 8 : 2, D = 128;
  const struct {
    const char* tag;
    int impl;
  } impls[] = {{"auto", 0}, {"cfg2", 2}, {"cfg3", 3}, {"cudnn", 4}};
  for (const auto& im : impls) {
    add_att(v, std::string("attention_L8k_") + im.tag, Att{1, big ? 8192 : 96, nq, nkv, D}, Knobs{im.impl},
            "", big ? 10 : 1);
    if (im.impl != 2)  // configuration 2 at 64K tokens: too slow to matter
      add_att(v, std::string("attention_L64k_") + im.tag, Att{1, big ? 65536 : 160, nq, nkv, D},
              Knobs{im.impl}, "", 1);
  }
  // 32 (test: 16) query heads at r = 1, 2, 4, 8, 16 query heads per KV head
  const int64_t gq = big ? 32 : 16;
  for (int64_t r : {1, 2, 4, 8, 16}) {
    const Att a{1, big ? 8192 : 64, gq, gq / r, 128};
    const std::string p = "attention_gqa_r" + std::to_string(r);
    add_att(v, p + "_cudnn", a, Knobs{4}, "fwd", big ? 10 : 1);
    add_att(v, p + "_cfg3", a, Knobs{3}, "", big ? 10 : 1);
    add_att(v, p + "_cudnn_expand", a, Knobs{4, 2}, "bwd", big ? 10 : 1);
    if (r > 1) {
      add_gqa_helpers(v, a.L, gq, a.D, r);
      add_att(v, p + "_cudnn_expand4x", a, Knobs{4, 2, 4}, "bwd", big ? 10 : 1);
      // cuDNN's native GQA backward asks for more workspace than the scratch contract (on the
      // H200 1,052,928 bytes at 64 tokens against 627-823 KB, 269 MB at 8192 against 156-207 MB):
      // it runs with twice the contract
      add_att(v, p + "_cudnn_native", a, Knobs{4, 1, 2}, "bwd", big ? 10 : 1);
    }
  }
  // GPT-OSS: window 128 (test: 24), sinks, tensor-core (0) and row (1) kernels
  for (int64_t window : {int64_t(0), int64_t(big ? 128 : 24)})
    for (bool sinks : {false, true})
      for (int impl : {0, 1}) {
        if (impl == 1 && window == 0) continue;  // the row kernels at full causal length: too slow to matter
        Att a{big ? 8 : 2, big ? 4096 : 96, big ? 64 : 8, big ? 8 : 2, 64, window, sinks};
        const std::string p = std::string("attention_gptoss") + (window ? "_window" : "_causal") +
                              (sinks ? "_sinks" : "") + (impl == 1 ? "_rows" : "");
        add_att(v, p, a, Knobs{impl}, "", big ? 10 : 1);
      }
  // Gemma 2: attention logits soft-capped at 50; Gemma-2-2B's heads (8 / 4, head_dim 256, which
  // only the row kernels take) on the sliding layers' 4096-token window and the global layers,
  // and head_dim 128 (the tensor-core kernels) for comparison. Test size: 96 tokens, window 24.
  for (int64_t D : {int64_t(256), int64_t(128)})
    for (int64_t window : {int64_t(big ? 4096 : 24), int64_t(0)}) {
      Att a{1, big ? 8192 : 96, 8, 4, D, window, false, 50.f};
      add_att(v, "attention_gemma2_softcap_D" + std::to_string(D) + (window ? "_window" : "_global"), a,
              Knobs{}, "", big ? 3 : 1);
    }
  // Gemma 3's sliding layers: a 1024-token window (test: 24) at head_dim 256 without a cap, which
  // cuDNN's diagonal band takes (implementation 0: the default choice)
  add_att(v, "attention_gemma3_window_D256", Att{1, big ? 8192 : 96, 8, 4, 256, big ? 1024 : 24}, Knobs{0},
          "", big ? 10 : 1);
}

}  // namespace rp::optable
