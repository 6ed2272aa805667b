// Helpers shared by the kernel benchmarks: device buffers with random contents, the median
// time of an op issued back to back on the compute stream, and one result line against the
// ceilings measured on the same GPU (bench_fp8_ops_bench); the random values also feed
// bench_cudnn_gqa_probe. The op table's benchmark (bench_ops) has its own harness
// (tests/kernels/op_table) and fixed ceilings (bench/ceilings.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.hpp"
#include "kernels/dtype.hpp"
#include "kernels/ops.hpp"

namespace rp::bench {

struct Env {
  std::unique_ptr<Device> dev;
  Ops* ops = nullptr;
  std::vector<DeviceBuffer> keep;
  double peak_tflops = 0, peak_gbs = 0;
  bool quick = false, dequant_only = false, moe_only = false, gptoss_only = false;
};

inline void* buffer(Env& e, int64_t n, DType t) {
  e.keep.emplace_back(*e.dev, size_t(n) * dtype_size(t));
  return e.keep.back().get();
}

// Approximately normal values (mean 0, variance 1: the Irwin-Hall sum of four uniforms from an
// xorshift64 stream seeded by `seed`), the same on every platform.
class NormalSource {
 public:
  explicit NormalSource(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  double operator()() { return (uniform() + uniform() + uniform() + uniform() - 2.0) * std::sqrt(3.0); }

 private:
  double uniform() {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return double(s_ >> 11) * (1.0 / 9007199254740992.0);
  }
  uint64_t s_;
};

// Fills n elements of type t with scale * (approximately normal) random values.
inline void fill_random(Env& e, void* dst, int64_t n, DType t, float scale, uint64_t seed) {
  const int64_t chunk = int64_t(1) << 22;
  std::vector<float> f(size_t(std::min(n, chunk)));
  std::vector<char> h(f.size() * dtype_size(t));
  NormalSource normal(seed);
  Stream& cs = e.dev->stream(StreamKind::compute);
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    const int64_t m = std::min(chunk, n - i0);
    for (int64_t i = 0; i < m; ++i) f[size_t(i)] = scale * float(normal());
    cast_f32_to(f.data(), h.data(), m, t);
    cs.copy_h2d(static_cast<char*>(dst) + size_t(i0) * dtype_size(t), h.data(), size_t(m) * dtype_size(t));
    cs.synchronize();
  }
}

inline void* rand_buffer(Env& e, int64_t n, DType t, float scale, uint64_t seed) {
  void* p = buffer(e, n, t);
  fill_random(e, p, n, t, scale, seed);
  return p;
}

// Median seconds per call of fn(rep).
inline double time_op(Env& e, const std::function<void(int)>& fn, int reps) {
  Stream& cs = e.dev->stream(StreamKind::compute);
  std::string err;
  auto check = [&] {
    cs.then([&](const std::string& x) {
      if (!x.empty()) err = x;
    });
    cs.synchronize();
    if (!err.empty()) {
      std::fprintf(stderr, "error: %s\n", err.c_str());
      std::exit(1);
    }
  };
  cs.launch([&] {
    fn(0);
    fn(1);
  });  // warm-up (plans, attributes, clocks)
  check();
  std::vector<double> t;
  for (int trial = 0; trial < (e.quick ? 2 : 5); ++trial) {
    auto t0 = std::chrono::steady_clock::now();
    cs.launch([&] {
      for (int r = 0; r < reps; ++r) fn(r);
    });
    cs.synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
    check();
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

inline void line(Env& e, const std::string& op, const std::string& shape, double sec, double flops,
                 double bytes) {
  if (flops > 0) {
    const double tf = flops / sec / 1e12;
    std::printf("%-34s %-30s %9.3f ms %8.1f TFLOP/s  %5.1f%% of measured GEMM (%5.1f%% of 800)\n", op.c_str(),
                shape.c_str(), sec * 1e3, tf, 100 * tf / e.peak_tflops, 100 * tf / 800);
  } else {
    const double gbs = bytes / sec / 1e9;
    std::printf("%-34s %-30s %9.3f ms %8.1f GB/s     %5.1f%% of measured copy (%5.1f%% of 4300)\n",
                op.c_str(), shape.c_str(), sec * 1e3, gbs, 100 * gbs / e.peak_gbs, 100 * gbs / 4300);
  }
  std::fflush(stdout);
}

/// Issues `launch20` (20 back-to-back calls of `flops_per_call` each, on the compute stream)
/// for `seconds`, printing the rate of every half second; returns the median of the second
/// half's rates in TFLOP/s (a GPU at its power limit settles into a lower clock under a
/// sustained load, so the first seconds read high).
inline double sustained_tflops(Env& e, double seconds, double flops_per_call,
                               const std::function<void()>& launch20) {
  Stream& cs = e.dev->stream(StreamKind::compute);
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> rates;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    int calls = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 0.5) {
      cs.launch(launch20);
      cs.synchronize();
      calls += 20;
    }
    const auto t1 = std::chrono::steady_clock::now();
    rates.push_back(flops_per_call * calls / std::chrono::duration<double>(t1 - t0).count() / 1e12);
    const double at = std::chrono::duration<double>(t1 - start).count();
    std::printf("t=%5.1f s  %6.1f TFLOP/s\n", at, rates.back());
    std::fflush(stdout);
    if (at >= seconds) break;
  }
  std::vector<double> tail(rates.begin() + long(rates.size() / 2), rates.end());
  std::sort(tail.begin(), tail.end());
  return tail[tail.size() / 2];
}

// The ceilings every line is set against, measured on this GPU: a 1 GiB device-to-device copy
// (GB/s read + written) and an 8192^3 bf16 GEMM through the backend's linear_fwd.
inline void measure_ceilings(Env& e) {
  Ops& ops = *e.ops;
  const DType bf = DType::bf16, f32 = DType::f32;
  const int64_t n = int64_t(1) << 30;  // 1 GiB each way
  void* a = rand_buffer(e, n / 4, f32, 1.f, 1);
  void* b = buffer(e, n / 4, f32);
  double s = time_op(
      e, [&](int) { ops.copy(f32, b, a, n / 4); }, 10);
  e.peak_gbs = 2.0 * double(n) / s / 1e9;
  const int64_t N = 8192;
  void* x = rand_buffer(e, N * N, bf, 1.f, 2);
  void* w = rand_buffer(e, N * N, bf, 0.02f, 3);
  void* y = buffer(e, N * N, bf);
  s = time_op(
      e, [&](int) { ops.linear_fwd(x, w, y, N, N, N); }, 10);
  e.peak_tflops = 2.0 * double(N) * N * N / s / 1e12;
  e.keep.clear();
  std::printf("ceilings: device-to-device copy %.0f GB/s (read+write), bf16 GEMM 8192^3 %.1f TFLOP/s\n\n",
              e.peak_gbs, e.peak_tflops);
}

}  // namespace rp::bench
