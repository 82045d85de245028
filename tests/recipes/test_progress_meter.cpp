// ProgressMeter (recipes/progress_meter.h): when the progress line comes, the summary's throughput and the
// "done" line. Whole runs check the metrics.jsonl records (test_train.cpp, test_run_outputs.cpp).
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "recipes/progress_meter.h"

namespace ingot::recipes {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Runs steps start_step+1 .. max_steps through the meter (loss = step) and returns what it logged.
std::string meter_run(ProgressOptions o, TrainSummary* r = nullptr) {
  std::ostringstream log;
  ProgressMeter meter(o, nullptr, log);
  for (int64_t step = o.start_step + 1; step <= o.max_steps; ++step) {
    meter.begin_step();
    meter.stop_clock();
    meter.log_step({.step = step, .loss = static_cast<double>(step), .lr = 1e-3, .grad_norm = -1,
                    .peak_memory_bytes = 1024});
  }
  if (r) meter.summarize(*r);
  return log.str();
}

TEST(ProgressMeter, LogsTheFirstStepEveryLogEveryStepsAndTheLast) {
  const std::vector<std::string> lines =
      lines_of(meter_run({.start_step = 0, .max_steps = 5, .log_every = 2, .tokens_per_step = 100}));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].rfind("step 1/5 | loss 1.000 | lr 1.0e-03 | ", 0), 0u) << lines[0];
  // The window since the previous line: steps 3 and 4 average to 3.5.
  EXPECT_EQ(lines[2].rfind("step 4/5 | loss 3.500 | ", 0), 0u) << lines[2];
  EXPECT_NE(lines[2].find("mem peak 1 KiB"), std::string::npos) << lines[2];
  EXPECT_EQ(lines[3].rfind("step 5/5 | loss 5.000 | ", 0), 0u) << lines[3];
  EXPECT_NE(lines[3].find("ETA 0:00"), std::string::npos) << lines[3];
}

TEST(ProgressMeter, AResumedRunLogsItsFirstStepAndCountsEarlierTime) {
  TrainSummary r;
  r.steps = 4;
  const std::vector<std::string> lines = lines_of(meter_run(
      {.start_step = 2, .max_steps = 4, .log_every = 10, .tokens_per_step = 100, .earlier_train_s = 10}, &r));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("step 3/4 | ", 0), 0u) << lines[0];
  EXPECT_GE(r.train_s, 10.0);
  EXPECT_LT(r.train_s, 11.0);
  ASSERT_TRUE(r.tokens_per_s.has_value());
  EXPECT_GT(*r.tokens_per_s, 0);
  EXPECT_FALSE(r.mfu.has_value());  // no device peak
}

TEST(ProgressMeter, ARunWithNoStepLeftHasNoThroughput) {
  TrainSummary r;
  r.steps = 4;
  r.first_loss = 2;
  r.final_loss = 1;
  ProgressOptions o{.start_step = 4, .max_steps = 4, .tokens_per_step = 100, .earlier_train_s = 11};
  std::ostringstream log;
  ProgressMeter meter(o, nullptr, log);
  meter.summarize(r);
  EXPECT_FALSE(r.tokens_per_s.has_value());
  meter.log_done(r);
  EXPECT_EQ(log.str(), "done | no step left to train (4 steps in 0:11) | loss 2.000 -> 1.000 | - tok/s | saved -\n");
}

TEST(ProgressMeter, TheDoneLineOfAResumedRunNamesTheStepsItRan) {
  TrainSummary r;
  r.steps = 4;
  r.first_loss = 2;
  r.final_loss = 1;
  r.train_s = 70;
  r.tokens_per_s = 12300;
  r.checkpoints = {"out/model.safetensors"};
  std::ostringstream log;
  ProgressMeter({.start_step = 2, .max_steps = 4}, nullptr, log).log_done(r);
  EXPECT_EQ(log.str(),
            "done | steps 3-4 in 0:00 (4 steps in 1:10 in all) | loss 2.000 -> 1.000 | 12.3k tok/s | saved "
            "out/model.safetensors\n");
}

}  // namespace
}  // namespace ingot::recipes
