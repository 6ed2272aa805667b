// Ops::moe_pad's host half (kernels/ops.hpp): the padded offsets of the last moe_sort under
// kernels/moe_buckets.hpp's rule, the same on every backend; the backend's moe_pad_rows moves
// row and token onto them.
#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/moe_buckets.hpp"
#include "kernels/ops.hpp"

namespace rp {

int64_t Ops::moe_pad(const int32_t* topk_idx, int32_t* offsets, int32_t* offsets_host, int32_t* row,
                     int32_t* token, int64_t T, int64_t E, int64_t k, int64_t capacity) {
  if (E < 1 || k < 1 || T < 0) throw std::invalid_argument("moe_pad: need T >= 0, E >= 1 and k >= 1");
  const std::vector<int32_t> off(offsets_host, offsets_host + E + 1);
  if (off[0] != 0 || off[size_t(E)] != T * k)
    throw std::invalid_argument("moe_pad: offsets_host are not moe_sort's (offsets[0] 0, offsets[E] T*k)");
  if (padded_rows_bound(T * k, kExpertPadFraction) > INT32_MAX)
    throw std::invalid_argument("moe_pad: the padded layout could pass 2^31 - 1 rows");
  const std::vector<int32_t> padded = padded_offsets(off, kExpertPadFraction);
  const int64_t Rp = padded[size_t(E)];
  if (Rp > capacity)
    throw std::invalid_argument(fmt::format(
        "moe_pad: the padded layout needs {} rows, the buffers hold {} (size them with padded_rows_bound)",
        Rp, capacity));
  moe_pad_rows(topk_idx, off.data(), padded.data(), offsets, row, token, T, E, k);
  std::copy(padded.begin(), padded.end(), offsets_host);
  return Rp;
}

}  // namespace rp
