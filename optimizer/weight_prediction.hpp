// Weight prediction for the staleness-1 optimizer ("async_compensation": "predict"). Iteration
// t computes its gradient with version t-2 of the weights, and that gradient is applied to
// version t-1. Instead of version k itself, the devices get the weights extrapolated by their
// last update, w_k + (w_k - w_{k-1}), an estimate of version k+1: the gradient is then taken
// close to the weights it is applied to. The idea is that of SpecTrain (Chen et al. 2018,
// "Efficient and Robust Parallel DNN Training through Model Parallelism on Multi-GPU
// Platform") and of XPipe's Adam-based prediction (Guan et al. 2019), here with the update
// AdamW really applied rather than one predicted from its moments.
//
// Cost: each trainable group keeps its last update, one fp32 per parameter (4 bytes on top of
// the master's and AdamW moments' 12), and an update makes two more passes over it.
// No CUDA, no actors: the optimizer shard owns the buffers.
#pragma once
#include <cstdint>

#include "optimizer/adamw.hpp"  // FloatVec, ThreadPool, DType

namespace rp {

/// The update a group received last: `delta` (n floats, empty until the first update) holds w
/// after step `step` minus w before it.
struct LastUpdate {
  FloatVec delta;
  int64_t step = -1;  ///< the step whose update `delta` is (-1: none yet)
};

/// Before an update of the n weights w: keeps a copy of them in last.delta (sized on the first
/// call). Throws std::invalid_argument for n < 0, a null w with n > 0, or a delta of another
/// size; nothing is written then.
void begin_update(const float* w, LastUpdate& last, int64_t n, ThreadPool* pool = nullptr);

/// After the update of step `step`: last.delta[i] = w[i] - last.delta[i] (the new weights minus
/// the copy begin_update took), last.step = step. Throws std::invalid_argument when last.delta
/// does not hold n elements (begin_update was not called).
void end_update(const float* w, LastUpdate& last, int64_t n, int64_t step, ThreadPool* pool = nullptr);

/// The low-precision copy of version `version`: w[i] + last.delta[i] rounded to `dtype` (the
/// rounding of write_lowp_copy) when last.step == version (the last update is the one that made
/// this version); a plain copy of w otherwise (the first version, or a version a skipped step
/// left unchanged). out: n elements of dtype (f32, bf16, f16). Throws as write_lowp_copy.
void write_predicted_copy(const float* w, const LastUpdate& last, int64_t version, void* out, int64_t n,
                          DType dtype, ThreadPool* pool = nullptr);

}  // namespace rp
