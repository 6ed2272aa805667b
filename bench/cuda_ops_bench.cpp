// Throughput of the CUDA backend's ops at Qwen3-1.7B shapes (hidden 2048, 16 query /
// 8 kv heads, head_dim 128, FFN 6144, vocab 151936, one sequence of 8192 tokens), one
// line per op with TFLOP/s or GB/s against the ceilings measured first on the same GPU
// (a device-to-device copy; an 8192^3 bf16 GEMM through the backend's own linear_fwd).
// Attention is also measured for 1, 2, 4, 8 and 16 query heads per KV head (32 query heads,
// L = 8192, head_dim 128): cuDNN's forward, its backward through the expanded GQA path (with
// the scratch of the Ops contract and with 4x that), through its native GQA graph (timed only
// when its gradients are finite), our flash kernels, and the expand / group-sum kernels alone.
//
// Frozen-weight dequantization (Ops::dequantize) is measured for each storage form on 50M
// values into the compute dtype: GB/s of storage read, of output written, and both.
//
// The mixture-of-experts ops are measured at Qwen3-30B-A3B shapes (moe_rows below), GPT-OSS's
// attention variants (sliding window 128, sinks) at 8 x 4096 tokens, 64/8 heads, D=64
// (attention_variants below).
//
//   bench_cuda_ops_bench [--quick] [--dequant] [--moe] [--gptoss] [--sustained S]  (--dequant /
//                          --moe / --gptoss: the ceilings and that section only; --sustained:
//                          the 8192^3 GEMM back to back for S seconds, its rate per half second)
//
// Timing: each op is issued R times back to back on the compute stream, then the stream
// is synchronised; the time per call is the median over 5 such trials, after warm-up.
// Memory-bound ops rotate over 4 input sets so the 60 MB L2 does not serve them.
// Inputs are random (never zeros). FLOP counts: GEMM 2*M*N*K; causal attention forward
// 2*2*L^2/2*D*nq (two matmuls over half the score matrix), backward 2.5x that;
// LM head + CE 2*T*H*V forward, 6*T*H*V with both gradients. Bytes: each input read
// once plus each output written once (read-modify-write outputs count twice).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/ops_timing.hpp"
#include "kernels/device.hpp"
#include "kernels/ops.hpp"
#include "kernels/weight_format.hpp"
#ifdef RP_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

using namespace rp;
using namespace rp::bench;

namespace {

// Ops::dequantize of n = 50M values (a multiple of every block) per storage form into the
// compute dtype, two rotating storage/output sets (each larger than the L2 together);
// values normal with sigma 0.02 (weights), quantized on the host. Bytes read: the storage
// (weight_format_bytes); written: n values of the compute dtype.
void dequantize_rows(Env& e, int R) {
  Ops& ops = *e.ops;
  const int64_t n = 50'000'000;
  const DType ct = ops.dtype();
  std::printf("\n-- dequantize (frozen weights, 50M values -> %s) --\n", dtype_name(ct));
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 0.02f);
  for (auto& x : v) x = nd(rng);
  Stream& cs = e.dev->stream(StreamKind::compute);
  auto row = [&](WeightFormat f, size_t src_off) {
    const size_t bytes = weight_format_bytes(f, n);
    std::vector<uint8_t> q(bytes);
    quantize_weights(f, v.data(), q.data(), n);
    std::vector<void*> src(2), dst(2);
    for (int s = 0; s < 2; ++s) {
      char* p = static_cast<char*>(buffer(e, int64_t(bytes + src_off + 3) / 4, DType::i32)) + src_off;
      for (size_t i = 0; i < bytes; i += size_t(16) << 20) {
        cs.copy_h2d(p + i, q.data() + i, std::min(size_t(16) << 20, bytes - i));
        cs.synchronize();
      }
      src[size_t(s)] = p;
      dst[size_t(s)] = buffer(e, n, ct);
    }
    const double sec = time_op(
        e, [&](int r) { ops.dequantize(f, src[size_t(r % 2)], dst[size_t(r % 2)], n); }, R);
    const double rd = double(bytes) / sec / 1e9, wr = double(n) * double(dtype_size(ct)) / sec / 1e9;
    const std::string op =
        std::string("dequantize ") + weight_format_name(f) + (src_off ? " (src +2 bytes)" : "");
    std::printf(
        "%-34s %9.3f ms  read %7.1f GB/s  written %7.1f GB/s  total %7.1f GB/s  %5.1f%% of measured copy\n",
        op.c_str(), sec * 1e3, rd, wr, rd + wr, 100 * (rd + wr) / e.peak_gbs);
    std::fflush(stdout);
    e.keep.clear();
  };
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16, WeightFormat::q8_0,
                         WeightFormat::q4_0, WeightFormat::nf4})
    row(f, 0);
  row(WeightFormat::q8_0, 2);  // a tensor that does not start at a 16-byte boundary
}

// Mixture-of-experts block at Qwen3-30B-A3B shapes: T = 4096 tokens routed to k = 8 of
// E = 128 experts (random logits: about T*k/E = 256 rows per expert), hidden 2048, expert
// FFN 768, bf16. Routing, the sort (with its host round trip), the gathers / combines, and
// the grouped linears per projection in the three grouped-GEMM modes (cuda_backend.hpp), next to
// one dense GEMM over all T*k rows as their ceiling. FLOPs of a grouped linear 2*T*k*K*N.
void moe_rows(Env& e, int R) {
  Ops& ops = *e.ops;
  const DType bf = DType::bf16, f32 = DType::f32, i32 = DType::i32;
  const int64_t T = 4096, E = 128, k = 8, H = 2048, F = 768, Rw = T * k;
  std::printf("\n-- mixture of experts (Qwen3-30B-A3B: T=4096, E=128, k=8, H=2048, F=768, bf16) --\n");
  void* logits = rand_buffer(e, T * E, bf, 1.f, 200);
  float* probs = static_cast<float*>(buffer(e, T * E, f32));
  float* tw = static_cast<float*>(buffer(e, T * k, f32));
  float* stats = static_cast<float*>(buffer(e, 2 * E, f32));
  auto* idx = static_cast<int32_t*>(buffer(e, Rw, i32));
  auto* off = static_cast<int32_t*>(buffer(e, E + 1, i32));
  auto* row = static_cast<int32_t*>(buffer(e, Rw, i32));
  auto* token = static_cast<int32_t*>(buffer(e, Rw, i32));
  std::vector<int32_t> off_h(size_t(E + 1), 0);
  const std::string sr = "T=4096 E=128 k=8";
  line(e, "moe_route (+stats)", sr,
       time_op(
           e, [&](int) { ops.moe_route(logits, probs, idx, tw, stats, T, E, k, true); }, R),
       0, double(T * E) * 6 + double(Rw) * 8);
  line(e, "moe_sort (+ offsets to host, wait)", sr,
       time_op(
           e, [&](int) { ops.moe_sort(idx, off, off_h.data(), row, token, T, E, k); }, R),
       0, double(Rw) * 12);
  int64_t lo = Rw, hi = 0;
  for (int64_t ex = 0; ex < E; ++ex) {
    lo = std::min<int64_t>(lo, off_h[size_t(ex + 1)] - off_h[size_t(ex)]);
    hi = std::max<int64_t>(hi, off_h[size_t(ex + 1)] - off_h[size_t(ex)]);
  }
  std::printf("rows per expert: %lld .. %lld\n", (long long)lo, (long long)hi);
  void* x = rand_buffer(e, T * H, bf, 1.f, 201);
  void* xs = rand_buffer(e, Rw * H, bf, 1.f, 202);
  void* ys = rand_buffer(e, Rw * H, bf, 1.f, 203);
  void* y = buffer(e, T * H, bf);
  void* dys = buffer(e, Rw * H, bf);
  float* dtw = static_cast<float*>(buffer(e, Rw, f32));
  const double RH = double(Rw * H) * 2, TH = double(T * H) * 2;
  const std::string sh = "R=32768 H=2048 bf16";
  line(e, "gather_rows", sh,
       time_op(
           e, [&](int) { ops.gather_rows(x, token, xs, Rw, H); }, R),
       0, 2 * RH);
  line(e, "moe_combine", sh,
       time_op(
           e, [&](int) { ops.moe_combine(ys, tw, row, y, T, k, H, false); }, R),
       0, RH + TH);
  line(e, "moe_combine_bwd", sh,
       time_op(
           e, [&](int) { ops.moe_combine_bwd(y, ys, tw, row, dys, dtw, T, k, H); }, R),
       0, TH + 2 * RH);
  line(e, "moe_gather_bwd", sh,
       time_op(
           e, [&](int) { ops.moe_gather_bwd(ys, row, y, T, k, H, false); }, R),
       0, RH + TH);
  struct P {
    const char* name;
    int64_t K, N;
  } ps[] = {{"gate / up", H, F},
            {"down", F, H},
            // per-expert LoRA adapters, rank 32: A of gate_up and down, B of gate (up) and down
            {"lora A gate_up", H, 32},
            {"lora B gate", 32, F},
            {"lora A down", F, 32},
            {"lora B down", 32, H}};
  for (const P& p : ps) {
    void* a = rand_buffer(e, Rw * p.K, bf, 1.f, 210);
    void* w = rand_buffer(e, E * p.N * p.K, bf, 0.02f, 211);
    void* b = buffer(e, Rw * p.N, bf);
    void* db = rand_buffer(e, Rw * p.N, bf, 1.f, 212);
    void* da = buffer(e, Rw * p.K, bf);
    void* dw = rand_buffer(e, E * p.N * p.K, f32, 0.01f, 213);
    const double fl = 2.0 * double(Rw) * double(p.K) * double(p.N);
    const std::string shape = std::string(p.name) + " K=" + std::to_string(p.K) + " N=" + std::to_string(p.N);
    line(e, "dense linear_fwd, all rows (ceiling)", shape,
         time_op(
             e, [&](int) { ops.linear_fwd(a, w, b, Rw, p.K, p.N); }, R),
         fl, 0);
#ifdef RP_HAVE_CUDA
    for (int mode : {0, 1, 2}) {
      rp::cuda::set_grouped_gemm(ops, mode);
      const std::string tag = mode == 0 ? " [loop]" : mode == 1 ? " [grouped]" : " [streams]";
#else
    {
      const std::string tag;
#endif
      line(e, "grouped_linear_fwd" + tag, shape,
           time_op(
               e, [&](int) { ops.grouped_linear_fwd(a, w, b, off_h.data(), E, p.K, p.N); }, R),
           fl, 0);
      line(e, "grouped_linear_bwd_input" + tag, shape,
           time_op(
               e, [&](int) { ops.grouped_linear_bwd_input(db, w, da, off_h.data(), E, p.K, p.N, false); }, R),
           fl, 0);
      line(e, "grouped_linear_bwd_weight" + tag, shape,
           time_op(
               e, [&](int) { ops.grouped_linear_bwd_weight(db, a, dw, off_h.data(), E, p.K, p.N); }, R),
           fl, 0);
    }
#ifdef RP_HAVE_CUDA
    if (std::min(p.K, p.N) <= 64) {  // the grouped mode without our low-rank kernels: cuBLAS's grouped call
      rp::cuda::set_grouped_gemm(ops, 1);
      rp::cuda::set_grouped_lowrank_kernel(ops, false);
      line(e, "grouped_linear_fwd [cuBLAS grouped]", shape,
           time_op(
               e, [&](int) { ops.grouped_linear_fwd(a, w, b, off_h.data(), E, p.K, p.N); }, R),
           fl, 0);
      line(e, "grouped_linear_bwd_input [cuBLAS grouped]", shape,
           time_op(
               e, [&](int) { ops.grouped_linear_bwd_input(db, w, da, off_h.data(), E, p.K, p.N, false); }, R),
           fl, 0);
      rp::cuda::set_grouped_lowrank_kernel(ops, true);
    }
    if (std::min(p.K, p.N) > 64) {  // our one-launch weight-gradient kernel on a full shape too
      rp::cuda::set_grouped_gemm(ops, 1);
      rp::cuda::set_grouped_wgrad_kernel_max(ops, INT64_MAX);
      line(e, "grouped_linear_bwd_weight [kernel]", shape,
           time_op(
               e, [&](int) { ops.grouped_linear_bwd_weight(db, a, dw, off_h.data(), E, p.K, p.N); }, R),
           fl, 0);
      rp::cuda::set_grouped_wgrad_kernel_max(ops, 64);
    }
#endif
  }
#ifdef RP_HAVE_CUDA
  rp::cuda::set_grouped_gemm(ops, 1);  // the default
#endif
  e.keep.clear();
}

#ifdef RP_HAVE_CUDA
// Runs fn once on the compute stream; false (with *err) when it threw or the stream failed.
bool try_once(Env& e, const std::function<void()>& fn, std::string* err) {
  Stream& cs = e.dev->stream(StreamKind::compute);
  std::string x;
  cs.launch([&] { fn(); });
  cs.then([&](const std::string& m) { x = m; });
  cs.synchronize();
  *err = x;
  return x.empty();
}

// Non-finite values among n bf16 elements on the device.
size_t count_nonfinite_bf16(Env& e, const void* p, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  Stream& cs = e.dev->stream(StreamKind::compute);
  cs.copy_d2h(h.data(), p, size_t(n) * 2);
  cs.synchronize();
  size_t bad = 0;
  for (uint16_t x : h) bad += (x & 0x7f80u) == 0x7f80u ? 1 : 0;
  return bad;
}

// GPT-OSS attention (Ops::attention_fwd_v / attention_bwd_v) at 8 sequences of 4096 tokens,
// 64 query / 8 kv heads, head_dim 64: plain causal, causal with sinks, window 128 with and
// without sinks (impl 0: tensor cores; impl 1: the row kernels). FLOPs count the visible keys
// only: 4*D*nq per (row, visible key) forward, 2.5x that backward.
void attention_variants(Env& e, int R) {
  Ops& ops = *e.ops;
  const DType bf = DType::bf16, f32 = DType::f32;
  const int64_t S = 8, L = 4096, nq = 64, nkv = 8, D = 64, T = S * L;
  const float scale = 0.125f;
  void* q = rand_buffer(e, T * nq * D, bf, 1.f, 130);
  void* k = rand_buffer(e, T * nkv * D, bf, 1.f, 131);
  void* v = rand_buffer(e, T * nkv * D, bf, 1.f, 132);
  void* dout = rand_buffer(e, T * nq * D, bf, 1.f, 133);
  void* sinks = rand_buffer(e, nq, bf, 1.f, 134);
  float* dsinks = static_cast<float*>(buffer(e, nq, f32));
  void *out = buffer(e, T * nq * D, bf), *dq = buffer(e, T * nq * D, bf);
  void *dk = buffer(e, T * nkv * D, bf), *dv = buffer(e, T * nkv * D, bf);
  float* lse = static_cast<float*>(buffer(e, S * nq * L, f32));
  void* scratch = buffer(e, int64_t(Ops::attention_scratch_bytes(S, L, nq, nkv, D) + 3) / 4, DType::i32);
  std::printf("\n-- GPT-OSS attention variants (8 x 4096 tokens, 64/8 heads, D=64) --\n");
  for (int64_t window : {int64_t(0), int64_t(128)})
    for (bool with_sinks : {false, true})
      for (int impl : {0, 1}) {
        if (impl == 1 && window == 0) continue;  // the row kernels at full causal length: too slow to matter
        Ops::AttentionVariant var;
        var.window = window;
        var.sinks = with_sinks ? sinks : nullptr;
        var.dsinks = with_sinks ? dsinks : nullptr;
        const double keys =
            window ? double(window) * L - double(window) * (window - 1) / 2 : double(L) * (L + 1) / 2;
        const double fl = 4.0 * D * nq * S * keys;
        const std::string tag = std::string(window ? " w=128" : " causal") + (with_sinks ? " +sinks" : "") +
                                (impl == 1 ? " [rows]" : "");
        rp::cuda::set_attention_impl(ops, impl);
        line(e, "attention_fwd_v" + tag, "8x4096 64/8 heads D=64",
             time_op(
                 e,
                 [&](int) { ops.attention_fwd_v(q, k, v, out, lse, S, L, nq, nkv, D, scale, var, scratch); },
                 R),
             fl, 0);
        line(e, "attention_bwd_v" + tag, "8x4096 64/8 heads D=64",
             time_op(
                 e,
                 [&](int) {
                   ops.attention_bwd_v(q, k, v, out, lse, dout, dq, dk, dv, S, L, nq, nkv, D, scale, var,
                                       scratch);
                 },
                 R),
             2.5 * fl, 0);
      }
  rp::cuda::set_attention_impl(ops, 0);
  e.keep.clear();
}

// Causal attention with 32 query heads at L = 8192, D = 128 for nkv = 32, 16, 8, 4, 2.
void attention_by_gqa_ratio(Env& e, int R) {
  Ops& ops = *e.ops;
  const DType bf = DType::bf16, f32 = DType::f32;
  const int64_t L = 8192, nq = 32, D = 128;
  const float scale = float(1.0 / std::sqrt(double(D)));
  const double fl = 2.0 * 2.0 * double(L) * double(L) / 2.0 * D * nq;
  const bool cudnn = rp::cuda::cudnn_attention_available();
  std::printf("\n-- attention by query heads per KV head (L=8192, 32 query heads, D=128) --\n");
  for (int64_t nkv : {int64_t(32), int64_t(16), int64_t(8), int64_t(4), int64_t(2)}) {
    const int64_t r = nq / nkv;
    void* q = rand_buffer(e, L * nq * D, bf, 1.f, 120);
    void* k = rand_buffer(e, L * nkv * D, bf, 1.f, 121);
    void* v = rand_buffer(e, L * nkv * D, bf, 1.f, 122);
    void* dout = rand_buffer(e, L * nq * D, bf, 1.f, 123);
    void* out = buffer(e, L * nq * D, bf);
    float* lse = static_cast<float*>(buffer(e, nq * L, f32));
    void* dq = buffer(e, L * nq * D, bf);
    void* dk = buffer(e, L * nkv * D, bf);
    void* dv = buffer(e, L * nkv * D, bf);
    const size_t contract = Ops::attention_scratch_bytes(1, L, nq, nkv, D);
    void* scratch = buffer(e, int64_t(4 * contract + 3) / 4, DType::i32);  // 4x the contract
    const std::string shape = "L=8192 " + std::to_string(nq) + "/" + std::to_string(nkv) + " heads D=128";
    auto fwd = [&](int impl, const char* tag) {
      rp::cuda::set_attention_impl(ops, impl);
      line(e, std::string("attention_fwd r=") + std::to_string(r) + tag, shape,
           time_op(
               e, [&](int) { ops.attention_fwd(q, k, v, out, lse, 1, L, nq, nkv, D, scale, scratch); }, R),
           fl, 0);
    };
    auto bwd_call = [&] {
      ops.attention_bwd(q, k, v, out, lse, dout, dq, dk, dv, 1, L, nq, nkv, D, scale, scratch);
    };
    // impl: 3 ours, 4 cuDNN (gqa: 1 native, 2 expand); scratch_x: multiple of the contract
    auto bwd = [&](int impl, int gqa, int scratch_x, std::string tag) {
      rp::cuda::set_attention_impl(ops, impl);
      rp::cuda::set_attention_gqa(ops, gqa);
      rp::cuda::set_attention_scratch_bytes(ops, scratch_x == 1 ? 0 : scratch_x * contract);
      std::string err;
      const bool ok = try_once(e, bwd_call, &err);
      const size_t bad = ok ? count_nonfinite_bf16(e, dq, L * nq * D) +
                                  count_nonfinite_bf16(e, dk, L * nkv * D) +
                                  count_nonfinite_bf16(e, dv, L * nkv * D)
                            : 0;
      if (impl == 4) tag += " passes=" + std::to_string(rp::cuda::attention_bwd_passes(ops));
      const std::string op = "attention_bwd r=" + std::to_string(r) + tag;
      if (!ok) std::printf("%-34s %-30s failed: %s\n", op.c_str(), shape.c_str(), err.c_str());
      else if (bad > 0)
        std::printf("%-34s %-30s %zu of %lld gradient values not finite: not timed\n", op.c_str(),
                    shape.c_str(), bad, (long long)(L * (nq + 2 * nkv) * D));
      else
        line(e, op, shape,
             time_op(
                 e, [&](int) { bwd_call(); }, R),
             2.5 * fl, 0);
      std::fflush(stdout);
    };
    if (cudnn) fwd(4, " [cuDNN]");
    fwd(3, " [cfg 3]");
    if (cudnn) {
      bwd(4, 2, 1, r == 1 ? " [cuDNN]" : " [cuDNN expand]");
      if (r > 1) {
        bwd(4, 2, 4, " [cuDNN expand 4x]");
        bwd(4, 1, 1, " [cuDNN native]");
      }
    }
    bwd(3, 0, 1, " [cfg 3]");
    rp::cuda::set_attention_impl(ops, 0);
    rp::cuda::set_attention_gqa(ops, 0);
    rp::cuda::set_attention_scratch_bytes(ops, 0);
    if (r > 1) {  // the expand / group-sum kernels over all heads (the single-pass case)
      char* x = static_cast<char*>(scratch);
      const size_t eb = size_t(L * nq * D) * 2;  // one expanded tensor
      if (4 * eb <= 4 * contract) {
        void *ke = x, *ve = x + eb, *dke = x + 2 * eb, *dve = x + 3 * eb;
        const double ex = double(2 * L * (nkv + nq) * D) * 2;  // read K, V; write expanded
        const double s1 = time_op(
            e, [&](int) { rp::cuda::gqa_expand_kv(ops, k, v, ke, ve, L, nkv, 0, nq, r, D); }, R);
        line(e, "gqa_expand_kv r=" + std::to_string(r), shape, s1, 0, ex);
        const double s2 = time_op(
            e,
            [&](int) {
              rp::cuda::gqa_group_sum(ops, bf, dke, dve, bf, dk, dv, nkv * D, L, nkv, r, D, false);
            },
            R);
        line(e, "gqa_group_sum r=" + std::to_string(r), shape, s2, 0, ex);
        std::printf("  expand + group sum move %.0f MB: %.0f us at 4 TB/s, measured %.0f us\n", 2 * ex / 1e6,
                    2 * ex / 4e12 * 1e6, (s1 + s2) * 1e6);
      }
    }
    e.keep.clear();
  }
}
#endif

// The 8192^3 bf16 GEMM issued back to back for `seconds`: TFLOP/s per half second. The
// ceilings above come from bursts of ~15 ms; a GPU at its power limit lowers its clock under
// a sustained load (watch it with nvidia-smi --query-gpu=clocks.sm,power.draw), and a training
// step's GEMMs run at the sustained rate.
void sustained_gemm(Env& e, double seconds) {
  Ops& ops = *e.ops;
  const int64_t N = 8192;
  const DType bf = DType::bf16;
  void* x = rand_buffer(e, N * N, bf, 1.f, 2);
  void* w = rand_buffer(e, N * N, bf, 0.02f, 3);
  void* y = buffer(e, N * N, bf);
  const double fl = 2.0 * double(N) * N * N;
  std::printf("\n-- sustained bf16 GEMM 8192^3, %.0f s --\n", seconds);
  const double tf = sustained_tflops(e, seconds, fl, [&] {
    for (int r = 0; r < 20; ++r) ops.linear_fwd(x, w, y, N, N, N);
  });
  std::printf("sustained (median of the second half): %.1f TFLOP/s; burst ceiling %.1f TFLOP/s (%.0f%%)\n",
              tf, e.peak_tflops, 100 * tf / e.peak_tflops);
  e.keep.clear();
}

}  // namespace

int main(int argc, char** argv) {
  Env e;
  double sustained_s = 0;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--quick") == 0) e.quick = true;
    else if (std::strcmp(argv[i], "--dequant") == 0) e.dequant_only = true;
    else if (std::strcmp(argv[i], "--moe") == 0) e.moe_only = true;
    else if (std::strcmp(argv[i], "--gptoss") == 0) e.gptoss_only = true;
    else if (std::strcmp(argv[i], "--sustained") == 0 && i + 1 < argc) sustained_s = std::atof(argv[++i]);
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device visible: nothing to measure\n");
    return 0;
  }
  DeviceOptions o;
  o.capacity_bytes = size_t(120) << 30;
  e.dev = make_cuda_device(0, o);
  e.ops = &e.dev->ops();
  Ops& ops = *e.ops;
  const DType bf = DType::bf16, f32 = DType::f32;
  std::printf("device: %s\n", e.dev->name().c_str());

  measure_ceilings(e);
  if (sustained_s > 0) {
    sustained_gemm(e, sustained_s);
    return 0;
  }

  const int64_t T = 8192, H = 2048, nq = 16, nkv = 8, D = 128, F = 6144, V = 151936;
  const int64_t Q = nq * D, KV = nkv * D;
  const int R = e.quick ? 3 : 10;
  if (e.dequant_only) {
    dequantize_rows(e, 2 * R);
    return 0;
  }
  if (e.moe_only) {
    moe_rows(e, R);
    return 0;
  }
#ifdef RP_HAVE_CUDA
  if (e.gptoss_only) {
    attention_variants(e, R);
    return 0;
  }
#endif

  // ---- GEMMs (the decoder layer's projections) ------------------------------------------
  {
    struct G {
      const char* name;
      int64_t K, N;
    } gs[] = {{"q_proj / o_proj^T", H, Q},
              {"k_proj / v_proj", H, KV},
              {"gate_proj / up_proj", H, F},
              {"down_proj", F, H}};
    for (auto& g : gs) {
      void* x = rand_buffer(e, T * g.K, bf, 1.f, 10);
      void* w = rand_buffer(e, g.N * g.K, bf, 0.02f, 11);
      void* y = buffer(e, T * g.N, bf);
      void* dy = rand_buffer(e, T * g.N, bf, 1.f, 12);
      void* dx = buffer(e, T * g.K, bf);
      void* dw = rand_buffer(e, g.N * g.K, f32, 0.01f, 13);
      const double fl = 2.0 * T * g.N * g.K;
      const std::string shape =
          "M=" + std::to_string(T) + " K=" + std::to_string(g.K) + " N=" + std::to_string(g.N);
      line(e, std::string("linear_fwd ") + g.name, shape,
           time_op(
               e, [&](int) { ops.linear_fwd(x, w, y, T, g.K, g.N); }, R),
           fl, 0);
      line(e, "linear_bwd_input", shape,
           time_op(
               e, [&](int) { ops.linear_bwd_input(dy, w, dx, T, g.K, g.N, false); }, R),
           fl, 0);
      line(e, "linear_bwd_weight (+= f32)", shape,
           time_op(
               e, [&](int) { ops.linear_bwd_weight(dy, x, dw, T, g.K, g.N); }, R),
           fl, 0);
      e.keep.clear();
    }
  }

  // ---- attention --------------------------------------------------------------------------
  for (int64_t L : {int64_t(8192), int64_t(65536)}) {
    if (e.quick && L > 8192) break;
    void* q = rand_buffer(e, L * Q, bf, 1.f, 20);
    void* k = rand_buffer(e, L * KV, bf, 1.f, 21);
    void* v = rand_buffer(e, L * KV, bf, 1.f, 22);
    void* dout = rand_buffer(e, L * Q, bf, 1.f, 23);
    void* out = buffer(e, L * Q, bf);
    float* lse = static_cast<float*>(buffer(e, nq * L, f32));
    void* dq = buffer(e, L * Q, bf);
    void* dk = buffer(e, L * KV, bf);
    void* dv = buffer(e, L * KV, bf);
    void* scratch = buffer(e, int64_t(Ops::attention_scratch_bytes(1, L, nq, nkv, D) + 3) / 4, DType::i32);
    const float scale = float(1.0 / std::sqrt(double(D)));
    const double fl = 2.0 * 2.0 * double(L) * double(L) / 2.0 * D * nq;
    const int r = L > 8192 ? 1 : R;
    const std::string shape = "L=" + std::to_string(L) + " 16/8 heads D=128";
#ifdef RP_HAVE_CUDA
    for (int impl : {2, 3, 4}) {  // our two flash configurations and cuDNN's flash attention
      if (L > 8192 && impl == 2) continue;
      if (impl == 4 && !rp::cuda::cudnn_attention_available()) continue;
      rp::cuda::set_attention_impl(ops, impl);
      const std::string tag = impl == 2 ? " [cfg 2]" : impl == 3 ? " [cfg 3]" : " [cuDNN]";
#else
    {
      const std::string tag;
#endif
      line(e, "attention_fwd (causal GQA)" + tag, shape,
           time_op(
               e, [&](int) { ops.attention_fwd(q, k, v, out, lse, 1, L, nq, nkv, D, scale, scratch); }, r),
           fl, 0);
      line(e, "attention_bwd" + tag, shape,
           time_op(
               e,
               [&](int) {
                 ops.attention_bwd(q, k, v, out, lse, dout, dq, dk, dv, 1, L, nq, nkv, D, scale, scratch);
               },
               r),
           2.5 * fl, 0);
    }
#ifdef RP_HAVE_CUDA
    rp::cuda::set_attention_impl(ops, 0);
#endif
    e.keep.clear();
  }
#ifdef RP_HAVE_CUDA
  attention_by_gqa_ratio(e, R);
  attention_variants(e, R);
#endif

  // ---- memory-bound ops (4 rotating input sets) --------------------------------------------
  {
    constexpr int kSets = 4;
    std::vector<void*> x(kSets), y(kSets), dy(kSets), dx(kSets), g(kSets), u(kSets), h(kSets), dg(kSets),
        du(kSets), qv(kSets), a32(kSets);
    for (int s = 0; s < kSets; ++s) {
      x[size_t(s)] = rand_buffer(e, T * H, bf, 1.f, 30 + s);
      y[size_t(s)] = buffer(e, T * H, bf);
      dy[size_t(s)] = rand_buffer(e, T * H, bf, 1.f, 40 + s);
      dx[size_t(s)] = buffer(e, T * H, bf);
      g[size_t(s)] = rand_buffer(e, T * F, bf, 1.f, 50 + s);
      u[size_t(s)] = rand_buffer(e, T * F, bf, 1.f, 60 + s);
      h[size_t(s)] = buffer(e, T * F, bf);
      dg[size_t(s)] = buffer(e, T * F, bf);
      du[size_t(s)] = buffer(e, T * F, bf);
      qv[size_t(s)] = rand_buffer(e, T * Q, bf, 1.f, 70 + s);
      a32[size_t(s)] = rand_buffer(e, T * F, f32, 1.f, 80 + s);
    }
    void* w = rand_buffer(e, H, bf, 1.f, 90);
    float* dw = static_cast<float*>(rand_buffer(e, H, f32, 1.f, 91));
    void* wd = rand_buffer(e, D, bf, 1.f, 92);
    float* dwd = static_cast<float*>(rand_buffer(e, D, f32, 1.f, 93));
    const double TH = double(T * H) * 2, TF = double(T * F) * 2, TQ = double(T * Q) * 2;
    auto S = [](int r) { return size_t(r % kSets); };
    const std::string sth = "[8192, 2048] bf16", stf = "[8192, 6144] bf16";
    line(e, "rmsnorm_fwd", sth,
         time_op(
             e, [&](int r) { ops.rmsnorm_fwd(x[S(r)], w, y[S(r)], T, H, 1e-6f); }, R),
         0, 2 * TH);
    line(e, "rmsnorm_bwd (dx +=)", sth,
         time_op(
             e, [&](int r) { ops.rmsnorm_bwd(x[S(r)], w, dy[S(r)], dx[S(r)], dw, T, H, 1e-6f, true); }, R),
         0, 4 * TH);
    line(e, "rmsnorm_fwd q_norm", "[8192*16, 128] bf16",
         time_op(
             e, [&](int r) { ops.rmsnorm_fwd(qv[S(r)], wd, dx[S(r)], T * nq, D, 1e-6f); }, R),
         0, 2 * TQ);
    line(e, "rmsnorm_bwd q_norm", "[8192*16, 128] bf16",
         time_op(
             e,
             [&](int r) { ops.rmsnorm_bwd(qv[S(r)], wd, dy[S(r)], dx[S(r)], dwd, T * nq, D, 1e-6f, false); },
             R),
         0, 3 * TQ);
    std::vector<float> inv(size_t(D / 2));
    for (int64_t i = 0; i < D / 2; ++i) inv[size_t(i)] = float(std::pow(1e6, -2.0 * double(i) / double(D)));
    line(e, "rope_fwd (q, in place)", "[8192, 16, 128] bf16",
         time_op(
             e, [&](int r) { ops.rope_fwd(qv[S(r)], 1, T, nq, D, inv.data(), 1.f); }, R),
         0, 2 * TQ);
    line(e, "rope_bwd", "[8192, 16, 128] bf16",
         time_op(
             e, [&](int r) { ops.rope_bwd(qv[S(r)], 1, T, nq, D, inv.data(), 1.f); }, R),
         0, 2 * TQ);
    line(e, "swiglu_fwd", stf,
         time_op(
             e, [&](int r) { ops.swiglu_fwd(g[S(r)], u[S(r)], h[S(r)], T * F); }, R),
         0, 3 * TF);
    line(e, "swiglu_bwd", stf,
         time_op(
             e, [&](int r) { ops.swiglu_bwd(g[S(r)], u[S(r)], h[S(r)], dg[S(r)], du[S(r)], T * F); }, R),
         0, 5 * TF);
    line(e, "add (residual)", sth,
         time_op(
             e, [&](int r) { ops.add(x[S(r)], dy[S(r)], y[S(r)], T * H); }, R),
         0, 3 * TH);
    line(e, "copy", stf,
         time_op(
             e, [&](int r) { ops.copy(bf, h[S(r)], g[S(r)], T * F); }, R),
         0, 2 * TF);
    line(e, "cast f32 -> bf16", "[8192, 6144]",
         time_op(
             e, [&](int r) { ops.cast(bf, h[S(r)], f32, a32[S(r)], T * F); }, R),
         0, 3 * TF);
    line(e, "add_into f32 += bf16", "[8192, 6144]",
         time_op(
             e, [&](int r) { ops.add_into(f32, a32[S(r)], bf, g[S(r)], T * F, 1.f); }, R),
         0, 5 * TF);
    line(e, "fill f32", "[8192, 6144]",
         time_op(
             e, [&](int r) { ops.fill(f32, a32[S(r)], T * F, 0.f); }, R),
         0, 2 * TF);
    e.keep.clear();
  }

  dequantize_rows(e, 2 * R);
  moe_rows(e, R);

  // ---- embedding and the LM head --------------------------------------------------------------
  {
    std::vector<int32_t> ids(size_t(T), 0);
    std::mt19937 rng(5);
    for (auto& id : ids) id = int32_t(rng() % uint32_t(V));
    int32_t* idd = static_cast<int32_t*>(buffer(e, T, DType::i32));
    Stream& cs = e.dev->stream(StreamKind::compute);
    cs.copy_h2d(idd, ids.data(), ids.size() * 4);
    cs.synchronize();
    void* table = rand_buffer(e, V * H, bf, 0.02f, 100);
    void* y = buffer(e, T * H, bf);
    void* dy = rand_buffer(e, T * H, bf, 1.f, 101);
    void* dtable = buffer(e, V * H, f32);
    const double TH = double(T * H) * 2;
    line(e, "embedding_fwd", "T=8192 H=2048 V=151936",
         time_op(
             e, [&](int) { ops.embedding_fwd(idd, table, y, T, H, V); }, R),
         0, 2 * TH);
    line(e, "embedding_bwd (f32 scatter-add)", "T=8192 H=2048 V=151936",
         time_op(
             e, [&](int) { ops.embedding_bwd(idd, dy, dtable, T, H, V); }, R),
         0, TH + 4 * TH);
    int32_t* tg = idd;  // random targets
    float* loss = static_cast<float*>(buffer(e, 2, f32));
    void* hn = rand_buffer(e, T * H, bf, 1.f, 102);
    void* dh = buffer(e, T * H, bf);
    void* scratch = buffer(e, int64_t(Ops::lm_head_ce_scratch_bytes(T, H, V) + 3) / 4, DType::i32);
    const double fl = 2.0 * T * H * double(V);
    const int r = e.quick ? 1 : 3;
    line(e, "lm_head_cross_entropy (loss only)", "T=8192 H=2048 V=151936",
         time_op(
             e,
             [&](int) { ops.lm_head_cross_entropy(hn, table, tg, T, H, V, loss, nullptr, nullptr, scratch); },
             r),
         fl, 0);
    line(
        e, "lm_head_cross_entropy (+dh, dW)", "T=8192 H=2048 V=151936",
        time_op(
            e, [&](int) { ops.lm_head_cross_entropy(hn, table, tg, T, H, V, loss, dh, dtable, scratch); }, r),
        3 * fl, 0);
    e.keep.clear();
  }
  std::printf("\npeak pool bytes: %.2f GiB\n", double(e.dev->peak_bytes()) / double(1 << 30));
  return 0;
}
