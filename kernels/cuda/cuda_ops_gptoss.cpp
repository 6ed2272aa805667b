// CudaOps: the ops GPT-OSS adds (kernels/ops.hpp: attention variants, per-expert bias,
// clamped SwiGLU). Kernels: cuda_gptoss.cu (rows, bias, SwiGLU, dsinks) and
// cuda_attention_variant.cu (tensor-core attention with a window and sinks).
// A default variant (no window, no sinks, no soft-cap; or a window >= L without sinks) runs the
// plain ops, cuDNN included, so it equals them exactly. A sliding window alone (Mistral, Phi-3,
// Gemma 3's sliding layers; not packed) runs on cuDNN's diagonal band when cuDNN takes it (any
// head_dim up to 256), else on our kernels.
// Soft-capped scores (Gemma 2) always run on our kernels (tensor-core flash for head_dim 64 /
// 128 / 256 where its shared memory fits, the row kernels otherwise), never cuDNN.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_ops.hpp"

namespace rp::cuda {
namespace {
void require(bool cond, const char* op, const char* what) {
  if (!cond) throw std::invalid_argument(std::string(op) + ": " + what);
}

void check_variant(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D,
                   const Ops::AttentionVariant& var, const char* op) {
  require(n_seq >= 0 && L >= 0 && D > 0 && D % 2 == 0, op, "bad dimensions");
  require(nq > 0 && nkv > 0 && nq % nkv == 0, op, "nq must be a positive multiple of nkv");
  require(var.window >= 0, op, "negative window");
  Ops::check_softcap(var.softcap, op);
}

/// The plain op computes this variant: no sinks, no soft-cap and no key outside the window.
bool plain(const Ops::AttentionVariant& var, int64_t L) {
  return var.sinks == nullptr && var.softcap == 0.f && (var.window == 0 || var.window >= L);
}

/// cuDNN's sliding-window graph computes this (non-plain) variant: a window alone, not packed.
bool window_only(const Ops::AttentionVariant& var) {
  return var.sinks == nullptr && var.softcap == 0.f && var.pos == nullptr && var.window > 0;
}
}  // namespace

void CudaOps::attention_fwd_v(const void* q, const void* k, const void* v, void* o, float* lse, int64_t n_seq,
                              int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale,
                              const AttentionVariant& var, void* scratch) {
  const char* op = "attention_fwd_v";
  check_variant(n_seq, L, nq, nkv, D, var, op);
  if (plain(var, L)) {
    if (var.pos) return attention_fwd_packed(q, k, v, o, lse, var.pos, n_seq, L, nq, nkv, D, scale, scratch);
    return attention_fwd(q, k, v, o, lse, n_seq, L, nq, nkv, D, scale, scratch);
  }
  if (n_seq * L == 0) return;
  set_device(dev_);
  const int64_t win = var.window >= L ? 0 : var.window;  // a window >= L restricts nothing
  if (window_only(var) && try_cudnn_variant([&](std::string* why) {
        return cudnn_->fwd(dtype_, q, k, v, o, lse, n_seq, L, nq, nkv, D, scale, scratch,
                           attention_ws(n_seq, L, nq, nkv, D), why, win);
      }))
    return;
  if (k_attention_flash_fwd_v(dtype_, q, k, v, o, lse, var.pos, var.sinks, win, n_seq, L, nq, nkv, D, scale,
                              attn_impl_, st_, var.softcap))
    return;
  k_attention_rows_fwd_v(dtype_, q, k, v, o, lse, var.pos, var.sinks, win, n_seq, L, L, 0, nq, nkv, D, scale,
                         st_, var.softcap);
}

void CudaOps::attention_bwd_v(const void* q, const void* k, const void* v, const void* o, const float* lse,
                              const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t L,
                              int64_t nq, int64_t nkv, int64_t D, float scale, const AttentionVariant& var,
                              void* scratch) {
  const char* op = "attention_bwd_v";
  check_variant(n_seq, L, nq, nkv, D, var, op);
  require(var.dsinks == nullptr || var.sinks != nullptr, op, "dsinks without sinks");
  if (plain(var, L)) {
    if (var.pos)
      return attention_bwd_packed(q, k, v, o, lse, dout, var.pos, dq, dk, dv, n_seq, L, nq, nkv, D, scale,
                                  scratch);
    return attention_bwd(q, k, v, o, lse, dout, dq, dk, dv, n_seq, L, nq, nkv, D, scale, scratch);
  }
  if (n_seq * L == 0) return;
  require(lse != nullptr && scratch != nullptr, op, "lse or scratch is null");
  set_device(dev_);
  const int64_t win = var.window >= L ? 0 : var.window;
  if (window_only(var) && try_cudnn_variant([&](std::string* why) {
        return cudnn_->bwd(dtype_, q, k, v, o, lse, dout, dq, dk, dv, n_seq, L, nq, nkv, D, scale, scratch,
                           attention_ws(n_seq, L, nq, nkv, D), why, win);
      }))
    return;
  // scratch (Ops::attention_scratch_bytes): the tensor-core path's fp32 dq accumulator
  // [T, nq, D] (8-byte aligned for its float2 atomics), then Di [n_seq, nq, L] fp32
  float* dq_acc = static_cast<float*>(scratch);
  float* di = dq_acc + n_seq * L * nq * D;
  k_attention_di(dtype_, o, dout, di, n_seq, L, nq, D, st_);
  if (var.dsinks)
    k_attention_dsinks(dtype_, var.sinks, lse, di, static_cast<float*>(var.dsinks), n_seq, L, nq, st_);
  if (k_attention_flash_bwd_v(dtype_, q, k, v, lse, di, dout, var.pos, dq, dk, dv, dq_acc, win, n_seq, L, nq,
                              nkv, D, scale, attn_impl_, st_, var.softcap))
    return;
  k_attention_rows_bwd_v(dtype_, q, k, v, lse, di, dout, var.pos, dq, dk, dv, win, n_seq, L, nq, nkv, D,
                         scale, st_, false, var.softcap);
}

void CudaOps::attention_decode_v(const void* q, const void* k_cache, const void* v_cache, void* o,
                                 int64_t past, int64_t n, int64_t nq, int64_t nkv, int64_t D, float scale,
                                 const AttentionVariant& var) {
  const char* op = "attention_decode_v";
  check_variant(1, n, nq, nkv, D, var, op);
  require(past >= 0, op, "negative past");
  require(var.pos == nullptr && var.dsinks == nullptr, op, "pos and dsinks must be null");
  set_device(dev_);
  const int64_t win = var.window >= past + n ? 0 : var.window;
  k_attention_rows_fwd_v(dtype_, q, k_cache, v_cache, o, nullptr, nullptr, var.sinks, win, 1, n, past + n,
                         past, nq, nkv, D, scale, st_, var.softcap);
}

void CudaOps::grouped_bias_fwd(void* y, const void* b, const int32_t* off, int64_t E, int64_t N) {
  const char* op = "grouped_bias_fwd";
  require(E >= 1 && N >= 0, op, "bad dimensions");
  require(off != nullptr && off[0] >= 0, op, "offsets_host must start at a row >= 0");
  for (int64_t e = 0; e < E; ++e) require(off[e + 1] >= off[e], op, "offsets_host must not decrease");
  set_device(dev_);
  k_grouped_bias_fwd(dtype_, y, b, off, E, N, st_);
}

void CudaOps::grouped_bias_bwd(const void* dy, void* db, const int32_t* off, int64_t E, int64_t N) {
  const char* op = "grouped_bias_bwd";
  require(E >= 1 && N >= 0, op, "bad dimensions");
  require(off != nullptr && off[0] >= 0, op, "offsets_host must start at a row >= 0");
  for (int64_t e = 0; e < E; ++e) require(off[e + 1] >= off[e], op, "offsets_host must not decrease");
  set_device(dev_);
  k_grouped_bias_bwd(dtype_, dy, static_cast<float*>(db), off, E, N, st_);
}

void CudaOps::swiglu_clamped_fwd(const void* g, const void* u, void* h, int64_t n, float alpha, float limit) {
  require(n >= 0, "swiglu_clamped_fwd", "negative size");
  set_device(dev_);
  k_swiglu_clamped_fwd(dtype_, g, u, h, n, alpha, limit, st_);
}

void CudaOps::swiglu_clamped_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n,
                                 float alpha, float limit) {
  require(n >= 0, "swiglu_clamped_bwd", "negative size");
  set_device(dev_);
  k_swiglu_clamped_bwd(dtype_, g, u, dh, dg, du, n, alpha, limit, st_);
}

}  // namespace rp::cuda
