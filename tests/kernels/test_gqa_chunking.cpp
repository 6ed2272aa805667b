// The pass sizes of the expanded GQA backward (kernels/cuda/gqa_chunking.hpp), on the CPU:
// the candidate sizes, and the chosen size against a brute-force oracle over every scratch
// size, with exact, low, high and missing estimates, cost jumps and refusals.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/gqa_chunking.hpp"

namespace rp::cuda {
namespace {

using Need = std::function<std::optional<size_t>(int64_t)>;

// Is hc a pass size a plan can use? Whole KV heads: g*r where g is the largest chunk of some
// split of nkv into n near-equal chunks (g == ceil(nkv / ceil(nkv / g))); parts of a KV head:
// hc < r likewise for r.
bool balanced(int64_t total, int64_t part) {
  const int64_t n = (total + part - 1) / part;  // parts of at most `part`
  return (total + n - 1) / n == part;           // the largest of n near-equal parts
}
bool usable(int64_t nkv, int64_t r, int64_t hc) {
  if (hc >= r) return hc % r == 0 && hc / r <= nkv && balanced(nkv, hc / r);
  return hc >= 1 && balanced(r, hc);
}

// Oracle: the largest usable hc whose pass fits, 0 when none.
int64_t oracle(int64_t nkv, int64_t r, size_t avail, const Need& need) {
  for (int64_t hc = nkv * r; hc >= 1; --hc) {
    if (!usable(nkv, r, hc)) continue;
    const auto b = need(hc);
    if (b && *b <= avail) return hc;
  }
  return 0;
}

TEST(GqaChunking, PassSizes) {
  EXPECT_EQ(gqa_pass_sizes(5, 4), (std::vector<int64_t>{20, 12, 8, 4, 2, 1}));
  EXPECT_EQ(gqa_pass_sizes(8, 4), (std::vector<int64_t>{32, 16, 12, 8, 4, 2, 1}));
  EXPECT_EQ(gqa_pass_sizes(2, 16), (std::vector<int64_t>{32, 16, 8, 6, 4, 3, 2, 1}));
  EXPECT_EQ(gqa_pass_sizes(3, 1), (std::vector<int64_t>{3, 2, 1}));
  EXPECT_EQ(gqa_pass_sizes(8, 5), (std::vector<int64_t>{40, 20, 15, 10, 5, 3, 2, 1}));
  EXPECT_TRUE(gqa_pass_sizes(0, 4).empty());
  for (int64_t nkv : {1, 3, 8})
    for (int64_t r : {1, 2, 5, 16}) {
      const std::vector<int64_t> c = gqa_pass_sizes(nkv, r);
      for (size_t i = 0; i < c.size(); ++i) {
        EXPECT_TRUE(usable(nkv, r, c[i])) << nkv << " " << r << " " << c[i];
        if (i > 0) {
          EXPECT_LT(c[i], c[i - 1]);
        }
      }
      int64_t count = 0;
      for (int64_t hc = 1; hc <= nkv * r; ++hc) count += usable(nkv, r, hc) ? 1 : 0;
      EXPECT_EQ(count, int64_t(c.size())) << nkv << " " << r;
    }
}

TEST(GqaChunking, MatchesTheOracleForEveryScratchSize) {
  for (auto [nkv, r] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 16}, {3, 4}, {5, 4}, {8, 4}, {8, 5}, {32, 1}}) {
    const size_t a = 1000, b = 64;  // bytes per query head, fixed bytes
    int calls = 0;
    const Need affine = [&](int64_t hc) -> std::optional<size_t> {
      ++calls;
      return size_t(hc) * a + b;
    };
    for (size_t est : {size_t(0), a, a / 2, 3 * a}) {  // none, exact, low, high
      for (size_t avail = 0; avail <= size_t(nkv * r + 1) * a + b; avail += 97) {
        calls = 0;
        const int64_t hc = plan_gqa_pass(nkv, r, avail, est, affine);
        const int plan_calls = calls;
        ASSERT_EQ(hc, oracle(nkv, r, avail, affine)) << "nkv " << nkv << " r " << r << " avail " << avail;
        if (hc > 0) {
          EXPECT_LE(size_t(hc) * a + b, avail);
        }
        if (est == a && hc > 0) {
          EXPECT_LE(plan_calls, 2) << "exact estimate, nkv " << nkv << " avail " << avail;
        }
      }
    }
  }
}

TEST(GqaChunking, JumpsAndRefusals) {
  // 8 KV heads of 4: a cost that jumps above 12 query heads despite a low estimate
  const Need jump = [](int64_t hc) -> std::optional<size_t> { return hc <= 12 ? size_t(hc) * 10 : 100000; };
  EXPECT_EQ(plan_gqa_pass(8, 4, 500, 10, jump), 12);  // 3 + 3 + 2 KV heads
  EXPECT_EQ(plan_gqa_pass(8, 4, 500, 10, jump), oracle(8, 4, 500, jump));
  // cuDNN refuses graphs of more than 2 heads: the plan keeps to 2 (parts of KV heads)
  const Need refuse = [](int64_t hc) -> std::optional<size_t> {
    if (hc > 2) return std::nullopt;
    return size_t(hc);
  };
  EXPECT_EQ(plan_gqa_pass(6, 4, 100, 1, refuse), 2);
  // refuses everything, or nothing fits: no plan
  const Need none = [](int64_t) -> std::optional<size_t> { return std::nullopt; };
  EXPECT_EQ(plan_gqa_pass(4, 2, 100, 1, none), 0);
  const Need unit = [](int64_t hc) -> std::optional<size_t> { return size_t(hc); };
  EXPECT_EQ(plan_gqa_pass(4, 2, 0, 1, unit), 0);
  EXPECT_EQ(plan_gqa_pass(0, 2, 100, 1, unit), 0);
}

}  // namespace
}  // namespace rp::cuda
