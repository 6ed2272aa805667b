// Backend selection that does not depend on whether the CUDA backend was built.
#include "kernels/device.hpp"

namespace rp {
#ifndef RP_HAVE_CUDA
int cuda_device_count() { return 0; }
std::unique_ptr<Device> make_cuda_device(int, const DeviceOptions&) {
  throw DeviceError("this build of RoundPipe has no CUDA backend (nvcc was not found at configure time)");
}
#endif
}  // namespace rp
