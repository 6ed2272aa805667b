// base/json_fields: the one-line "<where>: key '<k>': expected <what>, got <value>" errors of
// every JSON file reader.
#include <gtest/gtest.h>

#include <stdexcept>

#include "base/json_fields.hpp"

namespace {

using nlohmann::json;

template <class E = std::invalid_argument, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "no error";
}

TEST(JsonFields, OptionalFieldsCheckTypesAndRanges) {
  const json j = json::parse(R"({"n": 3, "big": 3000000000, "neg": -5, "f": 0.5, "s": "x", "b": true,
                                 "ns": "3"})");
  rp::JsonFields r(j, "spec.json");
  int64_t n = 0;
  int small = 0;
  uint64_t u = 7;
  double f = 0;
  std::string s;
  bool b = false;
  EXPECT_TRUE(r.optional("n", n));
  EXPECT_EQ(n, 3);
  EXPECT_FALSE(r.optional("missing", n));
  EXPECT_EQ(n, 3);
  EXPECT_TRUE(r.optional("f", f));
  EXPECT_EQ(f, 0.5);
  EXPECT_TRUE(r.optional("n", f));  // an integer is a number
  EXPECT_EQ(f, 3.0);
  EXPECT_TRUE(r.optional("s", s));
  EXPECT_TRUE(r.optional("b", b));
  EXPECT_EQ(error_of([&] { r.optional("ns", n); }), "spec.json: key 'ns': expected an integer, got \"3\"");
  EXPECT_EQ(error_of([&] { r.optional("big", small); }),
            "spec.json: key 'big': expected an integer <= 2147483647, got 3000000000");
  EXPECT_EQ(error_of([&] { r.optional("neg", u); }),
            "spec.json: key 'neg': expected an integer >= 0, got -5");
  EXPECT_EQ(u, 7u);
  EXPECT_EQ(error_of([&] { r.optional("s", b); }), "spec.json: key 's': expected true or false, got \"x\"");
  EXPECT_EQ(error_of([&] { r.optional("b", s); }), "spec.json: key 'b': expected a string, got true");
  EXPECT_EQ(error_of([&] { r.optional("s", f); }), "spec.json: key 's': expected a number, got \"x\"");
}

// A value set in code is a signed JSON integer even when it is not negative (json{{"seed", 3}}):
// unsigned fields take it like the same number parsed from text, and still refuse a negative one.
TEST(JsonFields, UnsignedFieldsTakeANonNegativeIntegerSetInCode) {
  json j = {{"seed", 3}, {"neg", -1}};
  ASSERT_FALSE(j["seed"].is_number_unsigned());
  rp::JsonFields r(j, "code");
  uint64_t u = 0;
  EXPECT_TRUE(r.optional("seed", u));
  EXPECT_EQ(u, 3u);
  EXPECT_EQ(r.unsigned_integer("seed"), 3u);
  EXPECT_EQ(error_of([&] { r.optional("neg", u); }), "code: key 'neg': expected an integer >= 0, got -1");
  EXPECT_EQ(error_of([&] { r.unsigned_integer("neg"); }),
            "code: key 'neg': expected an integer >= 0, got -1");
}

TEST(JsonFields, RequiredFieldsSayNothingWhenMissing) {
  const json j = json::parse(R"({"step": 0, "o": {"lr": "high"}, "v": 2})");
  rp::JsonFields r(j, "state.json", "", rp::JsonFields::Error::runtime_error);
  EXPECT_EQ(r.integer("step", 0), 0);
  EXPECT_EQ(error_of<std::runtime_error>([&] { r.integer("step", 1); }),
            "state.json: key 'step': expected an integer >= 1, got 0");
  EXPECT_EQ(error_of<std::runtime_error>([&] { r.string("model"); }),
            "state.json: key 'model': expected a string, got nothing");
  EXPECT_EQ(error_of<std::runtime_error>([&] { r.require_value("v", 1); }),
            "state.json: key 'v': expected 1, got 2");
  EXPECT_EQ(error_of<std::runtime_error>([&] { r.array("o"); }),
            "state.json: key 'o': expected an array, got {\"lr\":\"high\"}");
  // nested objects carry their path in the key
  const rp::JsonFields o = r.nested("o");
  double lr = 0;
  EXPECT_EQ(error_of<std::runtime_error>([&] { o.optional("lr", lr); }),
            "state.json: key 'o.lr': expected a number, got \"high\"");
  EXPECT_EQ(error_of<std::runtime_error>([&] {
              o.allow_only({"betas", "eps"});
            }),
            "state.json: unknown key 'o.lr' (known keys: betas, eps)");
  // a near miss of a known key (at most 2 edits) is named, with the object's path
  EXPECT_EQ(error_of<std::runtime_error>([&] {
              o.allow_only({"lrr", "eps"});
            }),
            "state.json: unknown key 'o.lr'; did you mean 'o.lrr'? (known keys: eps, lrr)");
  EXPECT_EQ(error_of<std::runtime_error>([&] { r.nested("step"); }),
            "state.json: key 'step': expected an object, got 0");
}

}  // namespace

namespace {

// A megabyte value or key in a spec quotes only its first bytes and its length: the error
// stays one short line (a fuzzed spec printed errors of megabytes).
TEST(JsonFields, AMegabyteValueOrKeyIsQuotedShort) {
  const std::string big(1 << 20, 'v');
  json j = {{"seq_len", big}};
  const rp::JsonFields f(j, "spec.json");
  int64_t n = 0;
  const std::string value = error_of([&] { f.optional("seq_len", n); });
  EXPECT_EQ(value.rfind("spec.json: key 'seq_len': expected an integer", 0), 0u) << value.substr(0, 300);
  EXPECT_LT(value.size(), 300u) << value.substr(0, 300);
  EXPECT_NE(value.find("... (1048578 bytes)"), std::string::npos) << value.substr(0, 300);  // with its quotes
  json k = {{big, 1}};
  const std::string key = error_of([&] { rp::JsonFields(k, "spec.json").allow_only({"seq_len"}); });
  EXPECT_EQ(key.rfind("spec.json: unknown key 'vvv", 0), 0u) << key.substr(0, 300);
  EXPECT_LT(key.size(), 300u) << key.substr(0, 300);
}

// The key an unknown one most likely misspells: at most 2 edits (a swap of neighbours is one),
// fewer than either name's length, and no other known key as near.
TEST(JsonFields, NearestKeyNamesOnlyAClearNearMiss) {
  const std::set<std::string> known = {"workers", "steps", "seq_len", "seed", "lora", "warmup_steps"};
  EXPECT_EQ(rp::nearest_key("wokers", known), "workers");
  EXPECT_EQ(rp::nearest_key("wokrers", known), "workers");  // a swap
  EXPECT_EQ(rp::nearest_key("setps", known), "steps");      // a swap
  EXPECT_EQ(rp::nearest_key("warmup_step", known), "warmup_steps");
  EXPECT_EQ(rp::nearest_key("seq-len", known), "seq_len");
  EXPECT_EQ(rp::nearest_key("colour", known), "");  // near nothing
  EXPECT_EQ(rp::nearest_key("sed", known), "seed");
  EXPECT_EQ(rp::nearest_key("lr", known), "");              // 2 edits of a 2-letter name is no near miss
  EXPECT_EQ(rp::nearest_key("see", {"seed", "seen"}), "");  // two as near: no guess
  EXPECT_EQ(rp::nearest_key(std::string(300, 'w'), known), "");
  EXPECT_EQ(rp::did_you_mean("wokers", known, "x."), "; did you mean 'x.workers'?");
  EXPECT_EQ(rp::did_you_mean("colour", known), "");
  // a name another program gives a key: suggested with where the name comes from
  const nlohmann::json j = nlohmann::json::parse(R"({"learnig_rate": 1})");
  EXPECT_EQ(
      error_of([&] {
        rp::JsonFields(j, "s.json").allow_only({"lr", "seed"}, {{"learning_rate", "optimizer.lr"}}, "HF");
      }),
      "s.json: unknown key 'learnig_rate'; did you mean 'optimizer.lr' (HF's learning_rate)? (known keys: "
      "lr, "
      "seed)");
}

}  // namespace
