// cuBLASLt's FP8 GEMM algorithms at the decoder linears' shapes: every algorithm its heuristic
// offers (up to --algos) timed against the first one, which is what the runtime runs
// (CudaOps::plan_for asks the heuristic for one answer and keeps it for the shape). A shape
// where another algorithm is clearly faster is a case for choosing per shape by timing.
//
//   bench_fp8_algos [--algos N] [--row-scales | --block-scales] [--quick] [--reps R] [--out FILE [--force]]
//
// Passes, in the runtime's operand layout (Ops::gemm_fp8: d[M, N] = sa sb A[M, K] B[N, K]^T,
// issued to cuBLASLt as the column-major TN product m = N, n = M, k = K):
//   forward         y[T, out] = x[T, in] W[out, in]^T          bf16 output
//   input gradient  dx[T, in] = dy[T, out] (W^T)[in, out]^T    bf16 output
//   weight gradient dW[out, in] += (dy^T)[out, T] (x^T)[in, T]^T  fp32 output, accumulated
// All operands e4m3 (the runtime's default for activations, weights and gradients), one fp32
// scale per tensor, or with --row-scales one per row of each operand (outer-vector scales, the
// stored-codes path; forward and input gradient only, as there), or with --block-scales one per
// 1 x 128 block of the activations and gradients and one per 128 x 128 block of the weights (the
// recipe of DeepSeek-V3, arXiv 2412.19437 section 3.3.2: a producer could write such codes in its
// own epilogue, the block's amax being local; the weight gradient's operands, both 1 x 128 along
// the tokens). T is the tokens of one
// micro-batch: 8192 for Qwen3-1.7B and -4B, 4096 for LLaMA-3.1-8B (the LoRA row's sequences).
//
// Timing: per algorithm, 3 warm-up calls, then the median of 5 trials of R calls issued back to
// back (CUDA events); the algorithms of one shape run interleaved trial by trial so that clock
// and power drift reach all of them alike. FLOPs 2 T in out. An algorithm the launch refuses is
// listed as refused; the output of each algorithm is compared with the first one's (bf16
// outputs: max |difference| over the first 4096 values, relative to max |first|), so a faster
// algorithm that computes something else is marked WRONG and the exit status is 1.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_main.hpp"
#include "bench/decoder_linears.hpp"
#include "bench/report_file.hpp"
#ifdef RP_HAVE_CUDA
#include "bench/expert_gemm_blas.hpp"
#include "bench/fp8_device.hpp"
#endif

namespace {

struct Options {
  int algos = 16, reps = 20;
  bool row_scales = false, block_scales = false, quick = false, force = false;
  std::string out;
};

using Linear = rp::bench::DecoderLinear;
constexpr const auto& kLinears = rp::bench::kDecoderLinears;

enum class Pass { forward, input_grad, weight_grad };
const char* pass_name(Pass p) {
  return p == Pass::forward ? "forward" : p == Pass::input_grad ? "input gradient" : "weight gradient";
}

// The runtime's (M, K, N) of gemm_fp8 for a pass of a linear.
struct Mkn {
  int64_t M, K, N;
};
Mkn mkn(const Linear& l, Pass p) {
  switch (p) {
    case Pass::forward: return {l.tokens, l.in, l.out};
    case Pass::input_grad: return {l.tokens, l.out, l.in};
    default: return {l.out, l.tokens, l.in};
  }
}

#ifdef RP_HAVE_CUDA
using rp::bench::check;
using rp::bench::DevMem;

constexpr size_t kWorkspace = size_t(32) << 20;  // the runtime's cuBLASLt workspace

// One FP8 TN matmul description and its layouts, as CudaOps::plan_for builds them.
struct Fp8Gemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  // scales: 0 one per tensor, 1 one per row (outer vectors), 2 blocks (see the file's head).
  Fp8Gemm(cublasLtHandle_t h, const Mkn& s, bool f32_out, int scales, bool weight_grad, const float* sa,
          const float* sb, int max_algos) {
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "transa");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n), "transb");
    const int8_t fast = 0;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast), "fast");
    if (scales > 0) {
      // cuBLASLt's A is the weight (forward), W^T (input gradient) or x^T (weight gradient)
      const int32_t mode_a = scales == 1   ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                             : weight_grad ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                           : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                    mode_b = scales == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                         : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a),
            "mode a");
      check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b),
            "mode b");
    }
    // cuBLASLt's A is the runtime's B (N x K) and its B the runtime's A (M x K)
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb, sizeof sb),
          "scale a");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa),
          "scale b");
    const auto u = [](int64_t v) { return uint64_t(v); };
    check(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, u(s.K), u(s.N), s.K), "layout a");
    check(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, u(s.K), u(s.M), s.K), "layout b");
    check(cublasLtMatrixLayoutCreate(&c, f32_out ? CUDA_R_32F : CUDA_R_16BF, u(s.N), u(s.M), s.N),
          "layout c");
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = kWorkspace;
    check(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
        "workspace");
    const uint32_t al = 16;  // the runtime's alignment for FP8 operands
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al), "alignment");
    algos.resize(size_t(std::max(1, max_algos)));
    int found = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, int(algos.size()), algos.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED) check(hs, "heuristic");
    algos.resize(hs == CUBLAS_STATUS_SUCCESS ? size_t(found) : 0);
  }
  ~Fp8Gemm() {
    cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
  }
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;
  cublasStatus_t run(cublasLtHandle_t h, size_t i, const void* A, const void* B, void* D, bool accumulate,
                     void* ws, cudaStream_t st) const {
    const float one = 1.f, beta = accumulate ? 1.f : 0.f;
    return cublasLtMatmul(h, op, &one, B, a, A, b, &beta, D, c, D, c, &algos[i].algo, ws, kWorkspace, st);
  }
};

// Codes of small random values (e4m3 of +-[1/16, 2)), so no product overflows bf16.
void fill_codes(void* p, size_t n, uint32_t seed, cudaStream_t st) {
  std::vector<uint8_t> h(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : h) {
    x = x * 1664525u + 1013904223u;
    v = uint8_t(((x >> 24) & 0x80) | (0x18 + ((x >> 16) % 32)));  // exponents 3..6, any mantissa
  }
  check(cudaMemcpyAsync(p, h.data(), n, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync codes");
  check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
}

float bf16_value(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Timed {
  double seconds = 0;  // median per call; 0: refused
  double diff = 0;     // relative to the first algorithm's output
  std::string name;    // "algo <id> tile <t> stages <s> splitK <k>"
};

std::string algo_name(const cublasLtMatmulAlgo_t& a) {
  int id = 0, tile = 0, stages = 0, splitk = 0, cluster = 0;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster,
                                       &w);
  std::ostringstream s;
  s << "id " << id << " tile " << tile << " stages " << stages << " split-k " << splitk << " cluster "
    << cluster;
  return s.str();
}

// Times every algorithm of one pass of one linear; appends its rows to `md`. False when an
// algorithm's output differs from the first's.
bool time_pass(cublasLtHandle_t h, cudaStream_t st, void* ws, const Linear& l, Pass pass, const Options& o,
               std::ostringstream& md) {
  const Mkn s = mkn(l, pass);
  const bool f32 = pass == Pass::weight_grad, rows = o.row_scales;
  const int mode = o.block_scales ? 2 : rows ? 1 : 0;
  // room for a scale per row and per 128 columns of both operands, rows padded (all 0.5)
  const size_t per_operand = size_t(std::max(s.M, s.N) + 128) * size_t(s.K / 128 + 4);
  DevMem A(size_t(s.M * s.K)), B(size_t(s.N * s.K)), D(size_t(s.M * s.N) * (f32 ? 4 : 2)),
      scales(per_operand * 8 + 64);
  fill_codes(A.p, size_t(s.M * s.K), 1, st);
  fill_codes(B.p, size_t(s.N * s.K), 2, st);
  std::vector<float> sc(per_operand * 2, 0.5f);
  auto* sa = static_cast<float*>(scales.p);
  // per-tensor scales 16 bytes apart, as cuBLASLt needs
  float* sb = sa + (mode == 2 ? std::ptrdiff_t(per_operand) : rows ? s.M : 4);
  check(cudaMemcpy(sa, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy scales");
  Fp8Gemm g(h, s, f32, mode, pass == Pass::weight_grad, sa, sb, o.algos);
  char head[256];
  std::snprintf(head, sizeof head, "| %s | %s | %s | %lld x %lld x %lld |", l.model, l.name, pass_name(pass),
                (long long)s.M, (long long)s.K, (long long)s.N);
  if (g.algos.empty()) {
    md << head << " none offered | | | |\n";
    std::printf("%s none offered\n", head);
    return true;
  }
  std::vector<Timed> t(g.algos.size());
  std::vector<std::vector<double>> trials(g.algos.size());
  std::vector<uint16_t> first, mine;
  const size_t probe = std::min<size_t>(4096, size_t(s.M * s.N));
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  for (size_t i = 0; i < g.algos.size(); ++i) {  // warm-up, refusals and outputs
    t[i].name = algo_name(g.algos[i].algo);
    bool ok = true;
    for (int w = 0; w < 3 && ok; ++w) ok = g.run(h, i, A.p, B.p, D.p, false, ws, st) == CUBLAS_STATUS_SUCCESS;
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    if (!ok) {
      t[i].seconds = 0;
      continue;
    }
    t[i].seconds = -1;
    if (f32) continue;  // accumulated outputs grow per call: compared on bf16 passes only
    mine.resize(probe);
    check(cudaMemcpy(mine.data(), D.p, probe * 2, cudaMemcpyDeviceToHost), "cudaMemcpy output");
    if (first.empty()) first = mine;
    double m = 0, d = 0;
    for (size_t k = 0; k < probe; ++k) {
      m = std::max(m, double(std::fabs(bf16_value(first[k]))));
      d = std::max(d, double(std::fabs(bf16_value(first[k]) - bf16_value(mine[k]))));
    }
    t[i].diff = m > 0 ? d / m : d;
  }
  for (int trial = 0; trial < 5; ++trial)
    for (size_t i = 0; i < g.algos.size(); ++i) {
      if (t[i].seconds == 0) continue;
      check(cudaEventRecord(e0, st), "cudaEventRecord");
      for (int r = 0; r < o.reps; ++r) g.run(h, i, A.p, B.p, D.p, f32, ws, st);
      check(cudaEventRecord(e1, st), "cudaEventRecord");
      check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      trials[i].push_back(ms * 1e-3 / o.reps);
    }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  bool good = true;
  const double flops = 2.0 * double(s.M) * double(s.K) * double(s.N);
  double t0 = 0;
  size_t best = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i].seconds == 0) continue;
    std::sort(trials[i].begin(), trials[i].end());
    t[i].seconds = trials[i][trials[i].size() / 2];
    if (i == 0) t0 = t[i].seconds;
    if (t[best].seconds == 0 || t[i].seconds < t[best].seconds) best = i;
  }
  for (size_t i = 0; i < t.size(); ++i) {
    const bool wrong = t[i].diff > 0.02;  // a different summation order moves bf16 outputs by ~1 ulp
    good = good && !wrong;
    char row[512];
    if (t[i].seconds == 0)
      std::snprintf(row, sizeof row, "%s %zu | %s | refused | | |", head, i, t[i].name.c_str());
    else
      std::snprintf(
          row, sizeof row, "%s %zu | %s | %.1f us, %.0f TFLOP/s | %s | %s%s |", head, i, t[i].name.c_str(),
          t[i].seconds * 1e6, flops / t[i].seconds * 1e-12,
          t0 > 0 ? (std::to_string(int(std::lround((t0 / t[i].seconds - 1) * 1000))) + " per mille").c_str()
                 : "-",
          i == best ? "fastest" : "", wrong ? " WRONG" : "");
    md << row << "\n";
    std::printf("%s\n", row);
  }
  return good;
}

int run_all(const Options& o, std::string& table, std::string& device) {
  const std::optional<cudaDeviceProp> found = bench::fp8_device();
  if (!found) return 0;
  const cudaDeviceProp& prop = *found;
  device = prop.name;
  std::printf("device: %s\n", prop.name);
  cublasLtHandle_t h = nullptr;
  check(cublasLtCreate(&h), "cublasLtCreate");
  cudaStream_t st = nullptr;
  check(cudaStreamCreate(&st), "cudaStreamCreate");
  DevMem ws(kWorkspace);
  std::ostringstream md;
  md << "| model | linear | pass | M x K x N | # | algorithm | time, rate | vs the heuristic's first | |\n"
        "|---|---|---|---|---|---|---|---|---|\n";
  bool good = true;
  for (const Linear& l : kLinears) {
    if (o.quick && std::strcmp(l.name, "gate_proj / up_proj") != 0) continue;
    for (Pass p : {Pass::forward, Pass::input_grad, Pass::weight_grad}) {
      if (p == Pass::weight_grad && (o.row_scales || std::strcmp(l.model, "LLaMA-3.1-8B") == 0)) continue;
      good = time_pass(h, st, ws.p, l, p, o, md) && good;
    }
  }
  cudaStreamDestroy(st);
  cublasLtDestroy(h);
  table = md.str();
  return good ? 0 : 1;
}
#else
int run_all(const Options&, std::string&, std::string&) {
  std::printf("built without CUDA: nothing to measure\n");
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "cuBLASLt's FP8 GEMM algorithms at the decoder linears' shapes, each against the heuristic's first"};
  app.add_option("--algos", o.algos, "algorithms asked of the heuristic per shape")->check(CLI::Range(1, 64));
  app.add_option("--reps", o.reps, "calls per timed trial")->check(CLI::Range(1, 10000));
  auto* rows_flag =
      app.add_flag("--row-scales", o.row_scales, "one scale per row of each operand (outer-vector scales)");
  app.add_flag("--block-scales", o.block_scales,
               "one scale per 1 x 128 block of activations and gradients, per 128 x 128 block of weights")
      ->excludes(rows_flag);
  app.add_flag("--quick", o.quick, "gate_proj / up_proj only");
  app.add_option("--out", o.out, "also write a Markdown report (command, commit, machine) to FILE");
  app.add_flag("--force", o.force, "replace an existing --out file");
  if (auto rc = bench::parse_options(app, argc, argv, "bench_fp8_algos")) return *rc;
  return bench::guarded_main("bench_fp8_algos", [&] {
    if (bench::out_is_taken("bench_fp8_algos", o.out, o.force)) return 2;
    std::string table, device;
    const int rc = run_all(o, table, device);
    bench::write_report(o.out, "bench_fp8_algos", bench::command_line(argc, argv), device, table);
    if (rc != 0) std::fprintf(stderr, "bench_fp8_algos: an algorithm's output differs from the first's\n");
    return rc;
  });
}
