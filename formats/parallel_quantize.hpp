// Converting a large tensor on several host threads: the storage forms of frozen weights
// (model loads, the disk tier's cache build, convert) are made row range by row range on the
// calling thread's pool (optimizer/thread_pool.hpp shared_pool). The bytes are those of one
// quantize_weights / one cast over the whole tensor: every piece starts on a whole row and a
// whole block, and each block is quantized alone.
#pragma once
#include <cstdint>
#include <functional>

#include "kernels/weight_format.hpp"

namespace rp {

/// Values a tensor needs before it is split (smaller ones run on the calling thread alone).
constexpr int64_t kParallelConvertValues = int64_t(1) << 22;

/// Host threads a conversion uses: the cores this process may run on, at most 16.
int convert_threads();

/// quantize_weights(f, src, dst, n, cols) in pieces of whole rows and whole blocks on several
/// threads (fp8 keeps its row scales ahead of the codes and runs as one piece). Same bytes;
/// same exceptions.
void quantize_weights_parallel(WeightFormat f, const float* src, void* dst, int64_t n, int64_t cols);

/// fn(lo, hi) over contiguous pieces of [0, n) whose bounds are multiples of `grain`, on several
/// threads when n is at least kParallelConvertValues, else once on the calling thread.
void for_ranges_parallel(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace rp
