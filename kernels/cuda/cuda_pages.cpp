// The physical pages and address ranges under a GPU's pool (the PageBackend of
// kernels/paged_pool.hpp) through the driver's virtual memory management: pages made by
// cuMemCreate, mapped at ranges reserved by cuMemAddressReserve.
#include <fmt/format.h>

#include <type_traits>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_device_impl.hpp"
#include "kernels/device.hpp"
#include "kernels/paged_pool.hpp"

#include <cuda.h>

namespace rp {
namespace cuda {
namespace {

// The driver functions of virtual memory management, looked up through the runtime (so the
// programs do not link libcuda and start on machines without a driver).
struct DriverApi {
  decltype(&cuGetErrorName) get_error_name = nullptr;
  decltype(&cuGetErrorString) get_error_string = nullptr;
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) address_reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
};

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi a;
    auto get = [](const char* sym, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      const cudaError_t e = cudaGetDriverEntryPointByVersion(sym, &p, 12000, cudaEnableDefault, &q);
      if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
        cudaGetLastError();
        throw DeviceError(fmt::format("the CUDA driver has no {} ({})", sym, cudaGetErrorString(e)));
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    get("cuGetErrorName", a.get_error_name);
    get("cuGetErrorString", a.get_error_string);
    get("cuDeviceGet", a.device_get);
    get("cuDeviceGetAttribute", a.device_get_attribute);
    get("cuMemGetAllocationGranularity", a.granularity);
    get("cuMemAddressReserve", a.address_reserve);
    get("cuMemAddressFree", a.address_free);
    get("cuMemCreate", a.create);
    get("cuMemRelease", a.release);
    get("cuMemMap", a.map);
    get("cuMemUnmap", a.unmap);
    get("cuMemSetAccess", a.set_access);
    return a;
  }();
  return api;
}

void check_cu(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  driver().get_error_name(r, &name);
  driver().get_error_string(r, &text);
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    throw DeviceOutOfMemory(
        fmt::format("CUDA driver error {} ({}) in {}", name ? name : "?", text ? text : "?", what));
  throw DeviceError(
      fmt::format("CUDA driver error {} ({}) in {}", name ? name : "?", text ? text : "?", what));
}

/// Physical pages and address ranges of one GPU through the driver's virtual memory management.
class CudaPages final : public PageBackend {
 public:
  explicit CudaPages(int index) : index_(index) {
    set_device(index_);
    RP_CUDA_CHECK(cudaFree(nullptr));  // the primary context exists and is current
    CUdevice dev = 0;
    check_cu(driver().device_get(&dev, index_), "cuDeviceGet");
    int vmm = 0;
    check_cu(
        driver().device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
        "cuDeviceGetAttribute");
    if (!vmm)
      throw DeviceError(
          fmt::format("cuda:{}: the driver does not support virtual memory management", index_));
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = dev;
    size_t g = 0;
    check_cu(driver().granularity(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             "cuMemGetAllocationGranularity");
    if (g == 0 || kCudaPoolGranule % g != 0)
      throw DeviceError(
          fmt::format("cuda:{}: allocation granularity {} does not divide {}", index_, g, kCudaPoolGranule));
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  uintptr_t reserve(size_t bytes, size_t align) override {
    set_device(index_);
    CUdeviceptr p = 0;
    check_cu(driver().address_reserve(&p, bytes, align, 0, 0), "cuMemAddressReserve");
    return uintptr_t(p);
  }
  void unreserve(uintptr_t va, size_t bytes) override { driver().address_free(CUdeviceptr(va), bytes); }
  uint64_t create(size_t bytes) override {
    set_device(index_);
    CUmemGenericAllocationHandle h = 0;
    check_cu(driver().create(&h, bytes, &prop_, 0), "cuMemCreate");
    return uint64_t(h);
  }
  void release(uint64_t h) override {
    check_cu(driver().release(CUmemGenericAllocationHandle(h)), "cuMemRelease");
  }
  void map(uintptr_t va, size_t bytes, uint64_t h) override {
    set_device(index_);
    check_cu(driver().map(CUdeviceptr(va), bytes, 0, CUmemGenericAllocationHandle(h), 0), "cuMemMap");
    const CUresult r = driver().set_access(CUdeviceptr(va), bytes, &access_, 1);
    if (r != CUDA_SUCCESS) {
      driver().unmap(CUdeviceptr(va), bytes);
      check_cu(r, "cuMemSetAccess");
    }
  }
  void unmap(uintptr_t va, size_t bytes) override {
    set_device(index_);
    check_cu(driver().unmap(CUdeviceptr(va), bytes), "cuMemUnmap");
  }
  size_t device_free_bytes() override {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
    return fr;
  }

 private:
  int index_;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
};

}  // namespace

std::unique_ptr<PageBackend> make_cuda_pages(int index) { return std::make_unique<CudaPages>(index); }

}  // namespace cuda
}  // namespace rp
