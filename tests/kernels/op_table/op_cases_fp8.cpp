// Op-table cases of FP8 compute (kernels/ops.hpp "FP8 compute"): the scales, the quantizations
// (per tensor, per row, transposed, transposed with the token count padded, both layouts at
// once), the norm and SwiGLU
// with their fused scale, and the FP8 GEMMs (e4m3 x e4m3 into the compute dtype, e5m2 x e4m3 as
// an input gradient, and into an fp32 weight-gradient accumulator) at the decoder linears of
// Qwen3-1.7B and LLaMA-3.1-8B over 8192 tokens. Codes compare by their decoded values (the
// backends compute them bit for bit alike, so only a difference in the scale shows).
#include <string>

#include "tests/kernels/op_table/op_table.hpp"

namespace rp::optable {

namespace {

constexpr Kind C = Kind::compute, F32 = Kind::f32, U8 = Kind::u8;
constexpr Fp8Format E4 = Fp8Format::e4m3, E5 = Fp8Format::e5m2;
// The scale of every generated code tensor: normal values up to 4 sigma map onto the format.
float code_scale(Fp8Format f) { return 4.f / fp8::max_finite(f); }

// Codes of scale * normal values quantized with code_scale(f).
Fill codes(Fp8Format f) {
  return [f](std::vector<float>& v, uint64_t seed) {
    normal(1.f)(v, seed);
    for (auto& x : v) x = float(fp8::quantize(f, x, code_scale(f)));
  };
}

Tensor codes_out(const std::string& name, int64_t n, Fp8Format f) {
  Tensor t = output(name, U8, n, 1e-6);
  t.codes = f;
  return t;
}

std::string mat(int64_t r, int64_t c) { return "[" + std::to_string(r) + ", " + std::to_string(c) + "]"; }

void add_quantize(std::vector<OpCase>& v, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols, ld = (rows + 15) / 16 * 16 + 16;
  const std::string sh = mat(rows, cols) + " e4m3";
  OpCase s{"fp8_scale", "fp8_scale", sh};
  s.tensors = {input("x", C, n), output("scale", F32, 1)};
  s.run = [=](Ops& o, const Buffers& b) { o.fp8_scale(b[0], n, E4, b.f(1)); };
  v.push_back(s);
  OpCase sr{"fp8_scale_rows", "fp8_scale_rows", sh};
  sr.tensors = {input("x", C, n), output("scale", F32, rows)};
  sr.run = [=](Ops& o, const Buffers& b) { o.fp8_scale_rows(b[0], rows, cols, E4, b.f(1)); };
  v.push_back(sr);
  // 0 x, 1 scale (the tensor's, from fp8_scale on the same backend), 2 codes
  auto quant = [&](const std::string& name, int64_t qn, RunFn run, bool per_row) {
    OpCase c{name, name, sh};
    c.tensors = {input("x", C, n), derived("scale", F32, per_row ? rows : 1), codes_out("q", qn, E4)};
    c.prepare = [=](Ops& o, const Buffers& b) {
      if (per_row) o.fp8_scale_rows(b[0], rows, cols, E4, b.f(1));
      else o.fp8_scale(b[0], n, E4, b.f(1));
    };
    c.run = std::move(run);
    v.push_back(c);
  };
  quant(
      "fp8_quantize", n, [=](Ops& o, const Buffers& b) { o.fp8_quantize(b[0], b.f(1), b.u(2), n, E4); },
      false);
  quant(
      "fp8_quantize_rows", n,
      [=](Ops& o, const Buffers& b) { o.fp8_quantize_rows(b[0], b.f(1), b.u(2), rows, cols, E4); }, true);
  quant(
      "fp8_quantize_transposed", n,
      [=](Ops& o, const Buffers& b) { o.fp8_quantize_transposed(b[0], b.f(1), b.u(2), rows, cols, E4); },
      false);
  quant(
      "fp8_quantize_transposed_padded", cols * ld,
      [=](Ops& o, const Buffers& b) {
        o.fp8_quantize_transposed_padded(b[0], b.f(1), b.u(2), rows, cols, ld, E4);
      },
      false);
  v.back().shape += " ld=" + std::to_string(ld);
  // both codes from one read (a weight gradient's dy: its rows for the input gradient too)
  OpCase both{"fp8_quantize_both", "fp8_quantize_both", sh + " ld=" + std::to_string(ld)};
  both.tensors = {input("x", C, n), derived("scale", F32, 1), codes_out("q", n, E4),
                  codes_out("qt", cols * ld, E4)};
  both.prepare = [=](Ops& o, const Buffers& b) { o.fp8_scale(b[0], n, E4, b.f(1)); };
  both.run = [=](Ops& o, const Buffers& b) {
    o.fp8_quantize_both(b[0], b.f(1), b.u(2), b.u(3), rows, cols, ld, E4);
  };
  v.push_back(both);
}

void add_fused(std::vector<OpCase>& v, int64_t T, int64_t H, int64_t F) {
  OpCase r{"rmsnorm_fwd_fp8_scale", "rmsnorm_fwd_fp8_scale", mat(T, H) + " e4m3"};
  r.tensors = {input("x", C, T * H), input("w", C, H), output("y", C, T * H), output("scale", F32, 1)};
  r.run = [=](Ops& o, const Buffers& b) {
    o.rmsnorm_fwd_fp8_scale(b[0], b[1], b[2], T, H, 1e-6f, E4, b.f(3));
  };
  v.push_back(r);
  OpCase ro{"rmsnorm_fwd_fp8_scale_offset", "rmsnorm_fwd_fp8_scale", mat(T, H) + " e4m3 w_offset=1"};
  ro.tensors = {input("x", C, T * H), input("w", C, H, normal(0.1f)), output("y", C, T * H),
                output("scale", F32, 1)};
  ro.run = [=](Ops& o, const Buffers& b) {
    o.rmsnorm_fwd_fp8_scale(b[0], b[1], b[2], T, H, 1e-6f, E4, b.f(3), 1.f);
  };
  v.push_back(ro);
  OpCase rr{"rmsnorm_fwd_fp8_rows", "rmsnorm_fwd_fp8_rows", mat(T, H) + " e4m3"};
  // the CPU twin's y is fp32, the GPU's bf16: a code moves a step where y's rounding crosses a
  // code boundary (tests/kernels/test_cuda_fp8.cpp checks the codes of the stored y bit for bit)
  Tensor rq = codes_out("q", T * H, E4);
  rq.nmse = 3e-3;
  rr.tensors = {input("x", C, T * H), input("w", C, H), output("y", C, T * H), rq, output("scale", F32, T)};
  rr.run = [=](Ops& o, const Buffers& b) {
    o.rmsnorm_fwd_fp8_rows(b[0], b[1], b[2], T, H, 1e-6f, E4, b.u(3), b.f(4));
  };
  v.push_back(rr);
  OpCase s{"swiglu_fwd_fp8_scale", "swiglu_fwd_fp8_scale", mat(T, F) + " e4m3"};
  s.tensors = {input("g", C, T * F), input("u", C, T * F), output("h", C, T * F), output("scale", F32, 1)};
  s.run = [=](Ops& o, const Buffers& b) { o.swiglu_fwd_fp8_scale(b[0], b[1], b[2], T * F, E4, b.f(3)); };
  v.push_back(s);
  OpCase sb{"swiglu_bwd_fp8_scale", "swiglu_bwd_fp8_scale", mat(T, F) + " e4m3"};
  sb.tensors = {input("g", C, T * F),      input("u", C, T * F),   input("dh", C, T * F),
                output("dg", C, T * F),    output("du", C, T * F), output("scale_dg", F32, 1),
                output("scale_du", F32, 1)};
  sb.run = [=](Ops& o, const Buffers& b) {
    o.swiglu_bwd_fp8_scale(b[0], b[1], b[2], b[3], b[4], T * F, E4, b.f(5), b.f(6));
  };
  v.push_back(sb);
}

// d[M,N] = sa*sb * A[M,K] B[N,K]^T: into the compute dtype (fa x e4m3, accumulate or not) and
// into an fp32 accumulator.
void add_gemm(std::vector<OpCase>& v, const std::string& tag, int64_t M, int64_t K, int64_t N) {
  const double fl = 2.0 * double(M) * double(K) * double(N);
  const std::string sh = "M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
  struct G {
    const char* name;
    Fp8Format fa;
    int into;  // 0 compute, 1 compute +=, 2 fp32 +=
  } gs[] = {
      {"gemm_fp8_", E4, 0}, {"gemm_fp8_e5m2_", E5, 0}, {"gemm_fp8_acc_", E4, 1}, {"gemm_fp8_f32_", E4, 2}};
  for (const G& g : gs) {
    OpCase c{g.name + tag, g.into == 2 ? "gemm_fp8_accumulate_f32" : "gemm_fp8",
             sh + " " + fp8_format_name(g.fa) + " x e4m3" +
                 (g.into == 2 ? " -> f32 +="
                  : g.into    ? " +="
                              : "")};
    const Fp8Format fa = g.fa;
    const int into = g.into;
    c.tensors = {input("a", U8, M * K, codes(fa)), input("scale_a", F32, 1, constant(code_scale(fa))),
                 input("b", U8, N * K, codes(E4)), input("scale_b", F32, 1, constant(code_scale(E4))),
                 into == 0 ? output("d", C, M * N)
                           : inout("d", into == 2 ? F32 : C, M * N, normal(into == 2 ? 1.f : 4.f))};
    c.run = [=](Ops& o, const Buffers& b) {
      if (into == 2) o.gemm_fp8_accumulate_f32(b.u(0), fa, b.f(1), b.u(2), E4, b.f(3), b.f(4), M, K, N);
      else o.gemm_fp8(b.u(0), fa, b.f(1), b.u(2), E4, b.f(3), b[4], M, K, N, into == 1);
    };
    c.flops = fl;
    c.bound = Bound::gemm_fp8;
    c.nmse = 1e-3;  // the tensor cores' reduced-precision sums within a k-block
    v.push_back(c);
  }
  // onto the residual stream: d = r + sa*sb * A B^T, r read in the epilogue (o_proj, down_proj)
  OpCase r{"gemm_fp8_residual_" + tag, "gemm_fp8_residual", sh + " e4m3 x e4m3, d = r + ..."};
  r.tensors = {input("a", U8, M * K, codes(E4)),  input("scale_a", F32, 1, constant(code_scale(E4))),
               input("b", U8, N * K, codes(E4)),  input("scale_b", F32, 1, constant(code_scale(E4))),
               input("r", C, M * N, normal(4.f)), output("d", C, M * N)};
  r.run = [=](Ops& o, const Buffers& b) {
    o.gemm_fp8_residual(b.u(0), E4, b.f(1), b.u(2), E4, b.f(3), b[4], b[5], M, K, N);
  };
  r.flops = fl;
  r.bound = Bound::gemm_fp8;
  r.nmse = 1e-3;
  v.push_back(r);
}

}  // namespace

void add_fp8_cases(std::vector<OpCase>& v, Size s) {
  const bool big = s == Size::bench;
  const int64_t T = big ? 8192 : 48, H = big ? 2048 : 64, F = big ? 6144 : 96;
  add_quantize(v, T, H);
  add_fused(v, T, H, F);
  add_gemm(v, "qwen_qproj", T, H, H);
  add_gemm(v, "qwen_gateup", T, H, F);
  add_gemm(v, "qwen_down", T, F, H);
  add_gemm(v, "llama_gateup", T, big ? 4096 : 64, big ? 14336 : 112);
  {  // the FP8 GEMM of the measured FP8 ceiling (8192^3 e4m3)
    const int64_t N = big ? 8192 : 64;
    std::vector<OpCase> sq;
    add_gemm(sq, "square", N, N, N);
    v.push_back(sq[0]);
  }
}

}  // namespace rp::optable
