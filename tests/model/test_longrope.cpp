// LongRoPE (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini): the short and long tables of a
// config.json against transformers' (tests/fixtures/rope/longrope_tables.json, made by
// make_longrope_tables.py beside it: Phi3Config's reading of the keys and
// _compute_longrope_parameters' values), the refusals of bad keys, the config.json round trip,
// and a decoder's choice of table per call: by seq_len without positions, by the packed
// micro-batch's largest position + 1 (LayerArgs::rope_length) with them. The whole model
// against transformers on both tables: HfParity (tests/fixtures/hf_golden/tiny_phi3_longrope).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/layers.hpp"
#include "tests/model/test_layer_util.hpp"

namespace rp::test {
namespace {

using nlohmann::json;

json cases() {
  std::ifstream f(std::string(RP_FIXTURES_DIR) + "/rope/longrope_tables.json");
  return json::parse(f);
}

std::string error_of(const json& j) {
  try {
    config_from_json(j, "config.json");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_table(const RopeTable& t, const json& inv, double scaling, const std::string& what) {
  ASSERT_EQ(t.inv_freq.size(), inv.size()) << what;
  for (size_t i = 0; i < inv.size(); ++i) {
    const double want = inv[i].get<double>();
    EXPECT_NEAR(t.inv_freq[i], want, 1e-6 * want) << what << " i=" << i;
  }
  EXPECT_NEAR(t.attention_scaling, scaling, 1e-6) << what;
}

TEST(LongRope, TablesMatchTransformers) {
  const json all = cases();
  ASSERT_EQ(all.size(), 4u);
  for (const auto& [name, k] : all.items()) {
    const ModelConfig c = config_from_json(k["config"], "config.json");
    ASSERT_EQ(c.rope_scaling.type, "longrope") << name;
    const int64_t orig = k["original_max_position_embeddings"].get<int64_t>();
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, orig) << name;
    const double scaling = k["attention_scaling"].get<double>();
    const RopeTables t = layer_rope_tables(c, 0);
    ASSERT_TRUE(t.longrope()) << name;
    expect_table(t.short_table, k["short_inv_freq"], scaling, name + " short");
    expect_table(t.long_table, k["long_inv_freq"], scaling, name + " long");
    // a pass of orig positions takes the short table, one more the long one
    EXPECT_EQ(&t.pick(orig), &t.short_table) << name;
    EXPECT_EQ(&t.pick(1), &t.short_table) << name;
    EXPECT_EQ(&t.pick(orig + 1), &t.long_table) << name;
    // written and read back: the same tables (the top-level original context included)
    const ModelConfig back = config_from_json(config_to_json(c), "config.json");
    const RopeTables tb = layer_rope_tables(back, 0);
    EXPECT_EQ(tb.short_table.inv_freq, t.short_table.inv_freq) << name;
    EXPECT_EQ(tb.long_table.inv_freq, t.long_table.inv_freq) << name;
    EXPECT_EQ(tb.short_table.attention_scaling, t.short_table.attention_scaling) << name;
    EXPECT_EQ(tb.original_max_position_embeddings, orig) << name;
  }
  // Phi-4-mini's published config as examples/configs has it
  std::ifstream f(std::string(RP_SOURCE_DIR) + "/examples/configs/phi-4-mini-instruct.json");
  const ModelConfig c4 = config_from_json(json::parse(f), "config.json");
  const RopeTables t4 = layer_rope_tables(c4, 0);
  expect_table(t4.long_table, all["phi4_mini"]["long_inv_freq"], all["phi4_mini"]["attention_scaling"],
               "example");
  // other types keep one table
  ModelConfig plain = c4;
  plain.rope_scaling = RopeScaling{};
  const RopeTables tp = layer_rope_tables(plain, 0);
  EXPECT_FALSE(tp.longrope());
  EXPECT_EQ(&tp.pick(1 << 20), &tp.short_table);
}

TEST(LongRope, BadKeysAreRefusedNamingThem) {
  const json base = cases()["factor_only"]["config"];  // 4 heads of 16: 8 factors each
  json j = base;
  j["rope_scaling"]["short_factor"] = {1.0, 2.0};
  EXPECT_EQ(
      error_of(j).rfind("config.json: key 'rope_scaling.short_factor': expected a list of rotary_dim/2 = 8 "
                        "positive finite numbers",
                        0),
      0u)
      << error_of(j);
  j = base;
  j["rope_scaling"]["long_factor"][3] = -1.0;
  EXPECT_NE(error_of(j).find("key 'rope_scaling.long_factor': expected a list of rotary_dim/2 = 8"),
            std::string::npos)
      << error_of(j);
  j = base;
  j["rope_scaling"]["long_factor"][0] = "x";
  EXPECT_NE(error_of(j).find("key 'rope_scaling.long_factor'"), std::string::npos) << error_of(j);
  j = base;
  j["rope_scaling"].erase("short_factor");
  EXPECT_NE(error_of(j).find("key 'rope_scaling.short_factor': expected a list of rotary_dim/2 = 8 positive "
                             "finite numbers (rope_type longrope needs it), got nothing"),
            std::string::npos)
      << error_of(j);
  j = base;
  j["rope_scaling"]["factor"] = 0;
  EXPECT_NE(error_of(j).find("key 'rope_scaling.factor': expected a positive number"), std::string::npos)
      << error_of(j);
  j = base;
  j["original_max_position_embeddings"] = 0;
  EXPECT_NE(error_of(j).find("key 'original_max_position_embeddings': expected an integer >= 1"),
            std::string::npos)
      << error_of(j);
  j = base;  // factor 2 over a 1-token context: ln(1) = 0 would divide the derived scaling
  j["original_max_position_embeddings"] = 1;
  EXPECT_NE(error_of(j).find("key 'original_max_position_embeddings': must be > 1 for longrope"),
            std::string::npos)
      << error_of(j);
  // transformers 5's rope_parameters, with partial rotary there: 6 factors
  j = base;
  j["rope_parameters"] = j["rope_scaling"];
  j.erase("rope_scaling");
  j["rope_parameters"]["partial_rotary_factor"] = 0.75;
  EXPECT_NE(error_of(j).find("key 'rope_parameters.short_factor': expected a list of rotary_dim/2 = 6"),
            std::string::npos)
      << error_of(j);
  // "yarn" off phi3 is YaRN, not LongRoPE
  j = base;
  j["model_type"] = "llama";
  j["rope_scaling"]["type"] = "yarn";
  EXPECT_EQ(config_from_json(j, "config.json").rope_scaling.type, "yarn");
  // a config built in code: validate() names the key
  ModelConfig c = config_from_json(base, "config.json");
  c.rope_scaling.long_factor.pop_back();
  try {
    c.validate();
    ADD_FAILURE() << "validate accepted 7 long factors";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("rope_scaling.long_factor: a list of rotary_dim/2 = 8", 0), 0u)
        << e.what();
  }
  RopeParams p = rope_params(config_from_json(base, "config.json"), 0);
  EXPECT_THROW(rope_frequencies(p), std::invalid_argument);  // two tables: rope_tables
  EXPECT_THROW(rope_tables(p, {}), std::invalid_argument);   // no factors
}

// forward of decoder layer 1 of `m` over `ids` as n_seq sequences of seq_len; with `pos`
// (packed) and `rope_length`
VecF decoder_forward(TinyModel& m, const std::vector<float>& x, MicroBatchShape s,
                     const std::vector<int32_t>* pos, int64_t rope_length) {
  std::vector<float> scratch;
  LayerArgs a = m.args(1, s, nullptr, scratch);
  VecF y(x.size());
  a.x = x.data();
  a.y = y.data();
  if (pos) a.positions = pos->data();
  a.rope_length = rope_length;
  m.layers[1]->forward(a);
  return y;
}

double max_diff(const VecF& a, const VecF& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - b[i]));
  return d;
}

// A packed micro-batch of two 10-token examples in one 20-token sequence (longer than the
// 16-token original context) takes the short table, as each example alone does; a 20-token
// example takes the long one. Backward recomputes with its forward's table: the input
// gradients of the packed pass equal those of the examples alone.
TEST(LongRope, DecoderPicksTheTableByTheLargestPosition) {
  TinyModel m({false, false, "longrope"});
  const int64_t H = m.layout.config.hidden_size, E = 10, L = 2 * E;
  std::mt19937 g(5);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> x(size_t(L * H)), dy(size_t(L * H));
  for (auto& v : x) v = n(g);
  for (auto& v : dy) v = n(g);
  std::vector<int32_t> pos(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) pos[size_t(t)] = int32_t(t % E);
  const VecF alone = decoder_forward(m, x, {2, E}, nullptr, 0);  // two sequences of 10
  const VecF packed = decoder_forward(m, x, {1, L}, &pos, E);
  EXPECT_LT(max_diff(packed, alone), 1e-5);
  // the long table (a wrong rope_length) changes the result: the choice is not a no-op
  EXPECT_GT(max_diff(decoder_forward(m, x, {1, L}, &pos, L), alone), 1e-3);
  EXPECT_THROW(decoder_forward(m, x, {1, L}, &pos, 0), std::invalid_argument);
  // one 20-token example: positions 0..19 with rope_length 20 equal the unpacked sequence
  std::vector<int32_t> whole(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) whole[size_t(t)] = int32_t(t);
  EXPECT_LT(max_diff(decoder_forward(m, x, {1, L}, &whole, L), decoder_forward(m, x, {1, L}, nullptr, 0)),
            1e-5);
  // backward: dx of the packed pass equals the two examples' alone
  auto dx_of = [&](MicroBatchShape s, const std::vector<int32_t>* p, int64_t len) {
    std::vector<VecF> grads = m.zero_grads();
    std::vector<float> scratch;
    LayerArgs a = m.args(1, s, &grads, scratch);
    VecF dx(x.size());
    a.x = x.data();
    a.dy = dy.data();
    a.dx = dx.data();
    if (p) a.positions = p->data();
    a.rope_length = len;
    m.layers[1]->backward(a);
    return dx;
  };
  const VecF dx_alone = dx_of({2, E}, nullptr, 0);
  EXPECT_LT(max_diff(dx_of({1, L}, &pos, E), dx_alone), 1e-5);
  EXPECT_GT(max_diff(dx_of({1, L}, &pos, L), dx_alone), 1e-4);
}

}  // namespace
}  // namespace rp::test
