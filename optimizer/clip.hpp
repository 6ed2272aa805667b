// Global gradient-norm clipping helpers (torch.nn.utils.clip_grad_norm_ semantics, L2 norm).
//
// The runtime's gradients of one step are spread over many parameter groups / shards:
// each shard computes sum_of_squares of its own gradients, the partial sums are added,
// global_norm = sqrt(total), and clip_coefficient(global_norm, max_norm) is folded into
// the grad_scale passed to adamw_update.
#pragma once
#include <cstdint>

namespace rp {

class ThreadPool;

/// Sum of g[i]^2 over n fp32 values, each squared and accumulated in double (so the sum of
/// per-shard results equals the sum over the concatenated gradients to double rounding).
/// Returns +inf if any value is +-inf, NaN if any is NaN (so one pass both feeds the norm
/// and detects overflow: a finite fp32 squared cannot overflow a double sum). n == 0 gives 0.
/// Unit: grad^2. The summation order is fixed: chunks of kSumsqChunk elements, each summed
/// as 16 interleaved partial sums (lane j takes i % 16 == j) added lane 0..15, and the chunk
/// sums added in order. The result is therefore deterministic for a given n, and the same
/// bits on every ISA path and for every thread pool. Vectorised (optimizer/isa.hpp).
/// Throws std::invalid_argument for n < 0 or g == nullptr with n > 0.
double sum_of_squares(const float* g, int64_t n);

/// The same sum, the chunks spread over the workers of `pool` (bit-identical to the
/// single-threaded call).
double sum_of_squares(const float* g, int64_t n, ThreadPool& pool);

inline constexpr int64_t kSumsqChunk = 65536;

/// torch clip_grad_norm_ coefficient: min(1, max_norm / (global_norm + 1e-6)).
/// global_norm: L2 norm of all gradients (sqrt of the summed sum_of_squares), >= 0.
/// max_norm: > 0 and finite, else std::invalid_argument (callers that do not clip must not
/// call this). A NaN global_norm gives NaN (as torch: check all_finite and skip the step);
/// +inf gives 0. The result multiplies the gradients (unitless).
double clip_coefficient(double global_norm, double max_norm);

/// True when none of the n values is +-inf or NaN (n == 0: true). Throws
/// std::invalid_argument for n < 0 or g == nullptr with n > 0.
bool all_finite(const float* g, int64_t n);

}  // namespace rp
