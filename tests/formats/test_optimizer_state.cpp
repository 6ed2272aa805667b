// formats/optimizer_state: the optimizer.bin format on its own (the Session's use of it is
// tested in tests/actors/test_resume.cpp): every section round-trips, a low-precision copy
// saved by another backend is converted, and damaged or old-version files are one line
// naming the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "formats/optimizer_state.hpp"
#include "kernels/dtype.hpp"
#include "model/layout.hpp"
#include "tests/formats/test_io_util.hpp"

namespace rp::test {
namespace {

ModelLayout small_layout() {
  ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.tie_word_embeddings = true;
  return make_layout(c);
}

struct State {
  ModelLayout layout = small_layout();
  std::vector<AdamWState> adam;
  std::vector<std::vector<float>> master;
  std::vector<std::vector<uint16_t>> lowp;  // bf16
  AdamWOptions opts;
  LossScaler scaler;
  State() {
    std::mt19937 rng(3);
    std::normal_distribution<float> d;
    opts.beta2 = 0.95;
    for (const auto& g : layout.groups) {
      AdamWState st;
      st.step = 7;
      st.m.resize(size_t(g.numel));
      st.v.resize(size_t(g.numel));
      std::vector<float> w(size_t(g.numel));
      std::vector<uint16_t> l(size_t(g.numel));
      for (int64_t i = 0; i < g.numel; ++i) {
        st.m[size_t(i)] = d(rng), st.v[size_t(i)] = std::abs(d(rng)), w[size_t(i)] = d(rng);
        l[size_t(i)] = f32_to_bf16(w[size_t(i)] * 0.5f);
      }
      adam.push_back(std::move(st));
      master.push_back(std::move(w));
      lowp.push_back(std::move(l));
    }
    scaler.update(true);  // backed off once: not the default state
  }
  void write(const std::string& path) const {
    OptimizerStateView v;
    v.header.steps = 7;
    v.header.async = true;
    v.header.has_master = v.header.has_lowp = v.header.has_scaler = true;
    v.header.lowp_dtype = DType::bf16;
    v.header.loss_scales = {scaler.scale(), scaler.scale()};
    v.layout = &layout;
    v.adam = &adam;
    v.adam_options = &opts;
    v.master = &master;
    for (const auto& l : lowp) v.lowp.push_back(l.data());
    v.scaler = &scaler;
    write_optimizer_state(path, v);
  }
};

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(OptimizerStateFile, EverySectionRoundTrips) {
  TempDir dir("optstate");
  const State s;
  s.write(dir / "optimizer.bin");
  OptimizerStateReader r(dir / "optimizer.bin");
  EXPECT_EQ(r.header().steps, 7);
  EXPECT_TRUE(r.header().async && r.header().has_master && r.header().has_lowp && r.header().has_scaler);
  EXPECT_EQ(r.header().lowp_dtype, DType::bf16);
  r.check_groups(s.layout);
  for (size_t g = 0; g < s.layout.groups.size(); ++g) {
    const auto& grp = s.layout.groups[g];
    AdamWState st;
    AdamWOptions o;
    r.read_adam(grp, st, o);
    EXPECT_EQ(st.step, 7);
    EXPECT_EQ(0, std::memcmp(st.m.data(), s.adam[g].m.data(), st.m.size() * 4)) << grp.name;
    EXPECT_EQ(o.beta2, 0.95);
    std::vector<float> w(size_t(grp.numel));
    r.read_master(grp, w.data());
    EXPECT_EQ(w, s.master[g]) << grp.name;
    // the bf16 copy read into an f32 session: converted exactly (bf16 -> f32 is exact)
    std::vector<float> l(size_t(grp.numel));
    r.read_lowp(grp, l.data(), DType::f32);
    for (int64_t i = 0; i < grp.numel; ++i) ASSERT_EQ(l[size_t(i)], bf16_to_f32(s.lowp[g][size_t(i)])) << i;
  }
  LossScaler got;
  r.read_scaler(got);
  EXPECT_TRUE(got == s.scaler);
  r.finish();
}

TEST(OptimizerStateFile, DamagedAndOldFilesAreOneLineNamingTheFile) {
  TempDir dir("optstate_bad");
  const State s;
  const std::string good_path = dir / "good.bin", bad = dir / "bad.bin";
  s.write(good_path);
  const std::string good = slurp(good_path);
  auto expect_error = [&](const std::string& bytes, const std::string& needle) {
    std::ofstream(bad, std::ios::binary) << bytes;
    try {
      OptimizerStateReader r(bad);
      r.check_groups(s.layout);
      for (const auto& grp : s.layout.groups) {
        AdamWState st;
        AdamWOptions o;
        std::vector<float> w(size_t(grp.numel));
        r.read_adam(grp, st, o);
        r.read_master(grp, w.data());
        r.read_lowp(grp, nullptr, DType::bf16);
      }
      LossScaler sc;
      r.read_scaler(sc);
      r.finish();
      ADD_FAILURE() << "accepted; wanted " << needle;
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(bad + ": ", 0), 0u) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  std::string v1 = good;
  v1[8] = 1;  // the version field: files written with FNV-1a checksums
  expect_error(v1, "format version 1");
  std::string v9 = good;
  v9[8] = 9;
  expect_error(v9, "format version 9, this build reads 2");
  std::string flip = good;
  flip[good.size() / 2] ^= 8;
  expect_error(flip, "checksum mismatch");
  expect_error(good.substr(0, good.size() - 3), "end marker");
  expect_error(good + "x", "trailing bytes");
  // the extent check alone (no group loaded) finds truncation anywhere and trailing bytes
  auto extent_error = [&](const std::string& bytes) -> std::string {
    const std::string bad = dir / "extent.bin";
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
    try {
      OptimizerStateReader(bad).check_extent();
      return "";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(bad + ": ", 0), 0u) << e.what();
      return e.what();
    }
  };
  EXPECT_EQ(extent_error(good), "");
  for (size_t cut : {good.size() / 3, good.size() / 2, good.size() - 20, good.size() - 3, good.size() - 1})
    EXPECT_NE(extent_error(good.substr(0, cut)).find("truncated optimizer state"), std::string::npos) << cut;
  EXPECT_NE(extent_error(good + "xyz").find("3 trailing bytes"), std::string::npos);
  std::string marker = good;
  marker[good.size() - 1] ^= 1;
  EXPECT_NE(extent_error(marker).find("end marker"), std::string::npos);
  std::string moments = good;  // the first group's AdamW moment count, 24 bytes into its record
  const size_t rec = good.find("RPADAMW1");
  ASSERT_NE(rec, std::string::npos);
  moments[rec + 24] ^= 4;
  EXPECT_NE(extent_error(moments).find("corrupted optimizer state: the AdamW state of group"),
            std::string::npos);
  std::string zeros = good;  // the rest of the file zeroed from the first group on
  std::fill(zeros.begin() + long(rec), zeros.end(), '\0');
  EXPECT_NE(extent_error(zeros).find("no AdamW state at byte"), std::string::npos);
  expect_error("RPOPTSTx", "not a RoundPipe optimizer state");
  // another model's groups
  State other;
  other.layout.groups[1].name = "layer.9";
  try {
    OptimizerStateReader(good_path).check_groups(other.layout);
    ADD_FAILURE() << "accepted another model's groups";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("saved for another model?"), std::string::npos) << e.what();
  }
}

TEST(OptimizerStateFile, AFailedWriteKeepsThePreviousFile) {
  TempDir dir("optstate_keep");
  State s;
  s.write(dir / "optimizer.bin");
  const std::string before = slurp(dir / "optimizer.bin");
  s.adam[0].v.resize(3);  // inconsistent: save_state refuses it half-way through the file
  EXPECT_THROW(s.write(dir / "optimizer.bin"), std::runtime_error);
  EXPECT_EQ(slurp(dir / "optimizer.bin"), before);
  size_t n = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir.path)) ++n;
  EXPECT_EQ(n, 1u) << "a temporary was left behind";
}

}  // namespace
}  // namespace rp::test
