#include "scheduler/gpu_presets.hpp"

#include <array>
#include <cctype>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

namespace {

// Dense rates: where a data sheet gives only the 2:4-sparse figure (marked with an asterisk
// in NVIDIA's data-centre data sheets), the dense one is half of it.
// clang-format off
constexpr std::array kPresets{
    //         name, aliases, source,
    //         bf16, fp16, fp16 acc16, fp8, fp8 acc16, GB, GB/s, PCIe gen, lanes
    GpuPreset{"RTX 3090", "3090,rtx3090,geforce rtx 3090",
              "NVIDIA Ampere GA102 GPU Architecture whitepaper, appendix A (GeForce RTX 3090)",
              71, 71, 142, 0, 0, 24, 936, 4, 16},
    GpuPreset{"RTX 4090", "4090,rtx4090,geforce rtx 4090",
              "NVIDIA Ada GPU Architecture whitepaper, appendix A (GeForce RTX 4090)",
              165.2, 165.2, 330.3, 330.3, 660.6, 24, 1008, 4, 16},
    GpuPreset{"RTX 5090", "5090,rtx5090,geforce rtx 5090",
              "NVIDIA RTX Blackwell GPU Architecture whitepaper, appendix A (GeForce RTX 5090)",
              209.5, 209.5, 419, 419, 838, 32, 1792, 5, 16},
    GpuPreset{"A100 40GB", "a100-40,a100 40g,a100-sxm4-40gb,a100-pcie-40gb",
              "NVIDIA A100 Tensor Core GPU data sheet (40GB; 312 dense, 624 with sparsity)",
              312, 312, 312, 0, 0, 40, 1555, 4, 16},
    GpuPreset{"A100 80GB", "a100-80,a100 80g,a100-sxm4-80gb",
              "NVIDIA A100 Tensor Core GPU data sheet (80GB SXM: 2,039 GB/s; the PCIe card 1,935)",
              312, 312, 312, 0, 0, 80, 2039, 4, 16},
    GpuPreset{"L40S", "l40s,nvidia l40s",
              "NVIDIA L40S GPU data sheet (362.05 / 733 TFLOPS dense, twice that with sparsity)",
              362.05, 362.05, 362.05, 733, 733, 48, 864, 4, 16},
    GpuPreset{"H100 SXM", "h100,h100sxm,h100-sxm5,h100 sxm5",
              "NVIDIA H100 Tensor Core GPU data sheet (H100 SXM: 1,979 / 3,958 TFLOPS with sparsity)",
              989.5, 989.5, 989.5, 1979, 1979, 80, 3350, 5, 16},
    GpuPreset{"H100 PCIe", "h100pcie,h100-pcie",
              "NVIDIA H100 Tensor Core GPU data sheet (H100 PCIe: 1,513 / 3,026 TFLOPS with sparsity)",
              756.5, 756.5, 756.5, 1513, 1513, 80, 2000, 5, 16},
    GpuPreset{"H200", "h200,h200sxm,h200-sxm,h200 sxm",
              "NVIDIA H200 Tensor Core GPU data sheet (H200 SXM: 1,979 / 3,958 TFLOPS with sparsity)",
              989, 989, 989, 1979, 1979, 141, 4800, 5, 16,
              kH200MeasuredTflops, kH200MeasuredMemoryGbps, kH200MeasuredPcieGbps, kH200MeasuredFp8Tflops},
    GpuPreset{"B200", "b200,hgx b200,dgx b200",
              "NVIDIA DGX B200 data sheet, per GPU (72 PFLOPS fp8 training with sparsity over 8 GPUs, "
              "1,440 GB, 64 TB/s)",
              2250, 2250, 2250, 4500, 4500, 180, 8000, 5, 16},
};
// clang-format on

// lower case, without spaces, '-' and '_'
std::string normalize(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c != ' ' && c != '-' && c != '_') out += char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::span<const GpuPreset> gpu_presets() { return kPresets; }

const GpuPreset* find_gpu_preset(std::string_view name) {
  const std::string key = normalize(name);
  if (key.empty()) return nullptr;
  for (const GpuPreset& p : kPresets) {
    if (normalize(p.name) == key) return &p;
    std::string_view a = p.aliases;
    for (size_t b = 0; b <= a.size();) {
      const size_t e = std::min(a.find(',', b), a.size());
      if (normalize(a.substr(b, e - b)) == key) return &p;
      b = e + 1;
    }
  }
  return nullptr;
}

std::string gpu_preset_names() {
  std::string s;
  for (const GpuPreset& p : kPresets) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

double pcie_link_gbps(int gen, int lanes) {
  constexpr std::array<double, 6> gts{2.5, 5, 8, 16, 32, 64};
  if (gen < 1 || gen > 6) throw std::invalid_argument(fmt::format("PCIe generation {}: expected 1..6", gen));
  if (lanes < 1) throw std::invalid_argument(fmt::format("PCIe lanes {}: expected >= 1", lanes));
  const double encoding = gen <= 2 ? 8.0 / 10.0 : 128.0 / 130.0;
  return gts[size_t(gen - 1)] * encoding * lanes / 8.0;
}

double link_efficiency() { return kH200MeasuredPcieGbps / pcie_link_gbps(5, 16); }

GpuRates achievable_rates(const GpuPreset& p) {
  GpuRates r;
  r.measured = p.measured_tflops > 0;
  r.tflops = r.measured ? p.measured_tflops : p.bf16_tflops * kComputeEfficiency;
  r.fp8_tflops = p.measured_fp8_tflops > 0 ? p.measured_fp8_tflops : p.fp8_tflops * kComputeEfficiency;
  r.memory_gbps = p.measured_memory_gbps > 0 ? p.measured_memory_gbps : p.memory_gbps * kMemoryEfficiency;
  r.pcie_gbps = p.measured_pcie_gbps > 0 ? p.measured_pcie_gbps
                                         : pcie_link_gbps(p.pcie_gen, p.pcie_lanes) * link_efficiency();
  r.memory_bytes = p.memory_gb * double(int64_t(1) << 30);
  return r;
}

}  // namespace rp
