// What LoRA adds to a decoder's linears on the GPU, at LLaMA-3.1-8B shapes (hidden 4096,
// 8 KV heads of 128, FFN 14336) for one 4096-token micro-batch, rank 32, bf16: per module the
// frozen base GEMM (forward, input gradient); base + adapter in the order the decoder used
// before (base GEMM, then a read-modify-write y += u B^T; the backward computing u again) beside
// adapted_linear_fwd / adapted_linear_bwd_input (adapter term written first, base GEMM
// accumulating onto it; u kept from the recompute); and the adapter's primitives one by one.
// Every adapter row prints its time as a percentage of the base GEMM's (forward rows of the
// forward GEMM, backward rows of the input-gradient GEMM).
//
//   bench_lora_ops_bench [--quick] [--tokens T] [--rank R]
//
// Timing as bench_cuda_ops_bench (bench/ops_timing.hpp): each op issued back to back on the
// compute stream, median over trials. FLOPs 2*M*N*K per GEMM; the adapter rows print ms and
// the fraction of the base GEMM they add.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench/ops_timing.hpp"
#include "model/layer_memory.hpp"
#include "model/lora_linear.hpp"

using namespace rp;
using namespace rp::bench;

namespace {

struct Module {
  const char* name;
  LoraModule module;
  int64_t in, out;
};

void module_rows(Env& e, const Module& m, int64_t T, int64_t r, int R) {
  Ops& ops = *e.ops;
  const DType bf = DType::bf16, f32 = DType::f32;
  void* x = rand_buffer(e, T * m.in, bf, 1.f, 10);
  void* w = rand_buffer(e, m.out * m.in, bf, 0.02f, 11);
  void* y = rand_buffer(e, T * m.out, bf, 1.f, 12);
  void* dy = rand_buffer(e, T * m.out, bf, 1.f, 13);
  void* dx = rand_buffer(e, T * m.in, bf, 1.f, 14);
  // the adapter group: A [r, in] then B [out, r]; its fp32 gradient accumulator
  void* params = rand_buffer(e, r * m.in + m.out * r, bf, 0.02f, 15);
  void* grads = rand_buffer(e, r * m.in + m.out * r, f32, 0.01f, 16);
  LoraLinear l;
  l.module = int(m.module);
  l.in = m.in;
  l.out = m.out;
  l.r = r;
  l.a_off = 0;
  l.b_off = r * m.in;
  LoraCall c;
  c.ops = &ops;
  c.params = params;
  c.grads = grads;
  c.scaling = 2.f;
  c.ax = buffer(e, T * r, bf);
  c.g = buffer(e, T * r, bf);
  const char* a = static_cast<const char*>(params);
  const void* A = a;
  const void* B = a + size_t(l.b_off) * 2;
  float* dA = static_cast<float*>(grads);
  float* dB = dA + l.b_off;
  const std::string shape = std::string(m.name) + " T=" + std::to_string(T) + " " + std::to_string(m.in) +
                            "->" + std::to_string(m.out) + " r=" + std::to_string(r);
  const double base_fl = 2.0 * double(T) * double(m.in) * double(m.out);
  const double fwd = time_op(
      e, [&](int) { ops.linear_fwd(x, w, y, T, m.in, m.out); }, R);
  line(e, "base linear_fwd", shape, fwd, base_fl, 0);
  const double bwd = time_op(
      e, [&](int) { ops.linear_bwd_input(dy, w, dx, T, m.in, m.out, true); }, R);
  line(e, "base linear_bwd_input (+=)", shape, bwd, base_fl, 0);
  auto extra = [&](const char* what, double sec, double base) {
    std::printf("%-34s %-30s %9.3f ms   %6.1f%% of the base GEMM's time\n", what, shape.c_str(), sec * 1e3,
                100 * sec / base);
    std::fflush(stdout);
  };
  // the order before adapted_linear_fwd: base GEMM, then u and a read-modify-write y += u B^T
  const double fwd_old = time_op(
      e,
      [&](int) {
        ops.linear_fwd(x, w, y, T, m.in, m.out);
        ops.fill(bf, c.ax, T * r, 0.f);
        ops.linear_fwd_add(x, A, c.ax, T, m.in, r, c.scaling);
        ops.linear_fwd_add(c.ax, B, y, T, r, m.out, 1.f);
      },
      R);
  extra("fwd: base, then y += u B^T", fwd_old, fwd);
  extra("fwd: adapted_linear_fwd",
        time_op(
            e, [&](int) { adapted_linear_fwd(ops, c, l, x, w, y, T, m.in, m.out, 0); }, R),
        fwd);
  // backward before: base dx = dy W, then the adapter with its u computed again and dx += g A
  extra("bwd: base, then adapter (dx +=)",
        time_op(
            e,
            [&](int) {
              ops.linear_bwd_input(dy, w, dx, T, m.in, m.out, false);
              lora_backward(c, l, x, dy, dx, T, 0, true, false);
            },
            R),
        bwd);
  c.u_keep = buffer(e, int64_t(kAdaptedLinears) * T * r, bf);
  c.u_rows = T;
  adapted_linear_fwd(ops, c, l, x, w, y, T, m.in, m.out, 0);  // leaves u in its slot
  extra(
      "bwd: adapted_linear_bwd_input",
      time_op(
          e, [&](int) { adapted_linear_bwd_input(ops, c, l, x, dy, w, dx, T, m.in, m.out, false, 0, true); },
          R),
      bwd);
  c.u_keep = nullptr;
  extra("  u = s x A^T (fill + fwd_add)",
        time_op(
            e,
            [&](int) {
              ops.fill(bf, c.ax, T * r, 0.f);
              ops.linear_fwd_add(x, A, c.ax, T, m.in, r, c.scaling);
            },
            R),
        fwd);
  extra("  y += u B^T (fwd_add, K=r)",
        time_op(
            e, [&](int) { ops.linear_fwd_add(c.ax, B, y, T, r, m.out, 1.f); }, R),
        fwd);
  extra("  y = u B^T (linear_fwd, K=r)",
        time_op(
            e, [&](int) { ops.linear_fwd(c.ax, B, y, T, r, m.out); }, R),
        fwd);
  extra("  dB += dy^T u",
        time_op(
            e, [&](int) { ops.linear_bwd_weight(dy, c.ax, dB, T, r, m.out); }, R),
        bwd);
  extra("  g = dy B",
        time_op(
            e, [&](int) { ops.linear_bwd_input(dy, B, c.g, T, r, m.out, false); }, R),
        bwd);
  extra("  dA += g^T x",
        time_op(
            e, [&](int) { ops.linear_bwd_weight(c.ax, x, dA, T, m.in, r); }, R),
        bwd);
  extra("  dx += g A",
        time_op(
            e, [&](int) { ops.linear_bwd_input(c.ax, A, dx, T, m.in, r, true); }, R),
        bwd);
  e.keep.clear();
}

}  // namespace

int main(int argc, char** argv) {
  Env e;
  int64_t T = 4096, r = 32;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      e.quick = true;
    } else if ((std::strcmp(argv[i], "--tokens") == 0 || std::strcmp(argv[i], "--rank") == 0) &&
               i + 1 < argc) {
      char* end = nullptr;
      const long long v = std::strtoll(argv[i + 1], &end, 10);
      if (!end || *end || v < 1 || v > 1 << 20) {
        std::fprintf(stderr, "bench_lora_ops_bench: %s: expected an integer in 1..1048576, got '%s'\n",
                     argv[i], argv[i + 1]);
        return 2;
      }
      (std::strcmp(argv[i], "--tokens") == 0 ? T : r) = v;
      ++i;
    } else {
      std::fprintf(stderr,
                   "bench_lora_ops_bench: unknown argument '%s' (expected --quick, --tokens T, --rank R)\n",
                   argv[i]);
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device visible: nothing to measure\n");
    return 0;
  }
  try {
    DeviceOptions o;
    o.capacity_bytes = size_t(40) << 30;
    e.dev = make_cuda_device(0, o);
    e.ops = &e.dev->ops();
    std::printf("device: %s\n", e.dev->name().c_str());
    measure_ceilings(e);
    const int R = e.quick ? 5 : 20;
    const Module ms[] = {{"q_proj", LoraModule::q, 4096, 4096},
                         {"k_proj", LoraModule::k, 4096, 1024},
                         {"gate_proj", LoraModule::gate, 4096, 14336},
                         {"down_proj", LoraModule::down, 14336, 4096}};
    for (const Module& m : ms) module_rows(e, m, T, r, R);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "bench_lora_ops_bench: %s\n", ex.what());
    return 1;
  }
  return 0;
}
