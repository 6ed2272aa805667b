// Knobs of the CUDA backend that are not part of the Device/Ops interfaces (tests,
// benchmarks). Declared without CUDA headers; defined only when RP_HAVE_CUDA.
#pragma once

namespace rp {
class Ops;
namespace cuda {

/// Attention implementation of a CUDA device's ops: 0 = automatic (cuDNN's fused flash
/// attention when the build has cuDNN and it accepts the shape, else our tensor-core
/// FlashAttention-2 kernels for head_dim 64/128, else the simple kernels), 1 = always
/// the simple one-warp-per-row kernels, 2 = flash with 4-warp forward blocks and an
/// unpipelined backward, 3 = flash with 8-warp forward blocks and a double-buffered
/// backward, 4 = cuDNN only (attention calls throw DeviceError naming what cuDNN
/// refused). Throws std::invalid_argument for non-CUDA ops or another value.
/// The initial value of every CUDA device comes from the environment variable
/// RP_CUDA_ATTENTION: auto (default), simple, flash, flash8 or cudnn.
void set_attention_impl(Ops& ops, int impl);

/// True when this build links cuDNN's flash attention (impl 4 can run).
bool cudnn_attention_available();

/// Parses an RP_CUDA_ATTENTION value ("auto", "simple", "flash", "flash8", "cudnn") into
/// the impl numbers above. Throws std::invalid_argument naming the variable and the
/// accepted values for anything else.
int parse_attention_impl(const char* text);

}  // namespace cuda
}  // namespace rp
