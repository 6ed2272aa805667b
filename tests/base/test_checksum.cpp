// base/checksum: XXH3-64 against the reference values published with xxHash, and the
// streaming form against the one-shot one.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "base/checksum.hpp"

namespace {

TEST(Checksum, MatchesXxh3ReferenceValues) {
  // XXH3_64bits of the empty input (seed 0), as listed in xxHash's sanity checks (cli/xsum_sanity_check.c)
  EXPECT_EQ(rp::checksum64("", 0), 0x2D06800538D394C2ull);
  rp::Checksum c;
  EXPECT_EQ(c.digest(), 0x2D06800538D394C2ull);
}

TEST(Checksum, StreamingEqualsOneShotForAnySplit) {
  std::mt19937 rng(5);
  std::vector<unsigned char> data(10000);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  const uint64_t whole = rp::checksum64(data.data(), data.size());
  for (int trial = 0; trial < 20; ++trial) {
    rp::Checksum c;
    size_t at = 0;
    while (at < data.size()) {
      const size_t n = std::min<size_t>(data.size() - at, rng() % 700);
      c.update(data.data() + at, n);
      at += n;
    }
    EXPECT_EQ(c.digest(), whole) << "trial " << trial;
  }
  rp::Checksum c;
  c.update(data.data(), 100);
  c.reset();
  c.update(data.data(), data.size());
  EXPECT_EQ(c.digest(), whole);
}

TEST(Checksum, EveryFlippedBitChangesTheDigest) {
  std::string s(256, 'a');
  const uint64_t h = rp::checksum64(s.data(), s.size());
  for (size_t i = 0; i < s.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      std::string t = s;
      t[i] = char(t[i] ^ (1 << bit));
      ASSERT_NE(rp::checksum64(t.data(), t.size()), h) << "byte " << i << " bit " << bit;
    }
}

}  // namespace
