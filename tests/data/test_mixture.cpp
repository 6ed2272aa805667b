// MixtureStream (data/mixture.hpp): weighted, deterministic, resumable by position.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "data/mixture.hpp"

using namespace rp;

namespace {
// `rows` sequences of 2 tokens; sequence r of source s holds ids {s * 1000 + r, 0}.
PackedSequences rows_of(int source, int rows) {
  PackedSequences p;
  p.seq_len = 2;
  for (int r = 0; r < rows; ++r) {
    p.ids.insert(p.ids.end(), {source * 1000 + r, 0});
    p.targets.insert(p.targets.end(), {0, kIgnoreIndex});
  }
  return p;
}
MixtureStream mixture(uint64_t seed, double w0 = 3, double w1 = 1) {
  return MixtureStream({{"a.jsonl", rows_of(1, 7), w0}, {"b.parquet", rows_of(2, 5), w1}}, seed);
}
std::vector<int32_t> firsts(const TokenBatch& b) {
  std::vector<int32_t> out;
  for (int64_t r = 0; r < b.n_seq; ++r) out.push_back(b.ids[size_t(r * b.seq_len)]);
  return out;
}
}  // namespace

TEST(Mixture, SameSeedSameStreamOtherSeedOtherStream) {
  MixtureStream a = mixture(7), b = mixture(7), c = mixture(8);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 20; ++i) {
    for (int32_t x : firsts(a.next(4))) sa.push_back(x);
    for (int32_t x : firsts(b.next(4))) sb.push_back(x);
    for (int32_t x : firsts(c.next(4))) sc.push_back(x);
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

// Seeking to a saved position continues exactly as the uninterrupted stream, whatever batch
// sizes came before.
TEST(Mixture, SeekContinuesBitExact) {
  MixtureStream whole = mixture(3);
  std::vector<TokenBatch> batches;
  for (int i = 0; i < 12; ++i) batches.push_back(whole.next(3));
  for (int64_t at : {0, 3, 15, 33}) {
    MixtureStream resumed = mixture(3);
    resumed.next(5);  // consumed differently before the seek: must not matter
    resumed.seek(at);
    for (size_t i = size_t(at / 3); i < batches.size(); ++i) {
      const TokenBatch b = resumed.next(3);
      EXPECT_EQ(b.ids, batches[i].ids) << "seek " << at << " batch " << i;
      EXPECT_EQ(b.targets, batches[i].targets);
    }
    EXPECT_EQ(resumed.served(), whole.served()) << "seek " << at;
  }
}

// The realised proportions follow the weights, and within a source every sequence is served
// once per epoch of that source.
TEST(Mixture, ProportionsFollowTheWeightsAndEachSourceCyclesItsEpochs) {
  MixtureStream m = mixture(11);
  std::map<int32_t, int> count;
  const int n = 8000;
  for (int32_t x : firsts(m.next(n))) ++count[x];
  const double share0 = double(m.served()[0]) / n;
  EXPECT_NEAR(share0, 0.75, 0.02) << m.proportions();
  EXPECT_EQ(m.served()[0] + m.served()[1], n);
  // source 1's 7 sequences each served served[0] / 7 times, give or take the last epoch
  for (int r = 0; r < 7; ++r) EXPECT_NEAR(count[1000 + r], double(m.served()[0]) / 7, 1.0) << r;
  for (int r = 0; r < 5; ++r) EXPECT_NEAR(count[2000 + r], double(m.served()[1]) / 5, 1.0) << r;
  EXPECT_NE(m.proportions().find("a.jsonl "), std::string::npos);
  EXPECT_NE(m.proportions().find("(weight 75.0%)"), std::string::npos) << m.proportions();
}

TEST(Mixture, BadSourcesAreOneLine) {
  const auto err = [](std::vector<MixtureSource> s) {
    try {
      MixtureStream m(std::move(s), 0);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("<no exception>");
  };
  EXPECT_NE(
      err({{"a", rows_of(1, 2), 1}, {"b", rows_of(2, 2), 0}}).find("data[1] (b): weight must be > 0, got 0"),
      std::string::npos);
  EXPECT_NE(err({{"a", rows_of(1, 2), std::numeric_limits<double>::quiet_NaN()}})
                .find("data[0] (a): weight must be > 0"),
            std::string::npos);
  EXPECT_NE(err({{"a", rows_of(1, 2), 1}, {"b", PackedSequences{}, 1}}).find("data[1] (b): no sequences"),
            std::string::npos);
  PackedSequences longer = rows_of(2, 1);
  longer.seq_len = 1;
  EXPECT_NE(err({{"a", rows_of(1, 2), 1}, {"b", longer, 1}})
                .find("data[1] (b): sequences of 1 tokens, data[0]'s have 2"),
            std::string::npos);
  EXPECT_NE(err({}).find("data: an empty list"), std::string::npos);
}
