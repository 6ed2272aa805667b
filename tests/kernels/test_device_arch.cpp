// Which GPUs a build covers (kernels/device_arch.hpp): CUDA's binary-compatibility rules over
// CMake's architecture lists, the one-line refusals, FP8 capability. On a machine with a GPU,
// the driver's own answer for this build must agree with the rules.
#include <gtest/gtest.h>

#include "kernels/device_arch.hpp"
#ifdef RP_HAVE_CUDA
#include <cuda_runtime.h>
#include "kernels/cuda/cuda_arch.hpp"
#include "roundpipe/device.hpp"
#endif

namespace rp {
namespace {

struct Gpu {
  const char* name;
  int major, minor;
};
constexpr Gpu kGpus[] = {{"A100", 8, 0}, {"RTX 3090", 8, 6}, {"RTX 4090", 8, 9},
                         {"H200", 9, 0}, {"B200", 10, 0},    {"RTX 5090", 12, 0}};

TEST(DeviceArch, TheDefaultListCoversEveryGpuFromAmpereOn) {
  for (const char* list : {"80-real;90-real;100-real;120", "80-real,86-real,89-real,90-real,100-real,120"})
    for (const Gpu& g : kGpus) {
      EXPECT_TRUE(arch_list_runs_on(list, g.major, g.minor)) << list << " on " << g.name;
      EXPECT_TRUE(arch_list_has_cubin_for(list, g.major, g.minor)) << list << " on " << g.name;
    }
  // a GPU newer than the list runs the compute_120 PTX, but has no cubin
  EXPECT_TRUE(arch_list_runs_on("80-real;90-real;100-real;120", 13, 0));
  EXPECT_FALSE(arch_list_has_cubin_for("80-real;90-real;100-real;120", 13, 0));
}

TEST(DeviceArch, CubinsRunWithinTheirMajorOnlyAndPtxOnEveryNewerGpu) {
  EXPECT_FALSE(arch_list_runs_on("90", 8, 9));  // sm_90 cubin + compute_90 PTX: not on Ada
  EXPECT_TRUE(arch_list_runs_on("90", 10, 0));  // ... but its PTX JIT-compiles on Blackwell
  EXPECT_FALSE(arch_list_runs_on("90-real", 10, 0));
  EXPECT_FALSE(arch_list_runs_on("90-real", 12, 0));
  EXPECT_TRUE(arch_list_runs_on("80-real", 8, 9));
  EXPECT_FALSE(arch_list_runs_on("89-real", 8, 6));  // a cubin never runs on an older minor
  EXPECT_FALSE(arch_list_runs_on("80-real", 9, 0));
  EXPECT_TRUE(arch_list_runs_on("80-virtual", 9, 0));
  EXPECT_FALSE(arch_list_has_cubin_for("80-virtual", 9, 0));
  EXPECT_FALSE(arch_list_runs_on("89-virtual", 8, 6));
  EXPECT_TRUE(arch_list_runs_on("90a-real", 9, 0));
  EXPECT_FALSE(arch_list_runs_on("90a-real", 10, 0));
  EXPECT_FALSE(arch_list_runs_on("90a", 10, 0));  // arch-specific PTX does not JIT forward
  EXPECT_TRUE(arch_list_runs_on("100f-real", 10, 3));
  EXPECT_FALSE(arch_list_runs_on("100a-real", 10, 3));
  EXPECT_TRUE(arch_list_runs_on(" 80-real , 90-real ", 9, 0));
}

TEST(DeviceArch, UnreadableListsLeaveTheDecisionToTheDriver) {
  EXPECT_TRUE(arch_list_runs_on("native", 8, 9));
  EXPECT_TRUE(arch_list_runs_on("", 8, 9));
  EXPECT_TRUE(arch_list_runs_on("80-realish", 9, 0));
}

TEST(DeviceArch, TheRefusalIsOneLineWithTheRebuildCommand) {
  const std::string s = arch_mismatch_line("cuda:0 (NVIDIA GeForce RTX 4090)", 8, 9, "90-real");
  EXPECT_EQ(s.find('\n'), std::string::npos);
  EXPECT_NE(s.find("RTX 4090"), std::string::npos) << s;
  EXPECT_NE(s.find("8.9"), std::string::npos) << s;
  EXPECT_NE(s.find("90-real"), std::string::npos) << s;
  EXPECT_NE(s.find("cmake -S . -B build -DCMAKE_CUDA_ARCHITECTURES=89 && cmake --build build"),
            std::string::npos)
      << s;
  const std::string old = arch_too_old_line("cuda:1 (Tesla T4)", 7, 5);
  EXPECT_EQ(old.find('\n'), std::string::npos);
  EXPECT_NE(old.find("7.5"), std::string::npos) << old;
  EXPECT_NE(old.find("8.0"), std::string::npos) << old;
}

TEST(DeviceArch, Fp8FromAdaOn) {
  EXPECT_FALSE(device_supports_fp8(8, 0));
  EXPECT_FALSE(device_supports_fp8(8, 6));
  EXPECT_TRUE(device_supports_fp8(8, 9));
  EXPECT_TRUE(device_supports_fp8(9, 0));
  EXPECT_TRUE(device_supports_fp8(12, 0));
  // "fp8": true on an older GPU: one line naming the device and its capability
  const std::string no = fp8_refusal_line("cuda:0 (NVIDIA A100)", 8, 0);
  EXPECT_NE(no.find("cuda:0 (NVIDIA A100) has compute capability 8.0"), std::string::npos) << no;
  EXPECT_NE(no.find("\"fp8\""), std::string::npos) << no;
  EXPECT_EQ(no.find('\n'), std::string::npos);
  EXPECT_EQ(fp8_refusal_line("cuda:0 (NVIDIA H200)", 9, 0), "");
}

#ifdef RP_HAVE_CUDA
// The driver decides whether this build has an image for each visible GPU; the rules above
// must predict it (a disagreement would make the one-line refusal wrong).
TEST(DeviceArch, TheDriverAgreesWithTheRulesForThisBuild) {
  const int n = cuda_device_count();
  if (n == 0) GTEST_SKIP() << "no CUDA device visible";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    ASSERT_EQ(cudaGetDeviceProperties(&p, i), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(i), cudaSuccess);
    cudaFuncAttributes a{};
    const cudaError_t e = cuda::probe_kernel_attributes(&a);
    cudaGetLastError();
    EXPECT_EQ(e == cudaSuccess, arch_list_runs_on(cuda::compiled_archs(), p.major, p.minor))
        << p.name << " sm_" << p.major << p.minor << " build " << cuda::compiled_archs() << ": "
        << cudaGetErrorName(e);
    if (e == cudaSuccess && !arch_list_has_cubin_for(cuda::compiled_archs(), p.major, p.minor))
      std::printf("[ info ] %s runs this build's PTX (compute_%d), JIT-compiled\n", p.name, a.ptxVersion);
  }
}
#endif

}  // namespace
}  // namespace rp
