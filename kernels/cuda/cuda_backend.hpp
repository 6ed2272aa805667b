// Knobs of the CUDA backend that are not part of the Device/Ops interfaces (tests,
// benchmarks). Declared without CUDA headers; defined only when RP_HAVE_CUDA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/dtype.hpp"
#include "kernels/fp8.hpp"

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
/// else the expanded path: K/V copied per query head, cuDNN's multi-head backward in
/// passes over the query heads sized to the scratch, dK/dV summed per group in fp32), 1 = native
/// always, 2 = expanded always. Initial value from RP_CUDA_ATTENTION_GQA: auto (default),
/// native or expand. Throws std::invalid_argument for non-CUDA ops or another value.
void set_attention_gqa(Ops& ops, int mode);
/// Parses an RP_CUDA_ATTENTION_GQA value into the modes above; throws
/// std::invalid_argument naming the variable and the accepted values for anything else.
int parse_attention_gqa(const char* text);

/// How a CUDA device's ops run the grouped linears of mixture-of-experts blocks
/// (Ops::grouped_linear_*): 0 = one cuBLASLt GEMM per expert with rows, in order on the
/// compute stream; 1 = one cublasGemmGroupedBatchedEx call for all experts (a call cuBLAS
/// refuses, e.g. more than 1024 experts with rows or the fp32 weight-gradient output, runs
/// as 2), and weight gradients of a low-rank shape in one kernel of our own (see
/// set_grouped_wgrad_kernel_max); 2 = the GEMMs of 0 spread round-robin over 4 side streams
/// forked from and joined back into the compute stream (each with its own cuBLASLt
/// workspace), so small experts run concurrently. All give the same results up to the
/// summation order of the GEMM kernels. Initial value from the environment variable
/// RP_CUDA_GROUPED_GEMM: grouped (default), streams or loop. Throws std::invalid_argument
/// for non-CUDA ops or another value.
void set_grouped_gemm(Ops& ops, int mode);
/// The current mode of set_grouped_gemm.
int grouped_gemm(Ops& ops);
/// Parses an RP_CUDA_GROUPED_GEMM value ("loop" -> 0, "grouped", empty or unset -> 1,
/// "streams" -> 2); throws std::invalid_argument naming the variable and the accepted values
/// otherwise.
int parse_grouped_gemm(const char* text);
/// In mode 1, bf16 / f16 weight gradients whose dW has a side (K or N) of at most `side`
/// elements (per-expert LoRA adapters: the rank) run as one launch of a tensor-core kernel
/// over every expert instead of one cuBLASLt call per expert, whose host-side issue cost
/// dominates such small GEMMs. Default 64; 0 turns it off. Throws std::invalid_argument for
/// non-CUDA ops or a negative side.
void set_grouped_wgrad_kernel_max(Ops& ops, int64_t side);
/// In mode 1, bf16 / f16 grouped linears whose inner dimension is at most 64 (per-expert
/// LoRA adapters: the forward of a B with K = r, the input gradient through an A with N = r)
/// run as one launch of a tensor-core kernel that reads and writes the output once, instead
/// of cuBLAS's grouped GEMM. On by default; false runs them through cuBLAS. Throws
/// std::invalid_argument for non-CUDA ops.
void set_grouped_lowrank_kernel(Ops& ops, bool on);

/// With ExpertGemm::bucketed, whether the batches of equal segment length run through
/// cuBLASLt's pointer-array batched matmul, its algorithm chosen once per power-of-two class of
/// length and count (true, the default: no per-call kernel choice), or through
/// cublasGemmBatchedEx, which chooses one for every new length (false). A batch cuBLASLt refuses
/// runs the legacy way either way. Throws std::invalid_argument for non-CUDA ops.
void set_bucketed_lt(Ops& ops, bool on);
/// Parses an RP_CUDA_BUCKETED_LT value, the initial set_bucketed_lt of new CUDA ops ("1", empty or
/// unset -> true, "0" -> false); throws std::invalid_argument naming the variable and the accepted
/// values otherwise.
bool parse_bucketed_lt(const char* text);
/// With ExpertGemm::bucketed and cuBLASLt's batches, how many streams the batches of one grouped
/// linear spread over, round-robin (1: all on the compute stream; 2-4, 4 the default: the compute
/// stream and the side streams of mode 2, forked from and joined back into the compute stream,
/// each with its own workspace), so that small batches run together instead of one after
/// another. Same results.
/// Initial value from RP_CUDA_BUCKETED_STREAMS. Throws std::invalid_argument for non-CUDA ops
/// or n outside 1..4.
void set_bucketed_streams(Ops& ops, int n);
/// Parses an RP_CUDA_BUCKETED_STREAMS value, the initial set_bucketed_streams ("1".."4"; empty or
/// unset -> 4); throws std::invalid_argument naming the variable and the accepted values otherwise.
int parse_bucketed_streams(const char* text);
/// Whether Ops::qk_norm_rope_fwd / _bwd run as one pass over the rows (true, the default;
/// head_dim 64, 128 or 256 with full rotary) or as the separate norm and RoPE kernels (false),
/// which give the same y and dx bits. Initial value from RP_CUDA_QK_NORM_ROPE. Throws
/// std::invalid_argument for non-CUDA ops.
void set_qk_norm_rope_fused(Ops& ops, bool on);
/// Parses an RP_CUDA_QK_NORM_ROPE value ("fused", empty or unset -> true, "separate" -> false);
/// throws std::invalid_argument naming the variable and the accepted values otherwise.
bool parse_qk_norm_rope(const char* text);
/// How many batches of the bucketed GEMMs these ops enqueued through cuBLASLt (first) and
/// through cublasGemmBatchedEx (second) since they were made.
std::pair<int64_t, int64_t> bucketed_batches(Ops& ops);

/// The scratch bytes the cuDNN attention paths of these ops assume each attention call's
/// scratch holds; 0 (default) = Ops::attention_scratch_bytes of the call's shape. Smaller
/// values emulate a smaller scratch (more, smaller passes of the expanded GQA backward);
/// larger ones are for benchmarks whose callers pass buffers at least that large. Our own
/// kernels always use only their fixed part of the contract.
void set_attention_scratch_bytes(Ops& ops, size_t bytes);

/// cuDNN backward executions of the last attention_bwd on these ops: 1 for one graph, the
/// number of passes of the expanded GQA path, 0 when our kernels ran it.
int64_t attention_bwd_passes(Ops& ops);

/// The expanded-GQA helper kernels on the ops' compute stream (kernels/cuda/cuda_kernels.hpp,
/// k_gqa_expand_kv and k_gqa_group_sum; CPU twins in tests/kernels/ref_ops.hpp):
/// ke[t, i, :] = k[t, (h0 + i) / r, :] (ve from v, compute dtype) for i < hc, and
/// out[t, g, :] (+)= sum_{j<m} in[t, g*m + j, :] for g < G (fp32 sums; in [T, G*m, D] of in_t,
/// out rows of out_row elements of out_t; dtypes bf16, f16 or f32).
void gqa_expand_kv(Ops& ops, const void* k, const void* v, void* ke, void* ve, int64_t T, int64_t nkv,
                   int64_t h0, int64_t hc, int64_t r, int64_t D);
void gqa_group_sum(Ops& ops, DType in_t, const void* in_k, const void* in_v, DType out_t, void* out_k,
                   void* out_v, int64_t out_row, int64_t T, int64_t G, int64_t m, int64_t D, bool accumulate);

/// Ops::dequantize on the ops' compute stream with the output in out_t (f32, bf16 or f16)
/// instead of the compute dtype (CUDA ops are bf16 or f16; tests and benchmarks reach the
/// f32 output this way): dst[i] = dequantize_weights()'s value i rounded once to out_t.
/// Throws std::invalid_argument for non-CUDA ops, another out_t, an unknown format or n
/// not a multiple of the format's block (fp8: of the row length cols).
void dequantize_to(Ops& ops, WeightFormat f, DType out_t, const void* src, void* dst, int64_t n,
                   int64_t cols = 0);

/// Ops::gemm_fp8 with cuBLASLt's fast FP8 accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM):
/// false (default) has cuBLASLt add each k-block's tensor-core sum into fp32 accumulators;
/// true keeps the whole sum in the tensor cores' reduced-precision accumulator (faster, less
/// accurate). Throws std::invalid_argument for non-CUDA ops.
void set_fp8_fast_accum(Ops& ops, bool on);

/// What check_fp8_conversions found.
struct Fp8ConversionCheck {
  uint64_t encode_mismatches = 0;     ///< non-NaN fp32 inputs whose codes differ
  uint32_t first_mismatch_bits = 0;   ///< the smallest such input's bits (when any)
  uint64_t nan_code_differences = 0;  ///< NaN inputs given different NaN codes
  uint64_t decode_mismatches = 0;     ///< codes (of 256) whose fp32 values differ (NaN = NaN)
};
/// Runs fp8::encode (kernels/fp8.hpp) and CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f)
/// (the cvt.rn.satfinite instruction on compute capability 8.9+) over all 2^32 fp32 bit
/// patterns on the ops' device, and fp8::decode against the hardware's fp8 -> f16 conversion
/// over the 256 codes; waits for the result. Throws std::invalid_argument for non-CUDA ops.
Fp8ConversionCheck check_fp8_conversions(Ops& ops, Fp8Format f);

}  // namespace cuda
}  // namespace rp
