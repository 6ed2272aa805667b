// The MoE experts' GEMMs several ways, at Qwen3-30B-A3B's shapes (128 experts, top-8 of 4,096
// tokens per micro-batch, hidden 2,048, expert FFN 768), to see what a different grouped GEMM or
// expert layout would buy. Each pass: forward y = x W_e^T and (unless --fwd-only) the input
// gradient dx = dy W_e, both with W_e [N, K]:
//   grouped   Ops::grouped_linear_fwd / _bwd_input as the runtime runs them (cuBLAS's grouped
//             call over the experts with rows; ragged: each expert's rows [off[e], off[e+1]));
//             its output is the reference every other variant (but dense) is checked against
//   grouped, direct  the same cublasGemmGroupedBatchedEx call issued here, its pointer arrays
//             copied host to device in the timed region (event-timed like the variants below)
//   padded    one cuBLASLt strided-batched matmul over all experts with every expert's rows
//             padded to the largest count (rounded up to 16), pad rows zero
//   dense     one GEMM of all R rows against one expert's weight: the rate of a dense GEMM of
//             the same useful FLOPs (an upper reference, not a correct expert product)
//   bucketed  experts sorted by row count and cut into buckets whose padding (sum of m - count,
//             m the bucket's largest count) is at most --max-pad (0.06) of the bucket's rows;
//             a layout where expert e's segment (expert order) is as long as its bucket's m, pad
//             rows zero; one pointer-array batch per bucket, as cuBLASLt matmuls
//             (CUBLASLT_BATCH_MODE_POINTER_ARRAY) and as cublasGemmBatchedEx calls; the one H2D
//             copy of all pointer arrays is in the time, the cuBLASLt descriptors and heuristic
//             queries (host) are reported apart
//   split     the ragged layout: one pointer-array batch over every expert's first m_common rows
//             (m_common the fewest rows of an expert with rows; cuBLASLt, or cublasGemmBatchedEx
//             where cuBLASLt has no algorithm), then the remaining rows through one
//             cublasGemmGroupedBatchedEx call; the parts timed alone and together
// Routings: uniform (each token's k experts drawn without replacement, equally likely) and
// skewed (expert e drawn with weight 1/(e+8)), seeded. Useful FLOPs 2*R*K*N (R real rows);
// median of 10 calls. A variant whose output differs from the grouped reference (every third
// row and each expert's last) by more than 0.02 + 0.02 |ref| makes the exit status 1.
//
//   bench_expert_gemm [--out FILE] [--max-pad F] [--fwd-only]   (FILE: the report with command,
//                     commit and machine)
//   bench_expert_gemm --plan [--max-pad F]   (the buckets of both routings; needs no GPU)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/expert_gemm_plan.hpp"
#include "bench/ops_timing.hpp"
#include "roundpipe_version.hpp"
#ifdef RP_HAVE_CUDA
#include "bench/expert_gemm_blas.hpp"
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

// The buckets of one routing, one line each (m x experts), with the padding and m_common; false
// (after a one-line message) where check_buckets finds them wrong.
bool print_plan(const char* what, const std::vector<int32_t>& off, double max_pad) {
  const std::vector<Bucket> bs = bucket_experts(off, max_pad);
  const std::string bad = check_buckets(off, bs, max_pad);
  if (!bad.empty()) {
    std::fprintf(stderr, "bench_expert_gemm: %s buckets: %s\n", what, bad.c_str());
    return false;
  }
  int64_t total = 0;
  padded_rows(off, bs, total);
  std::printf("%s: %zu buckets, %lld padded rows for %d (padding %.1f%%), m_common %d\n", what, bs.size(),
              (long long)total, off.back(), 100.0 * double(total - off.back()) / double(off.back()),
              common_rows(off));
  for (const Bucket& b : bs) std::printf("  m %d x %zu experts\n", b.m, b.experts.size());
  return true;
}

std::string cell(double flops, double sec) {
  if (sec <= 0) return "n/a";
  char s[64];
  std::snprintf(s, sizeof s, "%.0f (%.0f us)", flops / sec * 1e-12, sec * 1e6);
  return s;
}

#ifdef RP_HAVE_CUDA
constexpr size_t kWsBytes = size_t(32) << 20;

// The stream, handles and workspace the variants share (the workspace serves cuBLASLt and
// cuBLAS alike: one stream).
struct Blas {
  cudaStream_t st = nullptr;
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t h = nullptr;
  DevMem ws{kWsBytes};
  Blas() {
    check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cublasLtCreate(&lt), "cublasLtCreate");
    check(cublasCreate(&h), "cublasCreate");
    check(cublasSetStream(h, st), "cublasSetStream");
    check(cublasSetWorkspace(h, ws.p, kWsBytes), "cublasSetWorkspace");
  }
  ~Blas() {
    cublasDestroy(h);
    cublasLtDestroy(lt);
    cudaStreamDestroy(st);
  }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
};

// One routing and pass: the inputs, the reference output and the checks' outcome.
struct Case {
  Env& env;
  Blas& b;
  const std::vector<int32_t>& off;
  Pass p;
  const void* w;  // [E, N, K]
  const void* x;  // ragged input [R, p.in()]
  double max_pad = 0.06;
  int64_t R = 0;
  double flops = 0, worst = 0;
  bool ok = true;
  std::vector<uint16_t> ref;  // the grouped output, ragged
  std::vector<int64_t> ragged() const { return std::vector<int64_t>(off.begin(), off.end() - 1); }
  // Fills `out` (`rows` rows) with NaN, runs `fn` once, compares its rows (expert e's from
  // row0[e]) with the reference.
  template <class Fn>
  void verify(const char* variant, void* out, int64_t rows, const std::vector<int64_t>& row0, Fn fn) {
    check(cudaMemsetAsync(out, 0xff, size_t(rows * p.out()) * 2, b.st), "cudaMemsetAsync");
    fn();
    bool good = true;
    const double d = compare(ref, gather(out, off, row0, p.out()), p.out(), off, good);
    std::printf("  %-34s largest difference from grouped %.3g%s\n", variant, d, good ? "" : "  WRONG");
    worst = std::max(worst, d);
    ok = ok && good;
  }
};

double run_grouped_ops(Case& c) {
  DevMem y(size_t(c.R * c.p.out()) * 2);
  const Pass p = c.p;
  const double t = time_op(
      c.env,
      [&](int) {
        if (p.dx) c.env.ops->grouped_linear_bwd_input(c.x, c.w, y.p, c.off.data(), kE, p.K, p.N, false);
        else c.env.ops->grouped_linear_fwd(c.x, c.w, y.p, c.off.data(), kE, p.K, p.N);
      },
      10);
  c.ref = gather(y.p, c.off, c.ragged(), p.out());
  double most = 0;
  for (uint16_t v : c.ref) most = std::max(most, double(std::fabs(bf16_to_f32(v))));
  if (!(most > 0.1 && std::isfinite(most)))
    throw std::runtime_error("the grouped reference's largest magnitude is " + std::to_string(most) +
                             " (expected a finite value over 0.1: random inputs)");
  return t;
}

// The experts with rows, their counts past `skip` rows (those with more) and first rows.
void experts_past(const std::vector<int32_t>& off, int32_t skip, std::vector<int32_t>& e_out,
                  std::vector<int32_t>& rows, std::vector<int64_t>& row0) {
  for (int32_t e = 0; e < int32_t(kE); ++e) {
    const int32_t n = off[size_t(e + 1)] - off[size_t(e)];
    if (n > skip) e_out.push_back(e), rows.push_back(n - skip), row0.push_back(off[size_t(e)] + skip);
  }
}

double run_grouped_direct(Case& c) {
  DevMem y(size_t(c.R * c.p.out()) * 2);
  PtrTable t(c.p, c.w, c.x, y.p);
  std::vector<int32_t> es, rows;
  std::vector<int64_t> row0;
  experts_past(c.off, 0, es, rows, row0);
  t.add(es, rows, row0);
  t.finish();
  auto fn = [&] {
    t.upload(c.b.st);
    grouped_ex(c.b.h, c.p, t, 0);
  };
  c.verify("grouped, direct", y.p, c.R, c.ragged(), fn);
  return time_stream(c.b.st, fn);
}

double run_padded(Case& c, int64_t P) {
  std::vector<int64_t> row0(static_cast<size_t>(kE));
  for (int64_t e = 0; e < kE; ++e) row0[size_t(e)] = e * P;
  DevMem xl(size_t(kE * P * c.p.in()) * 2), yl(size_t(kE * P * c.p.out()) * 2);
  to_layout(c.x, xl.p, kE * P, c.off, row0, c.p.in());
  LtGemm g(c.b.lt, c.b.ws.p, kWsBytes, c.p, P, int(kE), false, c.p.N * c.p.K);
  if (!g.found) throw std::runtime_error("cuBLASLt found no algorithm for the padded strided batch");
  auto fn = [&] { g.run(c.w, xl.p, yl.p, c.b.st); };
  c.verify("padded batched", yl.p, kE * P, row0, fn);
  return time_stream(c.b.st, fn);
}

double run_dense(Case& c) {
  DevMem y(size_t(c.R * c.p.out()) * 2);
  LtGemm g(c.b.lt, c.b.ws.p, kWsBytes, c.p, c.R, 1, false, 0);
  if (!g.found) throw std::runtime_error("cuBLASLt found no algorithm for the dense GEMM");
  return time_stream(c.b.st, [&] { g.run(c.w, c.x, y.p, c.b.st); });
}

struct BucketResult {
  size_t buckets = 0;
  int64_t rows = 0;
  double lt = -1, ex = -1, host_us = 0;
  std::string lt_note;  // why there is no cuBLASLt time
};

// c.verify for a variant whose cuBLAS calls may be refused (cuBLASLt's pointer-array batches):
// false, with the error in `note`, where a call throws; its output is then not checked.
template <class Fn>
bool try_variant(Case& c, const char* variant, void* out, int64_t rows, const std::vector<int64_t>& row0,
                 Fn fn, std::string& note) {
  try {
    fn();
    check(cudaStreamSynchronize(c.b.st), "cudaStreamSynchronize");
  } catch (const std::runtime_error& e) {
    note = std::string("failed: ") + e.what();
    return false;
  }
  c.verify(variant, out, rows, row0, fn);
  return true;
}

BucketResult run_bucketed(Case& c) {
  const std::vector<Bucket> bs = bucket_experts(c.off, c.max_pad);
  if (const std::string bad = check_buckets(c.off, bs, c.max_pad); !bad.empty())
    throw std::runtime_error("buckets: " + bad);
  BucketResult r;
  r.buckets = bs.size();
  const std::vector<int64_t> row0 = padded_rows(c.off, bs, r.rows);
  DevMem xl(size_t(r.rows * c.p.in()) * 2), yl(size_t(r.rows * c.p.out()) * 2);
  to_layout(c.x, xl.p, r.rows, c.off, row0, c.p.in());
  PtrTable t(c.p, c.w, xl.p, yl.p);
  for (const Bucket& b : bs) {
    std::vector<int64_t> r0;
    for (int32_t e : b.experts) r0.push_back(row0[size_t(e)]);
    t.add(b.experts, std::vector<int32_t>(b.experts.size(), b.m), r0);
  }
  t.finish();
  const auto h0 = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<LtGemm>> g;
  bool found = true;
  for (const Bucket& b : bs) {
    g.push_back(
        std::make_unique<LtGemm>(c.b.lt, c.b.ws.p, kWsBytes, c.p, b.m, int(b.experts.size()), true, 0));
    found = found && g.back()->found;
  }
  r.host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count();
  auto lt = [&] {
    t.upload(c.b.st);
    for (size_t l = 0; l < g.size(); ++l) g[l]->run(t.a(l), t.b(l), t.c(l), c.b.st);
  };
  if (!found) {
    int status = 0;
    for (const auto& x : g) status = x->found ? status : int(x->status);
    r.lt_note = "no algorithm (cuBLASLt status " + std::to_string(status) + ")";
  } else if (try_variant(c, "bucketed, cuBLASLt pointer array", yl.p, r.rows, row0, lt, r.lt_note)) {
    r.lt = time_stream(c.b.st, lt);
  }
  if (!r.lt_note.empty()) std::printf("  bucketed, cuBLASLt pointer array: %s\n", r.lt_note.c_str());
  auto ex = [&] {
    t.upload(c.b.st);
    for (size_t l = 0; l < bs.size(); ++l) batched_ex(c.b.h, c.p, t, l);
  };
  c.verify("bucketed, cublasGemmBatchedEx", yl.p, r.rows, row0, ex);
  r.ex = time_stream(c.b.st, ex);
  return r;
}

struct SplitResult {
  int32_t m = 0;
  int64_t common_rows = 0;
  bool lt = false;
  double common = -1, rest = -1, total = -1;
};

SplitResult run_split(Case& c, bool lt_works) {
  SplitResult r;
  r.m = common_rows(c.off);
  DevMem y(size_t(c.R * c.p.out()) * 2);
  PtrTable t(c.p, c.w, c.x, y.p);
  std::vector<int32_t> es, rows, es2, rows2;
  std::vector<int64_t> row0, row02;
  experts_past(c.off, 0, es, rows, row0);
  r.common_rows = int64_t(es.size()) * r.m;
  t.add(es, std::vector<int32_t>(es.size(), r.m), row0);
  experts_past(c.off, r.m, es2, rows2, row02);
  t.add(es2, rows2, row02);
  t.finish();
  if (r.m == 0 || es.empty()) throw std::runtime_error("split: no expert has rows");
  LtGemm g(c.b.lt, c.b.ws.p, kWsBytes, c.p, r.m, int(es.size()), true, 0);
  r.lt = g.found && lt_works;
  auto common = [&] {
    t.upload(c.b.st);
    if (r.lt) g.run(t.a(0), t.b(0), t.c(0), c.b.st);
    else batched_ex(c.b.h, c.p, t, 0);
  };
  auto rest = [&] { grouped_ex(c.b.h, c.p, t, 1); };
  auto both = [&] {
    common();
    rest();
  };
  c.verify(r.lt ? "split (cuBLASLt + grouped)" : "split (GemmBatchedEx + grouped)", y.p, c.R, c.ragged(),
           both);
  r.common = time_stream(c.b.st, common);
  if (!es2.empty()) r.rest = time_stream(c.b.st, rest);
  r.total = time_stream(c.b.st, both);
  return r;
}

// One routing at one pass: every variant's rate as a Markdown row.
std::string measure(Env& env, Blas& b, const char* what, const std::vector<int32_t>& off, const Pass& p,
                    const void* w, const void* x, double max_pad, bool& ok) {
  Case c{env, b, off, p, w, x, max_pad};
  c.R = off[size_t(kE)];
  c.flops = 2.0 * double(c.R) * double(p.K) * double(p.N);
  int32_t most = 0;
  for (int64_t e = 0; e < kE; ++e) most = std::max(most, off[size_t(e + 1)] - off[size_t(e)]);
  const int64_t P = (int64_t(most) + 15) / 16 * 16;
  std::printf("%s, %lld x %lld%s:\n", what, (long long)p.K, (long long)p.N, p.dx ? ", dx" : "");
  const double grouped = run_grouped_ops(c), direct = run_grouped_direct(c), padded = run_padded(c, P),
               dense = run_dense(c);
  const BucketResult bk = run_bucketed(c);
  const SplitResult sp = run_split(c, bk.lt > 0);
  ok = ok && c.ok;
  const double fc = 2.0 * double(sp.common_rows) * double(p.K) * double(p.N);
  char line[2048];
  std::snprintf(
      line, sizeof line,
      "| %s | %lld x %lld%s | %d | %.1f%% | %s | %s | %s | %s | %zu (%.1f%%) | %s%s | %s | %d (%.0f%%) | "
      "%s + %s | %s | %.3g%s |",
      what, (long long)p.K, (long long)p.N, p.dx ? ", dx" : "", int(most),
      100.0 * double(kE * P - c.R) / double(c.R), cell(c.flops, grouped).c_str(),
      cell(c.flops, padded).c_str(), cell(c.flops, dense).c_str(), cell(c.flops, direct).c_str(), bk.buckets,
      100.0 * double(bk.rows - c.R) / double(c.R), cell(c.flops, bk.lt).c_str(),
      (bk.lt > 0 ? "; host " + std::to_string(int(bk.host_us)) + " us" : ": " + bk.lt_note).c_str(),
      cell(c.flops, bk.ex).c_str(), int(sp.m), 100.0 * double(sp.common_rows) / double(c.R),
      (cell(fc, sp.common) + (sp.lt ? " Lt" : " Ex")).c_str(), cell(c.flops - fc, sp.rest).c_str(),
      cell(c.flops, sp.total).c_str(), c.worst, c.ok ? "" : " WRONG");
  return line;
}
#endif

struct Options {
  std::string out;
  double max_pad = 0.06;
  bool fwd_only = false, plan = false;
};

std::string run_all(Env& env, const Options& o, bool& ok) {
  std::string md =
      "| routing | K x N | most rows of an expert | padding | grouped TFLOP/s | padded batched | dense "
      "| grouped, direct | buckets = launches (padding) | bucketed, cuBLASLt pointer array "
      "| bucketed, GemmBatchedEx | split: m_common (rows in it) | split: common + rest | split, total "
      "| largest difference |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
#ifdef RP_HAVE_CUDA
  Blas b;
  // inputs shared by all rows: every expert's weights, and R rows of the widest input
  const int64_t R = kT * kK;
  const void* w = rand_buffer(env, kE * kH * kF, DType::bf16, 0.02f, 1);
  const void* x = rand_buffer(env, R * kH, DType::bf16, 1.f, 2);
  for (bool skewed : {false, true}) {
    const std::vector<int32_t> off = routing(skewed, 7);
    for (auto [K, N] : {std::pair{kH, kF}, std::pair{kF, kH}})
      for (bool dx : {false, true}) {
        if (dx && o.fwd_only) continue;
        const std::string row =
            measure(env, b, skewed ? "skewed" : "uniform", off, Pass{dx, K, N}, w, x, o.max_pad, ok);
        std::printf("%s\n", row.c_str());
        std::fflush(stdout);
        md += row + "\n";
      }
  }
#else
  (void)env, (void)o, (void)ok;
#endif
  return md;
}

// The report's legend: what the columns beyond the first ones mean.
const char* kLegend =
    "Useful TFLOP/s = 2 R K N / time (R real rows), median of 10 calls. \"dx\" rows: the input "
    "gradient dx = dy W_e. grouped: Ops::grouped_linear_* (host-timed, the reference); grouped, "
    "direct: the same cuBLAS grouped call event-timed with its pointer-array copy; bucketed: one "
    "pointer-array batch per bucket over a padded layout (the time includes one H2D copy of the "
    "pointer arrays; host: cuBLASLt descriptors and heuristic queries of all buckets); split: a "
    "pointer-array batch of every expert's first m_common rows (Lt: cuBLASLt, Ex: "
    "cublasGemmBatchedEx) plus cuBLAS's grouped call for the rest, each part's TFLOP/s of its own "
    "rows; largest difference: from the grouped output over the checked rows, all variants.\n\n";

// Parses the arguments into `o`; false (after a one-line message) on a bad one.
bool parse(int argc, char** argv, Options& o, std::string& command) {
  command = argv[0];
  for (int i = 1; i < argc; ++i) {
    command += std::string(" ") + argv[i];
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--out") == 0 && has_value) {
      o.out = argv[++i];
      command += std::string(" ") + o.out;
    } else if (std::strcmp(argv[i], "--max-pad") == 0 && has_value) {
      char* end = nullptr;
      o.max_pad = std::strtod(argv[++i], &end);
      command += std::string(" ") + argv[i];
      if (*end != '\0' || !(o.max_pad >= 0 && o.max_pad < 1)) {
        std::fprintf(stderr, "bench_expert_gemm: --max-pad '%s' (expected a fraction in [0, 1))\n", argv[i]);
        return false;
      }
    } else if (std::strcmp(argv[i], "--fwd-only") == 0) {
      o.fwd_only = true;
    } else if (std::strcmp(argv[i], "--plan") == 0) {
      o.plan = true;
    } else {
      std::fprintf(
          stderr,
          "bench_expert_gemm: unknown argument '%s' (expected --out FILE, --max-pad F, --fwd-only or "
          "--plan)\n",
          argv[i]);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o;
    std::string command;
    if (!parse(argc, argv, o, command)) return 2;
    if (o.plan) {
      const bool good = print_plan("uniform", routing(false, 7), o.max_pad);
      return good && print_plan("skewed", routing(true, 7), o.max_pad) ? 0 : 1;
    }
    if (cuda_device_count() == 0) {
      std::printf("no CUDA device visible: nothing to measure\n");
      return 0;
    }
    Env env;
    DeviceOptions dopt;
    dopt.capacity_bytes = size_t(40) << 30;
    env.dev = make_cuda_device(0, dopt);
    env.ops = &env.dev->ops();
    std::printf("device: %s\n", env.dev->name().c_str());
    bool ok = true;
    const std::string table = run_all(env, o, ok);
    if (!o.out.empty()) {
      const std::time_t now = std::time(nullptr);
      char date[64];
      std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
      std::ostringstream md;
      md << "# bench_expert_gemm\n\n- command: `" << command << "`\n- commit: " << kGitCommit
         << "\n- machine: " << env.dev->name() << "\n- date: " << date << "\n\n"
         << (ok ? "" : "**A variant's output differs from the grouped reference (WRONG below).**\n\n")
         << kLegend << table;
      std::ofstream f(o.out);
      f << md.str();
      if (!f) {
        std::fprintf(stderr, "bench_expert_gemm: cannot write %s\n", o.out.c_str());
        return 1;
      }
    }
    if (!ok) {
      std::fprintf(stderr, "bench_expert_gemm: a variant's output differs from the grouped reference\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_expert_gemm: %s\n", e.what());
    return 1;
  }
}
