// CPU AdamW / Adam step on fp32 master weights, with a fused low-precision copy.
//
// Formulas (match torch.optim.AdamW / torch.optim.Adam, foreach=False, fused=False):
//   Adam:  Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization", Alg. 1
//          (with the "efficient" bias correction of Sec. 2 folded into step size / denom,
//          exactly as torch does it), AMSGrad per Reddi et al. 2018.
//   AdamW: Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Alg. 2
//          (the schedule multiplier eta_t is folded into `lr`, as in torch).
//
// One step, per element i, all arithmetic in fp32 with the scalar constants computed in
// double (t = step after increment):
//   g   = grad[i] * grad_scale                 (grad_scale: 1/num_target_tokens * clip)
//   g   = -g                                   if maximize
//   g   = g + weight_decay * w                 if !decoupled (Adam's L2 penalty)
//   w   = w * (1 - lr * weight_decay)          if decoupled  (AdamW)
//   m   = m + (1 - beta1) * (g - m)            (= beta1 m + (1-beta1) g, torch's lerp)
//   v   = beta2 * v + (1 - beta2) * g * g
//   vmax = max(vmax, v); use vmax below        if amsgrad
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   w   = w - (lr / (1 - beta1^t)) * m / denom
// The low-precision copy (if requested) is the final w rounded to nearest-even.
// Where the fp32 roundings fall (which multiply-adds are fused) is fixed in
// optimizer/kernels.hpp; the result is bit-identical for every ISA path (scalar, AVX2,
// AVX-512: optimizer/isa.hpp), every thread count and every pool, for finite values.
//
// Speed: explicitly vectorised kernels chosen at run time, run on a persistent
// (optionally pinned) ThreadPool; one pass over the data (reads w, m, v, g; writes w, m, v
// and streams the low-precision copy), so the step is bound by memory bandwidth.
//
// No CUDA, no actors: callers (optimizer shard actors) own the buffers.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <vector>

#include "kernels/dtype.hpp"
#include "optimizer/isa.hpp"
#include "optimizer/thread_pool.hpp"
#include "roundpipe/optimizer.hpp"  // AdamWOptions (hyper-parameters of one parameter group), validate

namespace rp {

/// std::allocator that default-initialises (leaves floats uninitialised on resize), so the
/// optimizer can first-touch each page on the thread that will use it (NUMA placement).
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  using value_type = T;
  DefaultInitAllocator() noexcept = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  template <class U>
  void construct(U* p) noexcept(noexcept(::new (static_cast<void*>(p)) U)) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  template <class U>
  bool operator==(const DefaultInitAllocator<U>&) const noexcept {
    return true;
  }
};

/// fp32 buffer whose resize() does not write the new elements.
using FloatVec = std::vector<float, DefaultInitAllocator<float>>;

/// Optimizer state of one parameter group (a flat range of n fp32 parameters).
/// m, v: first / second moments (n floats each); vmax: running max of v (n floats,
/// only with amsgrad, otherwise empty); step: number of updates applied so far.
/// Empty vectors are sized by the first adamw_update and zero-filled there by the threads
/// that update them (first touch: pages land on those threads' NUMA nodes).
struct AdamWState {
  FloatVec m, v, vmax;
  int64_t step = 0;
};

/// Applies one AdamW / Adam step to `n` fp32 master weights `w` in place.
///  - w:          n fp32 master weights (read and written).
///  - st:         state; st.step is incremented first and t = st.step is used for the
///                bias correction. m/v (and vmax with amsgrad) must be empty (then sized
///                to n and zeroed) or exactly n long.
///  - grad:       n raw fp32 gradients (read only; may not alias w or the state).
///  - grad_scale: multiplies every raw gradient first (the runtime passes
///                1/num_target_tokens * clip_coefficient). Unitless.
///  - o:          hyper-parameters (o.lr is ignored: the step's `lr` is used).
///  - lr:         learning rate of this step (from the schedule).
///  - lowp_out:   nullptr, or n elements of type `lowp_dtype` that receive the new
///                weights: float* for DType::f32, uint16_t* bit patterns for DType::bf16
///                and DType::f16 (round-to-nearest-even, NaN stays NaN, overflow -> inf).
///  - lowp_dtype: f32, bf16 or f16 (i32 is refused).
///  - threads:    >= 1; with threads > 1 the range is split into contiguous pieces run on
///                that many workers of the calling thread's shared_pool() (persistent, not
///                pinned; the calling thread waits). The result is bit-identical for every
///                thread count.
/// Throws std::invalid_argument for n < 0, null pointers with n > 0, state size mismatch,
/// bad options (see validate), lr < 0 or non-finite grad_scale; nothing is written then.
/// n == 0 still increments st.step (torch increments it for empty tensors too).
void adamw_update(float* w, AdamWState& st, const float* grad, int64_t n, float grad_scale,
                  const AdamWOptions& o, double lr, void* lowp_out = nullptr, DType lowp_dtype = DType::bf16,
                  int threads = 1);

/// The same step on the workers of `pool` (what an optimizer shard uses: its own pool,
/// pinned to its cores). The range [0, n) is split into min(pool.size(), ceil(n / 32768))
/// pieces by split_range(n, parts, 1024, p): the split, and so the thread that touches each
/// page, is the same on every call for a given n and pool. Tensors under 32768 elements run
/// on the calling thread. Same contract as above otherwise.
void adamw_update(float* w, AdamWState& st, const float* grad, int64_t n, float grad_scale,
                  const AdamWOptions& o, double lr, void* lowp_out, DType lowp_dtype, ThreadPool& pool);

/// Writes the low-precision copy of n fp32 weights, alone (what a shard does when the
/// protocol defers publishing a version): the same bits as adamw_update's fused copy
/// (round-to-nearest-even; f32: a copy), vectorised, split over `pool` (null: the calling
/// thread) like adamw_update. Throws std::invalid_argument for n < 0, null pointers with
/// n > 0, or a dtype other than f32, bf16, f16.
void write_lowp_copy(const float* w, void* out, int64_t n, DType dtype, ThreadPool* pool = nullptr);

/// Elements per piece below which adamw_update / sum_of_squares stay on fewer threads.
inline constexpr int64_t kMinElemsPerThread = 32768;

/// Writes `st` in a little-endian binary format: magic "RPADAMW1", version (u32, 3),
/// flags (u32, bit 0: vmax present, bit 1: hyper-parameters present), step (i64), n (i64),
/// [hyper-parameters: lr, beta1, beta2, eps, weight_decay as f64, then u32 bits
/// decoupled | amsgrad << 1 | maximize << 2], then m, v and (if present) vmax as n raw fp32
/// each, then the XXH3-64 checksum of the flags, step and n bytes, the hyper-parameter bytes
/// and the float payload (version 2, still read, left flags, step and n out of it, so a
/// damaged step loaded silently; version 1 had an FNV-1a checksum and is refused).
/// `opts` (optional) records the group's hyper-parameters with the state.
/// The fp32 master weights are not part of the state: save them separately (bit-exact)
/// for a bit-identical resume. Throws std::runtime_error when the stream fails.
void save_state(std::ostream& os, const AdamWState& st, const AdamWOptions* opts = nullptr);

/// Bytes save_state writes for a state of n moments with the flags it records (bit 0: vmax,
/// bit 1: hyper-parameters): the 32-byte head (magic, version, flags, step, n), the
/// hyper-parameters, the moments and the checksum. Lets a reader check a file's extent
/// without loading it.
int64_t saved_state_bytes(uint32_t flags, int64_t n);

/// Reads a state written by save_state into `st` (replacing it). `expected_n` is the
/// parameter count of the group it is loaded for (-1: accept any). Throws
/// std::runtime_error with a one-line reason on a bad magic / version, a size mismatch
/// ("expected N parameters, file has M"), m/v sizes inconsistent with the header, a
/// negative step, a truncated stream or a checksum mismatch; `st` is unchanged then.
/// When the file holds hyper-parameters and `opts` is not null, *opts receives them (a file
/// without them leaves *opts unchanged; `has_opts`, if given, says which happened).
void load_state(std::istream& is, AdamWState& st, int64_t expected_n = -1, AdamWOptions* opts = nullptr,
                bool* has_opts = nullptr);

}  // namespace rp
