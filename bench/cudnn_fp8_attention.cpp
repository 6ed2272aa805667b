// cuDNN's FP8 flash attention (sdpa_fp8 forward and backward, e4m3) against the bf16 graphs the
// runtime runs, at the attention shapes of the FP8 rows: what FP8 attention would save, and how
// far its outputs lie from bf16's. Attention is about a quarter of Qwen3-1.7B's FP8 training
// step at 8K tokens and stays bf16 today; this measures the lever before it is built.
//
//   bench_cudnn_fp8_attention [--quick] [--reps R] [--seconds S] [--out FILE [--force]]
//
// Shapes (one micro-batch of one sequence, causal, head_dim 128, as the rows' plans run them):
// Qwen3-1.7B L = 8192, 16 query / 8 KV heads; Qwen3-4B L = 8192, 32 / 8; LLaMA-3.1-8B L = 4096,
// 32 / 8. --quick: L = 1024, the 1.7B's heads only.
//
// bf16: the runtime's own CudnnAttention (kernels/cuda/cudnn_attention.hpp), forward with
// statistics and backward (its GQA mode: native at 2 query heads per KV head, expanded above).
// FP8: one sdpa_fp8 and one sdpa_fp8_backward graph with native GQA; on Hopper every FP8 tensor
// the graphs write is e4m3 (cuDNN 9 accepts bf16 outputs of FP8 attention on Blackwell only), so
// each output needs its scale before the kernel runs:
//   Q, K, V, dO: the current tensor's amax (a producer's epilogue could make these codes);
//   S = softmax probabilities in [0, 1]: a fixed 1/256;
//   O: amax(V) bounds every output row (a convex combination of V's rows), so O's scale is
//      known beforehand with no history;
//   dP, dQ, dK, dV: no bound of use exists; the amaxes a first backward reports are used by a
//      second (delayed scaling, as a run would use the previous micro-batch's), and the timed
//      calls run with them.
// Errors: each FP8 output, decoded with its scale, against the bf16 graph's on the same bf16
// inputs: relative L2 error and max |difference| / max |bf16|; the inputs' own quantization
// error is listed beside them.
// Timing: the median of 5 trials of R calls back to back (CUDA events), bf16 and FP8 trials
// interleaved; with --seconds, each variant's forward + backward also runs back to back for S
// seconds and the rate of the second half is reported (a power-capped GPU settles lower).
// FLOPs of causal attention: forward 2 * 2 * L^2 / 2 * hq * D, backward 2.5x that.
// Exit status: 0 when measured (or nothing to measure), 1 after one line when a CUDA call or
// cuDNN execution fails, 2 on a bad option.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_main.hpp"
#include "bench/report_file.hpp"

#if defined(RP_HAVE_CUDA) && defined(RP_HAVE_CUDNN)
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include "bench/fp8_device.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/dtype.hpp"
#include "kernels/fp8.hpp"
#endif

namespace {

struct Options {
  int reps = 10;
  double seconds = 0;
  bool quick = false, force = false;
  std::string out;
};

#if defined(RP_HAVE_CUDA) && defined(RP_HAVE_CUDNN)
namespace fe = cudnn_frontend;
using rp::DType;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

struct Dev {  // a device allocation freed at scope exit
  void* p = nullptr;
  explicit Dev(size_t bytes) { ok(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  float* f() const { return static_cast<float*>(p); }
};

struct Problem {
  const char* model;
  int64_t L, nq, nkv, D;
  size_t q_n() const { return size_t(L * nq * D); }
  size_t kv_n() const { return size_t(L * nkv * D); }
  double fwd_flops() const { return 2.0 * 2.0 * double(L) * double(L) / 2 * double(nq) * double(D); }
};

std::vector<float> randn(size_t n, uint64_t seed) {  // approximately normal, rounded to bf16
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto uniform = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return double(s >> 11) * (1.0 / 9007199254740992.0);
  };
  for (auto& x : v) {
    const double z = (uniform() + uniform() + uniform() + uniform() - 2.0) * std::sqrt(3.0);
    x = rp::bf16_to_f32(rp::f32_to_bf16(float(z)));
  }
  return v;
}

void upload_bf16(void* dst, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = rp::f32_to_bf16(v[i]);
  ok(cudaMemcpy(dst, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "upload");
}
std::vector<float> download_bf16(const void* src, size_t n) {
  std::vector<uint16_t> h(n);
  ok(cudaMemcpy(h.data(), src, n * 2, cudaMemcpyDeviceToHost), "download");
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = rp::bf16_to_f32(h[i]);
  return v;
}

float amax_of(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

/// e4m3 codes of v under the per-tensor scale of its amax (fp8.hpp's rule); *scale = that scale.
std::vector<uint8_t> quantize(const std::vector<float>& v, float* scale) {
  using rp::Fp8Format;
  *scale = rp::fp8::scale_from_amax(amax_of(v), Fp8Format::e4m3);
  std::vector<uint8_t> c(v.size());
  for (size_t i = 0; i < v.size(); ++i) c[i] = rp::fp8::quantize(Fp8Format::e4m3, v[i], *scale);
  return c;
}
std::vector<float> decode(const std::vector<uint8_t>& c, float scale) {
  std::vector<float> v(c.size());
  for (size_t i = 0; i < c.size(); ++i) v[i] = rp::fp8::decode(rp::Fp8Format::e4m3, c[i]) * scale;
  return v;
}
std::vector<uint8_t> download_codes(const void* src, size_t n) {
  std::vector<uint8_t> c(n);
  ok(cudaMemcpy(c.data(), src, n, cudaMemcpyDeviceToHost), "download");
  return c;
}

/// Relative L2 error of got against ref, and max |got - ref| / max |ref|; "NaN" counts.
std::string error_of(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0, worst = 0, top = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++bad;
      continue;
    }
    const double d = double(got[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
    worst = std::max(worst, std::fabs(d));
    top = std::max(top, std::fabs(double(ref[i])));
  }
  char b[96];
  if (bad) std::snprintf(b, sizeof b, "%zu not finite", bad);
  else
    std::snprintf(b, sizeof b, "%.4f / %.4f", std::sqrt(num / std::max(den, 1e-30)),
                  worst / std::max(top, 1e-30));
  return b;
}

// uids of the FP8 graphs' tensors
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  // scalars (fp32 [1,1,1,1]): one slot each of the scalar buffer, slot = uid - kScalar0
  kScalar0 = 100,
  kDescaleQ = kScalar0,
  kDescaleK,
  kDescaleV,
  kDescaleS,
  kScaleS,
  kScaleO,
  kAmaxS,
  kAmaxO,
  kDescaleO,
  kDescaleDO,
  kDescaleDP,
  kScaleDQ,
  kScaleDK,
  kScaleDV,
  kScaleDP,
  kAmaxDQ,
  kAmaxDK,
  kAmaxDV,
  kAmaxDP,
  kScalarEnd
};

struct Graph {
  std::shared_ptr<fe::graph::Graph> g;  // null: refused (why)
  int64_t workspace = 0;
  std::string why;
};

Graph build(cudnnHandle_t h, const Problem& p, bool backward) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::FP8_E4M3)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto dims = [&](int64_t heads) { return std::vector<int64_t>{1, heads, p.L, p.D}; };
  auto strides = [&](int64_t heads) { return std::vector<int64_t>{p.L * heads * p.D, p.D, heads * p.D, 1}; };
  auto tensor = [&](const char* name, int64_t uid, int64_t heads) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim(dims(heads))
                         .set_stride(strides(heads)));
  };
  auto scalar = [&](const char* name, int64_t uid) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({1, 1, 1, 1})
                         .set_stride({1, 1, 1, 1})
                         .set_data_type(fe::DataType_t::FLOAT));
  };
  auto out_scalar = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid) {
    t->set_output(true)
        .set_uid(uid)
        .set_dim({1, 1, 1, 1})
        .set_stride({1, 1, 1, 1})
        .set_data_type(fe::DataType_t::FLOAT);
  };
  auto out = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, int64_t heads) {
    t->set_output(true).set_uid(uid).set_dim(dims(heads)).set_stride(strides(heads));
  };
  const std::vector<int64_t> stats_dim{1, p.nq, p.L, 1}, stats_stride{p.nq * p.L, p.L, 1, 1};
  const float attn_scale = float(1.0 / std::sqrt(double(p.D)));
  auto Q = tensor("Q", kQ, p.nq), K = tensor("K", kK, p.nkv), V = tensor("V", kV, p.nkv);
  if (!backward) {
    auto opt = fe::graph::SDPA_fp8_attributes()
                   .set_name("fp8_fwd")
                   .set_generate_stats(true)
                   .set_causal_mask(true)
                   .set_attn_scale(attn_scale);
    auto [O, Stats, AmaxS, AmaxO] =
        g->sdpa_fp8(Q, K, V, scalar("dq", kDescaleQ), scalar("dk", kDescaleK), scalar("dv", kDescaleV),
                    scalar("ds", kDescaleS), scalar("ss", kScaleS), scalar("so", kScaleO), opt);
    out(O, kO, p.nq);
    Stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
    out_scalar(AmaxS, kAmaxS);
    out_scalar(AmaxO, kAmaxO);
  } else {
    auto O = tensor("O", kO, p.nq), dO = tensor("dO", kDO, p.nq);
    auto Stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_dim(stats_dim)
                               .set_stride(stats_stride)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opt =
        fe::graph::SDPA_fp8_backward_attributes().set_name("fp8_bwd").set_causal_mask(true).set_attn_scale(
            attn_scale);
    auto [dQ, dK, dV, AmaxDQ, AmaxDK, AmaxDV, AmaxDP] = g->sdpa_fp8_backward(
        Q, K, V, O, dO, Stats, scalar("dq", kDescaleQ), scalar("dk", kDescaleK), scalar("dv", kDescaleV),
        scalar("do", kDescaleO), scalar("ddo", kDescaleDO), scalar("ds", kDescaleS),
        scalar("ddp", kDescaleDP), scalar("ss", kScaleS), scalar("sdq", kScaleDQ), scalar("sdk", kScaleDK),
        scalar("sdv", kScaleDV), scalar("sdp", kScaleDP), opt);
    out(dQ, kDQ, p.nq);
    out(dK, kDK, p.nkv);
    out(dV, kDV, p.nkv);
    out_scalar(AmaxDQ, kAmaxDQ);
    out_scalar(AmaxDK, kAmaxDK);
    out_scalar(AmaxDV, kAmaxDV);
    out_scalar(AmaxDP, kAmaxDP);
  }
  Graph r;
  auto refuse = [&](const char* step, fe::error_t st) {
    r.why = std::string(step) + ": " + st.get_message();
    return r;
  };
  if (auto st = g->validate(); !st.is_good()) return refuse("validate", st);
  if (auto st = g->build_operation_graph(h); !st.is_good()) return refuse("build_operation_graph", st);
  if (auto st = g->create_execution_plans({fe::HeurMode_t::A}); !st.is_good())
    return refuse("create_execution_plans", st);
  if (auto st = g->check_support(h); !st.is_good()) return refuse("check_support", st);
  if (auto st = g->build_plans(h); !st.is_good()) return refuse("build_plans", st);
  if (auto st = g->get_workspace_size(r.workspace); !st.is_good()) return refuse("get_workspace_size", st);
  r.g = std::move(g);
  return r;
}

/// Milliseconds per call of fn, the median of 5 trials of `reps` calls, interleaved with the
/// other functions of `fns` trial by trial.
std::vector<double> time_interleaved(cudaStream_t st, const std::vector<std::function<void()>>& fns,
                                     int reps) {
  cudaEvent_t e0, e1;
  ok(cudaEventCreate(&e0), "cudaEventCreate");
  ok(cudaEventCreate(&e1), "cudaEventCreate");
  std::vector<std::vector<double>> t(fns.size());
  for (auto& f : fns) f();  // warm-up
  for (int trial = 0; trial < 5; ++trial)
    for (size_t i = 0; i < fns.size(); ++i) {
      ok(cudaEventRecord(e0, st), "cudaEventRecord");
      for (int r = 0; r < reps; ++r) fns[i]();
      ok(cudaEventRecord(e1, st), "cudaEventRecord");
      ok(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float ms = 0;
      ok(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      t[i].push_back(double(ms) / reps);
    }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::vector<double> med;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

/// Milliseconds per call of fn run back to back for `seconds`, over the second half.
double sustained_ms(cudaStream_t st, const std::function<void()>& fn, double seconds) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  while (elapsed() < seconds / 2) {
    for (int i = 0; i < 4; ++i) fn();
    ok(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  }
  const double t1 = elapsed();
  int calls = 0;
  while (elapsed() < seconds) {
    for (int i = 0; i < 4; ++i) fn();
    ok(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    calls += 4;
  }
  return (elapsed() - t1) * 1e3 / calls;
}

/// Appends the problem's row to `md` and, with `seconds`, its sustained row to `sustained`.
void measure(cudnnHandle_t h, cudaStream_t st, const Problem& p, int reps, double seconds,
             std::ostringstream& sustained, std::ostringstream& md) {
  char label[96];
  std::snprintf(label, sizeof label, "%s | L %lld, %lld / %lld heads", p.model, (long long)p.L,
                (long long)p.nq, (long long)p.nkv);
  std::printf("== %s\n", label);
  const Graph fwd = build(h, p, false), bwd = build(h, p, true);
  if (!fwd.g || !bwd.g) {
    const std::string why = fwd.g ? bwd.why : fwd.why;
    std::printf("FP8 graph refused: %s\n", why.c_str());
    md << "| " << label << " | FP8 refused: " << why << " | | | | |\n";
    return;
  }
  const std::vector<float> q = randn(p.q_n(), 1), k = randn(p.kv_n(), 2), v = randn(p.kv_n(), 3),
                           dout = randn(p.q_n(), 4);
  // bf16: the runtime's path
  Dev qb(p.q_n() * 2), kb(p.kv_n() * 2), vb(p.kv_n() * 2), ob(p.q_n() * 2), dob(p.q_n() * 2),
      dqb(p.q_n() * 2), dkb(p.kv_n() * 2), dvb(p.kv_n() * 2), lse(size_t(p.nq * p.L) * 4);
  upload_bf16(qb.p, q);
  upload_bf16(kb.p, k);
  upload_bf16(vb.p, v);
  upload_bf16(dob.p, dout);
  const size_t ws_bytes = std::max<size_t>(size_t(1) << 30, size_t(std::max(fwd.workspace, bwd.workspace)));
  Dev ws(ws_bytes);
  rp::cuda::CudnnAttention att(0, st);
  const float attn_scale = float(1.0 / std::sqrt(double(p.D)));
  std::string why;
  auto bf16_fwd = [&] {
    if (!att.fwd(DType::bf16, qb.p, kb.p, vb.p, ob.p, lse.f(), 1, p.L, p.nq, p.nkv, p.D, attn_scale, ws.p,
                 ws_bytes, &why))
      throw std::runtime_error("bf16 forward refused: " + why);
  };
  auto bf16_bwd = [&] {
    if (!att.bwd(DType::bf16, qb.p, kb.p, vb.p, ob.p, lse.f(), dob.p, dqb.p, dkb.p, dvb.p, 1, p.L, p.nq,
                 p.nkv, p.D, attn_scale, ws.p, ws_bytes, &why))
      throw std::runtime_error("bf16 backward refused: " + why);
  };
  bf16_fwd();
  bf16_bwd();
  ok(cudaStreamSynchronize(st), "bf16 attention");
  const std::vector<float> o_ref = download_bf16(ob.p, p.q_n()), dq_ref = download_bf16(dqb.p, p.q_n()),
                           dk_ref = download_bf16(dkb.p, p.kv_n()), dv_ref = download_bf16(dvb.p, p.kv_n());
  // FP8: inputs quantized per tensor; O's scale from amax(V); S fixed
  float s_q, s_k, s_v, s_do;
  const auto cq = quantize(q, &s_q), ck = quantize(k, &s_k), cv = quantize(v, &s_v),
             cdo = quantize(dout, &s_do);
  Dev q8(p.q_n()), k8(p.kv_n()), v8(p.kv_n()), o8(p.q_n()), do8(p.q_n()), dq8(p.q_n()), dk8(p.kv_n()),
      dv8(p.kv_n()), lse8(size_t(p.nq * p.L) * 4), scalars(sizeof(float) * (kScalarEnd - kScalar0));
  ok(cudaMemcpy(q8.p, cq.data(), cq.size(), cudaMemcpyHostToDevice), "upload");
  ok(cudaMemcpy(k8.p, ck.data(), ck.size(), cudaMemcpyHostToDevice), "upload");
  ok(cudaMemcpy(v8.p, cv.data(), cv.size(), cudaMemcpyHostToDevice), "upload");
  ok(cudaMemcpy(do8.p, cdo.data(), cdo.size(), cudaMemcpyHostToDevice), "upload");
  std::vector<float> sc(kScalarEnd - kScalar0, 1.f);
  auto at = [&](int64_t uid) -> float& { return sc[size_t(uid - kScalar0)]; };
  const float s_o = rp::fp8::scale_from_amax(amax_of(v), rp::Fp8Format::e4m3), s_s = 1.f / 256;
  at(kDescaleQ) = s_q, at(kDescaleK) = s_k, at(kDescaleV) = s_v, at(kDescaleDO) = s_do;
  at(kDescaleS) = s_s, at(kScaleS) = 1 / s_s, at(kScaleO) = 1 / s_o, at(kDescaleO) = s_o;
  auto push = [&] { ok(cudaMemcpy(scalars.p, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice), "scalars"); };
  auto pull = [&] { ok(cudaMemcpy(sc.data(), scalars.p, sc.size() * 4, cudaMemcpyDeviceToHost), "scalars"); };
  push();
  std::unordered_map<int64_t, void*> pack{{kQ, q8.p},   {kK, k8.p},       {kV, v8.p},
                                          {kO, o8.p},   {kStats, lse8.p}, {kDO, do8.p},
                                          {kDQ, dq8.p}, {kDK, dk8.p},     {kDV, dv8.p}};
  for (int64_t u = kScalar0; u < kScalarEnd; ++u) pack[u] = scalars.f() + (u - kScalar0);
  auto exec = [&](const Graph& g, const char* what) {
    std::unordered_map<int64_t, void*> mine;
    for (const auto& [u, ptr] : pack) mine.emplace(u, ptr);
    if (auto s = g.g->execute(h, mine, ws.p); !s.is_good())
      throw std::runtime_error(std::string(what) + ": " + s.get_message());
  };
  auto fp8_fwd = [&] { exec(fwd, "FP8 forward"); };
  auto fp8_bwd = [&] { exec(bwd, "FP8 backward"); };
  fp8_fwd();
  fp8_bwd();  // scales 1: its amaxes give the timed backward's scales (delayed scaling)
  ok(cudaStreamSynchronize(st), "FP8 attention");
  pull();
  using rp::Fp8Format;
  const float s_dp = rp::fp8::scale_from_amax(at(kAmaxDP), Fp8Format::e4m3);
  const float s_dq = rp::fp8::scale_from_amax(at(kAmaxDQ), Fp8Format::e4m3);
  const float s_dk = rp::fp8::scale_from_amax(at(kAmaxDK), Fp8Format::e4m3);
  const float s_dv = rp::fp8::scale_from_amax(at(kAmaxDV), Fp8Format::e4m3);
  std::printf("amax: S %.4g, O %.4g (bound %.4g), dP %.4g, dQ %.4g, dK %.4g, dV %.4g\n", at(kAmaxS),
              at(kAmaxO), amax_of(v), at(kAmaxDP), at(kAmaxDQ), at(kAmaxDK), at(kAmaxDV));
  at(kScaleDP) = 1 / s_dp, at(kDescaleDP) = s_dp, at(kScaleDQ) = 1 / s_dq, at(kScaleDK) = 1 / s_dk,
  at(kScaleDV) = 1 / s_dv;
  push();
  fp8_fwd();
  fp8_bwd();
  ok(cudaStreamSynchronize(st), "FP8 attention");
  const std::string e_o = error_of(decode(download_codes(o8.p, p.q_n()), s_o), o_ref);
  const std::string e_dq = error_of(decode(download_codes(dq8.p, p.q_n()), s_dq), dq_ref);
  const std::string e_dk = error_of(decode(download_codes(dk8.p, p.kv_n()), s_dk), dk_ref);
  const std::string e_dv = error_of(decode(download_codes(dv8.p, p.kv_n()), s_dv), dv_ref);
  const std::string e_in = error_of(decode(cq, s_q), q);
  std::printf("errors (rel L2 / max): O %s, dQ %s, dK %s, dV %s; Q's own quantization %s\n", e_o.c_str(),
              e_dq.c_str(), e_dk.c_str(), e_dv.c_str(), e_in.c_str());
  const std::vector<double> ms = time_interleaved(st, {bf16_fwd, fp8_fwd, bf16_bwd, fp8_bwd}, reps);
  const double ff = p.fwd_flops(), bf = 2.5 * ff;
  char row[512];
  std::snprintf(row, sizeof row,
                "| %s | %.3f ms, %.0f | %.3f ms, %.0f | %.2fx | %.3f ms, %.0f | %.3f ms, %.0f | %.2fx | %s | "
                "%s | %s | %s "
                "| %s |",
                label, ms[0], ff / ms[0] / 1e9, ms[1], ff / ms[1] / 1e9, ms[0] / ms[1], ms[2],
                bf / ms[2] / 1e9, ms[3], bf / ms[3] / 1e9, ms[2] / ms[3], e_o.c_str(), e_dq.c_str(),
                e_dk.c_str(), e_dv.c_str(), e_in.c_str());
  std::printf("%s\n", row);
  md << row << "\n";
  if (seconds > 0) {
    const double b = sustained_ms(
        st, [&] { bf16_fwd(), bf16_bwd(); }, seconds);
    const double f = sustained_ms(
        st, [&] { fp8_fwd(), fp8_bwd(); }, seconds);
    std::snprintf(row, sizeof row, "| %s | %.0f s each | %.3f ms, %.0f | %.3f ms, %.0f | %.2fx |", label,
                  seconds, b, 3.5 * ff / b / 1e9, f, 3.5 * ff / f / 1e9, b / f);
    std::printf("%s\n", row);
    sustained << row << "\n";
  }
}

int run_all(const Options& o, std::string& table, std::string& device) {
  const std::optional<cudaDeviceProp> found = bench::fp8_device();
  if (!found) return 0;
  const cudaDeviceProp& prop = *found;
  device = prop.name;
  std::printf("device: %s, cuDNN %zu\n", prop.name, size_t(cudnnGetVersion()));
  cudaStream_t st = nullptr;
  ok(cudaStreamCreate(&st), "cudaStreamCreate");
  cudnnHandle_t h = nullptr;
  if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) throw std::runtime_error("cudnnCreate failed");
  cudnnSetStream(h, st);
  std::ostringstream md;
  md << "cuDNN " << cudnnGetVersion()
     << ", one sequence, causal, head_dim 128; times: ms per call, TFLOP/s; errors: "
        "relative L2 / max |difference| over max |bf16|\n\n"
        "| model | shape | forward bf16 | forward FP8 | speed-up | backward bf16 | backward FP8 | speed-up | "
        "O error | "
        "dQ error | dK error | dV error | Q's quantization "
        "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  const std::vector<Problem> all = o.quick ? std::vector<Problem>{{"Qwen3-1.7B (quick)", 1024, 16, 8, 128}}
                                           : std::vector<Problem>{{"Qwen3-1.7B", 8192, 16, 8, 128},
                                                                  {"Qwen3-4B", 8192, 32, 8, 128},
                                                                  {"LLaMA-3.1-8B", 4096, 32, 8, 128}};
  std::ostringstream sustained;
  for (const Problem& p : all) measure(h, st, p, o.reps, o.seconds, sustained, md);
  if (o.seconds > 0)
    md << "\nForward + backward back to back, the second half's rate (a power-capped GPU settles lower):\n\n"
          "| model | shape | run | bf16 | FP8 | speed-up |\n|---|---|---|---|---|---|\n"
       << sustained.str();
  cudnnDestroy(h);
  cudaStreamDestroy(st);
  table = md.str();
  return 0;
}
#else
int run_all(const Options&, std::string&, std::string&) {
  std::printf("built without CUDA or cuDNN: nothing to measure\n");
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"cuDNN's FP8 flash attention against the bf16 graphs at the FP8 rows' attention shapes"};
  app.add_option("--reps", o.reps, "calls per timed trial")->check(CLI::Range(1, 1000));
  app.add_option("--seconds", o.seconds, "also run each variant back to back this long (power-capped rate)")
      ->check(CLI::Range(0.0, 120.0));
  app.add_flag("--quick", o.quick, "L = 1024, the 1.7B's heads only");
  app.add_option("--out", o.out, "also write a Markdown report (command, commit, machine) to FILE");
  app.add_flag("--force", o.force, "replace an existing --out file");
  if (auto rc = bench::parse_options(app, argc, argv, "bench_cudnn_fp8_attention")) return *rc;
  return bench::guarded_main("bench_cudnn_fp8_attention", [&] {
    if (bench::out_is_taken("bench_cudnn_fp8_attention", o.out, o.force)) return 2;
    std::string table, device;
    const int rc = run_all(o, table, device);
    bench::write_report(o.out, "bench_cudnn_fp8_attention", bench::command_line(argc, argv), device, table);
    return rc;
  });
}
