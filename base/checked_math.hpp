// Products and sums of counts that must not wrap around: a spec or a file can hold any
// 64-bit value, and a product that overflows to 0 or to a small number used to divide by
// zero or allocate the wrong size. Every size computed from user input goes through these.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>

namespace rp {

/// a * b * ..., or std::nullopt when a factor is negative or the product exceeds `limit`
/// (default: INT64_MAX). An empty list is 1.
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors,
                                              int64_t limit = INT64_MAX) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(p, f, &p) || p > limit) return std::nullopt;
  }
  return p;
}

/// The same for byte counts (size_t): std::nullopt on overflow of size_t.
inline std::optional<size_t> checked_bytes(std::initializer_list<size_t> factors) {
  size_t p = 1;
  for (size_t f : factors)
    if (__builtin_mul_overflow(p, f, &p)) return std::nullopt;
  return p;
}

/// a + b for byte counts; std::nullopt on overflow.
inline std::optional<size_t> checked_sum(size_t a, size_t b) {
  size_t s = 0;
  if (__builtin_add_overflow(a, b, &s)) return std::nullopt;
  return s;
}

}  // namespace rp
