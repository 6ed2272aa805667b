// predict_peak (scheduler/stage_peak.hpp): the working set of a stage plus what the task before
// it on the same GPU retains and the next task's prefetched weights, with the cap's effect.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "scheduler/stage_peak.hpp"

namespace rp {
namespace {

StageEstimate stage(int64_t work, int64_t weights, int64_t retained, int64_t slot = 0) {
  StageEstimate e;
  e.work_bytes = work;
  e.weight_bytes = weights;
  e.retained_bytes = retained;
  e.slot_bytes = slot;
  return e;
}

TEST(StagePeak, AddsTheRetiredOutputsAndTheNextWeights) {
  // F T B B: stage 3 (B) follows stage 2 (retains 40) and precedes stage 0 of the next iteration (weights
  // 300)
  const std::vector<StageEstimate> s = {stage(500, 100, 200), stage(400, 50, 10), stage(900, 20, 40),
                                        stage(950, 30, 0)};
  PartitionOptions o;
  o.gpus = 1;
  const PeakEstimate p = predict_peak(s, o);
  EXPECT_EQ(p.max_work, 950);
  EXPECT_EQ(p.stage, 3);
  EXPECT_EQ(p.bytes, 40 + 950 + 100);
  EXPECT_EQ(p.unbounded, p.bytes);
  // two GPUs: stage 2 follows stage 0 (retains 200) and precedes stage 0 of the next iteration
  o.gpus = 2;
  const PeakEstimate q = predict_peak(s, o);
  EXPECT_EQ(q.bytes, 200 + 900 + 100);
  EXPECT_EQ(q.stage, 2);
}

TEST(StagePeak, TheCapHoldsTheWorkerBack) {
  const std::vector<StageEstimate> s = {stage(500, 100, 200), stage(400, 50, 10), stage(900, 20, 40),
                                        stage(950, 30, 0)};
  PartitionOptions o;
  o.gpus = 1;
  o.memory_cap = 1050;  // 1090 does not fit: stage 3 waits for the drain (990) or the prefetch (1050)
  PeakEstimate p = predict_peak(s, o);
  EXPECT_EQ(p.bytes, 1050);
  EXPECT_EQ(p.unbounded, 1090);
  o.memory_cap = 960;  // neither fits: stage 3 alone (950); stage 2's whole switch is 940
  p = predict_peak(s, o);
  EXPECT_EQ(p.bytes, 950);
  EXPECT_LE(p.bytes, o.memory_cap);
}

TEST(StagePeak, WeightlessNextTaskIsAllocatedAheadWithTheWeightsAfterIt) {
  // stage 2 (the embedding's backward, no weights) follows stage 1: stage 1 holds its working
  // set, stage 2's and stage 0's (next iteration) weights
  const std::vector<StageEstimate> s = {stage(500, 100, 0), stage(600, 50, 0), stage(70, 0, 0)};
  PartitionOptions o;
  o.gpus = 1;
  EXPECT_EQ(predict_peak(s, o).bytes, 600 + 70 + 100);
}

TEST(StagePeak, EarlyStartHandsASlotToTheNextTask) {
  // M = 2: stage 0 computes its last micro-batch with one slot (150) the next task's (400)
  const std::vector<StageEstimate> s = {stage(1000, 100, 0, 150), stage(600, 50, 0, 400),
                                        stage(300, 10, 0, 50)};
  PartitionOptions o;
  o.gpus = 1;
  o.micro_batches = 2;
  const PeakEstimate p = predict_peak(s, o);
  EXPECT_EQ(p.bytes, 1000 - 150 + 400 + 50);
  o.micro_batches = 1;
  EXPECT_EQ(predict_peak(s, o).bytes, 1000 + 50);
}

TEST(StagePeak, RejectsAnEmptyPlan) {
  PartitionOptions o;
  EXPECT_THROW(predict_peak({}, o), std::invalid_argument);
  EXPECT_THROW(prefetch_refused({}, o), std::invalid_argument);
  o.gpus = 0;
  EXPECT_THROW(predict_peak({stage(1, 1, 1)}, o), std::invalid_argument);
  EXPECT_THROW(prefetch_refused({stage(1, 1, 1)}, o), std::invalid_argument);
}

TEST(PrefetchRefused, WhereTheWeightsDoNotFitBesideThePreviousWorkingSet) {
  // F B B: stage 0 of the next iteration follows stage 2 (900 + 100), stage 1 follows stage 0
  // (500 + 60), stage 2 follows stage 1 (400 + 30); the retired task's outputs do not count
  const std::vector<StageEstimate> s = {stage(500, 100, 0), stage(400, 60, 300), stage(900, 30, 300)};
  PartitionOptions o;
  o.gpus = 1;
  EXPECT_EQ(prefetch_refused(s, o), (std::vector<char>{0, 0, 0}));  // no cap
  o.memory_cap = 999;
  EXPECT_EQ(prefetch_refused(s, o), (std::vector<char>{1, 0, 0}));
  o.memory_cap = 1000;
  EXPECT_EQ(prefetch_refused(s, o), (std::vector<char>{0, 0, 0}));
  o.memory_cap = 540;  // 560 is over too
  EXPECT_EQ(prefetch_refused(s, o), (std::vector<char>{1, 1, 0}));
  // two GPUs: stage 2 follows stage 0 (500 + 30), stage 0 follows stage 1 (400 + 100)
  o.gpus = 2;
  o.memory_cap = 520;
  EXPECT_EQ(prefetch_refused(s, o), (std::vector<char>{0, 1, 1}));
}

TEST(PrefetchRefused, BehindAWeightlessStage) {
  // stage 2 (the embedding's backward, no weights) is never refused; stage 0 after it is
  // prefetched while stage 1 computes (600 + 70 + 100) or while stage 2 does (70 + 100)
  const std::vector<StageEstimate> s = {stage(500, 100, 0), stage(600, 50, 0), stage(70, 0, 0)};
  PartitionOptions o;
  o.gpus = 1;
  o.memory_cap = 700;
  EXPECT_EQ(prefetch_refused(s, o), (std::vector<char>{0, 0, 0}));
  o.memory_cap = 169;  // neither
  EXPECT_EQ(prefetch_refused(s, o)[0], 1);
  EXPECT_EQ(prefetch_refused(s, o)[2], 0);
}

}  // namespace
}  // namespace rp
