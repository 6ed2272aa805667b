// The KV-head chunking of the expanded GQA backward (kernels/cuda/gqa_chunking.hpp), on the
// CPU: the chosen chunk size against a brute-force oracle over every scratch size, with exact,
// low, high and missing estimates, cost jumps and refusals.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/gqa_chunking.hpp"

namespace rp::cuda {
namespace {

using Need = std::function<std::optional<size_t>(int64_t)>;

// Oracle: the largest g whose chunk fits and which is the chunk size of some pass count
// (g == ceil(nkv / ceil(nkv / g))), 0 when none.
int64_t oracle(int64_t nkv, size_t avail, const Need& need) {
  for (int64_t g = nkv; g >= 1; --g) {
    const int64_t passes = (nkv + g - 1) / g;
    if ((nkv + passes - 1) / passes != g) continue;
    const auto b = need(g);
    if (b && *b <= avail) return g;
  }
  return 0;
}

TEST(GqaChunking, MatchesTheOracleForEveryScratchSize) {
  for (int64_t nkv : {1, 2, 3, 5, 8, 12, 32}) {
    const size_t a = 1000, b = 64;  // bytes per KV head, fixed bytes
    int calls = 0;
    const Need affine = [&](int64_t g) -> std::optional<size_t> {
      ++calls;
      return size_t(g) * a + b;
    };
    for (size_t est : {size_t(0), a, a / 2, 3 * a}) {  // none, exact, low, high
      for (size_t avail = 0; avail <= size_t(nkv + 1) * a + b; avail += 97) {
        calls = 0;
        const int64_t g = plan_kv_chunk(nkv, avail, est, affine);
        const int plan_calls = calls;
        ASSERT_EQ(g, oracle(nkv, avail, affine)) << "nkv " << nkv << " avail " << avail << " est " << est;
        if (g > 0) {
          EXPECT_LE(size_t(g) * a + b, avail);
        }
        if (est == a && g > 0) {
          EXPECT_LE(plan_calls, 2) << "exact estimate, nkv " << nkv << " avail " << avail;
        }
      }
    }
  }
}

TEST(GqaChunking, ChunksAreAsEvenAsThePassCountAllows) {
  // 8 KV heads, room for 5: 2 passes of 4 (not 5 + 3); 5 KV heads, room for 4: 3 + 2
  const Need unit = [](int64_t g) -> std::optional<size_t> { return size_t(g); };
  EXPECT_EQ(plan_kv_chunk(8, 5, 1, unit), 4);
  EXPECT_EQ(plan_kv_chunk(5, 4, 1, unit), 3);
  EXPECT_EQ(plan_kv_chunk(5, 2, 1, unit), 2);  // 2 + 2 + 1
  EXPECT_EQ(plan_kv_chunk(7, 100, 1, unit), 7);
  EXPECT_EQ(plan_kv_chunk(7, 0, 1, unit), 0);
  EXPECT_EQ(plan_kv_chunk(0, 100, 1, unit), 0);
}

TEST(GqaChunking, JumpsAndRefusals) {
  // a cost that jumps above 3 heads (say a workspace tier) despite a low estimate
  const Need jump = [](int64_t g) -> std::optional<size_t> { return g <= 3 ? size_t(g) * 10 : 1000; };
  EXPECT_EQ(plan_kv_chunk(8, 500, 10, jump), 3);  // 8 heads: candidates 8, 4, 3 (3+3+2), 2, 1
  EXPECT_EQ(plan_kv_chunk(8, 500, 10, jump), oracle(8, 500, jump));
  // cuDNN refuses graphs of more than 2 heads: the plan keeps to 2
  const Need refuse = [](int64_t g) -> std::optional<size_t> {
    if (g > 2) return std::nullopt;
    return size_t(g);
  };
  EXPECT_EQ(plan_kv_chunk(6, 100, 1, refuse), 2);
  // refuses everything: no plan
  const Need none = [](int64_t) -> std::optional<size_t> { return std::nullopt; };
  EXPECT_EQ(plan_kv_chunk(4, 100, 1, none), 0);
}

}  // namespace
}  // namespace rp::cuda
