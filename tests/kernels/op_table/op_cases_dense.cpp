// Op-table cases of the dense GEMMs: the decoder projections (Qwen3-1.7B, 8192 tokens), the
// 8192^3 GEMM the bf16 ceiling was measured with, a LoRA adapter's primitives and its two call
// orders (LLaMA-3.1-8B, 4096 tokens, rank 32), the embedding and the chunked LM head with
// cross-entropy (Qwen3-1.7B's 151,936-token vocabulary).
#include <algorithm>
#include <string>

#include "tests/kernels/op_table/op_table.hpp"

namespace rp::optable {

namespace {

constexpr Kind C = Kind::compute, F32 = Kind::f32, I32 = Kind::i32;

std::string mkn(int64_t M, int64_t K, int64_t N) {
  return "M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
}

// linear_fwd, linear_bwd_input, linear_bwd_weight of y[M,N] = x[M,K] W[N,K]^T.
void add_linear(std::vector<OpCase>& v, const std::string& tag, int64_t M, int64_t K, int64_t N) {
  const double fl = 2.0 * double(M) * double(K) * double(N);
  OpCase f{"linear_fwd_" + tag, "linear_fwd", mkn(M, K, N)};
  f.tensors = {input("x", C, M * K), input("w", C, N * K, normal(0.02f)), output("y", C, M * N)};
  f.run = [=](Ops& o, const Buffers& b) { o.linear_fwd(b[0], b[1], b[2], M, K, N); };
  f.flops = fl;
  f.bound = Bound::gemm_bf16;
  v.push_back(f);
  OpCase bi{"linear_bwd_input_" + tag, "linear_bwd_input", mkn(M, K, N)};
  bi.tensors = {input("dy", C, M * N), input("w", C, N * K, normal(0.02f)), output("dx", C, M * K)};
  bi.run = [=](Ops& o, const Buffers& b) { o.linear_bwd_input(b[0], b[1], b[2], M, K, N, false); };
  bi.flops = fl;
  bi.bound = Bound::gemm_bf16;
  v.push_back(bi);
  // the scaled forms (a LoRA adapter's u = s x A^T and g = s dy B), dx accumulated
  OpCase fs{"linear_fwd_scaled_" + tag, "linear_fwd", mkn(M, K, N) + " alpha 0.5"};
  fs.tensors = f.tensors;
  fs.run = [=](Ops& o, const Buffers& b) { o.linear_fwd(b[0], b[1], b[2], M, K, N, 0.5f); };
  fs.flops = fl;
  fs.bound = Bound::gemm_bf16;
  v.push_back(fs);
  OpCase fr{"linear_fwd_residual_" + tag, "linear_fwd_residual", mkn(M, K, N) + " y = r + ..."};
  fr.tensors = {input("x", C, M * K), input("w", C, N * K, normal(0.02f)), input("r", C, M * N),
                output("y", C, M * N)};
  fr.run = [=](Ops& o, const Buffers& b) { o.linear_fwd_residual(b[0], b[1], b[2], b[3], M, K, N); };
  fr.flops = fl;
  fr.bound = Bound::gemm_bf16;
  v.push_back(fr);
  OpCase bs{"linear_bwd_input_scaled_" + tag, "linear_bwd_input", mkn(M, K, N) + " alpha -2, dx +="};
  bs.tensors = {input("dy", C, M * N), input("w", C, N * K, normal(0.02f)), inout("dx", C, M * K)};
  bs.run = [=](Ops& o, const Buffers& b) { o.linear_bwd_input(b[0], b[1], b[2], M, K, N, true, -2.f); };
  bs.flops = fl;
  bs.bound = Bound::gemm_bf16;
  v.push_back(bs);
  OpCase bw{"linear_bwd_weight_" + tag, "linear_bwd_weight", mkn(M, K, N) + " dw f32 +="};
  bw.tensors = {input("dy", C, M * N), input("x", C, M * K), inout("dw", F32, N * K, normal(0.01f))};
  bw.run = [=](Ops& o, const Buffers& b) { o.linear_bwd_weight(b[0], b[1], b[2], M, K, N); };
  bw.flops = fl;
  bw.bound = Bound::gemm_bf16;
  v.push_back(bw);
}

struct LoraShape {
  const char* tag;
  int64_t T, in, out, r;
};

// One case of the adapter on the module: tensors x, W, dy, A [r,in], B [out,r], y, dx, u, g, dA,
// dB, ax (the scaled dy B).
OpCase lora_case(const LoraShape& m, const std::string& what, const std::string& op) {
  const int64_t T = m.T, in = m.in, out = m.out, r = m.r;
  OpCase c{"lora_" + std::string(m.tag) + "_" + what, op,
           std::string(m.tag) + " T=" + std::to_string(T) + " " + std::to_string(in) + "->" +
               std::to_string(out) + " r=" + std::to_string(r)};
  c.tensors = {input("x", C, T * in),
               input("w", C, out * in, normal(0.02f)),
               input("dy", C, T * out),
               input("A", C, r * in, normal(0.02f)),
               input("B", C, out * r, normal(0.02f)),
               output("y", C, T * out),
               inout("dx", C, T * in),
               inout("u", C, T * r),
               output("g", C, T * r),
               inout("dA", F32, r * in, normal(0.01f)),
               inout("dB", F32, out * r, normal(0.01f)),
               output("ax", C, T * r)};
  c.bound = Bound::gemm_bf16;
  c.reps = 20;
  return c;
}

enum LoraTensor { x, w, dy, A, B, y, dx, u, g, dA, dB, ax };  // lora_case's order

// Adds lora_case(m, what, op) running `run`. Tensors it neither reads nor writes stay unread
// inputs (not compared, no traffic); bytes: those read once, those written once.
void lora_add(std::vector<OpCase>& v, const LoraShape& m, const std::string& what, const std::string& op,
              double fl, std::initializer_list<int> reads, std::initializer_list<int> written, RunFn run) {
  OpCase c = lora_case(m, what, op);
  c.run = std::move(run);
  c.flops = fl;
  c.bytes = 0;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    Tensor& t = c.tensors[i];
    const bool rd = std::find(reads.begin(), reads.end(), int(i)) != reads.end();
    const bool wr = std::find(written.begin(), written.end(), int(i)) != written.end();
    const double tb = double(t.n) * double(kind_bytes(t.kind, DType::bf16));
    c.bytes += (rd ? tb : 0) + (wr ? tb : 0);
    if (!wr) {
      t.role = Role::in;
      t.compare = false;
    }
  }
  v.push_back(c);
}

// The adapter's FLOPs: the base GEMM, and the low-rank products on the input / output side.
struct LoraFlops {
  double base, low_in, low_out;
  explicit LoraFlops(const LoraShape& m)
      : base(2.0 * double(m.T) * double(m.in) * double(m.out)),
        low_in(2.0 * double(m.T) * double(m.in) * double(m.r)),
        low_out(2.0 * double(m.T) * double(m.out) * double(m.r)) {}
};

constexpr float kLoraScaling = 2.f;

// The base GEMMs and the two call orders of a whole adapted linear, forward and backward.
void add_lora_sequences(std::vector<OpCase>& v, const LoraShape& m) {
  const int64_t T = m.T, in = m.in, out = m.out, r = m.r;
  const float s = kLoraScaling;
  const LoraFlops f(m);
  const double base = f.base, low_in = f.low_in, low_out = f.low_out;
  auto add = [&](const std::string& what, const std::string& op, double fl, std::initializer_list<int> reads,
                 std::initializer_list<int> written,
                 RunFn run) { lora_add(v, m, what, op, fl, reads, written, std::move(run)); };
  add("base_fwd", "linear_fwd", base, {x, w}, {y},
      [=](Ops& o, const Buffers& b) { o.linear_fwd(b[x], b[w], b[y], T, in, out); });
  add("base_bwd_input_acc", "linear_bwd_input", base, {dy, w, dx}, {dx},
      [=](Ops& o, const Buffers& b) { o.linear_bwd_input(b[dy], b[w], b[dx], T, in, out, true); });
  // the order before the adapted linears: base GEMM, then u and a read-modify-write y += u B^T
  add("fwd_base_then_adapter", "linear_fwd+fill+linear_fwd_add", base + low_in + low_out, {x, w, A, B, u, y},
      {y, u}, [=](Ops& o, const Buffers& b) {
        o.linear_fwd(b[x], b[w], b[y], T, in, out);
        o.fill(o.dtype(), b[u], T * r, 0.f);
        o.linear_fwd_add(b[x], b[A], b[u], T, in, r, s);
        o.linear_fwd_add(b[u], b[B], b[y], T, r, out, 1.f);
      });
  // model/lora_linear.cpp's adapted_linear_fwd: the adapter's term first, the base GEMM onto it
  add("fwd_adapted", "fill+linear_fwd_add+linear_fwd", base + low_in + low_out, {x, w, A, B, u, y}, {y, u},
      [=](Ops& o, const Buffers& b) {
        o.fill(o.dtype(), b[u], T * r, 0.f);
        o.linear_fwd_add(b[x], b[A], b[u], T, in, r, s);
        o.linear_fwd(b[u], b[B], b[y], T, r, out);
        o.linear_fwd_add(b[x], b[w], b[y], T, in, out, 1.f);
      });
  // adapted_linear_bwd_input with u kept from the forward (no dropout): dB, g = s dy B, dA,
  // dx = g A, then the base dx += dy W.
  add("bwd_adapted", "linear_bwd_weight+linear_bwd_input+add_into", base + 2 * low_in + 2 * low_out,
      {x, w, dy, A, B, u, dx, dA, dB}, {dx, g, dA, dB, ax}, [=](Ops& o, const Buffers& b) {
        const DType dt = o.dtype();
        o.linear_bwd_weight(b[dy], b[u], b[dB], T, r, out);
        o.linear_bwd_input(b[dy], b[B], b[g], T, r, out, false);
        o.fill(dt, b[ax], T * r, 0.f);
        o.add_into(dt, b[ax], dt, b[g], T * r, s);  // s * dy B
        o.linear_bwd_weight(b[ax], b[x], b[dA], T, in, r);
        o.linear_bwd_input(b[ax], b[A], b[dx], T, in, r, false);
        o.linear_bwd_input(b[dy], b[w], b[dx], T, in, out, true);
      });
  // the order before: the base dx = dy W, then the adapter with u computed again and dx += g A
  add("bwd_base_then_adapter", "linear_bwd_input+fill+linear_fwd_add+linear_bwd_weight+add_into",
      base + 3 * low_in + 2 * low_out, {x, w, dy, A, B, dA, dB}, {dx, u, g, dA, dB, ax},
      [=](Ops& o, const Buffers& b) {
        const DType dt = o.dtype();
        o.linear_bwd_input(b[dy], b[w], b[dx], T, in, out, false);
        o.fill(dt, b[u], T * r, 0.f);
        o.linear_fwd_add(b[x], b[A], b[u], T, in, r, s);
        o.linear_bwd_weight(b[dy], b[u], b[dB], T, r, out);
        o.linear_bwd_input(b[dy], b[B], b[g], T, r, out, false);
        o.fill(dt, b[ax], T * r, 0.f);
        o.add_into(dt, b[ax], dt, b[g], T * r, s);
        o.linear_bwd_weight(b[ax], b[x], b[dA], T, in, r);
        o.linear_bwd_input(b[ax], b[A], b[dx], T, in, r, true);
      });
}

// The adapter's primitives one by one.
void add_lora_primitives(std::vector<OpCase>& v, const LoraShape& m) {
  const int64_t T = m.T, in = m.in, out = m.out, r = m.r;
  const float s = kLoraScaling;
  const LoraFlops f(m);
  const double low_in = f.low_in, low_out = f.low_out;
  auto add = [&](const std::string& what, const std::string& op, double fl, std::initializer_list<int> reads,
                 std::initializer_list<int> written,
                 RunFn run) { lora_add(v, m, what, op, fl, reads, written, std::move(run)); };
  add("u_fill_fwd_add", "fill+linear_fwd_add", low_in, {x, A, u}, {u}, [=](Ops& o, const Buffers& b) {
    o.fill(o.dtype(), b[u], T * r, 0.f);
    o.linear_fwd_add(b[x], b[A], b[u], T, in, r, s);
  });
  add("y_add_uB", "linear_fwd_add", low_out, {u, B, y}, {y}, [=](Ops& o, const Buffers& b) {
    o.fill(o.dtype(), b[y], T * out, 0.f);
    o.linear_fwd_add(b[u], b[B], b[y], T, r, out, 1.f);
  });
  add("y_uB", "linear_fwd", low_out, {u, B}, {y},
      [=](Ops& o, const Buffers& b) { o.linear_fwd(b[u], b[B], b[y], T, r, out); });
  add("dB", "linear_bwd_weight", low_out, {dy, u, dB}, {dB},
      [=](Ops& o, const Buffers& b) { o.linear_bwd_weight(b[dy], b[u], b[dB], T, r, out); });
  add("g_dyB", "linear_bwd_input", low_out, {dy, B}, {g},
      [=](Ops& o, const Buffers& b) { o.linear_bwd_input(b[dy], b[B], b[g], T, r, out, false); });
  add("dA", "linear_bwd_weight", low_in, {u, x, dA}, {dA},
      [=](Ops& o, const Buffers& b) { o.linear_bwd_weight(b[u], b[x], b[dA], T, in, r); });
  add("dx_add_gA", "linear_bwd_input", low_in, {u, A, dx}, {dx},
      [=](Ops& o, const Buffers& b) { o.linear_bwd_input(b[u], b[A], b[dx], T, in, r, true); });
}

// The adapters of q, k and v (one input x [T, in], outputs of Q and 2 x KV), one after the other
// and as one (model/lora_linear.hpp's siblings): u and g [T, 3r], each module's a column block.
enum SiblingTensor {
  sx,
  sA,
  sBq,
  sBk,
  sBv,
  su,
  syq,
  syk,
  syv,
  sdyq,
  sdyk,
  sdyv,
  sg,
  sdA,
  sdBq,
  sdBk,
  sdBv,
  sdx
};

void add_lora_siblings(std::vector<OpCase>& v, bool big) {
  const int64_t T = big ? 4096 : 40, in = big ? 4096 : 64, Q = big ? 4096 : 64, KV = big ? 1024 : 32,
                r = big ? 32 : 8, R = 3 * r;
  const float s = kLoraScaling;
  const int64_t outs[3] = {Q, KV, KV};
  const std::string sh = "T=" + std::to_string(T) + " " + std::to_string(in) + "->" + std::to_string(Q) +
                         "," + std::to_string(KV) + "," + std::to_string(KV) + " r=" + std::to_string(r);
  auto mk = [&](const std::string& name, const std::string& op, bool backward) {
    OpCase c{"lora_qkv_" + name, op, sh + (backward ? " dA, dB f32 +=" : "")};
    c.tensors = {input("x", C, T * in),
                 input("A", C, R * in, normal(0.02f)),
                 input("Bq", C, Q * r, normal(0.02f)),
                 input("Bk", C, KV * r, normal(0.02f)),
                 input("Bv", C, KV * r, normal(0.02f)),
                 backward ? input("u", C, T * R) : output("u", C, T * R),
                 output("yq", C, T * Q),
                 output("yk", C, T * KV),
                 output("yv", C, T * KV),
                 input("dyq", C, T * Q),
                 input("dyk", C, T * KV),
                 input("dyv", C, T * KV),
                 output("g", C, T * R),
                 inout("dA", F32, R * in, normal(0.01f)),
                 inout("dBq", F32, Q * r, normal(0.01f)),
                 inout("dBk", F32, KV * r, normal(0.01f)),
                 inout("dBv", F32, KV * r, normal(0.01f)),
                 output("dx", C, T * in)};
    for (size_t i = 0; i < c.tensors.size(); ++i) {  // the other half's tensors: unread, not compared
      const bool fwd_tensor = i == sx || i == sA || i == sBq || i == sBk || i == sBv || i == su || i == syq ||
                              i == syk || i == syv;
      const bool bwd_tensor = !(i == syq || i == syk || i == syv);
      if ((backward ? bwd_tensor : fwd_tensor) || c.tensors[i].role == Role::in) continue;
      c.tensors[i].role = Role::in;
      c.tensors[i].compare = false;
      c.tensors[i].n = 0;
    }
    if (!backward)
      for (int i : {sdyq, sdyk, sdyv, sg}) c.tensors[size_t(i)].n = 0;
    c.flops = 0;
    for (int64_t o : outs) c.flops += (backward ? 4.0 : 2.0) * double(T) * double(r) * double(in + o);
    c.bound = Bound::gemm_bf16;
    c.reps = 20;
    return c;
  };
  const SiblingTensor B[3] = {sBq, sBk, sBv}, Y[3] = {syq, syk, syv}, DY[3] = {sdyq, sdyk, sdyv},
                      DB[3] = {sdBq, sdBk, sdBv};
  auto at = [](const Ops& o, void* p, int64_t elems) {
    return static_cast<char*>(p) + elems * int64_t(dtype_size(o.dtype()));
  };
  OpCase f1 = mk("fwd_separate", "linear_fwd", false);  // each: u_i = s x A_i^T, y_i = u_i B_i^T
  f1.run = [=](Ops& o, const Buffers& b) {
    for (int i = 0; i < 3; ++i) {
      void* u = at(o, b[su], i * T * r);
      o.linear_fwd(b[sx], at(o, b[sA], i * r * in), u, T, in, r, s);
      o.linear_fwd(u, b[B[i]], b[Y[i]], T, r, outs[i]);
    }
  };
  v.push_back(f1);
  OpCase f3 = mk("fwd_siblings", "linear_fwd+linear_fwd_ld", false);  // u = s x A^T once
  f3.run = [=](Ops& o, const Buffers& b) {
    o.linear_fwd(b[sx], b[sA], b[su], T, in, R, s);
    for (int i = 0; i < 3; ++i) o.linear_fwd_ld(at(o, b[su], i * r), R, b[B[i]], b[Y[i]], T, r, outs[i]);
  };
  v.push_back(f3);
  OpCase b1 = mk("bwd_separate", "linear_bwd_weight+linear_bwd_input", true);  // dB, g, dA, dx each
  b1.run = [=](Ops& o, const Buffers& b) {
    for (int i = 0; i < 3; ++i) {
      void* u = at(o, b[su], i * T * r);
      void* g = at(o, b[sg], i * T * r);
      o.linear_bwd_weight(b[DY[i]], u, b[DB[i]], T, r, outs[i]);
      o.linear_bwd_input(b[DY[i]], b[B[i]], g, T, r, outs[i], false, s);
      o.linear_bwd_weight(g, b[sx], static_cast<float*>(b[sdA]) + i * r * in, T, in, r);
      o.linear_bwd_input(g, at(o, b[sA], i * r * in), b[sdx], T, in, r, i > 0);
    }
  };
  v.push_back(b1);
  OpCase b3 =
      mk("bwd_siblings", "linear_bwd_weight_ld+linear_bwd_input_ld+linear_bwd_weight+linear_bwd_input",
         true);  // dB_i, g_i from the blocks, then dA and dx once
  b3.run = [=](Ops& o, const Buffers& b) {
    for (int i = 0; i < 3; ++i) {
      o.linear_bwd_weight_ld(b[DY[i]], at(o, b[su], i * r), R, b[DB[i]], T, r, outs[i]);
      o.linear_bwd_input_ld(b[DY[i]], b[B[i]], at(o, b[sg], i * r), R, T, r, outs[i], s);
    }
    o.linear_bwd_weight(b[sg], b[sx], b[sdA], T, in, R);
    o.linear_bwd_input(b[sg], b[sA], b[sdx], T, in, R, false);
  };
  v.push_back(b3);
}

void add_embedding_and_head(std::vector<OpCase>& v, bool big) {
  const int64_t T = big ? 8192 : 48, H = big ? 2048 : 64, V = big ? 151936 : 300;
  const std::string sh = "T=" + std::to_string(T) + " H=" + std::to_string(H) + " V=" + std::to_string(V);
  OpCase ef{"embedding_fwd", "embedding_fwd", sh};
  ef.tensors = {input("ids", I32, T, ints(0, V - 1)), input("table", C, V * H, normal(0.02f)),
                output("y", C, T * H)};
  ef.run = [=](Ops& o, const Buffers& b) { o.embedding_fwd(b.i(0), b[1], b[2], T, H, V); };
  ef.bytes = double(T) * 4 + 2.0 * double(T * H) * 2;  // the T rows read, not the table
  v.push_back(ef);
  OpCase eb{"embedding_bwd", "embedding_bwd", sh + " dtable f32 +="};
  eb.tensors = {input("ids", I32, T, ints(0, V - 1)), input("dy", C, T * H),
                inout("dtable", F32, V * H, constant(0.f))};
  eb.run = [=](Ops& o, const Buffers& b) { o.embedding_bwd(b.i(0), b[1], b[2], T, H, V, -1); };
  eb.bytes = double(T) * 4 + double(T * H) * 2 + 2.0 * double(T * H) * 4;  // rows touched, read and written
  v.push_back(eb);
  const size_t sb = Ops::lm_head_ce_scratch_bytes(T, H, V);
  const double fl = 2.0 * double(T) * double(H) * double(V);
  for (bool grads : {false, true}) {
    OpCase c{grads ? "lm_head_ce_grads" : "lm_head_ce_loss", "lm_head_cross_entropy",
             sh + (grads ? " +dh, dW" : " loss only")};
    c.tensors = {input("h", C, T * H),
                 input("w", C, V * H, normal(0.02f)),
                 input("targets", I32, T, ints(-1, V - 1)),  // about 1 in V ignored (-1)
                 output("loss", F32, 2),
                 output("dh", C, T * H),
                 inout("dw", F32, V * H, constant(0.f)),
                 scratch("scratch", sb)};
    if (!grads) {
      c.tensors[4].role = c.tensors[5].role = Role::in;  // not passed: no room needed
      c.tensors[4].compare = c.tensors[5].compare = false;
      c.tensors[4].n = c.tensors[5].n = 0;
    }
    c.run = [=](Ops& o, const Buffers& b) {
      o.lm_head_cross_entropy(b[0], b[1], b.i(2), T, H, V, b.f(3), grads ? b[4] : nullptr,
                              grads ? b[5] : nullptr, b[6]);
    };
    if (!grads) c.bytes = double(T * H + V * H) * 2 + double(T) * 4 + 8;  // h, W, targets read; loss
    c.flops = grads ? 3 * fl : fl;
    c.bound = Bound::gemm_bf16;
    c.reps = big ? 3 : 1;
    v.push_back(c);
  }
}

}  // namespace

void add_dense_cases(std::vector<OpCase>& v, Size s) {
  const bool big = s == Size::bench;
  const int64_t T = big ? 8192 : 48, H = big ? 2048 : 64, Q = big ? 2048 : 64, KV = big ? 1024 : 32,
                F = big ? 6144 : 96;
  add_linear(v, "qproj", T, H, Q);
  add_linear(v, "kvproj", T, H, KV);
  add_linear(v, "gateup", T, H, F);
  add_linear(v, "down", T, F, H);
  {  // the GEMM the bf16 ceiling was measured with (bench_ops --sustained runs it back to back)
    const int64_t N = big ? 8192 : 64;
    OpCase g{"gemm_square", "linear_fwd", mkn(N, N, N) + " bf16"};
    g.tensors = {input("x", C, N * N), input("w", C, N * N, normal(0.02f)), output("y", C, N * N)};
    g.run = [=](Ops& o, const Buffers& b) { o.linear_fwd(b[0], b[1], b[2], N, N, N); };
    g.flops = 2.0 * double(N) * double(N) * double(N);
    g.bound = Bound::gemm_bf16;
    v.push_back(g);
  }
  const int64_t LT = big ? 4096 : 40, r = big ? 32 : 8;
  const LoraShape ls[] = {{"q", LT, big ? 4096 : 64, big ? 4096 : 64, r},
                          {"k", LT, big ? 4096 : 64, big ? 1024 : 32, r},
                          {"gate", LT, big ? 4096 : 64, big ? 14336 : 112, r},
                          {"down", LT, big ? 14336 : 112, big ? 4096 : 64, r}};
  for (const LoraShape& m : ls) {
    add_lora_sequences(v, m);
    add_lora_primitives(v, m);
  }
  add_lora_siblings(v, big);
  add_embedding_and_head(v, big);
}

}  // namespace rp::optable
