#include "optimizer/weight_prediction.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {
namespace {

/// Runs fn(lo, hi) over [0, n) in the pieces adamw_update uses for this n and pool, so every
/// page is touched by the thread that updates it.
template <class Fn>
void for_pieces(int64_t n, ThreadPool* pool, Fn fn) {
  int parts = 1;
  if (pool) parts = int(std::min<int64_t>(pool->size(), (n + kMinElemsPerThread - 1) / kMinElemsPerThread));
  auto piece = [&](int p) {
    int64_t lo, hi;
    split_range(n, parts, 1024, p, lo, hi);
    if (lo < hi) fn(lo, hi);
  };
  if (parts <= 1) return piece(0);
  pool->run(parts, piece);
}

}  // namespace

void begin_update(const float* w, LastUpdate& last, int64_t n, ThreadPool* pool) {
  if (n < 0) throw std::invalid_argument(fmt::format("begin_update: n = {} is negative", n));
  if (n > 0 && !w) throw std::invalid_argument("begin_update: null weights with n > 0");
  if (!last.delta.empty() && int64_t(last.delta.size()) != n)
    throw std::invalid_argument(
        fmt::format("begin_update: the last update has {} elements, the group {}", last.delta.size(), n));
  if (last.delta.empty()) last.delta.resize(size_t(n));
  float* d = last.delta.data();
  for_pieces(n, pool, [&](int64_t lo, int64_t hi) { std::copy(w + lo, w + hi, d + lo); });
}

void end_update(const float* w, LastUpdate& last, int64_t n, int64_t step, ThreadPool* pool) {
  if (int64_t(last.delta.size()) != n)
    throw std::invalid_argument(
        fmt::format("end_update: the copy has {} elements, the group {} (begin_update was not called)",
                    last.delta.size(), n));
  float* __restrict d = last.delta.data();
  for_pieces(n, pool, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) d[i] = w[i] - d[i];
  });
  last.step = step;
}

void write_predicted_copy(const float* w, const LastUpdate& last, int64_t version, void* out, int64_t n,
                          DType dtype, ThreadPool* pool) {
  if (last.step != version || int64_t(last.delta.size()) != n) return write_lowp_copy(w, out, n, dtype, pool);
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    return write_lowp_copy(w, out, n, dtype, pool);  // throws, naming the dtype
  const size_t esz = dtype_size(dtype);
  for_pieces(n, pool, [&](int64_t lo, int64_t hi) {
    float buf[4096];
    for (int64_t a = lo; a < hi; a += 4096) {
      const int64_t b = std::min<int64_t>(hi, a + 4096);
      for (int64_t i = a; i < b; ++i) buf[i - a] = w[i] + last.delta[size_t(i)];
      write_lowp_copy(buf, static_cast<char*>(out) + size_t(a) * esz, b - a, dtype, nullptr);
    }
  });
}

}  // namespace rp
