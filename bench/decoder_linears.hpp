// The decoder linears whose shapes the FP8 benchmarks time (bench/fp8_ops_bench.cpp,
// bench/fp8_algos.cpp): the projections of Qwen3-1.7B, Qwen3-4B and LLaMA-3.1-8B, with the
// tokens of one micro-batch in the throughput rows those models are measured by (8 x 8192 for
// the Qwen3 models, 8 x 4096 for the LLaMA LoRA row). Linears of one shape are listed once.
#pragma once
#include <cstdint>

namespace rp::bench {

/// y[tokens, out] = x[tokens, in] W[out, in]^T.
struct DecoderLinear {
  const char* model;
  const char* name;
  int64_t tokens, in, out;
};

inline constexpr DecoderLinear kDecoderLinears[] = {
    {"Qwen3-1.7B", "q_proj / o_proj", 8192, 2048, 2048},
    {"Qwen3-1.7B", "k_proj / v_proj", 8192, 2048, 1024},
    {"Qwen3-1.7B", "gate_proj / up_proj", 8192, 2048, 6144},
    {"Qwen3-1.7B", "down_proj", 8192, 6144, 2048},
    {"Qwen3-4B", "q_proj", 8192, 2560, 4096},
    {"Qwen3-4B", "k_proj / v_proj", 8192, 2560, 1024},
    {"Qwen3-4B", "o_proj", 8192, 4096, 2560},
    {"Qwen3-4B", "gate_proj / up_proj", 8192, 2560, 9728},
    {"Qwen3-4B", "down_proj", 8192, 9728, 2560},
    {"LLaMA-3.1-8B", "q_proj / o_proj", 4096, 4096, 4096},
    {"LLaMA-3.1-8B", "k_proj / v_proj", 4096, 4096, 1024},
    {"LLaMA-3.1-8B", "gate_proj / up_proj", 4096, 4096, 14336},
    {"LLaMA-3.1-8B", "down_proj", 4096, 14336, 4096},
};

}  // namespace rp::bench
