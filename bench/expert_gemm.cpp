// The MoE experts' GEMMs three ways, at Qwen3-30B-A3B's shapes (128 experts, top-8 of 4,096 tokens
// per micro-batch, hidden 2,048, expert FFN 768), to see what a different grouped GEMM would buy:
//   grouped   Ops::grouped_linear_fwd as the runtime runs it (cuBLAS's grouped call over the
//             experts with rows; ragged: each expert's rows [off[e], off[e+1]))
//   padded    one cuBLASLt strided-batched matmul over all experts with every expert's rows
//             padded to the largest count (rounded up to 16): a layout whose expert segments
//             all have one length, so the batch is uniform (the padding rows are wasted work)
//   dense     one GEMM of all R = T*k rows against one expert's weight: the rate of a dense GEMM
//             of the same useful FLOPs (an upper reference, not a correct expert product)
// Routings: uniform (each token's k experts drawn without replacement, equally likely) and
// skewed (expert e drawn with weight 1/(e+8)), seeded. Useful FLOPs 2*R*K*N; median of 10 calls.
//
//   bench_expert_gemm [--out FILE]   (FILE: the report with command, commit and machine)
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/ops_timing.hpp"
#include "roundpipe_version.hpp"
#ifdef RP_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#endif

using namespace rp;
using namespace rp::bench;

namespace {

constexpr int64_t kT = 4096, kK = 8, kE = 128, kH = 2048, kF = 768;

// Host offsets [E+1] of a routing of kT tokens to kK distinct experts each.
std::vector<int32_t> routing(bool skewed, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> w(size_t(kE), 1.0);
  if (skewed)
    for (int64_t e = 0; e < kE; ++e) w[size_t(e)] = 1.0 / double(e + 8);
  std::vector<int32_t> count(size_t(kE), 0);
  for (int64_t t = 0; t < kT; ++t) {
    std::vector<double> left = w;
    for (int64_t j = 0; j < kK; ++j) {
      std::discrete_distribution<int> pick(left.begin(), left.end());
      const int e = pick(rng);
      count[size_t(e)]++;
      left[size_t(e)] = 0.0;
    }
  }
  std::vector<int32_t> off(size_t(kE + 1), 0);
  for (int64_t e = 0; e < kE; ++e) off[size_t(e + 1)] = off[size_t(e)] + count[size_t(e)];
  return off;
}

#ifdef RP_HAVE_CUDA
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}

// Median seconds of 10 calls of `fn` on `st`, after 3 warm-up calls.
template <class Fn>
double time_stream(cudaStream_t st, Fn fn) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < 10; ++i) {
    check(cudaEventRecord(a, st), "record");
    fn();
    check(cudaEventRecord(b, st), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One cuBLASLt bf16 matmul (fp32 accumulate), row-major y[batch][n, N] = x[batch][n, K] W[batch]^T
// with W [N, K]: column-major y^T = W x^T, m = N, n = rows, k = K.
struct LtGemm {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulHeuristicResult_t algo{};
  void* ws = nullptr;
  size_t ws_bytes = size_t(32) << 20;
  LtGemm(int64_t K, int64_t N, int64_t rows, int batch, int64_t w_stride) {
    check(cublasLtCreate(&h), "cublasLtCreate");
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "transa");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n), "transb");
    check(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, uint64_t(K), uint64_t(N), K), "layout a");
    check(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, uint64_t(K), uint64_t(rows), K), "layout b");
    check(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, uint64_t(N), uint64_t(rows), N), "layout c");
    const int64_t sb = rows * K, sc = rows * N;
    for (auto [l, s] : {std::pair{a, w_stride}, std::pair{b, sb}, std::pair{c, sc}}) {
      check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch),
            "count");
      check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s),
            "stride");
    }
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "pref");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                               sizeof ws_bytes),
          "pref ws");
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 1, &algo, &found), "heuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) throw std::runtime_error("cuBLASLt found no algorithm");
    check(cudaMalloc(&ws, ws_bytes), "cudaMalloc workspace");
  }
  ~LtGemm() {
    cudaFree(ws);
    cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
  }
  void run(const void* w, const void* x, void* y, cudaStream_t st) {
    const float one = 1.f, zero = 0.f;
    check(cublasLtMatmul(h, op, &one, w, a, x, b, &zero, y, c, y, c, &algo.algo, ws, ws_bytes, st), "matmul");
  }
};

// One routing at one (K, N): the three ways' rates as a Markdown row.
std::string measure(Env& env, const char* what, const std::vector<int32_t>& off, int64_t K, int64_t N) {
  const int64_t R = off[size_t(kE)];
  int32_t most = 0;
  for (int64_t e = 0; e < kE; ++e) most = std::max(most, off[size_t(e + 1)] - off[size_t(e)]);
  const int64_t P = (int64_t(most) + 15) / 16 * 16;
  void* w = rand_buffer(env, kE * N * K, DType::bf16, 0.02f, 1);
  void* x = rand_buffer(env, kE * P * K, DType::bf16, 1.f, 2);  // big enough for R rows and E*P
  void* y = buffer(env, kE * P * N, DType::bf16);
  const double grouped = time_op(
      env, [&](int) { env.ops->grouped_linear_fwd(x, w, y, off.data(), kE, K, N); }, 10);
  cudaStream_t st = nullptr;
  check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  double padded = 0, dense = 0;
  {
    LtGemm g(K, N, P, int(kE), N * K);
    padded = time_stream(st, [&] { g.run(w, x, y, st); });
  }
  {
    LtGemm g(K, N, R, 1, 0);
    dense = time_stream(st, [&] { g.run(w, x, y, st); });
  }
  cudaStreamDestroy(st);
  const double flops = 2.0 * double(R) * double(K) * double(N);
  char line[512];
  std::snprintf(line, sizeof line,
                "| %s | %lld x %lld | %d | %.1f%% | %.0f (%.0f us) | %.0f (%.0f us) | %.0f (%.0f us) |", what,
                (long long)K, (long long)N, int(most), 100.0 * double(kE * P - R) / double(R),
                flops / grouped * 1e-12, grouped * 1e6, flops / padded * 1e-12, padded * 1e6,
                flops / dense * 1e-12, dense * 1e6);
  return line;
}
#endif

std::string run_all(Env& env) {
  std::string md =
      "| routing | K x N | most rows of an expert | padding | grouped TFLOP/s | padded batched | dense |\n"
      "|---|---|---|---|---|---|---|\n";
#ifdef RP_HAVE_CUDA
  for (bool skewed : {false, true}) {
    const std::vector<int32_t> off = routing(skewed, 7);
    for (auto [K, N] : {std::pair{kH, kF}, std::pair{kF, kH}}) {
      const std::string row = measure(env, skewed ? "skewed" : "uniform", off, K, N);
      std::printf("%s\n", row.c_str());
      std::fflush(stdout);
      md += row + "\n";
    }
  }
#else
  (void)env;
#endif
  return md;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string out, command = argv[0];
    for (int i = 1; i < argc; ++i) {
      command += std::string(" ") + argv[i];
      if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
        out = argv[++i];
        command += std::string(" ") + out;
      } else {
        std::fprintf(stderr, "bench_expert_gemm: unknown argument '%s' (expected --out FILE)\n", argv[i]);
        return 2;
      }
    }
    if (cuda_device_count() == 0) {
      std::printf("no CUDA device visible: nothing to measure\n");
      return 0;
    }
    Env env;
    DeviceOptions o;
    o.capacity_bytes = size_t(40) << 30;
    env.dev = make_cuda_device(0, o);
    env.ops = &env.dev->ops();
    std::printf("device: %s\n", env.dev->name().c_str());
    const std::string table = run_all(env);
    if (!out.empty()) {
      const std::time_t now = std::time(nullptr);
      char date[64];
      std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
      std::ostringstream md;
      md << "# bench_expert_gemm\n\n- command: `" << command << "`\n- commit: " << kGitCommit
         << "\n- machine: " << env.dev->name() << "\n- date: " << date << "\n\n"
         << table;
      std::ofstream f(out);
      f << md.str();
      if (!f) {
        std::fprintf(stderr, "bench_expert_gemm: cannot write %s\n", out.c_str());
        return 1;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_expert_gemm: %s\n", e.what());
    return 1;
  }
}
