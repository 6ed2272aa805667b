// Device presets of `roundpipe plan --gpu`: lookup by name and alias, the link rates, and the
// rates a plan uses (measured for the H200, data sheet x the H200's ratios elsewhere).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "scheduler/gpu_presets.hpp"

namespace rp {
namespace {

TEST(GpuPresets, NamesAndAliasesMatchWhateverTheCaseAndSeparators) {
  const GpuPreset* p = find_gpu_preset("RTX 4090");
  ASSERT_NE(p, nullptr);
  EXPECT_STREQ(p->name, "RTX 4090");
  for (const char* n : {"rtx4090", "4090", "Rtx-4090", "GeForce RTX 4090", "rtx_4090"})
    EXPECT_EQ(find_gpu_preset(n), p) << n;
  EXPECT_STREQ(find_gpu_preset("h100")->name, "H100 SXM");
  EXPECT_STREQ(find_gpu_preset("H100-PCIe")->name, "H100 PCIe");
  EXPECT_STREQ(find_gpu_preset("a100 80gb")->name, "A100 80GB");
  EXPECT_STREQ(find_gpu_preset("A100-40")->name, "A100 40GB");
}

TEST(GpuPresets, UnknownNamesAreNotGuessed) {
  for (const char* n : {"", " ", "rtx4080", "409", "40900", "a100", "h20", "rtx 4090 ti"})
    EXPECT_EQ(find_gpu_preset(n), nullptr) << n;
  const std::string names = gpu_preset_names();
  for (const GpuPreset& p : gpu_presets()) EXPECT_NE(names.find(p.name), std::string::npos) << p.name;
}

TEST(GpuPresets, EveryNameAndAliasFindsItsOwnPresetOnly) {
  std::set<std::string> seen;
  for (const GpuPreset& p : gpu_presets()) {
    EXPECT_EQ(find_gpu_preset(p.name), &p) << p.name;
    std::string a = p.aliases;
    for (size_t b = 0; b <= a.size();) {
      const size_t e = std::min(a.find(',', b), a.size());
      const std::string alias = a.substr(b, e - b);
      EXPECT_EQ(find_gpu_preset(alias), &p) << alias << " of " << p.name;
      b = e + 1;
    }
  }
}

TEST(GpuPresets, DataSheetFiguresAreConsistent) {
  for (const GpuPreset& p : gpu_presets()) {
    SCOPED_TRACE(p.name);
    EXPECT_GT(p.bf16_tflops, 0);
    EXPECT_GE(p.fp16_acc16_tflops, p.fp16_tflops);  // fp16 accumulation is never slower
    if (p.fp8_tflops > 0) {
      EXPECT_GE(p.fp8_tflops, p.bf16_tflops);
    }
    EXPECT_GE(p.fp8_acc16_tflops, p.fp8_tflops);
    EXPECT_GT(p.memory_gb, 0);
    EXPECT_GT(p.memory_gbps, 0);
    EXPECT_NE(std::string(p.source).find("NVIDIA"), std::string::npos);
  }
  // GeForce cards accumulate fp16 in fp32 at half rate; data-centre parts do not
  for (const char* g : {"3090", "4090", "5090"})
    EXPECT_NEAR(find_gpu_preset(g)->fp16_acc16_tflops, 2 * find_gpu_preset(g)->fp16_tflops, 0.2) << g;
  EXPECT_EQ(find_gpu_preset("h200")->fp16_acc16_tflops, find_gpu_preset("h200")->fp16_tflops);
}

TEST(GpuPresets, PcieLinkRates) {
  EXPECT_NEAR(pcie_link_gbps(4, 16), 31.5, 0.05);  // 16 GT/s x 16 lanes x 128/130 / 8
  EXPECT_NEAR(pcie_link_gbps(5, 16), 63.0, 0.05);
  EXPECT_NEAR(pcie_link_gbps(3, 8), 7.88, 0.01);
  EXPECT_NEAR(pcie_link_gbps(2, 16), 8.0, 1e-9);  // 8b/10b
  EXPECT_THROW(pcie_link_gbps(0, 16), std::invalid_argument);
  EXPECT_THROW(pcie_link_gbps(7, 16), std::invalid_argument);
  EXPECT_THROW(pcie_link_gbps(4, 0), std::invalid_argument);
}

TEST(GpuPresets, PlannedRatesAreMeasuredOrCalibratedOnTheH200) {
  const GpuRates h200 = achievable_rates(*find_gpu_preset("H200"));
  EXPECT_TRUE(h200.measured);
  EXPECT_EQ(h200.tflops, 655);
  EXPECT_EQ(h200.memory_gbps, 4240);
  EXPECT_EQ(h200.pcie_gbps, 55);
  // the same ratios applied to the H200's own data sheet give back its measurements
  const GpuPreset& d = *find_gpu_preset("H200");
  EXPECT_NEAR(d.bf16_tflops * kComputeEfficiency, 655, 1e-9);
  EXPECT_NEAR(d.memory_gbps * kMemoryEfficiency, 4240, 1e-9);
  EXPECT_NEAR(pcie_link_gbps(d.pcie_gen, d.pcie_lanes) * link_efficiency(), 55, 1e-9);
  const GpuRates r = achievable_rates(*find_gpu_preset("4090"));
  EXPECT_FALSE(r.measured);
  EXPECT_NEAR(r.tflops, 165.2 * 655 / 989, 1e-9);
  EXPECT_NEAR(r.memory_gbps, 1008 * 4240.0 / 4800, 1e-9);
  EXPECT_NEAR(r.pcie_gbps, 31.5 * 55 / 63.0, 0.05);
  EXPECT_EQ(r.memory_bytes, 24.0 * (1 << 30));
  // FP8: measured on the H200 (~1.7x its bf16), data sheet x efficiency elsewhere, none before Ada
  EXPECT_EQ(h200.fp8_tflops, 1110);
  EXPECT_NEAR(h200.fp8_tflops / h200.tflops, 1.69, 0.01);
  EXPECT_NEAR(r.fp8_tflops, 330.3 * 655 / 989, 1e-9);
  EXPECT_EQ(achievable_rates(*find_gpu_preset("A100 80GB")).fp8_tflops, 0);
}

}  // namespace
}  // namespace rp
