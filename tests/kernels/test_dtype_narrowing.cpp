// narrowing_overflows (kernels/dtype.hpp) against the conversions themselves: a finite fp32
// value counts exactly when f32_to_f16 / f32_to_bf16 turns it into an infinity.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/dtype.hpp"

namespace rp {
namespace {

bool becomes_infinite(float v, DType t) {
  if (!std::isfinite(v)) return false;
  const uint16_t h = t == DType::f16 ? f32_to_f16(v) : f32_to_bf16(v);
  return t == DType::f16 ? (h & 0x7fffu) == 0x7c00u : (h & 0x7fffu) == 0x7f80u;
}

TEST(DtypeNarrowing, CountsExactlyTheFiniteValuesThatBecomeInfinite) {
  std::vector<float> v = {0.0f,
                          1.0f,
                          65504.0f,
                          -65504.0f,
                          FLT_MAX,
                          -FLT_MAX,
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  // both sides of f16's last rounding boundary (65520) and of bf16's, one float step apart
  for (float edge : {65520.0f, 0x1.ffp127f + 0x1p119f})
    for (float x = edge, k = 0; k < 64; ++k) {
      v.push_back(x), v.push_back(-x);
      x = std::nextafter(x, 0.0f);
    }
  std::mt19937 g(7);
  std::uniform_real_distribution<float> e(-20.0f, 129.0f);
  for (int i = 0; i < 20000; ++i) v.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(e(g)));
  for (DType t : {DType::f16, DType::bf16}) {
    int64_t count = 0, first = -1;
    for (size_t i = 0; i < v.size(); ++i)
      if (becomes_infinite(v[i], t) && count++ == 0) first = int64_t(i);
    const Overflows o = narrowing_overflows(v.data(), int64_t(v.size()), t);
    EXPECT_GT(count, 0) << dtype_name(t);
    EXPECT_EQ(o.count, count) << dtype_name(t);
    EXPECT_EQ(o.first, first) << dtype_name(t);
  }
  EXPECT_EQ(narrowing_overflows(v.data(), int64_t(v.size()), DType::f32).count, 0);
}

}  // namespace
}  // namespace rp
