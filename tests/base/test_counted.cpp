// Counts in messages are singular for one and plural otherwise.
#include <gtest/gtest.h>

#include <cstdint>

#include "base/counted.hpp"

TEST(Counted, SingularForOneAndPluralOtherwise) {
  EXPECT_EQ(rp::counted(1, "sequence"), "1 sequence");
  EXPECT_EQ(rp::counted(0, "sequence"), "0 sequences");
  EXPECT_EQ(rp::counted(int64_t(2), "step"), "2 steps");
  EXPECT_EQ(rp::counted(size_t(1), "pass", "passes"), "1 pass");
  EXPECT_EQ(rp::counted(3, "pass", "passes"), "3 passes");
  EXPECT_EQ(rp::counted(1, "micro-batch", "micro-batches"), "1 micro-batch");
}
