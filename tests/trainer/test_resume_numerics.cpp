// A resume whose model differs from the checkpoint's in a number the forward pass uses but the
// architecture does not fix (rope_theta, rms_norm_eps, the logit soft-caps) is warned about, one
// line per value naming the old and the new one; roundpipe_state.json records them, and a state
// of an earlier release without the record resumes without a word about them.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/trainer/trainer_log.hpp"
#include "trainer/trainer_state.hpp"

namespace {

using namespace rp::clitest;
using rp::test::run_logging;

rp::TrainSpec spec_of(const fs::path& d, const fs::path& model, const std::string& out, int64_t steps) {
  write(d / "data.jsonl",
        "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n"
        "{\"text\": \"And God said, Let there be light: and there was light.\"}\n");
  rp::TrainSpec s =
      rp::spec_from_json(nlohmann::json::parse(spec_for(model, d / "data.jsonl", d / out)), "test spec");
  s.steps = steps;
  s.save_dtype = "f32";
  return s;
}

/// A copy of model folder `from` at `to` with its config.json's `key` set to `value`.
fs::path with_config(const fs::path& from, const fs::path& to, const std::string& key, double value) {
  fs::create_directories(to);
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  nlohmann::json c = nlohmann::json::parse(slurp(to / "config.json"));
  c[key] = value;
  write(to / "config.json", c.dump());
  return to;
}

TEST(ResumeNumerics, AnotherRopeThetaOrNormEpsIsWarnedAboutNamingBothValues) {
  const auto d = tmpdir();
  const fs::path model = tiny_model(d);
  const rp::TrainResult first = rp::Trainer(spec_of(d, model, "first", 2)).run();
  const fs::path state = d / "first/state/final/roundpipe_state.json";
  const rp::TrainerState saved = rp::read_trainer_state(state.string());
  ASSERT_TRUE(saved.model_numerics.is_object());
  EXPECT_EQ(saved.model_numerics.at("rope_theta"), 10000.0);
  EXPECT_EQ(saved.model_numerics.at("rms_norm_eps"), 1e-6);

  fs::path other = with_config(model, d / "theta", "rope_theta", 20000.0);
  other = with_config(other, d / "theta_eps", "rms_norm_eps", 1e-5);
  rp::TrainSpec resumed = spec_of(d, other, "first", 3);
  resumed.resume_from = first.checkpoint;
  std::string log = run_logging(resumed);
  EXPECT_NE(log.find("rope_theta 20000 (the checkpoint's 10000)"), std::string::npos) << log;
  EXPECT_NE(log.find("rms_norm_eps 1e-05 (the checkpoint's 1e-06)"), std::string::npos) << log;
  for (const char* key : {"rope_theta", "rms_norm_eps"}) {  // one line each
    const auto at = log.find(key);
    ASSERT_NE(at, std::string::npos) << log;
    EXPECT_EQ(log.find(key, log.find('\n', at)), std::string::npos) << key << " named twice: " << log;
  }

  // the same model: nothing said about them
  rp::TrainSpec same = spec_of(d, model, "first", 4);
  same.resume_from = (d / "first/final").string();
  log = run_logging(same);
  EXPECT_EQ(log.find("rope_theta"), std::string::npos) << log;
  EXPECT_EQ(log.find("rms_norm_eps"), std::string::npos) << log;
  fs::remove_all(d);
}

TEST(ResumeNumerics, AStateWithoutTheRecordResumesSilently) {
  const auto d = tmpdir();
  const fs::path model = tiny_model(d);
  const rp::TrainResult first = rp::Trainer(spec_of(d, model, "first", 2)).run();
  const fs::path state = d / "first/state/final/roundpipe_state.json";
  nlohmann::json j = nlohmann::json::parse(slurp(state));
  ASSERT_TRUE(j.contains("model_numerics"));
  j.erase("model_numerics");  // as an earlier release wrote it
  write(state, j.dump(2));
  EXPECT_TRUE(rp::read_trainer_state(state.string()).model_numerics.is_null());
  // into another folder: the save would not replace a state file changed since it was written
  rp::TrainSpec resumed = spec_of(d, with_config(model, d / "theta", "rope_theta", 20000.0), "second", 3);
  resumed.resume_from = first.checkpoint;
  const std::string log = run_logging(resumed);
  EXPECT_EQ(log.find("rope_theta"), std::string::npos) << log;
  fs::remove_all(d);
}

// the soft-caps (Gemma) are compared as the other values are; 0 reads "none"
TEST(ResumeNumerics, SoftCapsAreComparedToo) {
  rp::ModelConfig a;
  a.architecture = "gemma2";
  a.attn_logit_softcapping = 50.0;
  a.final_logit_softcapping = 30.0;
  rp::ModelConfig b = a;
  EXPECT_TRUE(rp::numerics_differences(rp::numerics_of(a), rp::numerics_of(b)).empty());
  b.final_logit_softcapping = 0.0;
  b.attn_logit_softcapping = 40.0;
  const auto diff = rp::numerics_differences(rp::numerics_of(a), rp::numerics_of(b));
  ASSERT_EQ(diff.size(), 2u);
  EXPECT_EQ(diff[0], "attn_logit_softcapping 40 (the checkpoint's 50)");
  EXPECT_EQ(diff[1], "final_logit_softcapping none (the checkpoint's 30)");
  // a value the record lacks is not compared
  nlohmann::json partial = rp::numerics_of(a);
  partial.erase("attn_logit_softcapping");
  EXPECT_EQ(rp::numerics_differences(partial, rp::numerics_of(b)).size(), 1u);
}

}  // namespace
