// Probe of cuDNN's native grouped-query attention backward: on the lent H200 it returned
// all-NaN gradients when a KV head serves 4 query heads. For ratios 2 (the control), 4 and 8
// (32 query heads, head_dim 128, bf16, causal) and several sequence lengths and batch sizes it
// runs the native backward (one sdpa_backward graph with nkv K/V heads) in variants and prints
// one line per run: how many dq/dk/dv values are not finite, their relative error against the
// expanded path (K/V copied per query head, cuDNN's multi-head backward, fp32 group sum), and
// the time of one backward.
//
//   bench_cudnn_gqa_probe [--quick]      (--quick: L = 128 and 1000 only)
//
// Variants: default; outputs and workspace zeroed first (instead of NaN-poisoned);
// deterministic algorithm (cuDNN's dP-workspace kernel on Hopper); deterministic with
// CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT=0 (frontend >= 1.x with cuDNN >= 9.25: the ordered-dQ
// kernel instead); CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT=-1 (forces the dP workspace only
// on cuDNN 8.9, kept to show it changes nothing on 9). The environment variable is read when
// a graph is built, so every variant builds its graphs afresh.
// Exit status 0 whatever cuDNN does; 1 (after one line) when a CUDA runtime call fails.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/ops_timing.hpp"
#include "kernels/device.hpp"
#include "kernels/dtype.hpp"
#ifdef RP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cudnn_attention.hpp"
#endif

#ifdef RP_HAVE_CUDA
namespace {

using rp::DType;
using rp::cuda::CudnnAttention;

void cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::printf("CUDA error in %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

struct Dev {  // a device allocation freed at scope exit
  void* p = nullptr;
  explicit Dev(size_t bytes) { cuda_ok(cudaMalloc(&p, bytes < 256 ? 256 : bytes), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

std::vector<float> randn(size_t n, uint64_t seed) {  // NormalSource values, rounded to bf16
  std::vector<float> v(n);
  rp::bench::NormalSource normal(seed);
  for (auto& x : v) x = rp::bf16_to_f32(rp::f32_to_bf16(float(normal())));
  return v;
}

void upload(void* dst, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  rp::cast_f32_to(v.data(), h.data(), int64_t(v.size()), DType::bf16);
  cuda_ok(cudaMemcpy(dst, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "upload");
}

std::vector<float> download(const void* src, size_t n) {
  std::vector<uint16_t> h(n);
  cuda_ok(cudaMemcpy(h.data(), src, n * 2, cudaMemcpyDeviceToHost), "download");
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = rp::bf16_to_f32(h[i]);
  return v;
}

void poison(void* p, size_t n) {  // bf16 NaN is 0x7fc0
  std::vector<uint16_t> h(n, uint16_t(0x7fc0));
  cuda_ok(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice), "poison");
}

struct Stat {
  size_t nonfinite = 0;
  double rel = 0;
};
Stat compare(const std::vector<float>& got, const std::vector<float>& ref) {
  Stat s;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++s.nonfinite;
      continue;
    }
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  s.rel = s.nonfinite == got.size() ? NAN : std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  return s;
}

struct Variant {
  const char* name;
  bool zeroed, deterministic;
  const char* dp_limit;  // CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT, null: unset
};

struct Problem {
  int64_t n_seq, L, nq, nkv, D;
  size_t q_n() const { return size_t(n_seq * L * nq * D); }
  size_t kv_n() const { return size_t(n_seq * L * nkv * D); }
  std::string label() const {
    char b[96];
    std::snprintf(b, sizeof b, "r=%-2lld L=%-5lld n_seq=%lld D=%-3lld", (long long)(nq / nkv), (long long)L,
                  (long long)n_seq, (long long)D);
    return b;
  }
};

struct Buffers {
  Dev q, k, v, o, dout, dq, dk, dv, lse;
  Buffers(const Problem& p)
      : q(p.q_n() * 2),
        k(p.kv_n() * 2),
        v(p.kv_n() * 2),
        o(p.q_n() * 2),
        dout(p.q_n() * 2),
        dq(p.q_n() * 2),
        dk(p.kv_n() * 2),
        dv(p.kv_n() * 2),
        lse(size_t(p.n_seq * p.nq * p.L) * 4) {}
};

// One backward with a fresh CudnnAttention (graphs built under the current environment);
// returns false with *why when cuDNN refused. *ms: time of a second, timed run.
bool backward(const Problem& p, Buffers& b, CudnnAttention::GqaBackward mode, bool det, bool zeroed, void* ws,
              size_t ws_bytes, cudaStream_t st, std::string* why, double* ms) {
  CudnnAttention a(0, st);
  a.set_gqa_backward(mode);
  a.set_deterministic(det);
  const float scale = float(1.0 / std::sqrt(double(p.D)));
  auto once = [&] {
    if (zeroed) {
      cuda_ok(cudaMemsetAsync(b.dq.p, 0, p.q_n() * 2, st), "memset dq");
      cuda_ok(cudaMemsetAsync(b.dk.p, 0, p.kv_n() * 2, st), "memset dk");
      cuda_ok(cudaMemsetAsync(b.dv.p, 0, p.kv_n() * 2, st), "memset dv");
      cuda_ok(cudaMemsetAsync(ws, 0, ws_bytes, st), "memset workspace");
    } else {
      cuda_ok(cudaStreamSynchronize(st), "sync");
      poison(b.dq.p, p.q_n());
      poison(b.dk.p, p.kv_n());
      poison(b.dv.p, p.kv_n());
    }
    return a.bwd(DType::bf16, b.q.p, b.k.p, b.v.p, b.o.p, static_cast<float*>(b.lse.p), b.dout.p, b.dq.p,
                 b.dk.p, b.dv.p, p.n_seq, p.L, p.nq, p.nkv, p.D, scale, ws, ws_bytes, why);
  };
  try {
    if (!once()) return false;
    cudaEvent_t e0, e1;
    cuda_ok(cudaEventCreate(&e0), "event");
    cuda_ok(cudaEventCreate(&e1), "event");
    cuda_ok(cudaEventRecord(e0, st), "event record");
    once();
    cuda_ok(cudaEventRecord(e1, st), "event record");
    cuda_ok(cudaEventSynchronize(e1), "event sync");
    float t = 0;
    cuda_ok(cudaEventElapsedTime(&t, e0, e1), "event time");
    *ms = t;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  } catch (const std::exception& e) {  // cuDNN accepted the graph but its execution failed
    *why = std::string("execution failed: ") + e.what();
    cuda_ok(cudaStreamSynchronize(st), "sync after a failed execution");
    return false;
  }
  return true;
}

void probe(const Problem& p, const std::vector<Variant>& variants, void* ws, size_t ws_bytes,
           cudaStream_t st) {
  Buffers b(p);
  upload(b.q.p, randn(p.q_n(), 1));
  upload(b.k.p, randn(p.kv_n(), 2));
  upload(b.v.p, randn(p.kv_n(), 3));
  upload(b.dout.p, randn(p.q_n(), 4));
  const float scale = float(1.0 / std::sqrt(double(p.D)));
  std::string why;
  try {
    CudnnAttention a(0, st);
    if (!a.fwd(DType::bf16, b.q.p, b.k.p, b.v.p, b.o.p, static_cast<float*>(b.lse.p), p.n_seq, p.L, p.nq,
               p.nkv, p.D, scale, ws, ws_bytes, &why)) {
      std::printf("%s  forward refused: %s\n", p.label().c_str(), why.c_str());
      return;
    }
  } catch (const rp::DeviceError& e) {
    std::printf("%s  forward failed: %s\n", p.label().c_str(), e.what());
    cuda_ok(cudaStreamSynchronize(st), "sync after a failed forward");
    return;
  }
  double ms = 0;
  if (!backward(p, b, CudnnAttention::GqaBackward::expand, false, false, ws, ws_bytes, st, &why, &ms)) {
    std::printf("%s  expanded backward refused: %s\n", p.label().c_str(), why.c_str());
    return;
  }
  const std::vector<float> rq = download(b.dq.p, p.q_n()), rk = download(b.dk.p, p.kv_n()),
                           rv = download(b.dv.p, p.kv_n());
  const Stat sq = compare(rq, rq), sk = compare(rk, rk);
  std::printf("%s  %-34s nonfinite dq/dk/dv %zu/%zu/%zu   %8.3f ms\n", p.label().c_str(),
              "expand (reference)", sq.nonfinite, sk.nonfinite, compare(rv, rv).nonfinite, ms);
  for (const Variant& var : variants) {
    if (var.dp_limit) setenv("CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT", var.dp_limit, 1);
    else unsetenv("CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT");
    why.clear();
    const bool ran = backward(p, b, CudnnAttention::GqaBackward::native, var.deterministic, var.zeroed, ws,
                              ws_bytes, st, &why, &ms);
    unsetenv("CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT");
    std::printf("%s  native %-27s ", p.label().c_str(), var.name);
    if (!ran) {
      std::printf("refused: %s\n", why.c_str());
      continue;
    }
    const Stat a = compare(download(b.dq.p, p.q_n()), rq), c = compare(download(b.dk.p, p.kv_n()), rk),
               d = compare(download(b.dv.p, p.kv_n()), rv);
    std::printf("nonfinite dq/dk/dv %zu/%zu/%zu   %8.3f ms   rel err vs expand dq %.2e dk %.2e dv %.2e\n",
                a.nonfinite, c.nonfinite, d.nonfinite, ms, a.rel, c.rel, d.rel);
  }
  std::fflush(stdout);
}

}  // namespace
#endif

#ifdef RP_HAVE_CUDA
namespace {
void run_probe(bool quick) {
  cudaDeviceProp prop{};
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d), cuDNN %ld\n", prop.name, prop.major, prop.minor,
              CudnnAttention::version());
  std::printf(
      "native = one sdpa_backward graph with nkv K/V heads; reference = expanded path. "
      "32 query heads, bf16, causal.\n\n");
  cudaStream_t st;
  cuda_ok(cudaStreamCreate(&st), "cudaStreamCreate");
  const std::vector<Variant> variants = {
      {"default", false, false, nullptr},      {"outputs+workspace zeroed", true, false, nullptr},
      {"deterministic", false, true, nullptr}, {"deterministic, DP_WS_LIMIT=0", false, true, "0"},
      {"DP_WS_LIMIT=-1", false, false, "-1"},
  };
  // deterministic backward's dP workspace: n_seq * 32 heads * L^2 * 2 bytes (8 GiB at 2 x 8192)
  const size_t ws_bytes = size_t(12) << 30;
  Dev ws(ws_bytes);
  std::vector<int64_t> lengths = {128, 1000, 1024, 8192};
  if (quick) lengths = {128, 1000};
  for (int64_t r : {2, 4, 8})
    for (int64_t L : lengths)
      for (int64_t n_seq : {1, 2}) probe(Problem{n_seq, L, 32, 32 / r, 128}, variants, ws.p, ws_bytes, st);
  probe(Problem{1, 1024, 32, 8, 64}, variants, ws.p, ws_bytes, st);  // head_dim 64
  cudaStreamDestroy(st);
}
}  // namespace
#endif

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (rp::cuda_device_count() == 0) {
    std::printf("no CUDA device visible: nothing to probe\n");
    return 0;
  }
#ifdef RP_HAVE_CUDA
  if (!CudnnAttention::available()) {
    std::printf("this build has no cuDNN attention: nothing to probe\n");
    return 0;
  }
  try {
    run_probe(quick);
  } catch (const std::exception& e) {  // cudnnCreate or a CUDA call inside the library
    std::printf("error: %s\n", e.what());
    return 1;
  }
#else
  (void)quick;
#endif
  return 0;
}
