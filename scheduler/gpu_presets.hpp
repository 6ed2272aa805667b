// Device presets for `roundpipe plan --gpu NAME`: the rates of common GPUs as their vendor's
// data sheets state them, and the rates a predictor should use (sustained, achievable ones).
//
// Data sheet figures are peaks: the tensor rates are at the boost clock, the memory bandwidth
// is the pin rate, and the PCIe figure is the link's raw rate. A training step runs below all
// three. The only GPU this project measured is the H200 (bench/results/throughput.md,
// cuda_ops.md): a bf16 GEMM issued back to back for 20 s settles at 655 TFLOP/s at its 700 W
// power limit (about 790 in a ~15 ms burst; the data sheet says 989), a device copy reaches
// 4240 GB/s (data sheet 4800), and a pinned host copy 55 GB/s each way (PCIe 5.0 x16: 63.0).
// achievable_rates() uses those measurements for the H200 and, for every other GPU, its data
// sheet figures times the same ratios (kComputeEfficiency, kMemoryEfficiency,
// kLinkEfficiency). They are one calibration point: a GPU that holds its clock better under
// load (e.g. a GeForce card below its power limit) runs closer to its data sheet.
#pragma once
#include <span>
#include <string>
#include <string_view>

namespace rp {

/// One GPU as its data sheet describes it. TFLOP/s are dense (no 2:4 sparsity) tensor-core
/// rates; "acc16" are the rates with fp16 accumulation where the GPU has a faster one
/// (GeForce cards run fp16/fp8 GEMMs that accumulate in fp32 at half the fp16-accumulate
/// rate; data-centre parts run both at the same rate, and acc16 equals the fp32 figure).
/// 0 marks a rate the GPU does not have (fp8 before Ada / Hopper).
struct GpuPreset {
  const char* name;          ///< "RTX 4090"
  const char* aliases;       ///< comma-separated other names, matched like the name ("4090,rtx4090")
  const char* source;        ///< the data sheet or whitepaper the figures come from
  double bf16_tflops;        ///< bf16 inputs, fp32 accumulation
  double fp16_tflops;        ///< fp16 inputs, fp32 accumulation
  double fp16_acc16_tflops;  ///< fp16 inputs, fp16 accumulation
  double fp8_tflops;         ///< fp8 inputs, fp32 accumulation (0: none)
  double fp8_acc16_tflops;   ///< fp8 inputs, fp16 accumulation (0: none)
  double memory_gb;          ///< device memory as the data sheet states it (GB)
  double memory_gbps;        ///< device memory bandwidth, GB/s
  int pcie_gen;              ///< host link: PCIe generation
  int pcie_lanes;            ///< and lanes
  /// This project's measurements (0: none): sustained bf16 GEMM TFLOP/s, device copy GB/s,
  /// pinned host<->device GB/s per direction.
  double measured_tflops = 0, measured_memory_gbps = 0, measured_pcie_gbps = 0;
  double measured_fp8_tflops = 0;  ///< sustained e4m3 GEMM TFLOP/s (0: not measured)
};

/// Every preset, in the order `plan --list-gpus` prints them.
std::span<const GpuPreset> gpu_presets();

/// The preset called `name` or one of its aliases, compared case-insensitively and ignoring
/// spaces, '-' and '_' ("RTX 4090", "rtx4090", "4090", "h100-sxm"); nullptr when none is.
const GpuPreset* find_gpu_preset(std::string_view name);

/// The presets' names, comma-separated (for an error message).
std::string gpu_preset_names();

/// Raw rate of a PCIe link per direction in GB/s: lanes x transfer rate x encoding
/// (gen 1-2: 8b/10b, 2.5 / 5 GT/s; gen 3-6: 128b/130b, 8 / 16 / 32 / 64 GT/s; gen 6's FLIT
/// overhead ignored). Throws std::invalid_argument for a generation outside 1..6 or lanes < 1.
double pcie_link_gbps(int gen, int lanes);

/// Ratios of the H200's measured rates to its data sheet (see the file comment).
constexpr double kH200DatasheetTflops = 989.0, kH200MeasuredTflops = 655.0;
constexpr double kH200DatasheetMemoryGbps = 4800.0, kH200MeasuredMemoryGbps = 4240.0;
constexpr double kH200MeasuredPcieGbps = 55.0;
/// Sustained e4m3 GEMM TFLOP/s on the H200 under the same power limit (bench_fp8_ops_bench
/// --sustained: 1.1-1.2 PFLOP/s, ~1.7x the bf16 rate; docs/gpu.md, "FP8 compute").
constexpr double kH200MeasuredFp8Tflops = 1110.0;
/// Their ratio, what `roundpipe plan --fp8` assumes on a GPU without a preset.
constexpr double kFp8SpeedupH200 = kH200MeasuredFp8Tflops / kH200MeasuredTflops;          // 1.69
constexpr double kComputeEfficiency = kH200MeasuredTflops / kH200DatasheetTflops;         // 0.662
constexpr double kMemoryEfficiency = kH200MeasuredMemoryGbps / kH200DatasheetMemoryGbps;  // 0.883
/// Of PCIe 5.0 x16's 63.0 GB/s (pcie_link_gbps(5, 16)); computed in achievable_rates.
double link_efficiency();

/// The rates `roundpipe plan --gpu` plans with: measured where this project measured the
/// GPU, else the data sheet's bf16 (fp32-accumulate) rate, memory and link bandwidth times
/// the efficiencies above. memory_bytes is the data sheet's size read as GiB (what the
/// driver reports for these parts is within a few percent of it; a CUDA context and the
/// allocator take some of it, which --memory-cap can leave out).
struct GpuRates {
  double tflops = 0, memory_gbps = 0, pcie_gbps = 0;
  /// FP8 (e4m3, fp32 accumulation) GEMM TFLOP/s: measured on the H200, else the data sheet's
  /// fp8 rate times kComputeEfficiency; 0 for a GPU without FP8 tensor cores.
  double fp8_tflops = 0;
  double memory_bytes = 0;
  bool measured = false;  ///< from this project's measurements (the H200)
};
GpuRates achievable_rates(const GpuPreset& p);

}  // namespace rp
