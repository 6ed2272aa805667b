// CudaOps: the per-head q/k norm followed by RoPE as one pass over the rows
// (cuda_qk_norm_rope.cu), and its switch back to the separate kernels (set_qk_norm_rope_fused,
// RP_CUDA_QK_NORM_ROPE) for A/B measurements. Shapes the one pass does not take run the
// separate kernels, through Ops' defaults.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_ops.hpp"

namespace rp::cuda {
namespace {
void check(const Ops::QkNormRope& s, const char* op) {
  if (s.n_seq < 0 || s.seq_len < 0 || s.heads < 0 || s.head_dim <= 0)
    throw std::invalid_argument(std::string(op) + ": bad dimensions");
  if (s.inv_freq == nullptr) throw std::invalid_argument(std::string(op) + ": inv_freq is null");
}
}  // namespace

void CudaOps::qk_norm_rope_fwd(const void* x, const void* w, void* y, const QkNormRope& s) {
  check(s, "qk_norm_rope_fwd");
  const int64_t R = s.rotary_dim == 0 ? s.head_dim : s.rotary_dim;
  set_device(dev_);
  if (qk_rope_fused_ && k_qk_norm_rope_fwd(dtype_, x, w, y, s.pos, s.n_seq * s.seq_len, s.seq_len, s.heads,
                                           s.head_dim, R, s.eps, s.w_offset, s.inv_freq, s.rope_scale, st_))
    return;
  Ops::qk_norm_rope_fwd(x, w, y, s);
}

void CudaOps::qk_norm_rope_bwd(const void* x, const void* w, void* dy, void* dx, void* dw,
                               const QkNormRope& s) {
  check(s, "qk_norm_rope_bwd");
  if (dx == dy || dx == x) throw std::invalid_argument("qk_norm_rope_bwd: dx aliases x or dy");
  const int64_t R = s.rotary_dim == 0 ? s.head_dim : s.rotary_dim;
  set_device(dev_);
  if (qk_rope_fused_ &&
      k_qk_norm_rope_bwd(dtype_, x, w, dy, dx, static_cast<float*>(dw), s.pos, s.n_seq * s.seq_len, s.seq_len,
                         s.heads, s.head_dim, R, s.eps, s.w_offset, s.inv_freq, s.rope_scale, st_))
    return;
  Ops::qk_norm_rope_bwd(x, w, dy, dx, dw, s);
}

void set_qk_norm_rope_fused(Ops& ops, bool on) {
  cuda_ops(ops, "set_qk_norm_rope_fused").set_qk_norm_rope_fused(on);
}

bool parse_qk_norm_rope(const char* text) {
  if (!text || !*text) return true;
  const std::string t = text;
  if (t == "fused") return true;
  if (t == "separate") return false;
  throw std::invalid_argument(fmt::format("RP_CUDA_QK_NORM_ROPE='{}': expected fused or separate", t));
}

}  // namespace rp::cuda
