// cuDNN flash attention (see cudnn_attention.hpp). The graphs follow the cudnn-frontend
// SDPA recipe: BSHD-strided [b, h, s, d] Q/K/V/O, fp32 intermediate and compute, a
// top-left-aligned causal mask, natural-log stats. One graph per key, built on first use.
#include "kernels/cuda/cudnn_attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/gqa_chunking.hpp"

#ifdef RP_HAVE_CUDNN
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace rp::cuda {

#ifdef RP_HAVE_CUDNN

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// One graph's geometry: hq query heads and hk KV heads of [n_seq, L, heads, D] tensors whose
// consecutive tokens lie q_row (Q, O, dO, dQ) and kv_row (K, V, dK, dV) elements apart, so a
// sub-range of heads of a larger BSHD tensor is a pointer offset plus the full row stride.
// Stats are always packed [n_seq, hq, L].
struct Shape {
  bool backward = false, stats = false, deterministic = false;
  DType t = DType::bf16;
  int64_t n_seq = 0, L = 0, hq = 0, hk = 0, D = 0, q_row = 0, kv_row = 0;
  float scale = 1.f;
  int64_t window = 0;  ///< > 0: query t sees keys t - window < j <= t (cuDNN's diagonal band)
};

int64_t bits_of(float x) {
  int32_t b;
  static_assert(sizeof b == sizeof x);
  std::memcpy(&b, &x, sizeof b);
  return b;
}

using Key = std::array<int64_t, 13>;
Key key_of(const Shape& s) {
  return {s.backward, s.stats, s.deterministic, int64_t(s.t), s.n_seq,          s.L,     s.hq,
          s.hk,       s.D,     s.q_row,         s.kv_row,     bits_of(s.scale), s.window};
}

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN refused this configuration
  int64_t workspace = 0;
  std::string why;  // refusal reason (for the log line)
};

// Expanded-backward plan of one shape and scratch size: query heads per pass (0: none fits).
struct Plan {
  int64_t heads = 0;
  std::string why;
};
using PlanKey = std::array<int64_t, 10>;  // dtype, n_seq, L, nq, nkv, D, scale, deterministic, bytes, window

std::vector<int64_t> bshd_strides(int64_t row, int64_t s, int64_t d) { return {s * row, d, row, 1}; }

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Scratch of one expanded-backward pass, in this order: fp32 dK and dV accumulators [T, D]
// (only when passes split KV heads; first, so every pass finds them at the same place),
// cuDNN's workspace, expanded K, V, dK, dV ([T, hc, D] each), the pass's packed statistics
// [n_seq, hc, L] fp32 (when the pass is not every head: cuDNN before 9.26 reads only packed
// Stats, and a head offset of L floats need not keep the 16-byte alignment).
struct PassLayout {
  size_t acc = 0, ws = 0, kv = 0, stats = 0;
  size_t acc_at(int i) const { return size_t(i) * align256(acc); }
  size_t ws_at() const { return acc_at(2); }
  size_t kv_at(int i) const { return ws_at() + align256(ws) + size_t(i) * align256(kv); }
  size_t stats_at() const { return kv_at(4); }
  size_t total() const { return stats_at() + align256(stats); }
};

// As cuda_check.hpp's errors: what failed, why, the statement's file and line.
[[noreturn]] void throw_cudnn(const std::string& what, const std::string& msg, const char* file, int line) {
  throw DeviceError(fmt::format("cuDNN error ({}) in `{}` at {}:{}", msg, what, file, line));
}
void check_cudnn(cudnnStatus_t s, const char* what, const char* file, int line) {
  if (s != CUDNN_STATUS_SUCCESS) throw_cudnn(what, cudnnGetErrorString(s), file, line);
}
#define RP_CUDNN_CHECK(call) check_cudnn((call), #call, __FILE__, __LINE__)

bool supported_dtype(DType t) { return t == DType::bf16 || t == DType::f16; }

}  // namespace

struct CudnnAttention::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
  std::map<Key, Entry> cache;
  std::map<PlanKey, Plan> plans;
  GqaBackward gqa = GqaBackward::automatic;
  bool deterministic = false;
  int64_t last_passes = 0;

  Entry build(const Shape& s) {
    Entry e;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(s.t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tensor = [&](const char* name, int64_t uid, int64_t h, int64_t row) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({s.n_seq, h, s.L, s.D})
                           .set_stride(bshd_strides(row, s.L, s.D)));
    };
    auto Q = tensor("Q", kQ, s.hq, s.q_row), K = tensor("K", kK, s.hk, s.kv_row),
         V = tensor("V", kV, s.hk, s.kv_row);
    auto set_out = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& x, int64_t uid, int64_t h,
                       int64_t row) {
      x->set_output(true)
          .set_uid(uid)
          .set_dim({s.n_seq, h, s.L, s.D})
          .set_stride(bshd_strides(row, s.L, s.D));
    };
    const std::vector<int64_t> stats_dim{s.n_seq, s.hq, s.L, 1}, stats_stride{s.hq * s.L, s.L, 1, 1};
    if (!s.backward) {
      auto opt = fe::graph::SDPA_attributes()
                     .set_name("rp_attention_fwd")
                     .set_generate_stats(s.stats)
                     .set_causal_mask(true)
                     .set_attn_scale(s.scale);
      // the band's left bound keeps keys with col + window > row: the last `window` keys
      if (s.window > 0) opt.set_diagonal_band_left_bound(int(s.window));
      auto [O, Stats] = g->sdpa(Q, K, V, opt);
      set_out(O, kO, s.hq, s.q_row);
      if (s.stats)
        Stats->set_output(true)
            .set_uid(kStats)
            .set_data_type(fe::DataType_t::FLOAT)
            .set_dim(stats_dim)
            .set_stride(stats_stride);
    } else {
      auto O = tensor("O", kO, s.hq, s.q_row), dO = tensor("dO", kDO, s.hq, s.q_row);
      auto Stats = g->tensor(fe::graph::Tensor_attributes()
                                 .set_name("Stats")
                                 .set_uid(kStats)
                                 .set_dim(stats_dim)
                                 .set_stride(stats_stride)
                                 .set_data_type(fe::DataType_t::FLOAT));
      auto opt = fe::graph::SDPA_backward_attributes()
                     .set_name("rp_attention_bwd")
                     .set_causal_mask(true)
                     .set_attn_scale(s.scale)
                     .set_deterministic_algorithm(s.deterministic);
      if (s.window > 0) opt.set_diagonal_band_left_bound(int(s.window));
      auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opt);
      set_out(dQ, kDQ, s.hq, s.q_row);
      set_out(dK, kDK, s.hk, s.kv_row);
      set_out(dV, kDV, s.hk, s.kv_row);
    }
    auto refuse = [&](const char* step, fe::error_t st) {
      e.graph.reset();
      e.why = fmt::format("{}: {}", step, st.get_message());
      return e;
    };
    if (auto st = g->validate(); !st.is_good()) return refuse("validate", st);
    if (auto st = g->build_operation_graph(handle); !st.is_good()) return refuse("build_operation_graph", st);
    if (auto st = g->create_execution_plans({fe::HeurMode_t::A}); !st.is_good())
      return refuse("create_execution_plans", st);
    if (auto st = g->check_support(handle); !st.is_good()) return refuse("check_support", st);
    if (auto st = g->build_plans(handle); !st.is_good()) return refuse("build_plans", st);
    if (auto st = g->get_workspace_size(e.workspace); !st.is_good()) return refuse("get_workspace_size", st);
    e.graph = std::move(g);
    return e;
  }

  // The graph of `s`, built on first use (the caller holds mu).
  const Entry& lookup(const Shape& s) {
    const Key key = key_of(s);
    auto it = cache.find(key);
    if (it == cache.end()) {
      set_device(device);
      it = cache.emplace(key, build(s)).first;
    }
    return it->second;
  }

  // Looks up (or builds) the graph of `s`; null (with *why) when cuDNN refused it or its
  // workspace exceeds ws_bytes.
  const Entry* find(const Shape& s, size_t ws_bytes, std::string* why) {
    std::lock_guard lk(mu);
    const Entry& e = lookup(s);
    if (!e.graph) {
      if (why) *why = e.why;
      return nullptr;
    }
    if (size_t(e.workspace) > ws_bytes) {
      if (why)
        *why = fmt::format("workspace of {} bytes exceeds the {} bytes of scratch", e.workspace, ws_bytes);
      return nullptr;
    }
    return &e;
  }

  void run(const Entry& e, std::unordered_map<int64_t, void*>& pack, void* ws, const char* what) {
    set_device(device);
    if (auto st = e.graph->execute(handle, pack, ws); !st.is_good())
      throw_cudnn(what, st.get_message(), __FILE__, __LINE__);
  }

  // ---- expanded GQA backward ----

  struct Expanded {
    DType t;
    int64_t n_seq, L, nq, nkv, D;
    float scale;
    int64_t window;
    int64_t r() const { return nq / nkv; }
    int64_t T() const { return n_seq * L; }
    // the multi-head graph of a pass of hc query heads
    Shape shape(int64_t hc, bool deterministic) const {
      Shape s;
      s.backward = s.stats = true;
      s.deterministic = deterministic;
      s.t = t;
      s.n_seq = n_seq, s.L = L, s.hq = s.hk = hc, s.D = D;
      s.q_row = nq * D, s.kv_row = hc * D, s.scale = scale;
      s.window = window;
      return s;
    }
    // split: the plan's passes cover parts of KV heads (fp32 accumulators needed)
    PassLayout layout(int64_t hc, const Entry& e, bool split) const {
      PassLayout c;
      c.acc = split ? size_t(T() * D) * sizeof(float) : 0;
      c.ws = size_t(e.workspace);
      c.kv = size_t(T() * hc * D) * dtype_size(t);
      c.stats = hc < nq ? size_t(T() * hc) * sizeof(float) : 0;
      return c;
    }
    // the smaller last pass of a plan of hc query heads per pass (0: none)
    int64_t tail(int64_t hc) const {
      if (hc >= r()) return nkv % (hc / r()) * r();
      const int64_t m = (r() + hc - 1) / hc;
      return r() - (m - 1) * hc == hc ? 0 : r() - (m - 1) * hc;
    }
  };

  // Query heads per pass for `x` in ws_bytes of scratch (cached; the caller holds mu).
  const Plan& plan(const Expanded& x, size_t ws_bytes) {
    const PlanKey key{int64_t(x.t),  x.n_seq,           x.L,     x.nq, x.nkv, x.D, bits_of(x.scale),
                      deterministic, int64_t(ws_bytes), x.window};
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    std::string refused;
    auto need = [&](int64_t hc) -> std::optional<size_t> {
      const Entry& e = lookup(x.shape(hc, deterministic));
      if (!e.graph) {
        refused = e.why;
        return std::nullopt;
      }
      return x.layout(hc, e, hc < x.r()).total();
    };
    // per query head: expanded K, V, dK, dV; statistics; cuDNN's fp32 dQ accumulator and
    // softmax sums (the workspace of its non-deterministic backward)
    const size_t per_head = size_t(x.T()) * (4 * size_t(x.D) * dtype_size(x.t) + 4 + 4 * size_t(x.D + 1));
    Plan p;
    p.heads = plan_gqa_pass(x.nkv, x.r(), ws_bytes, per_head, need);
    if (p.heads == 0) {
      const std::optional<size_t> one = need(1);
      p.why = one ? fmt::format(
                        "expanded GQA backward: a pass of one query head needs {} bytes "
                        "of scratch, {} given",
                        *one, ws_bytes)
                  : "expanded GQA backward: " + refused;
    }
    return plans.emplace(key, std::move(p)).first->second;
  }

  struct Ptrs {
    const void *q, *k, *v, *o;
    const float* lse;
    const void* dout;
    void *dq, *dk, *dv;
  };

  // One pass: expand K/V for query heads [h0, h0 + hc), cuDNN's multi-head backward on them
  // (dq written in place, per-head dK/dV into the scratch).
  void run_pass(const Expanded& x, const Ptrs& p, const Entry& e, const PassLayout& c, int64_t h0, int64_t hc,
                char* base) {
    const size_t es = dtype_size(x.t);
    auto at = [&](const void* ptr, int64_t h) {  // query head h of a [T, nq, D] tensor
      return static_cast<void*>(static_cast<char*>(const_cast<void*>(ptr)) + size_t(h * x.D) * es);
    };
    k_gqa_expand_kv(x.t, p.k, p.v, base + c.kv_at(0), base + c.kv_at(1), x.T(), x.nkv, h0, hc, x.r(), x.D,
                    stream);
    void* stats = const_cast<float*>(p.lse);
    if (c.stats) {  // one row of hc*L floats per sequence, nq*L floats apart
      stats = base + c.stats_at();
      RP_CUDA_CHECK(cudaMemcpy2DAsync(stats, size_t(hc * x.L) * 4, p.lse + h0 * x.L, size_t(x.nq * x.L) * 4,
                                      size_t(hc * x.L) * 4, size_t(x.n_seq), cudaMemcpyDeviceToDevice,
                                      stream));
    }
    std::unordered_map<int64_t, void*> pack{
        {kQ, at(p.q, h0)},   {kK, base + c.kv_at(0)},  {kV, base + c.kv_at(1)},
        {kO, at(p.o, h0)},   {kStats, stats},          {kDO, at(p.dout, h0)},
        {kDQ, at(p.dq, h0)}, {kDK, base + c.kv_at(2)}, {kDV, base + c.kv_at(3)}};
    run(e, pack, base + c.ws_at(), "sdpa backward execute (expanded GQA pass)");
  }

  bool bwd_expanded(const Expanded& x, const Ptrs& p, void* ws, size_t ws_bytes, std::string* why) {
    const Entry *full = nullptr, *last = nullptr;
    int64_t hc = 0, tail = 0;
    {
      std::lock_guard lk(mu);
      const Plan& pl = plan(x, ws_bytes);
      if (pl.heads == 0) {
        if (why) *why = pl.why;
        return false;
      }
      hc = pl.heads;
      full = &lookup(x.shape(hc, deterministic));
      if (tail = x.tail(hc); tail != 0) {
        last = &lookup(x.shape(tail, deterministic));
        if (!last->graph || x.layout(tail, *last, hc < x.r()).total() > ws_bytes) {
          if (why)
            *why = fmt::format(
                "expanded GQA backward: the last pass of {} query heads "
                "does not run in {} bytes: {}",
                tail, ws_bytes, last->why);
          return false;
        }
      }
    }
    const int64_t r = x.r(), T = x.T(), D = x.D;
    const size_t es = dtype_size(x.t);
    char* base = static_cast<char*>(ws);
    auto head = [&](void* t, int64_t g) { return static_cast<char*>(t) + size_t(g * D) * es; };
    int64_t passes = 0;
    if (hc >= r) {  // whole KV heads per pass: sum each group straight into dk / dv
      for (int64_t h0 = 0; h0 < x.nq; h0 += hc, ++passes) {
        const int64_t n = std::min(hc, x.nq - h0);
        const Entry& e = n == hc ? *full : *last;
        const PassLayout c = x.layout(n, e, false);
        run_pass(x, p, e, c, h0, n, base);
        k_gqa_group_sum(x.t, base + c.kv_at(2), base + c.kv_at(3), x.t, head(p.dk, h0 / r),
                        head(p.dv, h0 / r), x.nkv * D, T, n / r, r, D, false, stream);
      }
    } else {  // parts of one KV head per pass: fp32 accumulators, then one rounding
      for (int64_t g = 0; g < x.nkv; ++g) {
        PassLayout c{};
        for (int64_t s = 0; s < r; s += hc, ++passes) {
          const int64_t n = std::min(hc, r - s);
          const Entry& e = n == hc ? *full : *last;
          c = x.layout(n, e, true);
          run_pass(x, p, e, c, g * r + s, n, base);
          k_gqa_group_sum(x.t, base + c.kv_at(2), base + c.kv_at(3), DType::f32, base + c.acc_at(0),
                          base + c.acc_at(1), D, T, 1, n, D, s > 0, stream);
        }
        k_gqa_group_sum(DType::f32, base + c.acc_at(0), base + c.acc_at(1), x.t, head(p.dk, g), head(p.dv, g),
                        x.nkv * D, T, 1, 1, D, false, stream);
      }
    }
    last_passes = passes;
    return true;
  }
};

CudnnAttention::CudnnAttention(int device, cudaStream_t stream) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->stream = stream;
  set_device(device);
  RP_CUDNN_CHECK(cudnnCreate(&impl_->handle));
  RP_CUDNN_CHECK(cudnnSetStream(impl_->handle, stream));
}

CudnnAttention::~CudnnAttention() {
  if (!impl_) return;
  cudaSetDevice(impl_->device);
  impl_->cache.clear();
  if (impl_->handle) cudnnDestroy(impl_->handle);
}

bool CudnnAttention::available() { return true; }
long CudnnAttention::version() { return long(cudnnGetVersion()); }

void CudnnAttention::set_gqa_backward(GqaBackward mode) { impl_->gqa = mode; }
CudnnAttention::GqaBackward CudnnAttention::gqa_backward() const { return impl_->gqa; }
void CudnnAttention::set_deterministic(bool on) { impl_->deterministic = on; }
int64_t CudnnAttention::last_bwd_passes() const { return impl_->last_passes; }

bool CudnnAttention::fwd(DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                         int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale, void* ws,
                         size_t ws_bytes, std::string* why, int64_t window) {
  if (!supported_dtype(t) || n_seq * L == 0) {
    if (why) *why = "needs bf16/f16 storage and at least one token";
    return false;
  }
  Shape s;
  s.stats = lse != nullptr;
  s.t = t;
  s.n_seq = n_seq, s.L = L, s.hq = nq, s.hk = nkv, s.D = D, s.q_row = nq * D, s.kv_row = nkv * D;
  s.scale = scale;
  s.window = window >= L ? 0 : window;
  const Entry* e = impl_->find(s, ws_bytes, why);
  if (!e) return false;
  std::unordered_map<int64_t, void*> pack{
      {kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kO, o}};
  if (lse) pack.emplace(kStats, lse);
  impl_->run(*e, pack, ws, "sdpa forward execute");
  return true;
}

bool CudnnAttention::bwd(DType t, const void* q, const void* k, const void* v, const void* o,
                         const float* lse, const void* dout, void* dq, void* dk, void* dv, int64_t n_seq,
                         int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale, void* ws,
                         size_t ws_bytes, std::string* why, int64_t window) {
  if (window >= L) window = 0;
  if (!supported_dtype(t) || n_seq * L == 0 || !lse || nkv <= 0 || nq % nkv != 0) {
    if (why)
      *why =
          "needs bf16/f16 storage, at least one token, the forward's stats and nq a "
          "multiple of nkv";
    return false;
  }
  const int64_t r = nq / nkv;
  const GqaBackward m = impl_->gqa;
  const bool expand = r > 1 && (m == GqaBackward::expand || (m == GqaBackward::automatic && r > 2));
  if (expand)
    return impl_->bwd_expanded(Impl::Expanded{t, n_seq, L, nq, nkv, D, scale, window},
                               Impl::Ptrs{q, k, v, o, lse, dout, dq, dk, dv}, ws, ws_bytes, why);
  Shape s;
  s.backward = s.stats = true;
  s.deterministic = impl_->deterministic;
  s.t = t;
  s.n_seq = n_seq, s.L = L, s.hq = nq, s.hk = nkv, s.D = D, s.q_row = nq * D, s.kv_row = nkv * D;
  s.scale = scale;
  s.window = window;
  const Entry* e = impl_->find(s, ws_bytes, why);
  if (!e) return false;
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(q)},
                                          {kK, const_cast<void*>(k)},
                                          {kV, const_cast<void*>(v)},
                                          {kO, const_cast<void*>(o)},
                                          {kStats, const_cast<float*>(lse)},
                                          {kDO, const_cast<void*>(dout)},
                                          {kDQ, dq},
                                          {kDK, dk},
                                          {kDV, dv}};
  impl_->run(*e, pack, ws, "sdpa backward execute");
  impl_->last_passes = 1;
  return true;
}

#else  // no cuDNN in this build

struct CudnnAttention::Impl {};
CudnnAttention::CudnnAttention(int, cudaStream_t) {}
CudnnAttention::~CudnnAttention() = default;
bool CudnnAttention::available() { return false; }
long CudnnAttention::version() { return 0; }
bool CudnnAttention::fwd(DType, const void*, const void*, const void*, void*, float*, int64_t, int64_t,
                         int64_t, int64_t, int64_t, float, void*, size_t, std::string* why, int64_t) {
  if (why) *why = "this build has no cuDNN";
  return false;
}
bool CudnnAttention::bwd(DType, const void*, const void*, const void*, const void*, const float*, const void*,
                         void*, void*, void*, int64_t, int64_t, int64_t, int64_t, int64_t, float, void*,
                         size_t, std::string* why, int64_t) {
  if (why) *why = "this build has no cuDNN";
  return false;
}
void CudnnAttention::set_gqa_backward(GqaBackward) {}
CudnnAttention::GqaBackward CudnnAttention::gqa_backward() const { return GqaBackward::automatic; }
void CudnnAttention::set_deterministic(bool) {}
int64_t CudnnAttention::last_bwd_passes() const { return 0; }

#endif

}  // namespace rp::cuda
