// The H200 ceilings bench_ops sets each op-table case against (one place; docs/gpu.md cites it).
//
// Measured on the lent `nvidia-h200` (1 x H200 SXM, 700 W power limit, driver 580.159.04):
//  - bf16 GEMM: an 8192^3 linear_fwd runs at 792-807 TFLOP/s in a burst of ~15 ms
//    (bench/results/cuda_ops.md, "ceilings"); back to back for 10-20 s the GPU sits at its
//    power limit and the same GEMM settles at 648-666 TFLOP/s (bench/results/throughput.md,
//    "The power limit"), the rate a training step's GEMMs see.
//  - FP8 e4m3 GEMM (gemm_fp8): 1,100-1,190 TFLOP/s at the decoder shapes in a burst, 1,216
//    TFLOP/s sustained for the 8192^3 product (bench/results/fp8_ops.md).
//  - HBM3e: 4.8 TB/s is the part's bandwidth; a 1 GiB device-to-device copy measures
//    4.22-4.25 TB/s read + written (bench/results/cuda_ops.md), so a memory-bound op at ~88% of
//    4.8 TB/s runs as fast as a copy does.
// Rates above a ceiling are possible (a GEMM shape cuBLAS handles better than the square one,
// an input the 60 MB L2 serves); bench_ops prints the fraction either way.
#pragma once

namespace rp::bench {

struct Ceilings {
  double bf16_gemm_burst_tflops = 800;
  double bf16_gemm_sustained_tflops = 660;
  double fp8_gemm_burst_tflops = 1190;
  double hbm_gbs = 4800;
  double copy_gbs = 4230;  ///< the measured device-to-device copy (read + written)
};

inline constexpr Ceilings kH200;

}  // namespace rp::bench
