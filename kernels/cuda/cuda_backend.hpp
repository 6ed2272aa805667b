// Knobs of the CUDA backend that are not part of the Device/Ops interfaces (tests,
// benchmarks). Declared without CUDA headers; defined only when RP_HAVE_CUDA.
#pragma once

namespace rp {
class Ops;
namespace cuda {

/// Attention implementation of a CUDA device's ops: 0 = automatic (tensor-core
/// FlashAttention-2 kernels for head_dim 64/128, else the simple kernels), 1 = always
/// the simple one-warp-per-row kernels, 2 = flash with 4-warp forward blocks and an
/// unpipelined backward, 3 = flash with 8-warp forward blocks and a double-buffered
/// backward. Throws std::invalid_argument for non-CUDA ops or another value.
void set_attention_impl(Ops& ops, int impl);

}  // namespace cuda
}  // namespace rp
