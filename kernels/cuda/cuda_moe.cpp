// Placeholder until the CUDA mixture-of-experts kernels land: every MoE op refuses.
#include <stdexcept>

#include "kernels/cuda/cuda_ops.hpp"

namespace rp::cuda {
namespace {
[[noreturn]] void refuse(const char* op) {
  throw std::logic_error(std::string(op) + ": mixture-of-experts ops are not built for CUDA yet");
}
}  // namespace
void CudaOps::moe_route(const void*, float*, int32_t*, float*, float*, int64_t, int64_t, int64_t, bool) {
  refuse("moe_route");
}
void CudaOps::moe_route_bwd(const float*, const int32_t*, const float*, const float*, float, void*, int64_t, int64_t,
                            int64_t, bool) {
  refuse("moe_route_bwd");
}
void CudaOps::moe_sort(const int32_t*, int32_t*, int32_t*, int32_t*, int32_t*, int64_t, int64_t, int64_t) {
  refuse("moe_sort");
}
void CudaOps::gather_rows(const void*, const int32_t*, void*, int64_t, int64_t) { refuse("gather_rows"); }
void CudaOps::moe_combine(const void*, const float*, const int32_t*, void*, int64_t, int64_t, int64_t, bool) {
  refuse("moe_combine");
}
void CudaOps::moe_combine_bwd(const void*, const void*, const float*, const int32_t*, void*, float*, int64_t,
                              int64_t, int64_t) {
  refuse("moe_combine_bwd");
}
void CudaOps::moe_gather_bwd(const void*, const int32_t*, void*, int64_t, int64_t, int64_t, bool) {
  refuse("moe_gather_bwd");
}
void CudaOps::grouped_linear_fwd(const void*, const void*, void*, const int32_t*, int64_t, int64_t, int64_t) {
  refuse("grouped_linear_fwd");
}
void CudaOps::grouped_linear_bwd_input(const void*, const void*, void*, const int32_t*, int64_t, int64_t, int64_t,
                                       bool) {
  refuse("grouped_linear_bwd_input");
}
void CudaOps::grouped_linear_bwd_weight(const void*, const void*, void*, const int32_t*, int64_t, int64_t,
                                        int64_t) {
  refuse("grouped_linear_bwd_weight");
}
}  // namespace rp::cuda
