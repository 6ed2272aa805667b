// FP8 compute on the CUDA backend (kernels/ops.hpp, "FP8 compute"): the e4m3 GEMM
// (Ops::gemm_fp8, cuBLASLt) next to the bf16 linear_fwd at the decoder linears' shapes of
// Qwen3-1.7B, Qwen3-4B and LLaMA-3.1-8B (8192 tokens), with cuBLASLt's fast FP8 accumulation
// off (the default) and on, and the whole FP8 forward of a linear whose weight is already
// quantized (activation scale + quantize + GEMM); then the quantization kernels' GB/s.
//
//   bench_fp8_ops_bench [--quick] [--sustained S]   (--sustained: the 8192^3 FP8 GEMM back to
//                                                     back for S seconds, its rate per half second)
//
// Timing (bench/ops_timing.hpp): median of 5 trials of R calls issued
// back to back; memory-bound ops rotate over 4 input sets so the L2 does not serve them.
// FLOPs 2*M*N*K; bytes: inputs read once plus outputs written once (bf16 2, codes 1 per value).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_main.hpp"
#include "bench/decoder_linears.hpp"
#include "bench/ops_timing.hpp"
#include "kernels/device.hpp"
#include "kernels/ops.hpp"
#ifdef RP_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

using namespace rp;
using namespace rp::bench;

namespace {

// the ops bench times every shape at 8192 tokens (gemm_rows' T), the LLaMA's too
using Linear = DecoderLinear;
constexpr const auto& kLinears = kDecoderLinears;

void set_fast_accum(Ops& ops, bool on) {
#ifdef RP_HAVE_CUDA
  rp::cuda::set_fp8_fast_accum(ops, on);
#else
  (void)ops, (void)on;
#endif
}

// A device fp32 scalar holding v.
float* scalar(Env& e, float v) {
  auto* p = static_cast<float*>(buffer(e, 1, DType::f32));
  Stream& cs = e.dev->stream(StreamKind::compute);
  cs.copy_h2d(p, &v, 4);
  cs.synchronize();
  return p;
}

// A linear whose weight runs from its fp8 storage (one scale per output row): the per-row-scale
// GEMM alone, the forward with per-token activation scales, and the byte transpose that gives
// the input gradient W^T's codes. Nothing where cuBLASLt refuses outer-vector scales.
void stored_weight_rows(Env& e, const Linear& l, void* x, void* y, uint8_t* qx, uint8_t* qw, int R) {
  Ops& ops = *e.ops;
  const int64_t T = 8192;
  const Fp8Format e4 = Fp8Format::e4m3;
  Stream& cs = e.dev->stream(StreamKind::compute);
  bool ok = false;
  cs.launch([&] { ok = ops.gemm_fp8_rows_supported(); });
  cs.synchronize();
  if (!ok) {
    std::printf("  gemm_fp8_rows: cuBLASLt offers no outer-vector scales here (the layers fall back)\n");
    return;
  }
  auto* sxr = static_cast<float*>(buffer(e, T, DType::f32));
  auto* swr = static_cast<float*>(buffer(e, l.out, DType::f32));
  auto* qwt = static_cast<uint8_t*>(buffer(e, (l.out * l.in + 3) / 4, DType::i32));
  cs.launch([&] {
    ops.fill(DType::f32, swr, l.out, 1e-3f);
    ops.fp8_scale_rows(x, T, l.in, e4, sxr);
  });
  cs.synchronize();
  const double fl = 2.0 * double(T) * double(l.out) * double(l.in);
  const std::string shape =
      std::string(l.model) + " K=" + std::to_string(l.in) + " N=" + std::to_string(l.out);
  line(e, "  gemm_fp8_rows e4m3 (per-row scales)", shape,
       time_op(
           e, [&](int) { ops.gemm_fp8_rows(qx, e4, sxr, qw, e4, swr, y, T, l.in, l.out, false); }, R),
       fl, 0);
  line(e, "  fp8 linear fwd, stored W (scale_rows+quant_rows+gemm_rows)", shape,
       time_op(
           e,
           [&](int) {
             ops.fp8_scale_rows(x, T, l.in, e4, sxr);
             ops.fp8_quantize_rows(x, sxr, qx, T, l.in, e4);
             ops.gemm_fp8_rows(qx, e4, sxr, qw, e4, swr, y, T, l.in, l.out, false);
           },
           R),
       fl, 0);
  line(e, "  transpose_bytes W (stored W^T codes)", shape,
       time_op(
           e, [&](int) { ops.transpose_bytes(qw, qwt, l.out, l.in); }, R),
       0, 2.0 * double(l.out) * double(l.in));
}

void gemm_rows(Env& e, int R) {
  Ops& ops = *e.ops;
  const DType bf = DType::bf16;
  const int64_t T = 8192;
  const Fp8Format e4 = Fp8Format::e4m3;
  std::printf("-- FP8 e4m3 GEMM vs bf16 (T = 8192 tokens; y[T,N] = x[T,K] W[N,K]^T) --\n");
  for (const Linear& l : kLinears) {
    void* x = rand_buffer(e, T * l.in, bf, 1.f, 10);
    void* w = rand_buffer(e, l.out * l.in, bf, 0.02f, 11);
    void* y = buffer(e, T * l.out, bf);
    auto* qx = static_cast<uint8_t*>(buffer(e, (T * l.in + 3) / 4, DType::i32));
    auto* qw = static_cast<uint8_t*>(buffer(e, (l.out * l.in + 3) / 4, DType::i32));
    float* sx = scalar(e, 0.f);
    float* sw = scalar(e, 0.f);
    Stream& cs = e.dev->stream(StreamKind::compute);
    cs.launch([&] {
      ops.fp8_scale(x, T * l.in, e4, sx);
      ops.fp8_scale(w, l.out * l.in, e4, sw);
      ops.fp8_quantize(x, sx, qx, T * l.in, e4);
      ops.fp8_quantize(w, sw, qw, l.out * l.in, e4);
    });
    cs.synchronize();
    const double fl = 2.0 * double(T) * double(l.out) * double(l.in);
    const std::string shape =
        std::string(l.model) + " K=" + std::to_string(l.in) + " N=" + std::to_string(l.out);
    std::printf("%s (%s)\n", l.model, l.name);
    line(e, "  linear_fwd bf16", shape,
         time_op(
             e, [&](int) { ops.linear_fwd(x, w, y, T, l.in, l.out); }, R),
         fl, 0);
    for (bool fast : {false, true}) {
      set_fast_accum(ops, fast);
      line(e, fast ? "  gemm_fp8 e4m3 (fast accum)" : "  gemm_fp8 e4m3", shape,
           time_op(
               e, [&](int) { ops.gemm_fp8(qx, e4, sx, qw, e4, sw, y, T, l.in, l.out, false); }, R),
           fl, 0);
    }
    set_fast_accum(ops, false);
    line(e, "  fp8 linear fwd (scale+quant+gemm)", shape,
         time_op(
             e,
             [&](int) {
               ops.fp8_scale(x, T * l.in, e4, sx);
               ops.fp8_quantize(x, sx, qx, T * l.in, e4);
               ops.gemm_fp8(qx, e4, sx, qw, e4, sw, y, T, l.in, l.out, false);
             },
             R),
         fl, 0);
    stored_weight_rows(e, l, x, y, qx, qw, R);
    e.keep.clear();
  }
}

void quantize_rows(Env& e, int R) {
  Ops& ops = *e.ops;
  const DType bf = DType::bf16;
  const Fp8Format e4 = Fp8Format::e4m3;
  constexpr int kSets = 4;
  std::printf("\n-- FP8 quantization kernels (bf16 in, e4m3 out) --\n");
  for (int64_t cols : {int64_t(2048), int64_t(4096), int64_t(14336)}) {
    const int64_t rows = 8192, n = rows * cols;
    std::vector<void*> x(kSets);
    std::vector<uint8_t*> q(kSets);
    std::vector<float*> rs(kSets);
    for (int s = 0; s < kSets; ++s) {
      x[size_t(s)] = rand_buffer(e, n, bf, 1.f, 30 + uint64_t(s));
      q[size_t(s)] = static_cast<uint8_t*>(buffer(e, (n + 3) / 4, DType::i32));
      rs[size_t(s)] = static_cast<float*>(buffer(e, rows, DType::f32));
    }
    float* s0 = scalar(e, 1.f);
    auto S = [](int r) { return size_t(r % kSets); };
    const std::string shape = "[8192, " + std::to_string(cols) + "]";
    const double in = double(n) * 2, out = double(n);
    line(e, "fp8_scale (amax, per tensor)", shape,
         time_op(
             e, [&](int r) { ops.fp8_scale(x[S(r)], n, e4, s0); }, R),
         0, in);
    line(e, "fp8_scale_rows", shape,
         time_op(
             e, [&](int r) { ops.fp8_scale_rows(x[S(r)], rows, cols, e4, rs[S(r)]); }, R),
         0, in + rows * 4.0);
    line(e, "fp8_quantize", shape,
         time_op(
             e, [&](int r) { ops.fp8_quantize(x[S(r)], s0, q[S(r)], n, e4); }, R),
         0, in + out);
    line(e, "fp8_quantize_rows", shape,
         time_op(
             e, [&](int r) { ops.fp8_quantize_rows(x[S(r)], rs[S(r)], q[S(r)], rows, cols, e4); }, R),
         0, in + out);
    line(e, "fp8_scale + fp8_quantize", shape,
         time_op(
             e,
             [&](int r) {
               ops.fp8_scale(x[S(r)], n, e4, s0);
               ops.fp8_quantize(x[S(r)], s0, q[S(r)], n, e4);
             },
             R),
         0, 2 * in + out);
    line(e, "fp8_scale_rows + fp8_quantize_rows", shape,
         time_op(
             e,
             [&](int r) {
               ops.fp8_scale_rows(x[S(r)], rows, cols, e4, rs[S(r)]);
               ops.fp8_quantize_rows(x[S(r)], rs[S(r)], q[S(r)], rows, cols, e4);
             },
             R),
         0, 2 * in + out);
    // the one pass a stored-fp8 linear's forward makes (no column scales; fp8_linear_fwd)
    line(e, "fp8_quantize_rows_col_scaled (none)", shape,
         time_op(
             e,
             [&](int r) {
               ops.fp8_quantize_rows_col_scaled(x[S(r)], nullptr, q[S(r)], rs[S(r)], rows, cols, e4);
             },
             R),
         0, in + out);
    // with column scales (a stored-fp8 linear's dy diag(s_w) in its input gradient), and the
    // same on rows 8 bytes off the 16-byte grid (the scalar kernel every backend can fall to)
    float* cs = static_cast<float*>(rand_buffer(e, cols, DType::f32, 1.f, 40));
    line(e, "fp8_quantize_rows_col_scaled (cols)", shape,
         time_op(
             e,
             [&](int r) { ops.fp8_quantize_rows_col_scaled(x[S(r)], cs, q[S(r)], rs[S(r)], rows, cols, e4); },
             R),
         0, in + out);
    void* xo = rand_buffer(e, n + 8, bf, 1.f, 41);
    line(e, "fp8_quantize_rows_col_scaled (cols, x 8 bytes off)", shape,
         time_op(
             e,
             [&](int r) {
               ops.fp8_quantize_rows_col_scaled(static_cast<char*>(xo) + 8, cs, q[S(r)], rs[S(r)], rows, cols,
                                                e4);
             },
             R),
         0, in + out);
    e.keep.clear();
  }
  // a weight's transposed codes (the input gradient's operand), once per upload
  for (const Linear& l :
       {kLinears[2], kLinears[11]}) {  // W [out, in] of the gate_proj of Qwen3-1.7B, LLaMA-3.1-8B
    const int64_t rows = l.out, cols = l.in, n = rows * cols;
    void* w = rand_buffer(e, n, bf, 0.02f, 40);
    auto* q = static_cast<uint8_t*>(buffer(e, (n + 3) / 4, DType::i32));
    float* s0 = scalar(e, 1.f);
    const std::string shape = "W [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
    line(e, "fp8_quantize_transposed", shape,
         time_op(
             e, [&](int) { ops.fp8_quantize_transposed(w, s0, q, rows, cols, e4); }, R),
         0, 3.0 * double(n));
    e.keep.clear();
  }
}

// The 8192^3 e4m3 GEMM back to back for `seconds` (as bench_ops --sustained for
// bf16): the rate a GPU at its power limit holds.
void sustained(Env& e, double seconds) {
  Ops& ops = *e.ops;
  const int64_t N = 8192;
  const Fp8Format e4 = Fp8Format::e4m3;
  auto* a = static_cast<uint8_t*>(buffer(e, N * N / 4, DType::i32));
  auto* b = static_cast<uint8_t*>(buffer(e, N * N / 4, DType::i32));
  void* x = rand_buffer(e, N * N, DType::bf16, 1.f, 2);
  void* y = buffer(e, N * N, DType::bf16);
  float* s = scalar(e, 0.f);
  Stream& cs = e.dev->stream(StreamKind::compute);
  cs.launch([&] {
    ops.fp8_scale(x, N * N, e4, s);
    ops.fp8_quantize(x, s, a, N * N, e4);
    ops.fp8_quantize(x, s, b, N * N, e4);
  });
  cs.synchronize();
  const double fl = 2.0 * double(N) * N * N;
  std::printf("\n-- sustained e4m3 GEMM 8192^3, %.0f s --\n", seconds);
  const double tf = sustained_tflops(e, seconds, fl, [&] {
    for (int r = 0; r < 20; ++r) ops.gemm_fp8(a, e4, s, b, e4, s, y, N, N, N, false);
  });
  std::printf("sustained e4m3 (median of the second half): %.1f TFLOP/s\n", tf);
  e.keep.clear();
}

int run(int argc, char** argv) {
  Env e;
  double sustained_s = 0;
  CLI::App app{"FP8 GEMM and quantization benchmark (CUDA)"};
  app.add_flag("--quick", e.quick, "fewer repetitions");
  app.add_option("--sustained", sustained_s, "time one e4m3 GEMM back to back for this many seconds instead")
      ->check(CLI::Range(0.0, 3600.0));
  if (const auto code = ::bench::parse_options(app, argc, argv, "bench_fp8_ops_bench")) return *code;
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device visible: nothing to measure\n");
    return 0;
  }
  DeviceOptions o;
  o.capacity_bytes = size_t(120) << 30;
  e.dev = make_cuda_device(0, o);
  e.ops = &e.dev->ops();
  std::printf("device: %s\n", e.dev->name().c_str());
  measure_ceilings(e);
  if (sustained_s > 0) {
    sustained(e, sustained_s);
    return 0;
  }
  const int R = e.quick ? 3 : 10;
  gemm_rows(e, R);
  quantize_rows(e, 2 * R);
  std::printf("\npeak pool bytes: %.2f GiB\n", double(e.dev->peak_bytes()) / double(1 << 30));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ::bench::guarded_main("bench_fp8_ops_bench", [&] { return run(argc, argv); });
}
