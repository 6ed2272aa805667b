// cuDNN flash attention (see cudnn_attention.hpp). The graphs follow the cudnn-frontend
// SDPA recipe: BSHD-strided [b, h, s, d] Q/K/V/O, fp32 intermediate and compute, a
// top-left-aligned causal mask, natural-log stats. One graph per key, built on first use.
#include "kernels/cuda/cudnn_attention.hpp"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/cuda_check.hpp"

#ifdef RP_HAVE_CUDNN
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace rp::cuda {

#ifdef RP_HAVE_CUDNN

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

using Key = std::array<int64_t, 9>;  // bwd, dtype, with_stats, n_seq, L, nq, nkv, D, scale bits

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN refused this configuration
  int64_t workspace = 0;
  std::string why;                          // refusal reason (for the log line)
};

std::vector<int64_t> bshd_dims(int64_t b, int64_t h, int64_t s, int64_t d) { return {b, h, s, d}; }
std::vector<int64_t> bshd_strides(int64_t h, int64_t s, int64_t d) {
  return {s * h * d, d, h * d, 1};
}

[[noreturn]] void throw_cudnn(const std::string& what, const std::string& msg) {
  throw DeviceError(fmt::format("cuDNN {} failed: {}", what, msg));
}

}  // namespace

struct CudnnAttention::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
  std::map<Key, Entry> cache;

  Entry build(const Key& key, DType t, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv,
              int64_t D, float scale) {
    const bool backward = key[0] != 0, with_stats = key[2] != 0;
    Entry e;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tensor = [&](const char* name, int64_t uid, int64_t h) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim(bshd_dims(n_seq, h, L, D))
                           .set_stride(bshd_strides(h, L, D)));
    };
    auto Q = tensor("Q", kQ, nq), K = tensor("K", kK, nkv), V = tensor("V", kV, nkv);
    auto set_out = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& x, int64_t uid,
                       int64_t h) {
      x->set_output(true).set_uid(uid).set_dim(bshd_dims(n_seq, h, L, D))
          .set_stride(bshd_strides(h, L, D));
    };
    if (!backward) {
      auto opt = fe::graph::SDPA_attributes()
                     .set_name("rp_attention_fwd")
                     .set_generate_stats(with_stats)
                     .set_causal_mask(true)
                     .set_attn_scale(scale);
      auto [O, Stats] = g->sdpa(Q, K, V, opt);
      set_out(O, kO, nq);
      if (with_stats)
        Stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT)
            .set_dim({n_seq, nq, L, 1}).set_stride({nq * L, L, 1, 1});
    } else {
      auto O = tensor("O", kO, nq), dO = tensor("dO", kDO, nq);
      auto Stats = g->tensor(fe::graph::Tensor_attributes()
                                 .set_name("Stats")
                                 .set_uid(kStats)
                                 .set_dim({n_seq, nq, L, 1})
                                 .set_stride({nq * L, L, 1, 1})
                                 .set_data_type(fe::DataType_t::FLOAT));
      auto opt = fe::graph::SDPA_backward_attributes()
                     .set_name("rp_attention_bwd")
                     .set_causal_mask(true)
                     .set_attn_scale(scale);
      auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opt);
      set_out(dQ, kDQ, nq);
      set_out(dK, kDK, nkv);
      set_out(dV, kDV, nkv);
    }
    auto refuse = [&](const char* step, fe::error_t st) {
      e.graph.reset();
      e.why = fmt::format("{}: {}", step, st.get_message());
      return e;
    };
    if (auto st = g->validate(); !st.is_good()) return refuse("validate", st);
    if (auto st = g->build_operation_graph(handle); !st.is_good())
      return refuse("build_operation_graph", st);
    if (auto st = g->create_execution_plans({fe::HeurMode_t::A}); !st.is_good())
      return refuse("create_execution_plans", st);
    if (auto st = g->check_support(handle); !st.is_good()) return refuse("check_support", st);
    if (auto st = g->build_plans(handle); !st.is_good()) return refuse("build_plans", st);
    if (auto st = g->get_workspace_size(e.workspace); !st.is_good())
      return refuse("get_workspace_size", st);
    e.graph = std::move(g);
    return e;
  }

  // Looks up (or builds) the graph for `key`; null (with *why) when cuDNN refused it or
  // its workspace exceeds ws_bytes.
  const Entry* find(const Key& key, DType t, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv,
                    int64_t D, float scale, size_t ws_bytes, std::string* why) {
    std::lock_guard lk(mu);
    auto it = cache.find(key);
    if (it == cache.end()) {
      set_device(device);
      it = cache.emplace(key, build(key, t, n_seq, L, nq, nkv, D, scale)).first;
    }
    const Entry& e = it->second;
    if (!e.graph) {
      if (why) *why = e.why;
      return nullptr;
    }
    if (size_t(e.workspace) > ws_bytes) {
      if (why) *why = fmt::format("workspace of {} bytes exceeds the {} bytes of scratch",
                                  e.workspace, ws_bytes);
      return nullptr;
    }
    return &e;
  }

  void run(const Entry& e, std::unordered_map<int64_t, void*>& pack, void* ws, const char* what) {
    set_device(device);
    if (auto st = e.graph->execute(handle, pack, ws); !st.is_good())
      throw_cudnn(what, st.get_message());
  }
};

namespace {
Key make_key(bool bwd, DType t, bool stats, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv,
             int64_t D, float scale) {
  int32_t bits;
  static_assert(sizeof bits == sizeof scale);
  std::memcpy(&bits, &scale, sizeof bits);
  return {bwd, int64_t(t), stats, n_seq, L, nq, nkv, D, bits};
}
bool supported_dtype(DType t) { return t == DType::bf16 || t == DType::f16; }
}  // namespace

CudnnAttention::CudnnAttention(int device, cudaStream_t stream) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->stream = stream;
  set_device(device);
  if (cudnnStatus_t s = cudnnCreate(&impl_->handle); s != CUDNN_STATUS_SUCCESS)
    throw DeviceError(fmt::format("cudnnCreate failed: {}", cudnnGetErrorString(s)));
  if (cudnnStatus_t s = cudnnSetStream(impl_->handle, stream); s != CUDNN_STATUS_SUCCESS)
    throw DeviceError(fmt::format("cudnnSetStream failed: {}", cudnnGetErrorString(s)));
}

CudnnAttention::~CudnnAttention() {
  if (!impl_) return;
  cudaSetDevice(impl_->device);
  impl_->cache.clear();
  if (impl_->handle) cudnnDestroy(impl_->handle);
}

bool CudnnAttention::available() { return true; }
long CudnnAttention::version() { return long(cudnnGetVersion()); }

bool CudnnAttention::fwd(DType t, const void* q, const void* k, const void* v, void* o,
                         float* lse, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv,
                         int64_t D, float scale, void* ws, size_t ws_bytes,
                         std::string* why) {
  if (!supported_dtype(t) || n_seq * L == 0) {
    if (why) *why = "needs bf16/f16 storage and at least one token";
    return false;
  }
  const Key key = make_key(false, t, lse != nullptr, n_seq, L, nq, nkv, D, scale);
  const Entry* e = impl_->find(key, t, n_seq, L, nq, nkv, D, scale, ws_bytes, why);
  if (!e) return false;
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(q)},
                                          {kK, const_cast<void*>(k)},
                                          {kV, const_cast<void*>(v)},
                                          {kO, o}};
  if (lse) pack.emplace(kStats, lse);
  impl_->run(*e, pack, ws, "sdpa forward execute");
  return true;
}

bool CudnnAttention::bwd(DType t, const void* q, const void* k, const void* v, const void* o,
                         const float* lse, const void* dout, void* dq, void* dk, void* dv,
                         int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D,
                         float scale, void* ws, size_t ws_bytes, std::string* why) {
  if (!supported_dtype(t) || n_seq * L == 0 || !lse) {
    if (why) *why = "needs bf16/f16 storage, at least one token and the forward's stats";
    return false;
  }
  if (nq > 2 * nkv) {
    // Measured on the lent H200 with the PyTorch wheel's cuDNN 9 and frontend 1.32: the
    // backward returns all-NaN dq/dk/dv when a KV head serves 4 query heads (2 and 1 are
    // exact; zeroing outputs and workspace first did not help). tests/kernels keeps the
    // case covered through the automatic fallback.
    if (why) *why = "backward with more than 2 query heads per KV head (NaN on cuDNN 9 / H200)";
    return false;
  }
  const Key key = make_key(true, t, true, n_seq, L, nq, nkv, D, scale);
  const Entry* e = impl_->find(key, t, n_seq, L, nq, nkv, D, scale, ws_bytes, why);
  if (!e) return false;
  std::unordered_map<int64_t, void*> pack{
      {kQ, const_cast<void*>(q)},     {kK, const_cast<void*>(k)},
      {kV, const_cast<void*>(v)},     {kO, const_cast<void*>(o)},
      {kStats, const_cast<float*>(lse)}, {kDO, const_cast<void*>(dout)},
      {kDQ, dq},                      {kDK, dk},
      {kDV, dv}};
  impl_->run(*e, pack, ws, "sdpa backward execute");
  return true;
}

#else  // no cuDNN in this build

struct CudnnAttention::Impl {};
CudnnAttention::CudnnAttention(int, cudaStream_t) {}
CudnnAttention::~CudnnAttention() = default;
bool CudnnAttention::available() { return false; }
long CudnnAttention::version() { return 0; }
bool CudnnAttention::fwd(DType, const void*, const void*, const void*, void*, float*, int64_t,
                         int64_t, int64_t, int64_t, int64_t, float, void*, size_t, std::string* why) {
  if (why) *why = "this build has no cuDNN";
  return false;
}
bool CudnnAttention::bwd(DType, const void*, const void*, const void*, const void*, const float*,
                         const void*, void*, void*, void*, int64_t, int64_t, int64_t, int64_t,
                         int64_t, float, void*, size_t, std::string* why) {
  if (why) *why = "this build has no cuDNN";
  return false;
}

#endif

}  // namespace rp::cuda
