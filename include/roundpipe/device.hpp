// Devices the runtime trains on: CUDA GPUs, or virtual GPUs of the CPU backend (each with
// its own memory pool and streams, so the whole runtime runs without a GPU).
#pragma once
#include <cstddef>

#include "roundpipe/dtype.hpp"

namespace rp {

/// Options common to both backends.
struct DeviceOptions {
  size_t capacity_bytes = size_t(24) << 30;  ///< pool cap (emulates a 24 GiB card by default)
  double pcie_bytes_per_s =
      0;  ///< CPU backend: a shared link of this bandwidth per direction (0 = memcpy speed)
  size_t pcie_chunk_bytes = size_t(1) << 20;  ///< CPU backend: the link is re-arbitrated after each chunk
  bool pcie_priorities = true;  ///< CPU backend: activation streams first (false: first come, first served)
  DType dtype = DType::bf16;    ///< CUDA backend: storage dtype, bf16 or f16 (the CPU backend is f32)
  /// fp16 accumulation of the dense linears' forward and input-gradient GEMMs (CUDA: needs
  /// dtype f16, else opening the device throws std::invalid_argument; CPU: emulated, slow).
  bool f16_accumulation = false;
  /// FP8 dense decoder linears (spec key "fp8"; LayerOptions::fp8, docs/gpu.md "FP8 linears"):
  /// their forward, recompute and input-gradient GEMMs in FP8 e4m3 with fp32 accumulation.
  /// CUDA: needs a GPU of compute capability 8.9 or newer (else opening the device throws
  /// rp::DeviceError) and dtype bf16 (else std::invalid_argument). CPU: emulated bit for bit
  /// in the FP8 rounding (the GEMM's sum in fp32), slow.
  bool fp8 = false;
  /// With fp8: the dense decoder linears' weight gradients dW += dy^T x as FP8 GEMMs as well
  /// (spec key "fp8_weight_gradients"; LayerOptions::fp8_weight_gradients): dy^T and x^T
  /// quantized to e4m3 with scales from their amax, summed in fp32 into the fp32 gradient.
  /// Ignored without fp8.
  bool fp8_weight_gradients = false;
  /// With fp8 over a LoRA base stored as fp8 (spec key "fp8_stored_direct";
  /// LayerOptions::fp8_stored_direct): its linears run from the stored codes and row scales
  /// instead of a dequantized and requantized copy per upload. Experimental, off by default;
  /// ignored without fp8.
  bool fp8_stored_direct = false;
  /// Mixture-of-experts grouped linears as bucketed pointer-array batches (spec key
  /// "expert_gemm": "bucketed"; Ops::set_expert_gemm, LayerOptions::expert_padded): each
  /// expert's sorted rows padded to its bucket's row count (at most 6% of a bucket's rows), one
  /// batched GEMM per bucket on CUDA. Same results; the default, faster end to end on the two
  /// models measured (docs/gpu.md); false: cuBLAS's grouped GEMM on the unpadded layout.
  bool expert_gemm_bucketed = true;
};

/// Number of CUDA devices visible (0 when the build has no CUDA or no driver/GPU).
int cuda_device_count();

}  // namespace rp
