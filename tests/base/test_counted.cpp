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

TEST(ByteText, TheUnitThatShowsTheSize) {
  EXPECT_EQ(rp::byte_text(0), "0 B");
  EXPECT_EQ(rp::byte_text(17), "17 B");
  EXPECT_EQ(rp::byte_text(1023), "1023 B");
  EXPECT_EQ(rp::byte_text(4096), "4.00 KiB");
  EXPECT_EQ(rp::byte_text(12.5 * 1024 * 1024), "12.5 MiB");
  EXPECT_EQ(rp::byte_text(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
  EXPECT_EQ(rp::byte_text(320.0 * 1024 * 1024 * 1024), "320 GiB");
  EXPECT_EQ(rp::byte_text(3.0 * 1024 * 1024 * 1024 * 1024 * 1024), "3072 TiB");
  EXPECT_EQ(rp::byte_text(-5), "0 B");
}
