// Op-table cases of the mixture-of-experts block at Qwen3-30B-A3B shapes (4096 tokens routed
// to 8 of 128 experts, hidden 2048, expert FFN 768): routing and its backward, the sort (with
// its host copy of the group offsets), the gathers and combines, and the grouped linears of
// each projection (and of rank-32 per-expert LoRA adapters) in the CUDA backend's grouped-GEMM
// modes (cuda_backend.hpp: 0 one GEMM per expert, 1 grouped, 2 streams), next to one dense GEMM
// over all routed rows as their ceiling. FLOPs of a grouped linear 2*T*k*K*N.
#include <algorithm>
#include <numeric>
#include <string>

#include "tests/kernels/op_table/op_table.hpp"
#ifdef RP_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace rp::optable {

namespace {

constexpr Kind C = Kind::compute, F32 = Kind::f32, I32 = Kind::i32;

// A permutation of 0..n-1 (Fisher-Yates on the seeded fill's uniforms).
Fill permutation() {
  return [](std::vector<float>& v, uint64_t seed) {
    std::vector<float> u(v.size());
    ints(0, 1 << 30)(u, seed);
    std::vector<int64_t> p(v.size());
    std::iota(p.begin(), p.end(), 0);
    for (size_t i = p.size(); i > 1; --i) std::swap(p[i - 1], p[size_t(u[i - 1]) % i]);
    for (size_t i = 0; i < p.size(); ++i) v[i] = float(p[i]);
  };
}

// Group offsets [E+1] of R rows: each row's expert drawn uniformly, counts accumulated.
Fill offsets(int64_t R, int64_t E) {
  return [R, E](std::vector<float>& v, uint64_t seed) {
    std::vector<float> ex(static_cast<size_t>(R));
    ints(0, E - 1)(ex, seed);
    std::vector<int64_t> cnt(size_t(E), 0);
    for (float e : ex) ++cnt[size_t(e)];
    v[0] = 0;
    for (int64_t e = 0; e < E; ++e) v[size_t(e + 1)] = v[size_t(e)] + float(cnt[size_t(e)]);
  };
}

struct Moe {
  int64_t T, E, k, H, F;
};

void add_routing(std::vector<OpCase>& v, const Moe& m, const std::string& sh) {
  const int64_t T = m.T, E = m.E, k = m.k, R = T * k, H = m.H;
  OpCase rt{"moe_route", "moe_route", sh + " +stats"};
  rt.tensors = {input("logits", C, T * E), output("probs", F32, T * E), output("topk_idx", I32, R, 0),
                output("topk_w", F32, R), inout("stats", F32, 2 * E, constant(0.f))};
  rt.run = [=](Ops& o, const Buffers& b) {
    o.moe_route(b[0], b.f(1), b.i(2), b.f(3), b.f(4), T, E, k, true);
  };
  v.push_back(rt);
  OpCase rb{"moe_route_bwd", "moe_route_bwd", sh};
  rb.tensors = {input("logits", C, T * E),   derived("probs", F32, T * E),
                derived("topk_idx", I32, R), derived("topk_w", F32, R),
                input("dw", F32, R),         input("counts", F32, E, ints(0, 64)),
                output("dlogits", C, T * E)};
  rb.prepare = [=](Ops& o, const Buffers& b) {
    o.moe_route(b[0], b.f(1), b.i(2), b.f(3), nullptr, T, E, k, true);
  };
  rb.run = [=](Ops& o, const Buffers& b) {
    o.moe_route_bwd(b.f(1), b.i(2), b.f(4), b.f(5), 0.01f, b[6], T, E, k, true);
  };
  v.push_back(rb);
  OpCase so{"moe_sort", "moe_sort", sh + " (+ offsets to host, wait)"};
  so.tensors = {input("topk_idx", I32, R, ints(0, E - 1)), output("offsets", I32, E + 1, 0),
                output("offsets_host", I32, E + 1, 0), output("row", I32, R, 0), output("token", I32, R, 0)};
  so.tensors[2].place = Place::host;
  so.run = [=](Ops& o, const Buffers& b) { o.moe_sort(b.i(0), b.i(1), b.i(2), b.i(3), b.i(4), T, E, k); };
  v.push_back(so);
  const std::string sr = "R=" + std::to_string(R) + " H=" + std::to_string(H);
  OpCase g{"moe_gather_rows", "gather_rows", sr};
  g.tensors = {input("x", C, T * H), input("token", I32, R, ints(0, T - 1)), output("xs", C, R * H)};
  g.run = [=](Ops& o, const Buffers& b) { o.gather_rows(b[0], b.i(1), b[2], R, H); };
  g.bytes = 2.0 * double(R * H) * 2 + double(R) * 4;
  v.push_back(g);
  OpCase cb{"moe_combine", "moe_combine", sr};
  cb.tensors = {input("ys", C, R * H), input("w", F32, R), input("row", I32, R, permutation()),
                output("y", C, T * H)};
  cb.run = [=](Ops& o, const Buffers& b) { o.moe_combine(b[0], b.f(1), b.i(2), b[3], T, k, H, false); };
  v.push_back(cb);
  OpCase cbb{"moe_combine_bwd", "moe_combine_bwd", sr};
  cbb.tensors = {input("dy", C, T * H),   input("ys", C, R * H),
                 input("w", F32, R),      input("row", I32, R, permutation()),
                 output("dys", C, R * H), output("dw", F32, R)};
  cbb.run = [=](Ops& o, const Buffers& b) {
    o.moe_combine_bwd(b[0], b[1], b.f(2), b.i(3), b[4], b.f(5), T, k, H);
  };
  v.push_back(cbb);
  OpCase gb{"moe_gather_bwd", "moe_gather_bwd", sr};
  gb.tensors = {input("dxs", C, R * H), input("row", I32, R, permutation()), output("dx", C, T * H)};
  gb.run = [=](Ops& o, const Buffers& b) { o.moe_gather_bwd(b[0], b.i(1), b[2], T, k, H, false); };
  v.push_back(gb);
}

// CUDA grouped-GEMM mode (-1: leave), our low-rank kernels off, our weight-gradient kernel on
// every shape.
struct Mode {
  const char* tag;
  int mode = -1;
  bool cublas_lowrank = false, wgrad_kernel = false;
};

void apply(OpCase& c, const Mode& md) {
#ifdef RP_HAVE_CUDA
  c.cuda_on = [md](Ops& o) {
    if (md.mode >= 0) cuda::set_grouped_gemm(o, md.mode);
    if (md.cublas_lowrank) cuda::set_grouped_lowrank_kernel(o, false);
    if (md.wgrad_kernel) cuda::set_grouped_wgrad_kernel_max(o, INT64_MAX);
  };
  c.cuda_off = [](Ops& o) {
    cuda::set_grouped_gemm(o, 1);
    cuda::set_grouped_lowrank_kernel(o, true);
    cuda::set_grouped_wgrad_kernel_max(o, 64);
  };
#else
  (void)c, (void)md;
#endif
}

// lowrank: a LoRA adapter's side (K or N the rank), where the CUDA backend uses its own low-rank
// kernels (measured beside cuBLAS's grouped call); else our weight-gradient kernel on the full shape.
void add_grouped(std::vector<OpCase>& v, const Moe& m, const char* proj, int64_t K, int64_t N, bool lowrank) {
  const int64_t E = m.E, R = m.T * m.k;
  const double fl = 2.0 * double(R) * double(K) * double(N);
  const std::string sh =
      std::string(proj) + " R=" + std::to_string(R) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
  const std::string p = std::string("moe_") + proj;
  OpCase d{p + "_dense_ceiling", "linear_fwd", sh + " (all rows, one weight)"};
  d.tensors = {input("x", C, R * K), input("w", C, N * K, normal(0.02f)), output("y", C, R * N)};
  d.run = [=](Ops& o, const Buffers& b) { o.linear_fwd(b[0], b[1], b[2], R, K, N); };
  d.flops = fl;
  d.bound = Bound::gemm_bf16;
  v.push_back(d);
  std::vector<Mode> modes = {{"loop", 0}, {"grouped", 1}, {"streams", 2}};
  if (lowrank) modes.push_back({"cublas_grouped", 1, true, false});
  else modes.push_back({"wgrad_kernel", 1, false, true});
  for (const Mode& md : modes) {
    // 0 offsets_host, 1 x, 2 w, 3 y, 4 dy, 5 dx, 6 dw
    auto make = [&](const std::string& what, const std::string& op) {
      OpCase c{p + "_" + what + "_" + md.tag, op, sh};
      c.tensors = {input("offsets_host", I32, E + 1, offsets(R, E)),
                   input("x", C, R * K),
                   input("w", C, E * N * K, normal(0.02f)),
                   output("y", C, R * N),
                   input("dy", C, R * N),
                   output("dx", C, R * K),
                   inout("dw", F32, E * N * K, normal(0.01f))};
      c.tensors[0].place = Place::host;
      c.flops = fl;
      c.bound = Bound::gemm_bf16;
      apply(c, md);
      return c;
    };
    const bool only_wgrad = md.wgrad_kernel, no_wgrad = md.cublas_lowrank;
    auto keep = [](OpCase& c, std::initializer_list<int> outs) {  // the others: unread, not compared
      for (size_t i = 3; i < c.tensors.size(); ++i)
        if (c.tensors[i].role != Role::in && std::find(outs.begin(), outs.end(), int(i)) == outs.end()) {
          c.tensors[i].role = Role::in;
          c.tensors[i].compare = false;
          c.tensors[i].n = 0;
        }
    };
    if (!only_wgrad) {
      OpCase f = make("fwd", "grouped_linear_fwd");
      f.tensors[4].n = 0;
      keep(f, {3});
      f.run = [=](Ops& o, const Buffers& b) { o.grouped_linear_fwd(b[1], b[2], b[3], b.i(0), E, K, N); };
      v.push_back(f);
      OpCase bi = make("bwd_input", "grouped_linear_bwd_input");
      bi.tensors[1].n = 0;
      keep(bi, {5});
      bi.run = [=](Ops& o, const Buffers& b) {
        o.grouped_linear_bwd_input(b[4], b[2], b[5], b.i(0), E, K, N, false);
      };
      v.push_back(bi);
    }
    if (!no_wgrad) {
      OpCase bw = make("bwd_weight", "grouped_linear_bwd_weight");
      bw.tensors[2].n = 0;
      keep(bw, {6});
      bw.run = [=](Ops& o, const Buffers& b) {
        o.grouped_linear_bwd_weight(b[4], b[1], b[6], b.i(0), E, K, N);
      };
      v.push_back(bw);
    }
  }
}

}  // namespace

void add_moe_cases(std::vector<OpCase>& v, Size s) {
  const bool big = s == Size::bench;
  const Moe m = big ? Moe{4096, 128, 8, 2048, 768} : Moe{32, 8, 2, 32, 24};
  const std::string sh =
      "T=" + std::to_string(m.T) + " E=" + std::to_string(m.E) + " k=" + std::to_string(m.k);
  add_routing(v, m, sh);
  const int64_t r = big ? 32 : 8;
  add_grouped(v, m, "gateup", m.H, m.F, false);
  add_grouped(v, m, "down", m.F, m.H, false);
  add_grouped(v, m, "loraA_gateup", m.H, r, true);
  add_grouped(v, m, "loraB_gate", r, m.F, true);
  add_grouped(v, m, "loraA_down", m.F, r, true);
  add_grouped(v, m, "loraB_down", r, m.H, true);
  {  // the LoRA adapter's B added onto the frozen projection's output
    const int64_t E = m.E, R = m.T * m.k, K = r, N = m.F;
    OpCase c{"moe_loraB_gate_fwd_add", "grouped_linear_fwd_add",
             "R=" + std::to_string(R) + " K=" + std::to_string(K) + " N=" + std::to_string(N)};
    c.tensors = {input("offsets_host", I32, E + 1, offsets(R, E)), input("x", C, R * K),
                 input("w", C, E * N * K, normal(0.02f)), inout("y", C, R * N)};
    c.tensors[0].place = Place::host;
    c.run = [=](Ops& o, const Buffers& b) {
      o.grouped_linear_fwd_add(b[1], b[2], b[3], b.i(0), E, K, N, 2.f);
    };
    c.flops = 2.0 * double(R) * double(K) * double(N);
    c.bound = Bound::gemm_bf16;
    v.push_back(c);
  }
}

}  // namespace rp::optable
