// The start-time warning of trainer/async_range.hpp: a spec whose peak learning rate lies above
// the range where the staleness-1 optimizer matched the synchronous one gets one line naming
// the lr, the range and the switch ("async": false); sync specs and specs inside the range
// get none; LoRA specs are judged by the LoRA row.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "roundpipe/spec.hpp"
#include "trainer/async_range.hpp"

namespace {

rp::TrainSpec parse(const std::string& extra) {
  const std::string s = std::string("{\"model\": \"m\", \"data\": \"d.jsonl\"") + extra + "}";
  return rp::spec_from_json(nlohmann::json::parse(s), "s.json");
}

std::string lr_key(double lr) { return ", \"optimizer\": {\"lr\": " + nlohmann::json(lr).dump() + "}"; }

TEST(AsyncLrRange, WarnsOnceAboveTheFullFineTuningRange) {
  const double max_lr = rp::kAsyncLrFullFineTuning.max_peak_lr;
  EXPECT_FALSE(rp::async_lr_warning(parse(lr_key(max_lr))));  // the edge is inside
  EXPECT_FALSE(rp::async_lr_warning(parse(lr_key(max_lr * 0.1))));
  const auto w = rp::async_lr_warning(parse(lr_key(max_lr * 3.34)));
  ASSERT_TRUE(w);
  EXPECT_EQ(w->find('\n'), std::string::npos) << *w;
  EXPECT_EQ(w->rfind("s.json: peak lr ", 0), 0u) << *w;
  EXPECT_NE(w->find(fmt::format("{:g}", max_lr * 3.34)), std::string::npos) << *w;  // the lr
  EXPECT_NE(w->find(fmt::format("above {:g}", max_lr)), std::string::npos) << *w;   // the range
  EXPECT_NE(w->find("\"async\": false"), std::string::npos) << *w;                  // the switch
  EXPECT_NE(w->find("full fine-tuning"), std::string::npos) << *w;
}

TEST(AsyncLrRange, SyncRunsAreNeverWarned) {
  EXPECT_FALSE(rp::async_lr_warning(parse(lr_key(1.0) + ", \"async\": false")));
  EXPECT_TRUE(rp::async_lr_warning(parse(lr_key(1.0) + ", \"async\": true")));
}

TEST(AsyncLrRange, ThePeakOfTheScheduleCountsNotItsFloor) {
  const double max_lr = rp::kAsyncLrFullFineTuning.max_peak_lr;
  // the schedule's own lr is the peak; optimizer.lr is then ignored by the run
  const std::string sched = ", \"lr_schedule\": {\"kind\": \"cosine\", \"warmup_steps\": 5, \"lr\": " +
                            nlohmann::json(max_lr * 10).dump() +
                            ", \"min_lr\": " + nlohmann::json(max_lr / 10).dump() + "}";
  EXPECT_TRUE(rp::async_lr_warning(parse(lr_key(max_lr / 10) + sched)));
}

TEST(AsyncLrRange, LoraSpecsUseTheLoraRow) {
  const rp::TrainSpec full = parse(lr_key(1e-3));
  const rp::TrainSpec lora = parse(lr_key(1e-3) + ", \"lora\": {\"r\": 4}");
  EXPECT_EQ(&rp::async_lr_range(full), &rp::kAsyncLrFullFineTuning);
  EXPECT_EQ(&rp::async_lr_range(lora), &rp::kAsyncLrLora);
  const double above = rp::kAsyncLrLora.max_peak_lr * 2;
  const auto w = rp::async_lr_warning(parse(lr_key(above) + ", \"lora\": {\"r\": 4}"));
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("for LoRA"), std::string::npos) << *w;
  EXPECT_FALSE(rp::async_lr_warning(parse(lr_key(rp::kAsyncLrLora.max_peak_lr) + ", \"lora\": {\"r\": 4}")));
}

}  // namespace

namespace {

std::string spec_error(const std::string& extra) {
  try {
    parse(extra);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "ok";
}

TEST(AsyncCompensation, SpecKeyIsReadAndChecked) {
  EXPECT_EQ(parse("").async_compensation, "none");
  EXPECT_EQ(parse(", \"async_compensation\": \"predict\"").async_compensation, "predict");
  EXPECT_EQ(spec_error(", \"async_compensation\": \"delay\""),
            "s.json: key 'async_compensation': expected \"none\" or \"predict\", got \"delay\"");
  EXPECT_EQ(
      spec_error(", \"async\": false, \"async_compensation\": \"predict\""),
      "s.json: key 'async_compensation': expected \"none\" with \"async\": false (it compensates the async "
      "optimizer's staleness), got \"predict\"");
  EXPECT_EQ(spec_error(", \"async\": false, \"async_compensation\": \"none\""), "ok");
  // a spec built in code gets the same check
  rp::TrainSpec s = parse("");
  s.async = false;
  s.async_compensation = "predict";
  EXPECT_THROW(rp::validate_spec(s), std::invalid_argument);
}

}  // namespace
