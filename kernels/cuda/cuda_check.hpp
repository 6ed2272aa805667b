// Checked CUDA / cuBLAS calls for the CUDA backend (internal to kernels/cuda).
//
// RP_CUDA_CHECK(call) / RP_CUBLAS_CHECK(call) evaluate `call` and, on failure, throw
// rp::DeviceError whose text names the error, the statement, file and line (llm.c's
// cudaCheck, but a typed error instead of exit()). RP_CUDA_LAUNCH_CHECK(name) checks
// the launch of the kernel just issued (name: any C string; the error names it with the
// caller's file and line); every kernel launch of the backend is followed by it. cuDNN's
// statuses are checked the same way in cudnn_attention.cpp (RP_CUDNN_CHECK), the one file
// that includes cuDNN.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "kernels/device.hpp"

namespace rp::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t s, const char* what, const char* file, int line);

inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) throw_cuda_error(e, what, file, line);
}
inline void check(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_cublas_error(s, what, file, line);
}
/// The launch of kernel `name` just issued on this thread (cudaGetLastError).
void check_launch(const char* name, const char* file, int line);

/// Sets the calling thread's current device to `dev` (cheap when already current).
void set_device(int dev);

}  // namespace rp::cuda

#define RP_CUDA_CHECK(call) ::rp::cuda::check((call), #call, __FILE__, __LINE__)
#define RP_CUBLAS_CHECK(call) ::rp::cuda::check((call), #call, __FILE__, __LINE__)
#define RP_CUDA_LAUNCH_CHECK(name) ::rp::cuda::check_launch((name), __FILE__, __LINE__)
