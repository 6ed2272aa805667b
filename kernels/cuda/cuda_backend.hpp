// Knobs of the CUDA backend that are not part of the Device/Ops interfaces (tests,
// benchmarks). Declared without CUDA headers; defined only when RP_HAVE_CUDA.
#pragma once
#include <cstddef>
#include <cstdint>

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

/// Grouped-query attention backward through cuDNN (kernels/cuda/cudnn_attention.hpp):
/// 0 = automatic (cuDNN's native GQA graph when a KV head serves at most 2 query heads,
/// else the expanded path: K/V copied per query head, cuDNN's multi-head backward over
/// chunks of KV heads sized to the scratch, dK/dV summed per group in fp32), 1 = native
/// always, 2 = expanded always. Initial value from RP_CUDA_ATTENTION_GQA: auto (default),
/// native or expand. Throws std::invalid_argument for non-CUDA ops or another value.
void set_attention_gqa(Ops& ops, int mode);
/// Parses an RP_CUDA_ATTENTION_GQA value into the modes above; throws
/// std::invalid_argument naming the variable and the accepted values for anything else.
int parse_attention_gqa(const char* text);

/// Caps the scratch bytes the cuDNN attention paths use to min(bytes,
/// Ops::attention_scratch_bytes(shape)); 0 removes the cap. For tests and benchmarks of a
/// smaller scratch (more, smaller chunks of the expanded GQA backward); our own kernels
/// always use their fixed part of the contract.
void set_attention_scratch_limit(Ops& ops, size_t bytes);

/// cuDNN backward executions of the last attention_bwd on these ops: 1 for one graph, the
/// number of KV-head chunks on the expanded GQA path, 0 when our kernels ran it.
int64_t attention_bwd_passes(Ops& ops);

/// The expanded-GQA helper kernels on the ops' compute stream, in its compute dtype
/// (see kernels/cuda/cuda_kernels.hpp: k_gqa_expand_kv, k_gqa_group_sum): for the KV
/// heads [g0, g0+gc) of [T, nkv, D] tensors with r query heads each,
/// ke[t, g*r + j, :] = k[t, g0 + g, :] (ve from v), and
/// dk[t, g0 + g, :] = sum_j dke[t, g*r + j, :] (dv from dve; fp32 sum, other heads untouched).
void gqa_expand_kv(Ops& ops, const void* k, const void* v, void* ke, void* ve, int64_t T,
                   int64_t nkv, int64_t g0, int64_t gc, int64_t r, int64_t D);
void gqa_group_sum(Ops& ops, const void* dke, const void* dve, void* dk, void* dv, int64_t T,
                   int64_t nkv, int64_t g0, int64_t gc, int64_t r, int64_t D);

}  // namespace cuda
}  // namespace rp
