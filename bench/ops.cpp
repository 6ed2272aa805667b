// The op table's performance mode: every case of tests/kernels/op_table (or those --filter
// selects) at its benchmark size on the CUDA backend, one line each with the median time per
// call, achieved TFLOP/s and GB/s, and the fraction of the H200 ceilings of bench/ceilings.hpp
// (a GEMM case against the bf16 or FP8 GEMM ceiling, every case's bytes against HBM).
//
//   bench_ops [--filter PATTERNS] [--list] [--quick] [--trials N] [--out FILE] [--sustained S]
//     --filter  comma-separated case-name patterns, '*' matching any run of characters
//               (a pattern without '*' matches names containing it); default: every case
//     --list    print the selected cases (op, shape, FLOPs, bytes) and exit; no GPU needed
//     --quick   3 trials of a third of each case's calls
//     --trials  timed trials per case (median; default 5)
//     --out     also write the report (command, commit, machine, ceilings, the lines) to FILE
//               as Markdown (default: none)
//     --cpu     the cases at their test size on the CPU backend (checks this program without a
//               GPU; the rates mean nothing)
//     --sustained S  instead: the first selected case (default gemm_square) back to back for S
//               seconds, its rate per half second and the median of the second half
//
// Timing: the case's calls are issued R times back to back on the compute stream between two
// CUDA events (Stream::mark_time); seconds per call = elapsed / R, the median over the trials,
// after two warm-up calls. Memory-bound cases rotate over up to 4 allocations (so ~256 MB
// and more is touched per round and the 60 MB L2 does not serve them). Inputs are the table's
// seeded values. A case that fails (allocation, a thrown error, a device error) prints one line
// "<case>: error: ..." and the run goes on; the exit status is then 1.
#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include "bench/ceilings.hpp"
#include "kernels/device.hpp"
#include "roundpipe_version.hpp"
#include "tests/kernels/op_table/op_table.hpp"

using namespace rp;
using namespace rp::optable;

namespace {

struct Args {
  std::vector<std::string> patterns;
  bool list = false, quick = false, cpu = false, help = false, force = false;
  int trials = 5;
  std::string out;
  double sustained_s = 0;
  std::string command;
};

bool glob(const char* p, const char* s) {
  if (*p == 0) return *s == 0;
  if (*p == '*') return glob(p + 1, s) || (*s && glob(p, s + 1));
  return *s == *p && glob(p + 1, s + 1);
}

bool selected(const Args& a, const std::string& name) {
  if (a.patterns.empty()) return true;
  for (const std::string& p : a.patterns)
    if (p.find('*') != std::string::npos ? glob(p.c_str(), name.c_str()) : name.find(p) != std::string::npos)
      return true;
  return false;
}

// Parses argv; returns false (after printing why) on a bad argument.
bool parse(int argc, char** argv, Args& a) {
  for (int i = 0; i < argc; ++i) a.command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string x = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (x == "--help" || x == "-h") {
      a.help = true;
      return true;
    } else if (x == "--list") a.list = true;
    else if (x == "--force") a.force = true;
    else if (x == "--quick") a.quick = true;
    else if (x == "--cpu") a.cpu = true;
    else if (x == "--filter" || x == "--trials" || x == "--out" || x == "--sustained") {
      const char* v = value();
      if (!v) {
        std::fprintf(stderr, "bench_ops: %s needs a value\n", x.c_str());
        return false;
      }
      if (x == "--filter") {
        std::stringstream ss(v);
        for (std::string p; std::getline(ss, p, ',');)
          if (!p.empty()) a.patterns.push_back(p);
      } else if (x == "--out") {
        a.out = v;
      } else {
        char* end = nullptr;
        const double d = std::strtod(v, &end);
        if (!end || *end || !(d > 0) || d > 1e6) {
          std::fprintf(stderr, "bench_ops: %s: expected a positive number, got '%s'\n", x.c_str(), v);
          return false;
        }
        if (x == "--trials") a.trials = int(d);
        else a.sustained_s = d;
      }
    } else {
      std::fprintf(
          stderr,
          "bench_ops: unknown argument '%s' (expected --filter P, --list, --quick, --cpu, --trials N, "
          "--out F [--force], --sustained S, --help)\n",
          x.c_str());
      return false;
    }
  }
  return true;
}

// The stream's error since the last check ("" when none).
std::string stream_error(Stream& cs) {
  auto pr = std::make_shared<std::promise<std::string>>();
  auto fut = pr->get_future();
  cs.then([pr](const std::string& e) { pr->set_value(e); });
  return fut.get();
}

// Runs fn inside a compute launch and waits; throws the stream's or fn's error.
void launch_checked(Stream& cs, const std::function<void()>& fn) {
  std::string thrown;
  cs.launch([&] {
    try {
      fn();
    } catch (const std::exception& e) {
      thrown = e.what();
    }
  });
  const std::string err = stream_error(cs);
  if (!thrown.empty()) throw std::runtime_error(thrown);
  if (!err.empty()) throw std::runtime_error("device error: " + err);
}

struct Timed {
  double sec = 0;
  int sets = 1;
};

// Median seconds per call of c (prepared allocations rotated), CUDA-event timed.
Timed time_case(Device& dev, const OpCase& c, const Args& a) {
  Stream& cs = dev.stream(StreamKind::compute);
  Ops& ops = dev.ops();
  const auto inputs = make_inputs(c, ops.dtype());
  const double bytes = derived_bytes(c, ops.dtype());
  Timed t;
  if (c.bound == Bound::memory && bytes > 0) t.sets = int(std::clamp(256e6 / bytes, 1.0, 4.0));
  std::vector<Allocation> al;
  for (int s = 0; s < t.sets; ++s) al.push_back(allocate(dev, c, inputs));
  std::vector<Buffers> bufs;
  for (const Allocation& x : al) bufs.emplace_back(x.ptr);
  const int reps = std::max(1, a.quick ? c.reps / 3 : c.reps);
  const RunFn& run = a.cpu && c.twin ? c.twin : c.run;
  struct Knob {  // the case's CUDA setting, undone even when a call throws
    const OpCase& c;
    Ops& o;
    Stream& cs;
    bool cuda;
    ~Knob() {
      if (cuda && c.cuda_off) cs.launch([this] { c.cuda_off(o); });
      cs.synchronize();
    }
  } knob{c, ops, cs, !a.cpu};
  launch_checked(cs, [&] {
    if (!a.cpu && c.cuda_on) c.cuda_on(ops);
    for (const Buffers& b : bufs)
      if (c.prepare) c.prepare(ops, b);
    for (int w = 0; w < 2; ++w) run(ops, bufs[size_t(w) % bufs.size()]);
  });
  std::vector<double> per_call;
  for (int trial = 0; trial < (a.quick ? 3 : a.trials); ++trial) {
    std::unique_ptr<TimingMark> m0, m1;
    launch_checked(cs, [&] {
      m0 = cs.mark_time();
      for (int r = 0; r < reps; ++r) run(ops, bufs[size_t(r) % bufs.size()]);
      m1 = cs.mark_time();
    });
    per_call.push_back(m1->seconds_since(*m0) / reps);
  }
  std::sort(per_call.begin(), per_call.end());
  t.sec = per_call[per_call.size() / 2];
  return t;
}

std::string fmt_line(const OpCase& c, DType ct, double sec, int sets) {
  const rp::bench::Ceilings& k = rp::bench::kH200;
  const double bytes = case_bytes(c, ct), gbs = bytes / sec / 1e9;
  char buf[512];
  if (c.bound == Bound::memory || c.flops <= 0) {
    std::snprintf(buf, sizeof buf, "%-44s %-40s %9.4f ms %9s %7s %8.1f GB/s %5.1f%% of HBM%s", c.name.c_str(),
                  c.shape.c_str(), sec * 1e3, "", "", gbs, 100 * gbs / k.hbm_gbs,
                  sets > 1 ? (" (" + std::to_string(sets) + " sets)").c_str() : "");
  } else {
    const double tf = c.flops / sec / 1e12;
    if (c.bound == Bound::gemm_fp8)
      std::snprintf(buf, sizeof buf, "%-44s %-40s %9.4f ms %7.1f TFLOP/s %5.1f%% of FP8 %8.1f GB/s",
                    c.name.c_str(), c.shape.c_str(), sec * 1e3, tf, 100 * tf / k.fp8_gemm_burst_tflops, gbs);
    else  // bf16: against the burst and the sustained (power-limited) GEMM rate
      std::snprintf(buf, sizeof buf,
                    "%-44s %-40s %9.4f ms %7.1f TFLOP/s %5.1f%% of bf16 (%5.1f%% sust.) %8.1f GB/s",
                    c.name.c_str(), c.shape.c_str(), sec * 1e3, tf, 100 * tf / k.bf16_gemm_burst_tflops,
                    100 * tf / k.bf16_gemm_sustained_tflops, gbs);
  }
  return buf;
}

std::string machine(Device& dev) {
  struct utsname u;
  uname(&u);
  char host[256];
  std::snprintf(host, sizeof host, "%s (%s %s %s)", dev.name().c_str(), u.nodename, u.sysname, u.release);
  return host;
}

// The first selected case back to back for a.sustained_s seconds.
int sustained(Device& dev, const std::vector<OpCase>& cases, const Args& a) {
  const OpCase& c = cases.front();
  Stream& cs = dev.stream(StreamKind::compute);
  Ops& ops = dev.ops();
  Allocation al = allocate(dev, c, make_inputs(c, ops.dtype()));
  const Buffers b(al.ptr);
  std::printf("-- %s (%s) back to back for %.0f s --\n", c.name.c_str(), c.shape.c_str(), a.sustained_s);
  std::vector<double> rates;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    int calls = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 0.5) {
      launch_checked(cs, [&] {
        for (int r = 0; r < 20; ++r) c.run(ops, b);
      });
      calls += 20;
    }
    const auto t1 = std::chrono::steady_clock::now();
    rates.push_back(c.flops * calls / std::chrono::duration<double>(t1 - t0).count() / 1e12);
    const double at = std::chrono::duration<double>(t1 - start).count();
    std::printf("t=%5.1f s  %7.1f TFLOP/s\n", at, rates.back());
    std::fflush(stdout);
    if (at >= a.sustained_s) break;
  }
  std::vector<double> tail(rates.begin() + long(rates.size() / 2), rates.end());
  std::sort(tail.begin(), tail.end());
  std::printf(
      "sustained (median of the second half): %.1f TFLOP/s; ceilings bf16 %.0f burst / %.0f sustained\n",
      tail[tail.size() / 2], rp::bench::kH200.bf16_gemm_burst_tflops,
      rp::bench::kH200.bf16_gemm_sustained_tflops);
  return 0;
}

int run_all(const std::vector<OpCase>& cases, const Args& a) {
  DeviceOptions o;
  o.capacity_bytes = size_t(a.cpu ? 8 : 120) << 30;
  auto dev = a.cpu ? make_cpu_device(0, o) : make_cuda_device(0, o);
  if (a.sustained_s > 0) return sustained(*dev, cases, a);
  const rp::bench::Ceilings& k = rp::bench::kH200;
  std::ostringstream md;
  char head[1024];
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::snprintf(
      head, sizeof head,
      "# bench_ops\n\n- command: `%s`\n- commit: %s (%s build, CUDA architectures %s)\n- machine: %s\n"
      "- date: %s\n- ceilings (bench/ceilings.hpp): bf16 GEMM %.0f TFLOP/s burst, %.0f sustained; FP8 "
      "GEMM %.0f; HBM %.0f GB/s (copy measured %.0f)\n\n```\n",
      a.command.c_str(), rp::kGitCommit, rp::kBuildType, rp::kCudaArchitectures, machine(*dev).c_str(), date,
      k.bf16_gemm_burst_tflops, k.bf16_gemm_sustained_tflops, k.fp8_gemm_burst_tflops, k.hbm_gbs, k.copy_gbs);
  std::fputs(head, stdout);
  md << head;
  int failed = 0;
  for (const OpCase& c : cases) {
    std::string line;
    try {
      const std::string why = !a.cpu && c.cuda_unavailable ? c.cuda_unavailable() : "";
      if (!why.empty()) {
        line = c.name + ": skipped: " + why;
      } else {
        const Timed t = time_case(*dev, c, a);
        line = fmt_line(c, dev->ops().dtype(), t.sec, t.sets);
      }
    } catch (const std::exception& e) {
      line = c.name + ": error: " + e.what();
      ++failed;
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    md << line << "\n";
  }
  md << "```\n";
  std::printf("```\n");
  if (failed) std::printf("%d of %zu cases failed\n", failed, cases.size());
  if (!a.out.empty()) {
    std::ofstream f(a.out);
    f << md.str();
    if (!f) {
      std::fprintf(stderr, "bench_ops: cannot write %s\n", a.out.c_str());
      return 1;
    }
  }
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a;
    if (!parse(argc, argv, a)) return 2;
    if (a.help) {
      std::printf(
          "bench_ops: times the op table's cases (tests/kernels/op_table) on the GPU against the ceilings "
          "of\n"
          "bench/ceilings.hpp.\n"
          "  --filter P[,P...]  cases whose names match a pattern (* wildcards); --list: names, FLOPs, "
          "bytes\n"
          "  --quick            fewer trials; --trials N: trials per case (median reported, default 5)\n"
          "  --cpu              the CPU backend at the test sizes (no GPU needed)\n"
          "  --sustained S      the 8192^3 bf16 GEMM back to back for S seconds\n"
          "  --out F [--force]  also write a Markdown report (command, commit, machine) to F; an existing F\n"
          "                     is kept unless --force\n");
      return 0;
    }
    if (!a.out.empty() && !a.force && std::filesystem::exists(a.out)) {
      std::fprintf(stderr,
                   "bench_ops: --out %s: the file exists (remove it, choose another name or pass --force)\n",
                   a.out.c_str());
      return 2;
    }
    std::vector<OpCase> cases;
    for (OpCase& c : op_table(a.cpu ? Size::test : Size::bench))
      if (selected(a, c.name)) cases.push_back(std::move(c));
    if (a.sustained_s > 0 && a.patterns.empty()) {
      cases.erase(
          std::remove_if(cases.begin(), cases.end(), [](const OpCase& c) { return c.name != "gemm_square"; }),
          cases.end());
    }
    if (cases.empty()) {
      std::fprintf(stderr, "bench_ops: no case matches the filter (--list shows the names)\n");
      return 2;
    }
    if (a.list) {
      for (const OpCase& c : cases)
        std::printf("%-44s %-34s %-40s %10.3g FLOP %10.3g B\n", c.name.c_str(), c.op.c_str(), c.shape.c_str(),
                    c.flops, case_bytes(c, DType::bf16));
      return 0;
    }
    if (!a.cpu && cuda_device_count() == 0) {
      std::fprintf(stderr,
                   "bench_ops: no CUDA device visible: nothing to measure (--cpu times the CPU backend)\n");
      return 1;
    }
    return run_all(cases, a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ops: %s\n", e.what());
    return 1;
  }
}
