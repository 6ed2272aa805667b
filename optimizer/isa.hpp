// Run-time choice of the instruction set the optimizer kernels use (AdamW, sum of squares).
//
// Every kernel exists in three versions: portable scalar C++ (any x86-64 or other CPU),
// AVX2 (+FMA, F16C) and AVX-512 (F, BW, VL, DQ). The vector versions are compiled with
// per-function target attributes, so they are present whatever -march the build uses
// (RP_NATIVE=OFF included), and chosen at run time from cpuid (__builtin_cpu_supports,
// which also checks that the OS saves the vector registers). All versions give
// bit-identical results for finite values (see adamw.hpp), so the choice only changes speed.
#pragma once
#include <vector>

namespace rp {

enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2 };

/// "scalar", "avx2", "avx512".
const char* isa_name(Isa isa);

/// Parses isa_name's output; throws std::invalid_argument listing the valid names.
Isa parse_isa(const char* name);

/// True when this CPU (and this build: vector paths exist only on x86-64) can run `isa`.
bool isa_supported(Isa isa);

/// Every supported ISA, scalar first.
std::vector<Isa> supported_isas();

/// The fastest supported ISA.
Isa best_isa();

/// The ISA the kernels use now. Initially best_isa(), or the value of the environment
/// variable RP_OPTIMIZER_ISA (scalar, avx2, avx512) read once at the first call; an
/// unsupported or unknown value there falls back to best_isa() with a warning on stderr.
Isa adamw_isa();

/// Forces the kernels onto `isa` for the whole process (tests, benchmarks). Throws
/// std::invalid_argument when the CPU cannot run it. Thread-safe (atomic), but a call
/// running concurrently may still use the previous ISA.
void set_adamw_isa(Isa isa);

}  // namespace rp
