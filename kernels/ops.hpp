// The numeric ops of one device (two backends, CPU and CUDA, one runtime).
//
// Every backend implements the same interface:
//  - CPU backend (kernels/cpu/cpu_ops.cpp): Eigen, fp32 storage and compute; every
//    `void*` below is a float*.
//  - CUDA backend: bf16/fp16 storage (dtype()), fp32 accumulation, fp32 gradient
//    accumulators (grad_dtype()).
// Conventions for all methods:
//  - Tensor pointers are device pointers in dtype() ("compute dtype") unless the
//    parameter says otherwise: gradient accumulators of parameters (dw, dtable, ...)
//    are in grad_dtype(); ids/targets are int32; lse/loss are fp32.
//  - Shapes are row-major; the last listed dimension is contiguous. T = tokens,
//    H = hidden size, V = vocabulary, D = head_dim.
//  - "+=" outputs accumulate into what is there; every other output is overwritten
//    entirely (tests poison outputs with NaN first).
//  - Calls are issued on the device's compute stream (Device::ops()); the CPU
//    backend runs them synchronously on the calling thread.
//  - Invalid arguments (negative dims, ids out of range on the CPU, ...) throw
//    std::invalid_argument / std::out_of_range before anything is written.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dtype.hpp"
#include "kernels/fp8.hpp"
#include "kernels/weight_format.hpp"

namespace rp {

// ---------------------------------------------------------------------------------
// RoPE frequencies (host side, computed once per model)
// ---------------------------------------------------------------------------------

/// Inputs of HF transformers' `ROPE_INIT_FUNCTIONS[rope_type](config)`
/// (modeling_rope_utils.py). kernels/ does not know ModelConfig; model/ fills this.
struct RopeParams {
  std::string type = "default";  ///< default | linear | llama3 | yarn
  double theta = 10000.0;        ///< rope_theta (the base)
  /// the rotary dimension: D, or the rotary_dim of a partial rotary (the table then has
  /// rotary_dim/2 frequencies over rotary_dim, as transformers' `dim = head_dim*partial_rotary_factor`)
  int64_t head_dim = 0;
  double factor = 1.0;  ///< linear / llama3 / yarn scaling factor
  // llama3 (Llama 3.1 "_compute_llama3_parameters")
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  /// llama3: required (> 0). yarn: the pre-training context; 0 = use
  /// max_position_embeddings (as transformers does when the key is absent).
  int64_t original_max_position_embeddings = 0;
  int64_t max_position_embeddings = 2048;
  // yarn (Peng et al. 2023, "YaRN", arXiv 2309.00071, sec. 3.2-3.4)
  double beta_fast = 32.0, beta_slow = 1.0;
  double attention_factor = 0.0;  ///< yarn mscale; 0 = 0.1*ln(factor)+1 (1 if factor <= 1)
  /// yarn: round the correction range outwards to whole dimensions (transformers'
  /// rope_parameters "truncate", default true; GPT-OSS ships false: the bounds stay fractional)
  bool truncate = true;
};

/// Result of rope_frequencies: inv_freq[i] for i < D/2, and the scale HF multiplies
/// into both cos and sin ("attention_scaling"; 1 except for yarn).
struct RopeTable {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};

/// Computes the inverse-frequency table exactly as transformers' rope init functions:
///  default: inv_freq_i = theta^(-2i/D)
///  linear : default / factor
///  llama3 : wavelen = 2*pi/inv_freq; wavelen > orig/low_freq_factor -> inv_freq/factor;
///           wavelen < orig/high_freq_factor -> unchanged; in between the smooth blend
///           s = (orig/wavelen - low)/(high - low), (1-s)*inv/factor + s*inv.
///  yarn   : correction range [low, high] = [floor(d(beta_fast)), ceil(d(beta_slow))]
///           (unrounded [d(beta_fast), d(beta_slow)] when truncate is false)
///           clamped to [0, D-1] with d(r) = D*ln(orig/(2*pi*r)) / (2*ln(theta));
///           ramp_i = clamp((i-low)/(high-low), 0, 1); extrapolation weight 1-ramp_i;
///           inv = inv_interp*ramp + inv_extrap*(1-ramp), inv_interp = inv_extrap/factor;
///           attention_scaling = attention_factor (or 0.1*ln(factor)+1).
///           Note: `factor` is taken as given (the DeepSeek-V3 override factor =
///           max_pos/original_max_pos of newer transformers releases is not applied).
/// Computed in double, rounded to float. Throws std::invalid_argument for an unknown
/// type, odd/zero head_dim, factor <= 0, llama3 without original_max_position_embeddings.
RopeTable rope_frequencies(const RopeParams& p);

/// Half the rotary dimension of a RoPE op on heads of D features (rotary_dim 0 = D), after
/// checking D and rotary_dim are even with 0 < rotary_dim <= D; std::invalid_argument
/// "<op>: ..." otherwise. Shared by every backend so they refuse the same shapes.
inline int64_t rope_half(int64_t D, int64_t rotary_dim, const char* op) {
  const int64_t R = rotary_dim == 0 ? D : rotary_dim;
  if (!(D > 0 && D % 2 == 0))
    throw std::invalid_argument(std::string(op) + ": head_dim must be even and positive");
  if (!(R > 0 && R % 2 == 0 && R <= D))
    throw std::invalid_argument(std::string(op) + ": rotary_dim must be even, positive and <= head_dim");
  return R / 2;
}

/// How MoE blocks run their grouped linears (Ops::set_expert_gemm).
enum class ExpertGemm { grouped, bucketed };

// ---------------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------------

class Ops {
 public:
  /// Tokens per chunk of lm_head_cross_entropy: logits exist for at most this many
  /// tokens at a time ([kCeChunk, V] fp32 scratch).
  static constexpr int64_t kCeChunk = 128;

  virtual ~Ops() = default;
  /// Thrown by ops a backend does not implement yet (std::logic_error naming the op).
  [[noreturn]] static void unimplemented(const char* op) {
    throw std::logic_error(std::string(op) + ": not implemented on this backend");
  }
  /// Storage type of weights, activations and activation gradients (f32 on the CPU).
  virtual DType dtype() const = 0;
  /// Type of parameter-gradient accumulators (f32 on both backends).
  virtual DType grad_dtype() const = 0;
  /// Threads one op may use (CPU: GEMMs, incl. those of lm_head_cross_entropy, are
  /// split over this many std::threads, since Eigen is built without OpenMP; default 1
  /// because several virtual workers run in parallel). CUDA: ignored.
  /// CPU ops keep no other state: one object may serve concurrent callers.
  virtual void set_num_threads(int n) = 0;
  virtual int num_threads() const = 0;
  /// fp16 accumulation of the dense linears' forward and input-gradient GEMMs (linear_fwd,
  /// linear_bwd_input, linear_fwd_add; weight gradients, grouped and LM-head GEMMs stay fp32):
  /// twice the tensor-core rate of fp32 accumulation on GeForce GPUs (docs/gpu.md, "fp16
  /// accumulation"). A sum past 65504 becomes inf, which the f16 loss scaling's non-finite
  /// check catches. CUDA: cuBLASLt's CUBLAS_COMPUTE_16F, needs dtype() f16; the CPU backend
  /// emulates it (the fp32 sum of each k-chunk of 16 products is added to an fp16
  /// accumulator, as an m16n8k16 tensor-core step does). Set before the ops are used.
  /// Throws std::invalid_argument on a bf16 device.
  void set_f16_accumulation(bool on) {
    if (on && dtype() == DType::bf16)
      throw std::invalid_argument("fp16 accumulation needs the f16 compute dtype (this device stores bf16)");
    f16_accum_ = on;
  }
  bool f16_accumulation() const { return f16_accum_; }
  /// Products per fp16 rounding of the accumulator in the CPU emulation (the k of one mma).
  static constexpr int64_t kF16AccumChunk = 16;

  // ---- memory helpers (element counts, any of f32/bf16/f16; fill also i32) ------
  /// x[i] = value, i < n, x of type t.
  virtual void fill(DType t, void* x, int64_t n, float value) = 0;
  /// dst[i] = src[i] (same type t; regions must not overlap).
  virtual void copy(DType t, void* dst, const void* src, int64_t n) = 0;
  /// dst[i] = convert(src[i]) (round-to-nearest-even for 16-bit targets).
  virtual void cast(DType dst_t, void* dst, DType src_t, const void* src, int64_t n) = 0;
  /// dst[i] = the i-th value of n values stored in format f at src (kernels/weight_format.hpp),
  /// written in this device's compute dtype (dtype()). The host twin is
  /// dequantize_weights(); quantized formats need n to be a multiple of the block and src
  /// to start at a block, fp8 the row length `cols` (> 0, dividing n; other formats ignore
  /// it). Throws std::invalid_argument otherwise.
  virtual void dequantize(WeightFormat f, const void* src, void* dst, int64_t n, int64_t cols = 0) = 0;
  /// dequantize() of each of the `count` parts (kernels/weight_format.hpp; outputs must not overlap), with
  /// the same values bit for bit. CUDA checks every part before it enqueues anything (the default loop throws
  /// at the first bad part, after the earlier ones) and runs consecutive parts of one format in one launch
  /// per up to 32 of them: a mixture-of-experts layer stores each expert's matrices as tensors of ~1M values,
  /// and one launch each (hundreds per layer and upload) left the GPU idle between the short kernels.
  virtual void dequantize_many(const DequantPart* parts, int64_t count) {
    for (int64_t i = 0; i < count; ++i)
      dequantize(parts[i].format, parts[i].src, parts[i].dst, parts[i].n, parts[i].cols);
  }
  /// dst[i] += alpha * src[i], computed in fp32 (gradient accumulation).
  virtual void add_into(DType dst_t, void* dst, DType src_t, const void* src, int64_t n,
                        float alpha = 1.0f) = 0;
  /// y[i] = a[i] + b[i] (residual add; y may alias a or b). Backward of a residual
  /// add is the identity on dy: use copy/add_into.
  virtual void add(const void* a, const void* b, void* y, int64_t n) = 0;

  // ---- linear: y = x W^T, W [N, K] row-major ([out, in], as HF stores nn.Linear) --
  /// y[M,N] = alpha * x[M,K] W[N,K]^T (the fp32 sum scaled once, then rounded to dtype()).
  /// alpha != 1: a LoRA adapter's u = s * x A^T in one call (model/lora_linear.hpp).
  virtual void linear_fwd(const void* x, const void* w, void* y, int64_t M, int64_t K, int64_t N,
                          float alpha = 1.0f) = 0;
  /// dx[M,K] = alpha * dy[M,N] W[N,K]  (dx += ... when accumulate; alpha as in linear_fwd).
  virtual void linear_bwd_input(const void* dy, const void* w, void* dx, int64_t M, int64_t K, int64_t N,
                                bool accumulate, float alpha = 1.0f) = 0;
  /// dw[N,K] += dy[M,N]^T x[M,K]   (dw in grad_dtype()).
  virtual void linear_bwd_weight(const void* dy, const void* x, void* dw, int64_t M, int64_t K,
                                 int64_t N) = 0;
  /// y[M,N] += alpha * x[M,K] W[N,K]^T (products summed in fp32, then added to y, which is
  /// read and written in dtype()). The low-rank update of a LoRA adapter (model/lora_linear.hpp)
  /// and, into a zeroed y, a scaled linear.
  virtual void linear_fwd_add(const void* x, const void* w, void* y, int64_t M, int64_t K, int64_t N,
                              float alpha) = 0;
  /// y[M,N] = r[M,N] + x[M,K] W[N,K]^T, r != y (both in dtype()): a linear whose output joins
  /// the residual stream (o_proj and down_proj of a pre-norm decoder). The default is the two
  /// passes linear_fwd and add (the CPU backend's, bits unchanged); CUDA reads r in the GEMM's
  /// epilogue (the fp32 product plus r, rounded once), saving a pass that reads r and y and
  /// writes y. Throws std::invalid_argument when r is y.
  virtual void linear_fwd_residual(const void* x, const void* w, const void* r, void* y, int64_t M, int64_t K,
                                   int64_t N) {
    if (r == y) throw std::invalid_argument("linear_fwd_residual: r and y are the same tensor");
    linear_fwd(x, w, y, M, K, N);
    add(r, y, y, M * N);
  }

  // ---- linears with a column-block operand --------------------------------------------
  // Adapters that share their input (q/k/v, gate/up: model/lora_linear.hpp) keep their low-rank
  // tensors side by side: u = s x [A_1; ...; A_G]^T and g = [g_1 ... g_G] are [M, G r], each
  // adapter's [M, r] a block of columns whose rows lie ld = G r elements apart. These are the
  // three linears above with that block as an operand; ld below the block's width, or a
  // negative dimension, throws std::invalid_argument. With ld equal to the width each equals
  // its contiguous twin bit for bit.
  /// y[M,N] = x[M,K] W[N,K]^T, x's rows ldx apart (as linear_fwd with alpha 1).
  virtual void linear_fwd_ld(const void* x, int64_t ldx, const void* w, void* y, int64_t M, int64_t K,
                             int64_t N) = 0;
  /// dx[M,K] = alpha * dy[M,N] W[N,K], dx's rows lddx apart; its other columns are not written
  /// (as linear_bwd_input without accumulate).
  virtual void linear_bwd_input_ld(const void* dy, const void* w, void* dx, int64_t lddx, int64_t M,
                                   int64_t K, int64_t N, float alpha) = 0;
  /// dw[N,K] += dy[M,N]^T x[M,K], x's rows ldx apart, dw in grad_dtype() (as linear_bwd_weight).
  virtual void linear_bwd_weight_ld(const void* dy, const void* x, int64_t ldx, void* dw, int64_t M,
                                    int64_t K, int64_t N) = 0;
  /// The column-block linears' argument check, shared by the backends: throws
  /// std::invalid_argument "<op>: ..." for a negative dimension or ld < K.
  static void check_linear_ld(int64_t M, int64_t K, int64_t N, int64_t ld, const char* op) {
    if (M < 0 || K < 0 || N < 0) throw std::invalid_argument(std::string(op) + ": negative dimension");
    if (ld < K) throw std::invalid_argument(std::string(op) + ": leading dimension below the block's width");
  }

  // ---- dropout with a counter-based mask (Srivastava et al. 2014, inverted dropout) ----
  /// y[r,c] = keep ? x[r,c] / (1 - p) : 0 for r < rows, c < cols (row-major, dtype()), where
  /// keep = dropout_uniform(seed, row0 + r, c) >= p (kernels/dropout_hash.hpp). The mask is
  /// a pure function of (seed, row0 + r, c), identical on every backend, so a recompute
  /// (or the backward: the same call on the output gradient) regenerates it exactly.
  /// y may alias x. p in [0, 1), else std::invalid_argument.
  virtual void dropout(const void* x, void* y, int64_t rows, int64_t cols, float p, uint64_t seed,
                       int64_t row0) = 0;

  // ---- embedding ----------------------------------------------------------------
  /// y[t,:] = table[ids[t],:], table [V,H]. ids must lie in [0, V).
  virtual void embedding_fwd(const int32_t* ids, const void* table, void* y, int64_t T, int64_t H,
                             int64_t V) = 0;
  /// dtable[ids[t],:] += dy[t,:] (scatter-add; repeated ids accumulate), dtable in
  /// grad_dtype(), except for ids equal to `padding_idx` (>= 0; -1: none), whose row gets
  /// nothing, as torch's nn.Embedding(padding_idx=...) (every id is still range-checked).
  virtual void embedding_bwd(const int32_t* ids, const void* dy, void* dtable, int64_t T, int64_t H,
                             int64_t V, int64_t padding_idx) = 0;

  // ---- RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm, computed in fp32) ----------
  /// y[r,:] = x[r,:] * rsqrt(mean_j x[r,j]^2 + eps) * w   for rows r < R of n columns.
  /// Qwen3 q_norm/k_norm = this with R = T*heads, n = D. (HF rounds x*rsqrt(..) to the
  /// storage dtype before the multiply by w; 16-bit backends should do the same.)
  /// w_offset != 0 (Gemma's RMSNorm, 1): y = x * rsqrt(..) * (w + w_offset), the whole product
  /// in fp32 and rounded once, as HF GemmaRMSNorm does.
  virtual void rmsnorm_fwd(const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                           float w_offset = 0.0f) = 0;
  /// With r = rsqrt(mean(x^2)+eps), xh = x*r, g = dy*(w + w_offset):
  /// dx = r * (g - xh * mean_j(g*xh))   (dx += ... when accumulate_dx), and
  /// dw[j] += sum_r dy[r,j]*xh[r,j] (dw in grad_dtype(); dw null: not computed, a frozen
  /// weight). Recomputes r from x.
  virtual void rmsnorm_bwd(const void* x, const void* w, const void* dy, void* dx, void* dw, int64_t R,
                           int64_t n, float eps, bool accumulate_dx, float w_offset = 0.0f) = 0;

  // ---- RoPE (Su et al. 2021, RoFormer; rotate-half layout of HF LLaMA/Qwen3) --------
  /// In place on x [n_seq*seq_len, heads, D]; token t has position p = t % seq_len.
  /// Only the first R = rotary_dim features of each head rotate (0: R = D; partial rotary,
  /// Phi-4-mini's R = 0.75*D, as transformers' apply_rotary_pos_emb with cos of width R);
  /// features R..D-1 pass through unchanged. With a_i = float(p)*inv_freq[i],
  /// c = cos(a_i)*scale, s = sin(a_i)*scale, h = R/2:
  ///   x'[i]   = x[i]*c - x[i+h]*s,   x'[i+h] = x[i+h]*c + x[i]*s     (i < h).
  /// inv_freq: host array of R/2 floats (RopeTable::inv_freq), read during the call.
  /// Throws std::invalid_argument unless D and R are even, 0 < R <= D.
  virtual void rope_fwd(void* x, int64_t n_seq, int64_t seq_len, int64_t heads, int64_t D,
                        const float* inv_freq, float scale, int64_t rotary_dim = 0) = 0;
  /// In place on dx (gradient of x'): the transposed rotation
  ///   dx[i] = dx'[i]*c + dx'[i+h]*s,  dx[i+h] = dx'[i+h]*c - dx'[i]*s   (features >= R: dx').
  virtual void rope_bwd(void* dx, int64_t n_seq, int64_t seq_len, int64_t heads, int64_t D,
                        const float* inv_freq, float scale, int64_t rotary_dim = 0) = 0;

  // ---- causal GQA attention (Vaswani et al. 2017; GQA: Ainslie et al. 2023) ---------
  /// Per sequence s (tokens s*L .. s*L+L-1, L = seq_len) and query head h (kv head
  /// h / (nq/nkv), as HF repeat_kv): o = softmax(q k^T * scale, causal) v.
  /// q, o [T, nq, D]; k, v [T, nkv, D]; lse [n_seq, nq, L] fp32 receives the
  /// log-sum-exp of each row of scaled scores (may be null when no backward follows).
  /// scratch: attention_scratch_bytes() bytes (CPU: the sequence/head pairs are
  /// processed one at a time, 64 query rows at a time: [64, L] fp32 scores).
  virtual void attention_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int64_t n_seq,
                             int64_t seq_len, int64_t nq, int64_t nkv, int64_t D, float scale,
                             void* scratch) = 0;
  /// Backward of attention_fwd given its o and lse (FlashAttention-2 recurrences,
  /// Dao 2023, Alg. 2): P = exp(S - lse), Di = rowsum(do*o), dv = P^T do,
  /// dS = P*(do v^T - Di), dq = scale*dS k, dk = scale*dS^T q. Writes dq [T,nq,D]
  /// and dk, dv [T,nkv,D] (overwritten; summed over the query heads of a group).
  virtual void attention_bwd(const void* q, const void* k, const void* v, const void* o, const float* lse,
                             const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t seq_len,
                             int64_t nq, int64_t nkv, int64_t D, float scale, void* scratch) = 0;
  /// Scratch bytes attention_fwd / attention_bwd may use, on every backend (a static
  /// contract so layers can size scratch without a device): fp32 room for
  /// 2*min(64,L)*L scores (the CPU uses only these) plus n_seq*L*(nq + nq*D + 2*nkv*D)
  /// (row statistics and fp32 dq/dk/dv accumulators of a GPU backward).
  static size_t attention_scratch_bytes(int64_t n_seq, int64_t seq_len, int64_t nq, int64_t nkv, int64_t D) {
    const int64_t blk = seq_len < 64 ? seq_len : 64;
    return size_t(2 * blk * seq_len + n_seq * seq_len * (nq + nq * D + 2 * nkv * D)) * 4;
  }

  // ---- packed sequences and KV-cache decoding -------------------------------------
  // Several examples share one sequence ("packing"): a position array pos (device int32,
  // one per token) restarts at 0 where an example begins, and drives both RoPE and the
  // attention mask, so causal attention never crosses examples (HF's position_ids of a
  // padding-free batch, from which flash-attention derives cu_seqlens).
  /// rope_fwd / rope_bwd with token t (t < T) at position pos[t] (>= 0) instead of
  /// t % seq_len; same formula and rotary_dim.
  virtual void rope_fwd_at(void* x, const int32_t* pos, int64_t T, int64_t heads, int64_t D,
                           const float* inv_freq, float scale, int64_t rotary_dim = 0) = 0;
  virtual void rope_bwd_at(void* dx, const int32_t* pos, int64_t T, int64_t heads, int64_t D,
                           const float* inv_freq, float scale, int64_t rotary_dim = 0) = 0;

  // ---- per-head q/k norm followed by RoPE (Qwen3, Gemma 3) ---------------------------
  /// Shape and constants of qk_norm_rope_fwd / _bwd: rows [T, heads, head_dim], T = n_seq * seq_len.
  struct QkNormRope {
    int64_t n_seq = 0, seq_len = 0, heads = 0, head_dim = 0;
    float eps = 1e-6f;                ///< rms_norm_eps
    float w_offset = 0.0f;            ///< as rmsnorm_fwd's (Gemma 3: 1)
    const float* inv_freq = nullptr;  ///< host, rotary_dim/2 floats (RopeTable::inv_freq)
    float rope_scale = 1.0f;          ///< RopeTable::attention_scaling
    int64_t rotary_dim = 0;           ///< as rope_fwd's (0: head_dim)
    const int32_t* pos = nullptr;  ///< device positions (packed sequences, rope_fwd_at) or null: t % seq_len
  };
  /// y = RoPE(RMSNorm(x)) per head: rmsnorm_fwd(x, w, y, T*heads, head_dim, eps, w_offset), then
  /// rope_fwd(y, ...) (rope_fwd_at with pos). x, y [T, heads, head_dim] in dtype(), w [head_dim].
  /// The default is those two calls; CUDA runs them as one pass over the rows with the same bits
  /// (head_dim 64, 128 or 256 with full rotary; other shapes take the two calls). Throws as they do.
  virtual void qk_norm_rope_fwd(const void* x, const void* w, void* y, const QkNormRope& s) {
    rmsnorm_fwd(x, w, y, s.n_seq * s.seq_len * s.heads, s.head_dim, s.eps, s.w_offset);
    rope(y, s, false);
  }
  /// RoPE alone, in place on x [T, heads, head_dim] with s's constants: rope_fwd, or rope_bwd when
  /// `backward`, or their _at forms at s.pos when it is set (s.eps and s.w_offset unused).
  void rope(void* x, const QkNormRope& s, bool backward) {
    const int64_t T = s.n_seq * s.seq_len, h = s.heads, D = s.head_dim, R = s.rotary_dim;
    if (s.pos && backward) rope_bwd_at(x, s.pos, T, h, D, s.inv_freq, s.rope_scale, R);
    else if (s.pos) rope_fwd_at(x, s.pos, T, h, D, s.inv_freq, s.rope_scale, R);
    else if (backward) rope_bwd(x, s.n_seq, s.seq_len, h, D, s.inv_freq, s.rope_scale, R);
    else rope_fwd(x, s.n_seq, s.seq_len, h, D, s.inv_freq, s.rope_scale, R);
  }
  /// Backward of qk_norm_rope_fwd from dy (the gradient of y): rope_bwd (rope_bwd_at) of dy, then
  /// rmsnorm_bwd(x, w, dy', dx, dw, T*heads, head_dim, eps, false, w_offset): dx overwritten, dw +=
  /// (grad_dtype(); null: a frozen norm). dy is scratch: afterwards it holds dy or its rotation
  /// back (the default rotates in place; CUDA's one pass, as above, leaves it). dx must not alias
  /// x or dy. CUDA's dx equals the two calls' bit for bit; dw is summed in another order.
  virtual void qk_norm_rope_bwd(const void* x, const void* w, void* dy, void* dx, void* dw,
                                const QkNormRope& s) {
    rope(dy, s, true);
    rmsnorm_bwd(x, w, dy, dx, dw, s.n_seq * s.seq_len * s.heads, s.head_dim, s.eps, false, s.w_offset);
  }
  /// attention_fwd where query t of sequence s attends to the keys j of s with
  /// t - p <= j <= t, p = pos[s*L + t] (the example's own earlier tokens). Requires
  /// 0 <= p <= t (CPU: std::invalid_argument; CUDA: p is clamped into range). Same
  /// shapes, lse layout and scratch contract as attention_fwd; with pos[s*L+t] = t it
  /// equals attention_fwd.
  virtual void attention_fwd_packed(const void* q, const void* k, const void* v, void* o, float* lse,
                                    const int32_t* pos, int64_t n_seq, int64_t seq_len, int64_t nq,
                                    int64_t nkv, int64_t D, float scale, void* scratch) = 0;
  /// Backward of attention_fwd_packed (the recurrences of attention_bwd over the same keys).
  virtual void attention_bwd_packed(const void* q, const void* k, const void* v, const void* o,
                                    const float* lse, const void* dout, const int32_t* pos, void* dq,
                                    void* dk, void* dv, int64_t n_seq, int64_t seq_len, int64_t nq,
                                    int64_t nkv, int64_t D, float scale, void* scratch) = 0;
  /// Attention over a KV cache, for generation (one sequence): query row i of q [n, nq, D]
  /// is token past+i and attends to rows 0..past+i of k_cache, v_cache ([>= past+n, nkv, D],
  /// rows past..past+n-1 already holding this call's keys and values):
  /// o[i] = softmax(q_i K^T * scale) V over those rows. o [n, nq, D]; no scratch, no lse.
  virtual void attention_decode(const void* q, const void* k_cache, const void* v_cache, void* o,
                                int64_t past, int64_t n, int64_t nq, int64_t nkv, int64_t D, float scale) = 0;

  // ---- attention variants (GPT-OSS: sliding window, attention sinks) ---------------
  // GPT-OSS (HF GptOssAttention) alternates layers whose queries see only the last
  // `window` keys with full causal layers, and gives each query head a learned "sink"
  // logit that joins the softmax denominator without a value row (Xiao et al. 2023,
  // "Efficient Streaming Language Models with Attention Sinks"). With the default
  // AttentionVariant every *_v op equals its plain counterpart above.
  /// window > 0: query t (position p) sees keys j with t - window < j <= t (HF's
  ///   sliding_window mask: the last `window` keys, itself included); 0: every earlier key.
  ///   With pos set, the example mask of attention_fwd_packed applies as well.
  /// sinks: [nq] in dtype() (device), or null: row i of head h has
  ///   P_ij = exp(s_ij - lse_i), lse_i = log(exp(sinks[h]) + sum_j exp(s_ij)), s = q k^T *
  ///   scale (the sink is not scaled). lse outputs include the sink term.
  /// dsinks (backward only): [nq] in grad_dtype(), += d loss / d sinks[h] =
  ///   -sum_i exp(sinks[h] - lse_i) * rowsum(do_i * o_i); null: not computed.
  /// pos: packed positions as attention_fwd_packed (device int32 [T]), or null.
  /// softcap > 0 (Gemma 2's attn_logit_softcapping; HF Gemma2 eager_attention_forward): each
  ///   score is soft-capped before the mask and the softmax,
  ///     s = cap * tanh(s_raw / cap),   s_raw = q k^T * scale,
  ///   so |s| < cap; lse is that of the capped scores (the sink logit is not capped). The
  ///   backward chains the softmax's dS through the tanh:
  ///     dS_raw = dS * (1 - tanh^2(s_raw / cap)),   dq = scale * dS_raw k, dk = scale * dS_raw^T q.
  ///   0: no capping. Negative or non-finite: std::invalid_argument.
  struct AttentionVariant {
    int64_t window = 0;
    const void* sinks = nullptr;
    void* dsinks = nullptr;
    const int32_t* pos = nullptr;
    float softcap = 0.0f;
  };
  /// Throws std::invalid_argument "<op>: ..." unless softcap is 0 or a finite number > 0 (shared
  /// by every backend's attention variants and cross-entropy).
  static void check_softcap(float softcap, const char* op) {
    if (!(softcap >= 0.f) || !std::isfinite(softcap))
      throw std::invalid_argument(std::string(op) + ": softcap must be 0 (none) or a finite number > 0");
  }
  /// attention_fwd (or attention_fwd_packed when var.pos) with var's window, sinks and softcap.
  /// Same shapes, lse layout and scratch contract (attention_scratch_bytes).
  virtual void attention_fwd_v(const void* q, const void* k, const void* v, void* o, float* lse,
                               int64_t n_seq, int64_t seq_len, int64_t nq, int64_t nkv, int64_t D,
                               float scale, const AttentionVariant& var, void* scratch) = 0;
  /// Backward of attention_fwd_v (the recurrences of attention_bwd over the same keys; lse
  /// from attention_fwd_v); dq, dk, dv overwritten, dsinks accumulated.
  virtual void attention_bwd_v(const void* q, const void* k, const void* v, const void* o, const float* lse,
                               const void* dout, void* dq, void* dk, void* dv, int64_t n_seq, int64_t seq_len,
                               int64_t nq, int64_t nkv, int64_t D, float scale, const AttentionVariant& var,
                               void* scratch) = 0;
  /// attention_decode with var's window, sinks and softcap (var.pos and var.dsinks must be null):
  /// query row i (token past+i) sees cache rows j with past+i - window < j <= past+i.
  virtual void attention_decode_v(const void* q, const void* k_cache, const void* v_cache, void* o,
                                  int64_t past, int64_t n, int64_t nq, int64_t nkv, int64_t D, float scale,
                                  const AttentionVariant& var) = 0;

  /// Adds a per-group bias (linear and expert biases of GPT-OSS; E = 1 with offsets_host =
  /// {0, R} is a plain linear bias): y[r,:] += b[e,:] for rows r in
  /// [offsets_host[e], offsets_host[e+1]), b [E,N] in dtype(), y [R,N].
  virtual void grouped_bias_fwd(void* y, const void* b, const int32_t* offsets_host, int64_t E,
                                int64_t N) = 0;
  /// db[e,:] += sum of dy[r,:] over the rows of group e (db [E,N] in grad_dtype(), fp32 sums).
  virtual void grouped_bias_bwd(const void* dy, void* db, const int32_t* offsets_host, int64_t E,
                                int64_t N) = 0;

  // ---- SwiGLU MLP activation (Shazeer 2020, "GLU Variants Improve Transformer") ----
  /// h = silu(g) * u, silu(z) = z * sigmoid(z), n elements.
  virtual void swiglu_fwd(const void* g, const void* u, void* h, int64_t n) = 0;
  /// dg = dh * u * sigmoid(g) * (1 + g*(1-sigmoid(g))),  du = dh * silu(g).
  virtual void swiglu_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n) = 0;

  // ---- GeGLU MLP activation (Shazeer 2020; HF GemmaMLP with gelu_pytorch_tanh) -------
  /// h = gelu_tanh(g) * u, n elements, gelu_tanh(z) = 0.5 z (1 + tanh(k (z + 0.044715 z^3))),
  /// k = sqrt(2/pi) (torch's gelu(approximate="tanh")), computed in fp32.
  virtual void geglu_fwd(const void* g, const void* u, void* h, int64_t n) = 0;
  /// With t = tanh(k (g + 0.044715 g^3)):  du = dh * gelu_tanh(g),
  /// dg = dh * u * (0.5 (1 + t) + 0.5 g (1 - t^2) k (1 + 3 * 0.044715 g^2));  dg, du overwritten.
  virtual void geglu_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n) = 0;

  /// GPT-OSS's clamped SwiGLU (HF GptOssExperts): gc = min(g, limit),
  /// uc = clamp(u, -limit, limit), h = (uc + 1) * gc * sigmoid(alpha * gc), n elements.
  virtual void swiglu_clamped_fwd(const void* g, const void* u, void* h, int64_t n, float alpha,
                                  float limit) = 0;
  /// Backward of swiglu_clamped_fwd, dg, du overwritten. The clamps pass the gradient only
  /// where their input lies strictly inside the bounds (g < limit; -limit < u < limit), as
  /// torch.clamp's backward does (torch 2.x gives 0 at x == max and at x == min):
  ///   s = sigmoid(alpha*gc), dg = [g < limit] * dh * (uc+1) * (s + alpha*gc*s*(1-s)),
  ///   du = [-limit < u < limit] * dh * gc * s.
  virtual void swiglu_clamped_bwd(const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n,
                                  float alpha, float limit) = 0;

  // ---- mixture of experts (Shazeer et al. 2017; HF Qwen3MoeSparseMoeBlock) -------------
  // A sparse MLP block routes each of T tokens to k of E experts: the router's logits
  // [T, E] give p = softmax (fp32), the k largest p pick the experts, and the token's output
  // is sum_j w_j * expert_{i_j}(x) with w_j = p_{i_j} (divided by sum_j p_{i_j} when
  // norm_topk). The T*k (token, slot) assignments are grouped by expert ("sorted rows") so
  // each expert's rows are contiguous and its linears run as one GEMM per expert (grouped
  // linear). Expert weights of one linear are stacked [E, N, K] (expert e at e*N*K).
  //
  // The grouped linears need each expert's row count when they are launched: moe_sort
  // returns the group offsets in host memory as well (on a GPU: a wait for the stream per
  // call, the only host round trip of the block; moe_sort_launch / moe_sort_wait let the
  // gather of the sorted rows run on the GPU while the host waits). With ExpertGemm::bucketed
  // the block pads each expert's segment (moe_pad): offsets, row and token then describe the
  // padded layout, and every op taking them reads it as it reads the unpadded one.
  /// Router: for t < T, p[t,:] = softmax(logits[t,:]) computed in fp32 (logits in dtype()),
  /// written to probs [T,E] fp32; topk_idx [T,k] i32 = the k experts of largest p in
  /// descending order (ties: lower index first); topk_w [T,k] fp32 = their p, divided by
  /// their sum when norm_topk. stats (fp32 [2E], may be null): stats[e] += the number of
  /// assignments to e, stats[E+e] += sum_t p[t,e] (the load-balancing loss's inputs).
  /// 1 <= k <= E, else std::invalid_argument.
  virtual void moe_route(const void* logits, float* probs, int32_t* topk_idx, float* topk_w, float* stats,
                         int64_t T, int64_t E, int64_t k, bool norm_topk) = 0;
  /// Backward of moe_route through p (the choice of experts is piecewise constant): dw [T,k]
  /// fp32 is d loss / d topk_w; when counts != null (fp32 [E]), aux_coef * counts[e] is
  /// added to d loss / d p[t,e] for every token (the Switch load-balancing loss, Fedus et al.
  /// 2021, eq. 4: E * sum_e f_e P_e, whose gradient in p is the same for all tokens).
  /// dlogits [T,E] (dtype(), overwritten) = p * (dp - sum_e p_e dp_e).
  virtual void moe_route_bwd(const float* probs, const int32_t* topk_idx, const float* dw,
                             const float* counts, float aux_coef, void* dlogits, int64_t T, int64_t E,
                             int64_t k, bool norm_topk) = 0;
  /// Groups the R = T*k assignments (assignment a = t*k + j is token t's j-th expert
  /// topk_idx[a], each in [0, E)) by expert, stably (by a within an expert): offsets [E+1]
  /// i32 on the device and offsets_host [E+1] in host memory (expert e's sorted rows are
  /// offsets[e] .. offsets[e+1]-1; offsets[0] = 0, offsets[E] = R), row [R] i32 (the sorted
  /// row of assignment a), token [R] i32 (the token of sorted row r). offsets_host is valid
  /// when the call returns. Throws std::invalid_argument for E < 1, k < 1; an expert index
  /// outside [0, E) throws on the CPU and is reported as a device error on a GPU.
  virtual void moe_sort(const int32_t* topk_idx, int32_t* offsets, int32_t* offsets_host, int32_t* row,
                        int32_t* token, int64_t T, int64_t E, int64_t k) = 0;
  /// moe_sort in two halves, so that stream-ordered work that needs only the device results
  /// (gather_rows of the sorted rows) is queued before the host waits: moe_sort_launch does what
  /// moe_sort does but offsets_host is valid only after moe_sort_wait(offsets_host, E) returns.
  /// No other moe_sort or moe_sort_launch may run on this Ops in between. The default runs
  /// moe_sort at once (its wait does nothing): the CPU backend is synchronous anyway.
  virtual void moe_sort_launch(const int32_t* topk_idx, int32_t* offsets, int32_t* offsets_host, int32_t* row,
                               int32_t* token, int64_t T, int64_t E, int64_t k) {
    moe_sort(topk_idx, offsets, offsets_host, row, token, T, E, k);
  }
  /// Makes the offsets_host of the last moe_sort_launch valid (E as given there).
  virtual void moe_sort_wait(int32_t* offsets_host, int64_t E) {
    (void)offsets_host;
    (void)E;
  }
  /// Padded layout (set_expert_gemm(ExpertGemm::bucketed); kernels/moe_buckets.hpp): after
  /// moe_sort (offsets_host valid), the experts are bucketed by row count and each expert's
  /// segment padded to its bucket's largest count m (at most kExpertPadFraction of a bucket's
  /// rows are padding), segments in expert order, real rows first. offsets (device and host)
  /// then describe the padded segments, row[a] the padded position of assignment a, token[r]
  /// = -1 for a pad row; returns the padded row count Rp (> capacity: std::invalid_argument,
  /// nothing changed). The grouped ops stay correct on this layout as long as pad rows of
  /// their inputs are zero: gather_rows writes zeros there, and moe_zero_pad_rows zeroes the
  /// pad rows of moe_combine_bwd's dys (combine and the gathers' backward read only row[]).
  int64_t moe_pad(const int32_t* topk_idx, int32_t* offsets, int32_t* offsets_host, int32_t* row,
                  int32_t* token, int64_t T, int64_t E, int64_t k, int64_t capacity);
  /// moe_pad's device half, from the unpadded and padded host offsets [E+1]: offsets =
  /// padded_host, row[a] += padded_host[e] - offsets_host[e] (e = topk_idx[a]), token[r] = a / k
  /// at r = row[a] and -1 at every other r < padded_host[E].
  virtual void moe_pad_rows(const int32_t* topk_idx, const int32_t* offsets_host, const int32_t* padded_host,
                            int32_t* offsets, int32_t* row, int32_t* token, int64_t T, int64_t E,
                            int64_t k) = 0;
  /// x[r,:] = 0 for the rows r < R with token[r] < 0 (the pad rows of moe_pad), others unchanged.
  virtual void moe_zero_pad_rows(void* x, const int32_t* token, int64_t R, int64_t H) = 0;
  /// How MoE blocks run their grouped linears (spec key "expert_gemm"): bucketed (the default,
  /// as DeviceOptions::expert_gemm_bucketed): moe_pad's layout, and on CUDA one batched GEMM
  /// per segment length; or grouped on the unpadded layout. Set before the ops are used.
  void set_expert_gemm(ExpertGemm g) { expert_gemm_ = g; }
  ExpertGemm expert_gemm() const { return expert_gemm_; }
  /// xs[r,:] = x[token[r],:] for r < R (rows of H elements, dtype()); zeros where token[r] < 0.
  virtual void gather_rows(const void* x, const int32_t* token, void* xs, int64_t R, int64_t H) = 0;
  /// y[t,:] (+)= sum_{j<k} w[t,j] * ys[row[t*k+j],:] (fp32 sum over j in order, then one
  /// rounding; overwritten unless accumulate). w fp32 [T,k].
  virtual void moe_combine(const void* ys, const float* w, const int32_t* row, void* y, int64_t T, int64_t k,
                           int64_t H, bool accumulate) = 0;
  /// Backward of moe_combine: dys[row[t*k+j],:] = w[t,j] * dy[t,:] (overwritten, every row
  /// < T*k; in the padded layout the pad rows are left as they were) and dw[t,j] = sum_c dy[t,c] *
  /// ys[row[t*k+j],c] (fp32, overwritten).
  virtual void moe_combine_bwd(const void* dy, const void* ys, const float* w, const int32_t* row, void* dys,
                               float* dw, int64_t T, int64_t k, int64_t H) = 0;
  /// Backward of gather_rows, per token: dx[t,:] (+)= sum_{j<k} dxs[row[t*k+j],:] (fp32 sum
  /// in j order; deterministic, no atomics).
  virtual void moe_gather_bwd(const void* dxs, const int32_t* row, void* dx, int64_t T, int64_t k, int64_t H,
                              bool accumulate) = 0;
  /// Grouped linear: for each expert e, rows r in [offsets_host[e], offsets_host[e+1]) of x
  /// [R,K]: y[r,:] = x[r,:] W_e^T with W_e = w + e*N*K ([N,K] row-major). R = offsets_host[E].
  /// (Padded layout: pad rows included; ExpertGemm::bucketed on CUDA: one batched GEMM per
  /// distinct segment length, for these four ops where they are not rank-sized.)
  virtual void grouped_linear_fwd(const void* x, const void* w, void* y, const int32_t* offsets_host,
                                  int64_t E, int64_t K, int64_t N) = 0;
  /// The same product added in: y[r,:] += alpha * x[r,:] W_e^T (one rounding of the sum to
  /// the storage dtype; a LoRA adapter's s * a B^T added onto the frozen projection's output).
  virtual void grouped_linear_fwd_add(const void* x, const void* w, void* y, const int32_t* offsets_host,
                                      int64_t E, int64_t K, int64_t N, float alpha) = 0;
  /// dx[r,:] (+)= dy[r,:] W_e for the rows of each expert e.
  virtual void grouped_linear_bwd_input(const void* dy, const void* w, void* dx, const int32_t* offsets_host,
                                        int64_t E, int64_t K, int64_t N, bool accumulate) = 0;
  /// dW_e += dy_e^T x_e (dw [E,N,K] in grad_dtype()); an expert without rows adds nothing.
  virtual void grouped_linear_bwd_weight(const void* dy, const void* x, void* dw, const int32_t* offsets_host,
                                         int64_t E, int64_t K, int64_t N) = 0;

  // ---- FP8 compute (kernels/fp8.hpp: formats, rounding, scales) ------------------------
  // A tensor is quantized with a scale s from its own largest magnitude (no history):
  // s = fp8::scale_from_amax(max|x|, f) = amax / 448 for e4m3 (amax / 57344 for e5m2), 1 for
  // an all-zero tensor, NaN / inf when x holds one (propagated, so products using the scale
  // are non-finite), and each value becomes the code of x / s (fp32 division,
  // round-to-nearest-even, saturating). Codes are one byte per element (uint8_t), row-major
  // like their source; scales are fp32 device values. Both backends compute scales and codes
  // bit for bit alike (the shared scalar code of kernels/fp8.hpp).
  /// scale[0] = scale_from_amax(max_i |x[i]|, f) over n elements of x (dtype()); a NaN
  /// anywhere gives NaN, an inf (and no NaN) inf.
  virtual void fp8_scale(const void* x, int64_t n, Fp8Format f, float* scale) = 0;
  /// scale[r] = scale_from_amax(max_c |x[r,c]|, f) for each row r of x [rows, cols].
  virtual void fp8_scale_rows(const void* x, int64_t rows, int64_t cols, Fp8Format f, float* scale) = 0;
  /// rmsnorm_fwd(x, w, y, R, n, eps), then scale[0] as fp8_scale(y, R * n, f, scale) over the
  /// stored y: the scale of the FP8 linears that read y. CUDA reduces max |y| inside the
  /// norm's own pass (no second read of y); the default is the two calls, so both backends
  /// give the same y and the same scale bits.
  virtual void rmsnorm_fwd_fp8_scale(const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                                     Fp8Format f, float* scale, float w_offset = 0.0f) {
    rmsnorm_fwd(x, w, y, R, n, eps, w_offset);
    fp8_scale(y, R * n, f, scale);
  }
  /// rmsnorm_fwd(x, w, y, R, n, eps), then the codes of the stored y with one scale per row,
  /// as fp8_scale_rows(y, R, n, f, scale) and fp8_quantize_rows(y, scale, q, R, n, f): the input
  /// of FP8 linears with per-token scales (a frozen base run from its fp8 storage). CUDA makes
  /// the codes in the norm's own pass where a row fits its registers (y not read again); the
  /// default is the three calls, so both backends give the same y, scales and codes.
  virtual void rmsnorm_fwd_fp8_rows(const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                                    Fp8Format f, uint8_t* q, float* scale, float w_offset = 0.0f) {
    rmsnorm_fwd(x, w, y, R, n, eps, w_offset);
    fp8_scale_rows(y, R, n, f, scale);
    fp8_quantize_rows(y, scale, q, R, n, f);
  }
  /// swiglu_fwd(g, u, h, n), then scale[0] as fp8_scale(h, n, f, scale) (fused on CUDA, as
  /// rmsnorm_fwd_fp8_scale).
  virtual void swiglu_fwd_fp8_scale(const void* g, const void* u, void* h, int64_t n, Fp8Format f,
                                    float* scale) {
    swiglu_fwd(g, u, h, n);
    fp8_scale(h, n, f, scale);
  }
  /// swiglu_bwd(g, u, dh, dg, du, n), then scale_dg[0] and scale_du[0] as fp8_scale(dg, n, f, ...)
  /// and fp8_scale(du, n, f, ...) over the stored dg and du: the scales of the output gradients
  /// that the gate and up projections' FP8 weight and input gradients quantize (fused on CUDA,
  /// as rmsnorm_fwd_fp8_scale, so neither gradient is read again for its amax).
  virtual void swiglu_bwd_fp8_scale(const void* g, const void* u, const void* dh, void* dg, void* du,
                                    int64_t n, Fp8Format f, float* scale_dg, float* scale_du) {
    swiglu_bwd(g, u, dh, dg, du, n);
    fp8_scale(dg, n, f, scale_dg);
    fp8_scale(du, n, f, scale_du);
  }
  /// q[i] = fp8::quantize(f, x[i], scale[0]) for i < n (x in dtype(), q n bytes).
  virtual void fp8_quantize(const void* x, const float* scale, uint8_t* q, int64_t n, Fp8Format f) = 0;
  /// q[r,c] = fp8::quantize(f, x[r,c], scale[r]) for x [rows, cols].
  virtual void fp8_quantize_rows(const void* x, const float* scale, uint8_t* q, int64_t rows, int64_t cols,
                                 Fp8Format f) = 0;
  /// q[c,r] = fp8::quantize(f, x[r,c], scale[0]) for x [rows, cols]: the codes of x^T
  /// ([cols, rows], rows contiguous). The FP8 GEMM needs K contiguous in both operands, so a
  /// linear's input gradient dx = dy W takes its weight as W^T [in, out] codes.
  virtual void fp8_quantize_transposed(const void* x, const float* scale, uint8_t* q, int64_t rows,
                                       int64_t cols, Fp8Format f) = 0;
  /// The same with q's columns ld >= rows codes apart: q[c * ld + r] for r < rows, and code 0
  /// (+0) for rows <= r < ld. A weight gradient's GEMM sums over tokens, so its operands are
  /// the codes of dy^T and x^T with the token count padded to the FP8 GEMM's multiple of 16
  /// (the zero codes add nothing).
  virtual void fp8_quantize_transposed_padded(const void* x, const float* scale, uint8_t* q, int64_t rows,
                                              int64_t cols, int64_t ld, Fp8Format f) = 0;
  /// Both codes of x [rows, cols] under one scale from one read of x: q [rows, cols] as
  /// fp8_quantize and qt [cols, ld] as fp8_quantize_transposed_padded, bit for bit. A linear's
  /// output gradient dy feeds two FP8 GEMMs in the backward, the input gradient (dy's rows,
  /// K = out contiguous) and the weight gradient (dy^T, K = tokens contiguous). Here: the two
  /// calls; CUDA fuses them (one pass over x, tiles through shared memory).
  virtual void fp8_quantize_both(const void* x, const float* scale, uint8_t* q, uint8_t* qt, int64_t rows,
                                 int64_t cols, int64_t ld, Fp8Format f) {
    fp8_quantize(x, scale, q, rows * cols, f);
    fp8_quantize_transposed_padded(x, scale, qt, rows, cols, ld, f);
  }
  /// d[M,N] (+)= (scale_a[0] * scale_b[0]) * A[M,K] B[N,K]^T with A, B FP8 codes (formats fa,
  /// fb; row-major, K contiguous in both: a linear's activations and its [out, in] weight) and
  /// d in dtype() (read when accumulate, then rounded once). Products and sums are fp32; the
  /// scales multiply the sum. CUDA: cuBLASLt on FP8 tensor cores (compute capability 8.9+),
  /// K and N multiples of 16, a, b and d 16-byte aligned, not both operands e5m2; the tensor
  /// cores add each k-block's products at reduced precision before cuBLASLt adds the blocks in
  /// fp32 (so the result differs from an exact fp32 sum by more than summation order alone;
  /// tests/kernels/test_cuda_fp8.cpp bounds it). CPU: the codes decoded exactly, Eigen's fp32
  /// GEMM, the scale product applied to the sum. Throws std::invalid_argument for bad shapes
  /// or formats, rp::DeviceError on a GPU without FP8 tensor cores.
  virtual void gemm_fp8(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b, Fp8Format fb,
                        const float* scale_b, void* d, int64_t M, int64_t K, int64_t N, bool accumulate) = 0;
  /// d[M,N] = r[M,N] + (scale_a[0] * scale_b[0]) * A[M,K] B[N,K]^T, r != d (dtype(); on CUDA
  /// 16-byte aligned): gemm_fp8 onto the residual stream, as linear_fwd_residual. The default
  /// is gemm_fp8 then add (the CPU backend's); CUDA reads r in the GEMM's epilogue. The operand
  /// rules and errors of gemm_fp8, and std::invalid_argument when r is d.
  virtual void gemm_fp8_residual(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b,
                                 Fp8Format fb, const float* scale_b, const void* r, void* d, int64_t M,
                                 int64_t K, int64_t N) {
    if (r == d) throw std::invalid_argument("gemm_fp8_residual: r and d are the same tensor");
    gemm_fp8(a, fa, scale_a, b, fb, scale_b, d, M, K, N, false);
    add(r, d, d, M * N);
  }
  /// d[M,N] += (scale_a[0] * scale_b[0]) * A[M,K] B[N,K]^T into fp32 d (grad_dtype()): a
  /// weight gradient dW [out, in] += dy^T x from the codes of dy^T [out, K] and x^T [in, K]
  /// (Ops::fp8_quantize_transposed_padded, K the padded token count). The same operand rules,
  /// sums and errors as gemm_fp8; only d's type differs.
  virtual void gemm_fp8_accumulate_f32(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b,
                                       Fp8Format fb, const float* scale_b, float* d, int64_t M, int64_t K,
                                       int64_t N) = 0;
  /// d[M,N] (+)= (scale_a[m] * scale_b[n]) * A[M,K] B[N,K]^T: gemm_fp8 with one fp32 scale per
  /// row of each operand (scale_a [M], scale_b [N], device fp32, 16-byte aligned): a linear's
  /// output y = x W^T from per-token activation scales and a weight stored with one scale per
  /// output row (kernels/weight_format.hpp, fp8), whose codes are used as they are. The same
  /// operand rules, sums and errors as gemm_fp8; the scale product multiplies each fp32 sum.
  /// CUDA: cuBLASLt's outer-vector scale mode (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on
  /// both operands); throws rp::DeviceError where gemm_fp8_rows_supported() is false.
  virtual void gemm_fp8_rows(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b,
                             Fp8Format fb, const float* scale_b, void* d, int64_t M, int64_t K, int64_t N,
                             bool accumulate) = 0;
  /// Whether gemm_fp8_rows runs here, decided at the first call and then fixed: always on the
  /// CPU; on CUDA when the GPU has FP8 tensor cores and cuBLASLt offers an algorithm for
  /// outer-vector scales (a probe shape's heuristic query). Callers that get false keep to
  /// gemm_fp8 with tensor scales. Call it on the thread that runs this object's ops.
  virtual bool gemm_fp8_rows_supported() { return true; }
  /// The codes of v[r,c] = x[r,c] * col_scale[c] (x [rows, cols] in dtype(), col_scale fp32
  /// [cols], the product in fp32; null col_scale: v = x) with one scale per row: scale[r] =
  /// scale_from_amax(max_c |v[r,c]|, f), q[r,c] = fp8::quantize(f, v[r,c], scale[r]). Without
  /// column scales these are fp8_scale_rows' scales and fp8_quantize_rows' codes, from one read
  /// of x on CUDA (a row of at most 4,096 values stays in a block's registers; a wider one is read
  /// again from L1/L2 for its codes). An input gradient dx = dy W
  /// of a weight stored as codes C with row scales s_w is dy diag(s_w) C: the row scales fold into dy here,
  /// and W^T's codes are C^T (transpose_bytes) with no rescaling.
  virtual void fp8_quantize_rows_col_scaled(const void* x, const float* col_scale, uint8_t* q, float* scale,
                                            int64_t rows, int64_t cols, Fp8Format f) = 0;
  /// dst[c * rows + r] = src[r * cols + c]: the bytes (FP8 codes) of src [rows, cols] as
  /// [cols, rows]. Exact.
  virtual void transpose_bytes(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) = 0;

  // ---- chunked LM head + cross-entropy ------------------------------------------
  /// For tokens t with targets[t] >= 0 (targets[t] < V required):
  ///   z_t = h[t,:] W^T (W [V,H]),   loss_t = logsumexp(z_t) - z_t[targets[t]].
  /// loss[0] = sum_t loss_t, loss[1] = number of such tokens (fp32 device array of 2;
  /// overwritten). When dh != null: dh[t,:] = (softmax(z_t) - onehot) W, 0 for ignored
  /// tokens (overwritten). When dw != null: dw += sum_t (softmax(z_t)-onehot)^T h[t,:]
  /// (grad_dtype()). Tokens are processed kCeChunk at a time (ignored ones skipped),
  /// so only [kCeChunk, V] logits exist at once.
  /// scratch: lm_head_ce_scratch_bytes(T, H, V) bytes.
  /// loss_scale (unitless, finite and > 0, default 1): dh and the dw contribution are the
  /// gradients of loss_scale * sum_t loss_t (fp16 dynamic loss scaling); loss[] is unscaled.
  /// The scale multiplies the products in fp32 (the dlogits are never scaled in storage), so
  /// an overflow shows up as inf in dh (16-bit) or dw. Throws std::invalid_argument for a
  /// non-finite or non-positive loss_scale.
  /// softcap > 0 (Gemma's final_logit_softcapping; HF Gemma2ForCausalLM.forward): the loss is
  /// that of the capped logits zc = soft_cap(z, softcap) = softcap * tanh(z / softcap) (in fp32
  /// from the stored z), and the gradient goes through the tanh:
  ///   dlogits = (softmax(zc) - onehot) * (1 - tanh^2(z / softcap)).
  /// 0: no capping; negative or non-finite: std::invalid_argument.
  virtual void lm_head_cross_entropy(const void* h, const void* w, const int32_t* targets, int64_t T,
                                     int64_t H, int64_t V, float* loss, void* dh, void* dw, void* scratch,
                                     float loss_scale = 1.0f, float softcap = 0.0f) = 0;
  /// cap * tanh(x / cap) in fp32 (cap > 0), x itself for cap 0: the logit soft-capping of Gemma
  /// 2 (attention scores and final logits) on the host; the CUDA kernels' twin is
  /// rp::cuda::soft_cap (cuda_common.cuh).
  static float soft_cap(float x, float cap) { return cap > 0.f ? cap * std::tanh(x / cap) : x; }
  /// Scratch bytes lm_head_cross_entropy may use, on every backend (static contract):
  /// R*(V + 2*H) fp32 (logits / dlogits of one chunk, gathered h and dh rows) + R int32
  /// (token indices), R = clamp(T, kCeChunk, kCeMaxRows). The CPU backend uses kCeChunk
  /// rows; the CUDA backend sizes its chunks to all of it, so the LM-head weight gradient
  /// GEMM runs T/R times instead of T/kCeChunk times (each pass reads and writes dW).
  static constexpr int64_t kCeMaxRows = 4096;
  /// The argument checks every backend's lm_head_cross_entropy makes before enqueuing
  /// anything: throws std::invalid_argument naming the op for bad dimensions, a null loss
  /// or scratch, or a non-finite / non-positive loss_scale.
  static void check_lm_head_ce_args(int64_t T, int64_t H, int64_t V, const float* loss, const void* scratch,
                                    float loss_scale, float softcap = 0.0f) {
    auto require = [](bool ok, const char* what) {
      if (!ok) throw std::invalid_argument(std::string("lm_head_cross_entropy: ") + what);
    };
    require(T >= 0 && H > 0 && V > 0, "bad dimensions");
    require(loss != nullptr, "loss is null");
    require(scratch != nullptr, "scratch is null");
    require(std::isfinite(loss_scale) && loss_scale > 0.f, "loss_scale must be finite and > 0");
    check_softcap(softcap, "lm_head_cross_entropy");
  }
  static size_t lm_head_ce_scratch_bytes(int64_t T, int64_t H, int64_t V) {
    const int64_t R = std::clamp<int64_t>(T, kCeChunk, kCeMaxRows);
    return size_t(R * (V + 2 * H)) * 4 + size_t(R) * 4;
  }

 protected:
  bool f16_accum_ = false;
  ExpertGemm expert_gemm_ = ExpertGemm::bucketed;
};

/// The CPU backend's ops (fp32, Eigen). `num_threads` as Ops::set_num_threads.
std::unique_ptr<Ops> make_cpu_ops(int num_threads = 1);

}  // namespace rp
