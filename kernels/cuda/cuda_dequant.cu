// CUDA dequantization of frozen weights (storage forms: kernels/weight_format.hpp) into a
// compute buffer of f32, bf16 or f16. Every value is computed in fp32 exactly as the host
// twin dequantize_weights() computes it (one product of the same two fp32 factors) and
// rounded once (round-to-nearest-even), so results equal the host's bit for bit.
//
// Quantized formats (q8_0, q4_0, nf4, mxfp4): one thread block per tile of kTile outputs. The tile's
// storage bytes are staged in shared memory with 16-byte loads (byte loads only for the up
// to 15 bytes before the first and after the last 16-byte boundary, so a tensor may start
// at any byte offset of its group's storage); then each thread turns 8 consecutive values
// of one block into one 16-byte store (bf16/f16; two for f32). Plain formats are casts
// (k_cast) or copies; a source not aligned to its element size is read byte by byte.
// fp8 (e4m3 codes after one fp32 scale per row): when the codes sit on a 16-byte boundary, the
// row length is a multiple of 16 and the output is 16-byte aligned, each thread turns one
// 16-byte load of codes (16 values of one row, its scale read once) into 16-byte stores;
// otherwise one thread per output, the row's scale read byte by byte.
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/fp8.hpp"
#include "kernels/weight_format.hpp"

namespace rp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPer = 8;                          // outputs per thread and step
constexpr int kSteps = 4;                        // steps per tile
constexpr int kTile = kThreads * kPer * kSteps;  // 8192 outputs per tile

// The 16 code values of a 4-bit format (kNf4 or kMxfp4), staged in shared memory.
struct Nf4Table {
  float v[16];
};

// Little-endian fields at any byte address (shared memory).
__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}
__device__ __forceinline__ float f32_at(const uint8_t* p) {
  return __uint_as_float(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
}

// Each format: kVals values in kBytes bytes per block; decode() writes values
// [8*part, 8*part + 8) of the block at b in the host twin's order of operations.
struct Q8_0 {
  static constexpr int kVals = 32, kBytes = 34;  // {f16 d; int8 q[32]}
  __device__ static void decode(const uint8_t* b, int part, const float*, float (&o)[kPer]) {
    const float d = f16_at(b);
    const uint8_t* q = b + 2 + kPer * part;
#pragma unroll
    for (int k = 0; k < kPer; ++k) o[k] = float(int8_t(q[k])) * d;
  }
};
struct Q4_0 {
  static constexpr int kVals = 32, kBytes = 18;  // {f16 d; uint8 qs[16]}: 0..15 low, 16..31 high
  __device__ static void decode(const uint8_t* b, int part, const float*, float (&o)[kPer]) {
    const float d = f16_at(b);
    const uint8_t* q = b + 2 + kPer * (part & 1);
    const int shift = part >= 2 ? 4 : 0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) o[k] = float(int((q[k] >> shift) & 15) - 8) * d;
  }
};
struct Nf4 {
  static constexpr int kVals = 64, kBytes = 36;  // {f32 absmax; uint8 q[32]}: value 2i high nibble
  __device__ static void decode(const uint8_t* b, int part, const float* lut, float (&o)[kPer]) {
    const float amax = f32_at(b);
    const uint8_t* q = b + 4 + (kPer / 2) * part;
#pragma unroll
    for (int k = 0; k < kPer / 2; ++k) {
      o[2 * k] = lut[q[k] >> 4] * amax;
      o[2 * k + 1] = lut[q[k] & 15] * amax;
    }
  }
};

struct Mxfp4 {
  static constexpr int kVals = 32, kBytes = 17;  // {uint8 e; uint8 qs[16]}: 0..15 low, 16..31 high
  __device__ static void decode(const uint8_t* b, int part, const float* lut, float (&o)[kPer]) {
    // 2^(e-128) exactly: the exponent field e-1 for e >= 2, the subnormals 2^-128, 2^-127 below
    const uint32_t e = b[0];
    const float d = __uint_as_float(e >= 2 ? (e - 1) << 23 : 0x00200000u << e);
    const uint8_t* q = b + 1 + kPer * (part & 1);
    const int shift = part >= 2 ? 4 : 0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) o[k] = lut[(q[k] >> shift) & 15] * d;
  }
};

// Copies len bytes from g into shared memory at s + (g mod 16), so that 16-byte-aligned
// chunks of g land on 16-byte-aligned chunks of s; returns that offset.
__device__ __forceinline__ int stage_bytes(const uint8_t* g, int len, uint8_t* s) {
  const int mis = int(reinterpret_cast<uintptr_t>(g) & 15u);
  uint8_t* d = s + mis;
  const int head = min((16 - mis) & 15, len);
  const int nvec = (len - head) / 16;
  const int tail = head + nvec * 16;
  const uint4* gv = reinterpret_cast<const uint4*>(g + head);
  uint4* sv = reinterpret_cast<uint4*>(d + head);
  for (int i = threadIdx.x; i < nvec; i += blockDim.x) sv[i] = __ldcs(gv + i);
  if (int(threadIdx.x) < head) d[threadIdx.x] = g[threadIdx.x];
  if (int(threadIdx.x) < len - tail) d[tail + threadIdx.x] = g[tail + threadIdx.x];
  return mis;
}

// Tile `tile` of a tensor of nblocks blocks at src into dst (s: the block's shared staging,
// lut: its 16 codes); every thread of the block calls it.
template <class F, typename T, bool VEC>
__device__ __forceinline__ void dequant_tile(const uint8_t* src, T* dst, int64_t nblocks, int64_t tile,
                                             uint8_t* s, const float* lut) {
  constexpr int kBlocksPerTile = kTile / F::kVals;
  constexpr int kParts = F::kVals / kPer;
  const int64_t b0 = tile * kBlocksPerTile;
  const int nb = int(min(int64_t(kBlocksPerTile), nblocks - b0));
  const int mis = stage_bytes(src + b0 * F::kBytes, nb * F::kBytes, s);
  __syncthreads();
  const uint8_t* t = s + mis;
  T* out = dst + b0 * F::kVals;
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    const int idx = int(threadIdx.x) + u * kThreads;  // group of kPer outputs in the tile
    const int blk = idx / kParts;
    if (blk < nb) {
      float v[kPer];
      F::decode(t + blk * F::kBytes, idx % kParts, lut, v);
      store_n<kPer, VEC>(out + int64_t(idx) * kPer, v);
    }
  }
  __syncthreads();  // the next tile overwrites s
}

template <class F>
__host__ __device__ constexpr int tile_stage_words() {
  return (kTile / F::kVals * F::kBytes + 31) / 16;  // 16-byte aligned staging of one tile
}

template <class F, typename T, bool VEC>
__global__ void __launch_bounds__(kThreads)
    dequant_blocks_kernel(const uint8_t* src, T* dst, int64_t nblocks, Nf4Table tab) {
  __shared__ uint4 s16[tile_stage_words<F>()];
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = tab.v[threadIdx.x];
  const int64_t ntiles = (nblocks + kTile / F::kVals - 1) / (kTile / F::kVals);
  for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x)
    dequant_tile<F, T, VEC>(src, dst, nblocks, tile, reinterpret_cast<uint8_t*>(s16), lut);
}

template <class F, typename T>
void launch_blocks(const void* src, T* dst, int64_t n, cudaStream_t st) {
  Nf4Table tab;
  const float* codes = std::is_same_v<F, Mxfp4> ? kMxfp4 : kNf4;
  for (int i = 0; i < 16; ++i) tab.v[i] = codes[i];
  const int64_t nblocks = n / F::kVals;
  const unsigned grid = grid_for(nblocks, kTile / F::kVals);
  const auto* s = static_cast<const uint8_t*>(src);
  if (aligned16(dst)) dequant_blocks_kernel<F, T, true><<<grid, kThreads, 0, st>>>(s, dst, nblocks, tab);
  else dequant_blocks_kernel<F, T, false><<<grid, kThreads, 0, st>>>(s, dst, nblocks, tab);
  RP_CUDA_LAUNCH_CHECK("dequantize");
}

// Plain values whose address is not a multiple of their size (e.g. an f32 tensor after
// an odd number of 18-byte q4_0 blocks): assembled from bytes, one value per thread.
template <typename S>
__device__ __forceinline__ float plain_at(const uint8_t* p) {
  if constexpr (sizeof(S) == 4) {
    return f32_at(p);
  } else {
    const auto u = (unsigned short)(p[0] | (p[1] << 8));
    if constexpr (std::is_same_v<S, bf16>) return __bfloat162float(__ushort_as_bfloat16(u));
    else return __half2float(__ushort_as_half(u));
  }
}

template <typename S, typename T>
__global__ void __launch_bounds__(kThreads)
    dequant_plain_bytes_kernel(const uint8_t* src, T* dst, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = from_f<T>(plain_at<S>(src + i * int64_t(sizeof(S))));
}

DType plain_dtype(WeightFormat f) {
  return f == WeightFormat::f32 ? DType::f32 : f == WeightFormat::bf16 ? DType::bf16 : DType::f16;
}

// Calls fn(T*) with a null pointer of the element type of t (f32, bf16 or f16).
template <class Fn>
void with_type(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn(static_cast<float*>(nullptr));
    case DType::bf16: return fn(static_cast<bf16*>(nullptr));
    case DType::f16: return fn(static_cast<f16*>(nullptr));
    default: bad_dtype("dequantize", t);
  }
}

void dequant_plain(WeightFormat f, DType dst_t, const void* src, void* dst, int64_t n, cudaStream_t st) {
  const DType src_t = plain_dtype(f);
  const size_t es = dtype_size(src_t);
  if (src_t == dst_t) {
    check(cudaMemcpyAsync(dst, src, size_t(n) * es, cudaMemcpyDeviceToDevice, st), "dequantize (copy)",
          __FILE__, __LINE__);
  } else if (reinterpret_cast<uintptr_t>(src) % es == 0) {
    k_cast(dst_t, dst, src_t, src, n, st);
  } else {
    with_type(dst_t, [&](auto* tag_t) {
      using T = std::remove_pointer_t<decltype(tag_t)>;
      with_type(src_t, [&](auto* tag_s) {
        using S = std::remove_pointer_t<decltype(tag_s)>;
        dequant_plain_bytes_kernel<S, T><<<grid_for(n, kThreads), kThreads, 0, st>>>(
            static_cast<const uint8_t*>(src), static_cast<T*>(dst), n);
        RP_CUDA_LAUNCH_CHECK("dequantize (unaligned)");
      });
    });
  }
}

// fp8 rows (kernels/weight_format.hpp): rows * 4 bytes of fp32 scales, then the e4m3 codes.
// One thread per output, grid-stride; the scale is read byte by byte (the tensor may start at
// any byte offset of its group's storage). x = decode(code) * scale, as the host twin.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dequant_fp8_rows_kernel(const uint8_t* src, T* dst, int64_t n, int64_t cols) {
  const uint8_t* codes = src + (n / cols) * 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float s = f32_at(src + (i / cols) * 4);
    dst[i] = from_f<T>(fp8::decode<Fp8Format::e4m3>(codes[i]) * s);
  }
}

// The aligned case: chunk c turns codes [16c, 16c + 16), one row's (cols % 16 == 0), into
// outputs with the same products as the kernel above.
template <typename T>
__device__ __forceinline__ void fp8_chunk16(const uint8_t* src, T* dst, int64_t n, int64_t cols, int64_t c) {
  const uint8_t* codes = src + (n / cols) * 4;
  const float s = f32_at(src + (c / (cols / 16)) * 4);
  alignas(16) uint8_t q[16];
  *reinterpret_cast<uint4*>(q) = reinterpret_cast<const uint4*>(codes)[c];
  float v[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) v[k] = fp8::decode<Fp8Format::e4m3>(q[k]) * s;
  store_n<16, true>(dst + c * 16, v);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dequant_fp8_rows16_kernel(const uint8_t* src, T* dst, int64_t n, int64_t cols) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < n / 16; c += stride)
    fp8_chunk16(src, dst, n, cols, c);
}

// Whether fp8 rows take the 16-byte path: codes on a 16-byte boundary, rows of a multiple of
// 16 values, the output 16-byte aligned.
bool fp8_vec(const void* src, const void* dst, int64_t n, int64_t cols) {
  return cols % 16 == 0 && aligned16(static_cast<const uint8_t*>(src) + (n / cols) * 4) && aligned16(dst);
}

void dequant_fp8(DType dst_t, const void* src, void* dst, int64_t n, int64_t cols, cudaStream_t st) {
  if (cols <= 0 || n % cols != 0)
    throw std::invalid_argument("dequantize: fp8 needs a row length dividing the value count");
  const auto* s8 = static_cast<const uint8_t*>(src);
  const bool vec = fp8_vec(src, dst, n, cols);
  with_type(dst_t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (vec)
      dequant_fp8_rows16_kernel<T>
          <<<grid_for(n / 16, kThreads), kThreads, 0, st>>>(s8, static_cast<T*>(dst), n, cols);
    else
      dequant_fp8_rows_kernel<T>
          <<<grid_for(n, kThreads), kThreads, 0, st>>>(s8, static_cast<T*>(dst), n, cols);
    RP_CUDA_LAUNCH_CHECK("dequantize (fp8)");
  });
}

}  // namespace

void k_dequantize(WeightFormat f, DType dst_t, const void* src, void* dst, int64_t n, int64_t cols,
                  cudaStream_t st) {
  if (dst_t != DType::f32 && dst_t != DType::bf16 && dst_t != DType::f16) bad_dtype("dequantize", dst_t);
  if (n <= 0) return;
  auto blocks = [&](auto* fmt) {
    using F = std::remove_pointer_t<decltype(fmt)>;
    with_type(dst_t, [&](auto* tag) { launch_blocks<F>(src, static_cast<decltype(tag)>(dst), n, st); });
  };
  switch (f) {
    case WeightFormat::f32:
    case WeightFormat::bf16:
    case WeightFormat::f16: return dequant_plain(f, dst_t, src, dst, n, st);
    case WeightFormat::q8_0: return blocks(static_cast<Q8_0*>(nullptr));
    case WeightFormat::q4_0: return blocks(static_cast<Q4_0*>(nullptr));
    case WeightFormat::nf4: return blocks(static_cast<Nf4*>(nullptr));
    case WeightFormat::mxfp4: return blocks(static_cast<Mxfp4*>(nullptr));
    case WeightFormat::fp8: return dequant_fp8(dst_t, src, dst, n, cols, st);
  }
  throw std::invalid_argument("dequantize: unknown weight format " + std::to_string(int(f)));
}

// ---- batches: one launch for up to kMaxBatch tensors of one format -------------------------
// The tensors' work units (fp8: 16-value chunks; block formats: tiles) are numbered one after
// another (start[] the prefix sums); a unit finds its tensor by binary search. The table is a
// __grid_constant__ parameter, read in place (no per-thread copy).
namespace {

constexpr int kMaxBatch = 32;

struct BatchTable {
  const uint8_t* src[kMaxBatch];
  void* dst[kMaxBatch];
  int64_t n[kMaxBatch];     // fp8: values; block formats: blocks
  int64_t cols[kMaxBatch];  // fp8 only
  int64_t start[kMaxBatch + 1];
  int count;
};

__device__ __forceinline__ int part_of(const BatchTable& t, int64_t unit) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.start[mid] <= unit) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dequant_fp8_rows16_batch_kernel(const __grid_constant__ BatchTable t) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, total = t.start[t.count];
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < total; u += stride) {
    const int p = part_of(t, u);
    fp8_chunk16(t.src[p], static_cast<T*>(t.dst[p]), t.n[p], t.cols[p], u - t.start[p]);
  }
}

template <class F, typename T>
__global__ void __launch_bounds__(kThreads)
    dequant_blocks_batch_kernel(const __grid_constant__ BatchTable t, Nf4Table tab) {
  __shared__ uint4 s16[tile_stage_words<F>()];
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = tab.v[threadIdx.x];
  for (int64_t u = blockIdx.x; u < t.start[t.count]; u += gridDim.x) {
    const int p = part_of(t, u);
    dequant_tile<F, T, true>(t.src[p], static_cast<T*>(t.dst[p]), t.n[p], u - t.start[p],
                             reinterpret_cast<uint8_t*>(s16), lut);
  }
}

template <class F, typename T>
void launch_blocks_batch(const BatchTable& t, cudaStream_t st) {
  Nf4Table tab;
  const float* codes = std::is_same_v<F, Mxfp4> ? kMxfp4 : kNf4;
  for (int i = 0; i < 16; ++i) tab.v[i] = codes[i];
  dequant_blocks_batch_kernel<F, T><<<grid_for(t.start[t.count], 1), kThreads, 0, st>>>(t, tab);
  RP_CUDA_LAUNCH_CHECK("dequantize (batch)");
}

// Work units of a batchable part (0: not batchable, dequantized on its own): fp8 on the
// 16-byte path, block formats with a 16-byte aligned output.
int64_t batch_units(const DequantPart& p) {
  if (p.n <= 0) return 0;
  switch (p.format) {
    case WeightFormat::fp8: return fp8_vec(p.src, p.dst, p.n, p.cols) ? p.n / 16 : 0;
    case WeightFormat::q8_0:
    case WeightFormat::q4_0:
    case WeightFormat::nf4:
    case WeightFormat::mxfp4: {
      if (!aligned16(p.dst)) return 0;
      const int64_t per_tile = kTile / weight_format_block(p.format);
      return (p.n / weight_format_block(p.format) + per_tile - 1) / per_tile;
    }
    default: return 0;
  }
}

void launch_batch(WeightFormat f, DType dst_t, const BatchTable& t, cudaStream_t st) {
  with_type(dst_t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    switch (f) {
      case WeightFormat::fp8:
        dequant_fp8_rows16_batch_kernel<T><<<grid_for(t.start[t.count], kThreads), kThreads, 0, st>>>(t);
        RP_CUDA_LAUNCH_CHECK("dequantize (fp8 batch)");
        return;
      case WeightFormat::q8_0: return launch_blocks_batch<Q8_0, T>(t, st);
      case WeightFormat::q4_0: return launch_blocks_batch<Q4_0, T>(t, st);
      case WeightFormat::nf4: return launch_blocks_batch<Nf4, T>(t, st);
      case WeightFormat::mxfp4: return launch_blocks_batch<Mxfp4, T>(t, st);
      default: throw std::invalid_argument("dequantize: no batch kernel for this format");
    }
  });
}

}  // namespace

void k_dequantize_many(DType dst_t, const DequantPart* parts, int64_t count, cudaStream_t st) {
  BatchTable t{};
  WeightFormat f = WeightFormat::bf16;
  auto flush = [&] {
    if (t.count > 0) launch_batch(f, dst_t, t, st);
    t.count = 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const DequantPart& p = parts[i];
    const int64_t units = batch_units(p);
    if (units == 0) {  // on its own (in order: the outputs do not overlap, so order is free)
      if (p.n > 0) k_dequantize(p.format, dst_t, p.src, p.dst, p.n, p.cols, st);
      continue;
    }
    if (t.count == kMaxBatch || (t.count > 0 && p.format != f)) flush();
    f = p.format;
    const int k = t.count++;
    t.src[k] = static_cast<const uint8_t*>(p.src);
    t.dst[k] = p.dst;
    t.n[k] = p.format == WeightFormat::fp8 ? p.n : p.n / weight_format_block(p.format);
    t.cols[k] = p.cols;
    t.start[k + 1] = t.start[k] + units;
  }
  flush();
}

}  // namespace rp::cuda
