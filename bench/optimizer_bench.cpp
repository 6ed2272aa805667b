// AdamW throughput against the memory-bandwidth bound measured in the same run.
//
//   bench_optimizer_bench [--params N] [--threads 1,2,4|max] [--reps R] [--qwen3-1.7b]
//                         [--qwen-layers L] [--md FILE]
//
// For each thread count T (a ThreadPool of T workers pinned to the first T CPUs of
// preferred_cpu_order()):
//  - bandwidth bounds over buffers of the same size as the update's (fp32 arrays of N
//    elements and a bf16 copy), split over the pool the way adamw_update splits them, timed
//    in turns with the AdamW runs (same background load):
//      copy   m = w, v = g                       (STREAM convention: 16 B counted / element)
//      triad  m = v + s * g                      (STREAM convention: 12 B counted / element)
//      update-shaped: over AdamW's own arrays, read w, m, v, g, write w, m, v in place and
//             stream the bf16 copy, with trivial arithmetic: exactly the traffic of one AdamW
//             step (30 B / element); AVX-512 where the CPU has it (else AVX2)
//    bound (params/s) = the best of the three GB/s figures / 30 B.
//  - AdamW (decoupled, weight decay 0.01, fused bf16 copy) on the best ISA: params/s, its
//    GB/s at 30 B / param, and the fraction of the bound; also with the extra pass that
//    global-norm clipping costs (sum_of_squares over g on the pool, then the update).
// Then every ISA path at the largest T, and optionally a full optimizer step over the
// parameter groups of Qwen3-1.7B (tied embeddings; 28 layers; ~1.72e9 parameters, ~31 GB
// of host memory), to compare with one GPU iteration.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics start from an "undefined" vector it then warns about
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

#include "base/atomic_file.hpp"
#include "bench/bench_main.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/clip.hpp"
#include "optimizer/isa.hpp"
#include "optimizer/thread_pool.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kBytesPerParam = 30;     // w, m, v, g read; w, m, v written; bf16 copy
constexpr double kTorchCpuAdam = 0.77e9;  // params/s, PyTorch CPU Adam, 16 threads, on the lent GPU machine

// ---- bandwidth kernels (AVX2 where the CPU has it; plain loops otherwise) ------------------
#if defined(__x86_64__)
__attribute__((target("avx2"))) void copy_avx2(const float* a, float* b, const float* c, float* d, int64_t lo,
                                               int64_t hi) {
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    _mm256_storeu_ps(b + i, _mm256_loadu_ps(a + i));
    _mm256_storeu_ps(d + i, _mm256_loadu_ps(c + i));
  }
  for (; i < hi; ++i) b[i] = a[i], d[i] = c[i];
}
__attribute__((target("avx2,fma"))) void triad_avx2(float* a, const float* b, const float* c, float s,
                                                    int64_t lo, int64_t hi) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8)
    _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(b + i), _mm256_mul_ps(vs, _mm256_loadu_ps(c + i))));
  for (; i < hi; ++i) a[i] = b[i] + s * c[i];
}
__attribute__((target("avx2,fma"))) void update_shaped_avx2(float* w, float* m, float* v, const float* g,
                                                            uint16_t* out, int64_t lo, int64_t hi) {
  const __m256 a = _mm256_set1_ps(0.9f), b = _mm256_set1_ps(0.999f), s = _mm256_set1_ps(-1e-6f);
  int64_t i = lo;
  while (i < hi && (reinterpret_cast<uintptr_t>(out + i) & 15)) {
    w[i] += -1e-6f * g[i], m[i] = 0.9f * m[i] + g[i], v[i] = 0.999f * v[i] + g[i] * g[i];
    out[i] = uint16_t(std::bit_cast<uint32_t>(w[i]) >> 16);
    ++i;
  }
  for (; i + 8 <= hi; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    const __m256 wi = _mm256_fmadd_ps(s, gi, _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(w + i, wi);
    _mm256_storeu_ps(m + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(m + i), gi));
    _mm256_storeu_ps(v + i, _mm256_fmadd_ps(b, _mm256_loadu_ps(v + i), _mm256_mul_ps(gi, gi)));
    const __m256i u = _mm256_srli_epi32(_mm256_castps_si256(wi), 16);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
  }
  for (; i < hi; ++i) {
    w[i] += -1e-6f * g[i], m[i] = 0.9f * m[i] + g[i], v[i] = 0.999f * v[i] + g[i] * g[i];
    out[i] = uint16_t(std::bit_cast<uint32_t>(w[i]) >> 16);
  }
  _mm_sfence();
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) void update_shaped_avx512(float* w, float* m, float* v,
                                                                               const float* g, uint16_t* out,
                                                                               int64_t lo, int64_t hi) {
  const __m512 a = _mm512_set1_ps(0.9f), b = _mm512_set1_ps(0.999f), s = _mm512_set1_ps(-1e-6f);
  int64_t i = lo;
  while (i < hi && (reinterpret_cast<uintptr_t>(out + i) & 31)) {
    w[i] += -1e-6f * g[i], m[i] = 0.9f * m[i] + g[i], v[i] = 0.999f * v[i] + g[i] * g[i];
    out[i] = uint16_t(std::bit_cast<uint32_t>(w[i]) >> 16);
    ++i;
  }
  for (; i + 16 <= hi; i += 16) {
    const __m512 gi = _mm512_loadu_ps(g + i);
    const __m512 wi = _mm512_fmadd_ps(s, gi, _mm512_loadu_ps(w + i));
    _mm512_storeu_ps(w + i, wi);
    _mm512_storeu_ps(m + i, _mm512_fmadd_ps(a, _mm512_loadu_ps(m + i), gi));
    _mm512_storeu_ps(v + i, _mm512_fmadd_ps(b, _mm512_loadu_ps(v + i), _mm512_mul_ps(gi, gi)));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(wi), 16)));
  }
  for (; i < hi; ++i) {
    w[i] += -1e-6f * g[i], m[i] = 0.9f * m[i] + g[i], v[i] = 0.999f * v[i] + g[i] * g[i];
    out[i] = uint16_t(std::bit_cast<uint32_t>(w[i]) >> 16);
  }
  _mm_sfence();
}
#endif

bool have_avx2() { return rp::isa_supported(rp::Isa::avx2); }

void copy_k(const float* a, float* b, const float* c, float* d, int64_t lo, int64_t hi) {
#if defined(__x86_64__)
  if (have_avx2()) return copy_avx2(a, b, c, d, lo, hi);
#endif
  for (int64_t i = lo; i < hi; ++i) b[i] = a[i], d[i] = c[i];
}
void triad_k(float* a, const float* b, const float* c, float s, int64_t lo, int64_t hi) {
#if defined(__x86_64__)
  if (have_avx2()) return triad_avx2(a, b, c, s, lo, hi);
#endif
  for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
}
void update_shaped_k(float* w, float* m, float* v, const float* g, uint16_t* out, int64_t lo, int64_t hi) {
#if defined(__x86_64__)
  if (rp::isa_supported(rp::Isa::avx512)) return update_shaped_avx512(w, m, v, g, out, lo, hi);
  if (have_avx2()) return update_shaped_avx2(w, m, v, g, out, lo, hi);
#endif
  for (int64_t i = lo; i < hi; ++i) {
    w[i] += -1e-6f * g[i], m[i] = 0.9f * m[i] + g[i], v[i] = 0.999f * v[i] + g[i] * g[i];
    out[i] = uint16_t(std::bit_cast<uint32_t>(w[i]) >> 16);
  }
}

// ---- helpers -------------------------------------------------------------------------------
std::string read_first(const char* path, const char* key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) {
      auto p = line.find(':');
      std::string v = p == std::string::npos ? line : line.substr(p + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "?";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// Median seconds of each of `fs` over `reps` rounds, after one warm-up round; the functions
/// take turns within a round, so all see the same background load.
std::vector<double> time_interleaved(int reps, const std::vector<std::function<void()>>& fs) {
  for (auto& f : fs) f();
  std::vector<std::vector<double>> t(fs.size());
  for (int r = 0; r < reps; ++r)
    for (size_t k = 0; k < fs.size(); ++k) {
      const auto t0 = Clock::now();
      fs[k]();
      t[k].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  std::vector<double> out;
  for (auto& v : t) out.push_back(median(v));
  return out;
}

/// Median seconds of `reps` runs of f after one warm-up.
double time_it(int reps, const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

struct Buffers {
  int64_t n;
  std::unique_ptr<float[]> w, m, v, g;
  std::unique_ptr<uint16_t[]> out;
  explicit Buffers(int64_t n_, rp::ThreadPool& pool)
      : n(n_),
        w(new float[size_t(n_)]),
        m(new float[size_t(n_)]),
        v(new float[size_t(n_)]),
        g(new float[size_t(n_)]),
        out(new uint16_t[size_t(n_)]) {
    // first touch by the pool, in adamw_update's split
    const int parts = pool.size();
    pool.run(parts, [&](int p) {
      int64_t lo, hi;
      rp::split_range(n, parts, 1024, p, lo, hi);
      uint32_t x = 12345u + uint32_t(p);
      for (int64_t i = lo; i < hi; ++i) {
        x = x * 1664525u + 1013904223u;
        const float r = float(int32_t(x >> 8) - (1 << 23)) / float(1 << 23);  // [-1, 1)
        w[i] = r;
        g[i] = 1e-3f * r + 1e-4f;
        m[i] = 0, v[i] = 0, out[i] = 0;
      }
    });
  }
};

void parallel(rp::ThreadPool& pool, int64_t n, const std::function<void(int64_t, int64_t)>& f) {
  const int parts = pool.size();
  pool.run(parts, [&](int p) {
    int64_t lo, hi;
    rp::split_range(n, parts, 1024, p, lo, hi);
    f(lo, hi);
  });
}

struct Row {
  int threads;
  double copy_gbs, triad_gbs, upd_gbs, bound_pps, adam_pps, adam_clip_pps;
};

/// --threads: "all" (1..maxt) or a comma-separated list of counts from 1 to maxt and "max".
/// Throws std::invalid_argument naming the option for anything else.
std::vector<int> parse_threads(const std::string& s, int maxt) {
  std::vector<int> out;
  if (s == "all") {
    for (int t = 1; t <= maxt; ++t) out.push_back(t);
    return out;
  }
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok == "max") {
      out.push_back(maxt);
      continue;
    }
    char* end = nullptr;
    const long t = std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || *end != '\0' || t < 1 || t > maxt)
      throw std::invalid_argument(
          fmt::format("--threads {}: expected all, or counts from 1 to {} (this process's CPUs) and max, "
                      "separated by commas",
                      s, maxt));
    out.push_back(int(t));
  }
  if (out.empty()) throw std::invalid_argument("--threads: expected all, or counts separated by commas");
  return out;
}

struct Group {
  int64_t n;
  std::unique_ptr<float[]> w, g;
  std::unique_ptr<uint16_t[]> out;
  rp::AdamWState st;
};

int run(int argc, char** argv) {
  double params = double(64 << 20);
  std::string threads_arg = "all", md_path;
  int reps = 5, qwen_layers = 28;
  bool qwen = false, force = false;
  CLI::App app{"CPU AdamW and memory-bandwidth benchmark"};
  app.add_option("--params", params, "parameters per buffer (a number, e.g. 64e6)")
      ->check(CLI::Range(1.0, 1e11));
  app.add_option("--threads", threads_arg, "all, or thread counts separated by commas (max: all CPUs)");
  app.add_option("--reps", reps, "repetitions per row")->check(CLI::Range(1, 1000));
  app.add_flag("--qwen3-1.7b", qwen, "also time a whole Qwen3-1.7B optimizer step");
  auto* layers = app.add_option("--qwen-layers", qwen_layers, "that step's layers (implies --qwen3-1.7b)")
                     ->check(CLI::Range(1, 1000));
  app.add_option("--md", md_path, "also write the report to this file (an existing file needs --force)");
  app.add_flag("--force", force, "with --md: replace an existing file");
  if (const auto code = bench::parse_options(app, argc, argv, "bench_optimizer_bench")) return *code;
  if (layers->count() > 0) qwen = true;
  const int64_t n = int64_t(params);
  if (const auto dir = std::filesystem::path(md_path).parent_path();
      !md_path.empty() && !dir.empty() && !std::filesystem::is_directory(dir)) {
    std::fprintf(stderr, "bench_optimizer_bench: --md %s: no folder %s\n", md_path.c_str(), dir.c_str());
    return 2;
  }
  if (!md_path.empty() && !force && std::filesystem::exists(md_path)) {
    std::fprintf(stderr, "bench_optimizer_bench: --md %s: the file exists; add --force to replace it\n",
                 md_path.c_str());
    return 2;
  }
  const std::vector<int> order = rp::preferred_cpu_order();
  const int maxt = int(order.size());
  std::vector<int> tlist;
  try {
    tlist = parse_threads(threads_arg, maxt);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_optimizer_bench: %s\n", e.what());
    return 2;
  }

  std::ostringstream md;
  auto out = [&](const std::string& s) {
    std::fputs(s.c_str(), stdout);
    std::fflush(stdout);
    md << s;
  };
  struct utsname u;
  uname(&u);
  char buf[512];
  std::string isas;
  for (auto i : rp::supported_isas()) isas += std::string(rp::isa_name(i)) + " ";
  std::vector<int> nodes = rp::numa_node_of(order);
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  std::snprintf(
      buf, sizeof buf,
      "- uname -a: %s %s %s %s %s\n- nproc: %ld (allowed: %d), NUMA nodes: %zu\n- CPU: %s\n"
      "- memory: %s\n- ISA paths: %s(using %s)\n- parameters: %lld (%.2f GB moved per step at 30 B)\n\n",
      u.sysname, u.nodename, u.release, u.version, u.machine, sysconf(_SC_NPROCESSORS_ONLN), maxt,
      nodes.size(), read_first("/proc/cpuinfo", "model name").c_str(),
      read_first("/proc/meminfo", "MemTotal").c_str(), isas.c_str(), rp::isa_name(rp::adamw_isa()),
      (long long)n, double(n) * kBytesPerParam / 1e9);
  out(buf);

  rp::ThreadPool init_pool(rp::ThreadPool::Options{maxt, order, 50, "rp-bench"});
  Buffers B(n, init_pool);
  rp::AdamWOptions opt;
  opt.weight_decay = 0.01;

  out("| threads | copy GB/s | triad GB/s | update-shaped GB/s | bound Gparam/s | AdamW Gparam/s | AdamW "
      "GB/s | "
      "of bound | x PyTorch 0.77 | +clip pass Gparam/s |\n|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Row> rows;
  for (int t : tlist) {
    if (t < 1 || t > maxt) continue;
    std::vector<int> cpus(order.begin(), order.begin() + t);
    rp::ThreadPool pool(rp::ThreadPool::Options{t, cpus, 50, "rp-bench"});
    Row r{t, 0, 0, 0, 0, 0, 0};
    float* w = B.w.get();
    float* m = B.m.get();
    float* v = B.v.get();
    float* g = B.g.get();
    uint16_t* o = B.out.get();
    // the update-shaped bound runs over AdamW's own arrays (w, its m and v, g, the copy)
    rp::AdamWState st;
    rp::adamw_update(w, st, g, n, 1.f, opt, 1e-5, o, rp::DType::bf16, pool);  // sizes + first-touches m, v
    float* sm = st.m.data();
    float* sv = st.v.data();
    const auto times = time_interleaved(
        reps, {[&] { parallel(pool, n, [&](int64_t lo, int64_t hi) { copy_k(w, m, g, v, lo, hi); }); },
               [&] { parallel(pool, n, [&](int64_t lo, int64_t hi) { triad_k(m, v, g, 1e-7f, lo, hi); }); },
               [&] {
                 parallel(pool, n, [&](int64_t lo, int64_t hi) { update_shaped_k(w, sm, sv, g, o, lo, hi); });
               },
               [&] { rp::adamw_update(w, st, g, n, 1.f, opt, 1e-5, o, rp::DType::bf16, pool); },
               [&] {
                 volatile double s = rp::sum_of_squares(g, n, pool);
                 (void)s;
                 rp::adamw_update(w, st, g, n, 1.f, opt, 1e-5, o, rp::DType::bf16, pool);
               }});
    const double tc = times[0], tt = times[1], tu = times[2], ta = times[3], tac = times[4];
    r.copy_gbs = 16.0 * double(n) / tc / 1e9;
    r.triad_gbs = 12.0 * double(n) / tt / 1e9;
    r.upd_gbs = kBytesPerParam * double(n) / tu / 1e9;
    r.bound_pps = std::max({r.copy_gbs, r.triad_gbs, r.upd_gbs}) * 1e9 / kBytesPerParam;
    r.adam_pps = double(n) / ta;
    r.adam_clip_pps = double(n) / tac;
    rows.push_back(r);
    std::snprintf(buf, sizeof buf,
                  "| %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f | %.0f%% | %.2fx | %.2f |\n", t, r.copy_gbs,
                  r.triad_gbs, r.upd_gbs, r.bound_pps / 1e9, r.adam_pps / 1e9,
                  r.adam_pps * kBytesPerParam / 1e9, 100 * r.adam_pps / r.bound_pps,
                  r.adam_pps / kTorchCpuAdam, r.adam_clip_pps / 1e9);
    out(buf);
  }

  // every ISA path, and amsgrad / f16 / no copy, at the largest thread count
  const int tmax = rows.empty() ? maxt : rows.back().threads;
  {
    std::vector<int> cpus(order.begin(), order.begin() + tmax);
    rp::ThreadPool pool(rp::ThreadPool::Options{tmax, cpus, 50, "rp-bench"});
    std::snprintf(buf, sizeof buf,
                  "\nAt %d threads, by ISA path and variant (Gparam/s):\n\n"
                  "| ISA | bf16 copy | f16 copy | no copy | amsgrad + bf16 |\n|---|---|---|---|---|\n",
                  tmax);
    out(buf);
    const rp::Isa saved = rp::adamw_isa();
    for (rp::Isa isa : rp::supported_isas()) {
      rp::set_adamw_isa(isa);
      double r[4];
      int k = 0;
      for (int variant = 0; variant < 4; ++variant) {
        rp::AdamWOptions o2 = opt;
        o2.amsgrad = variant == 3;
        rp::AdamWState st;
        void* dst = variant == 2 ? nullptr : B.out.get();
        const rp::DType dt = variant == 1 ? rp::DType::f16 : rp::DType::bf16;
        const double tv = time_it(std::max(2, reps / 2), [&] {
          rp::adamw_update(B.w.get(), st, B.g.get(), n, 1.f, o2, 1e-5, dst, dt, pool);
        });
        r[k++] = double(n) / tv / 1e9;
      }
      std::snprintf(buf, sizeof buf, "| %s | %.2f | %.2f | %.2f | %.2f |\n", rp::isa_name(isa), r[0], r[1],
                    r[2], r[3]);
      out(buf);
    }
    rp::set_adamw_isa(saved);
  }

  if (qwen) {
    // Qwen3-1.7B: vocab 151936, hidden 2048, 28 layers, 16 q / 8 kv heads x 128, FFN 6144,
    // tied embeddings. One parameter group per tensor, updated one after another, each on
    // the pool (what one shard does as the groups' gradients land).
    const int64_t V = 151936, H = 2048, F = 6144, Q = 16 * 128, KV = 8 * 128, D = 128;
    std::vector<int64_t> sizes = {V * H};
    for (int l = 0; l < qwen_layers; ++l)
      for (int64_t s : {Q * H, KV * H, KV * H, H * Q, F * H, F * H, H * F, H, H, D, D}) sizes.push_back(s);
    sizes.push_back(H);  // final norm
    int64_t total = 0;
    for (auto s : sizes) total += s;
    std::vector<int> cpus(order.begin(), order.begin() + tmax);
    rp::ThreadPool pool(rp::ThreadPool::Options{tmax, cpus, 50, "rp-bench"});
    std::vector<Group> groups;
    const auto t_alloc = Clock::now();
    for (auto s : sizes) {
      Group gr{s,
               std::unique_ptr<float[]>(new float[size_t(s)]),
               std::unique_ptr<float[]>(new float[size_t(s)]),
               std::unique_ptr<uint16_t[]>(new uint16_t[size_t(s)]),
               {}};
      const int parts = int(std::min<int64_t>(tmax, std::max<int64_t>(1, s / rp::kMinElemsPerThread)));
      pool.run(parts, [&](int p) {
        int64_t lo, hi;
        rp::split_range(s, parts, 1024, p, lo, hi);
        for (int64_t i = lo; i < hi; ++i)
          gr.w[i] = 0.01f * float((i * 7919) % 2001 - 1000) / 1000.f,
          gr.g[i] = 1e-4f * float((i * 104729) % 2001 - 1000) / 1000.f;
      });
      groups.push_back(std::move(gr));
    }
    // first step sizes and first-touches the moments; then time full steps
    auto full_step = [&](bool clip) {
      double ss = 0;
      if (clip)
        for (auto& gr : groups) ss += rp::sum_of_squares(gr.g.get(), gr.n, pool);
      const float scale = clip ? float(1.0 / (std::sqrt(ss) + 1e-6)) : 1.f;
      for (auto& gr : groups)
        rp::adamw_update(gr.w.get(), gr.st, gr.g.get(), gr.n, scale, opt, 1e-5, gr.out.get(), rp::DType::bf16,
                         pool);
    };
    full_step(false);
    const double setup = std::chrono::duration<double>(Clock::now() - t_alloc).count();
    const double tf = time_it(3, [&] { full_step(false); });
    const double tfc = time_it(3, [&] { full_step(true); });
    std::snprintf(
        buf, sizeof buf,
        "\nQwen3-1.7B full optimizer step (%d layers, %zu groups, %.3g parameters, %.1f GB of optimizer "
        "state + grads + bf16 copy; setup %.1f s), %d threads: %.3f s per step (%.2f Gparam/s); with the "
        "global-norm clipping pass: %.3f s.\nOne GPU iteration at the issue-3 target (31K tokens/s, 65536 "
        "tokens/step) is %.2f s; at the Python RoundPipe's 20.9K tokens/s, %.2f s.\n",
        qwen_layers, groups.size(), double(total), double(total) * 18 / 1e9, setup, tmax, tf,
        double(total) / tf / 1e9, tfc, 65536.0 / 31000, 65536.0 / 20900);
    out(buf);
  }
  if (!md_path.empty()) {
    rp::write_file_atomically(md_path, [&](std::ostream& os) { os << md.str(); });
    std::printf("wrote %s\n", md_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::guarded_main("bench_optimizer_bench", [&] { return run(argc, argv); });
}
