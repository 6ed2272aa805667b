// The counter-based random numbers of Ops::dropout, shared by the CPU backend and the CUDA
// kernels (compiled as host and device code) so both draw the same mask bit for bit.
// No state: a value is a pure function of (seed, row, col), so a backward recomputing a
// forward regenerates its mask without storing it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define RP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define RP_HOST_DEVICE inline
#endif

namespace rp {

/// SplitMix64's output function (Steele, Lea & Flood 2014, "Fast splittable pseudorandom
/// number generators"): a bijective 64-bit mixer.
RP_HOST_DEVICE uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// A uniform number in [0, 1) with 24 random bits (exact in float) for element (row, col)
/// of the stream `seed`.
RP_HOST_DEVICE float dropout_uniform(uint64_t seed, uint64_t row, uint64_t col) {
  const uint64_t h = mix64(mix64(seed ^ mix64(row)) + col);
  return float(uint32_t(h >> 40)) * (1.0f / 16777216.0f);
}

}  // namespace rp
