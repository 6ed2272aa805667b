// A stage task's per-micro-batch rules (scheduler/stage_progress.hpp), which the worker runs
// and the bubble simulator replays: uploads one micro-batch ahead, computes in order behind
// the slot's previous downloads, copies counted per micro-batch, retirement, slot hand-over.
#include <gtest/gtest.h>

#include <stdexcept>

#include "scheduler/stage_progress.hpp"

namespace rp {
namespace {

using W = StageProgress::Wait;

TEST(StageProgress, UploadsRunOneMicroBatchAheadOfTheCompute) {
  StageProgress p(5);
  EXPECT_EQ(p.upload_wait(true), W::slot) << "no slot held yet";
  p.hold_slot(0);
  EXPECT_EQ(p.upload_wait(false), W::input);
  EXPECT_EQ(p.upload_wait(true), W::none);
  EXPECT_EQ(p.upload_issued(1), 0);
  EXPECT_EQ(p.upload_wait(true), W::slot) << "micro-batch 1 uses slot 1";
  p.hold_slot(1);
  EXPECT_EQ(p.upload_issued(2), 1);
  EXPECT_EQ(p.upload_wait(true), W::slot_inputs)
      << "micro-batch 2 reuses slot 0: micro-batch 0 must compute first";
  EXPECT_FALSE(p.uploaded(0));
  EXPECT_TRUE(p.upload_copy_done(0));
  EXPECT_FALSE(p.upload_copy_done(1)) << "one of micro-batch 1's two copies";
  EXPECT_TRUE(p.upload_copy_done(1));
  EXPECT_EQ(p.uploads_done(), 2);
  EXPECT_EQ(p.compute_issued(), 0);
  EXPECT_EQ(p.upload_wait(true), W::slot_inputs) << "issued is not computed";
  p.computed(0, 1);
  EXPECT_EQ(p.upload_wait(true), W::none);
  EXPECT_THROW(p.upload_copy_done(2), std::logic_error) << "micro-batch 2 was not issued";
}

TEST(StageProgress, ComputesWaitForCurrentWeightsInputsAndTheSlotsOutputs) {
  StageProgress p(3);
  p.hold_slot(0);
  p.hold_slot(1);
  EXPECT_EQ(p.compute_wait(false, true), W::not_current);
  EXPECT_EQ(p.compute_wait(true, false), W::weights);
  EXPECT_EQ(p.compute_wait(true, true), W::uploads);
  for (int m = 0; m < 2; ++m) p.upload_issued(0);  // nothing to copy: uploaded at once
  EXPECT_EQ(p.compute_wait(true, true), W::none);
  p.compute_issued();
  p.compute_issued();
  p.computed(0, 2);
  p.computed(1, 0);  // no outputs to copy: downloaded at once
  EXPECT_TRUE(p.downloaded(1));
  p.upload_issued(0);
  EXPECT_EQ(p.compute_wait(true, true), W::slot_outputs)
      << "micro-batch 0's outputs still download from slot 0";
  EXPECT_FALSE(p.download_copy_done(0));
  EXPECT_TRUE(p.download_copy_done(0));
  EXPECT_EQ(p.compute_wait(true, true), W::none);
  EXPECT_EQ(p.compute_issued(), 2);
  EXPECT_EQ(p.compute_wait(true, true), W::finished);
  EXPECT_EQ(p.upload_wait(true), W::finished);
  EXPECT_THROW(p.computed(0, 0), std::logic_error) << "computed twice";
}

// A task retires with its last compute; a slot is finished (and may go to the next task) once
// its last micro-batch is downloaded, and not before the task issued all its uploads.
TEST(StageProgress, RetirementAndSlotHandOver) {
  StageProgress p(3);  // slot 0: micro-batches 0, 2; slot 1: micro-batch 1
  EXPECT_EQ(p.last_in_slot(0), 2);
  EXPECT_EQ(p.last_in_slot(1), 1);
  EXPECT_EQ(StageProgress(1).last_in_slot(1), -1);
  EXPECT_TRUE(StageProgress(1).slot_finished(1)) << "a slot without micro-batches is never touched";
  p.hold_slot(0);
  p.hold_slot(1);
  p.upload_issued(0);
  p.upload_issued(0);
  p.compute_issued();
  p.compute_issued();
  p.computed(0, 1);
  p.computed(1, 1);
  EXPECT_TRUE(p.download_copy_done(1));
  EXPECT_TRUE(p.slot_finished(1));
  EXPECT_FALSE(p.may_hand_over(1)) << "micro-batch 2 is not uploaded yet";
  EXPECT_EQ(p.uploads_in_flight(), 0);
  EXPECT_EQ(p.downloads_in_flight(), 1);
  p.upload_issued(0);
  EXPECT_TRUE(p.may_hand_over(1));
  EXPECT_FALSE(p.may_hand_over(0));
  EXPECT_TRUE(p.download_copy_done(0));
  p.compute_issued();
  EXPECT_FALSE(p.retired());
  p.computed(2, 1);
  EXPECT_TRUE(p.retired());
  EXPECT_FALSE(p.outputs_done());
  EXPECT_FALSE(p.may_hand_over(0)) << "micro-batch 2's output still downloads";
  EXPECT_TRUE(p.download_copy_done(2));
  EXPECT_TRUE(p.outputs_done());
  EXPECT_TRUE(p.may_hand_over(0));
}

TEST(StageProgress, MoreSlotsLetUploadsRunFurtherAhead) {
  StageProgress p(6, 3);
  for (int j = 0; j < 3; ++j) p.hold_slot(j);
  for (int m = 0; m < 3; ++m) {
    EXPECT_EQ(p.upload_wait(true), W::none) << m;
    p.upload_issued(1);
  }
  EXPECT_EQ(p.upload_wait(true), W::slot_inputs);
  EXPECT_EQ(p.last_in_slot(2), 5);
}

TEST(StageProgress, DescribesWhatItWaitsForAndRejectsBadSizes) {
  StageProgress p(2);
  p.hold_slot(0);
  const std::string d = p.describe(false, true, false);
  EXPECT_NE(d.find("0/2 uploaded"), std::string::npos) << d;
  EXPECT_NE(d.find("upload of micro-batch 0 waits for its input"), std::string::npos) << d;
  EXPECT_NE(d.find("compute of micro-batch 0 waits for the stage's weights"), std::string::npos) << d;
  EXPECT_THROW(StageProgress(-1), std::invalid_argument);
  EXPECT_THROW(StageProgress(2, 0), std::invalid_argument);
}

}  // namespace
}  // namespace rp
