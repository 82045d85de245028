#include "recipes/progress_meter.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>

#include "recipes/metrics.h"
#include "recipes/run_outputs.h"

namespace ingot::recipes {

namespace {

// "40 steps in 0:11", "1 step in 0:01"; a resumed run says which steps this process ran and the total:
// "steps 21-40 in 0:05 (40 steps in 0:11 in all)"; a finished run resumed: "no step left (40 steps in 0:11)".
std::string done_steps_text(int64_t steps, int64_t start_step, double this_s, double total_s) {
  auto count = [](int64_t n) { return std::to_string(n) + (n == 1 ? " step" : " steps"); };
  if (start_step == 0) return count(steps) + " in " + format_duration(total_s);
  const std::string all = count(steps) + " in " + format_duration(total_s);
  if (steps == start_step) return "no step left to train (" + all + ")";
  const std::string range = steps == start_step + 1 ? "step " + std::to_string(steps)
                                                     : "steps " + std::to_string(start_step + 1) + "-" +
                                                           std::to_string(steps);
  return range + " in " + format_duration(this_s) + " (" + all + " in all)";
}

double seconds_between(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

}  // namespace

ProgressMeter::ProgressMeter(const ProgressOptions& o, RunOutputs* outputs, std::ostream& log)
    : o_(o), outputs_(outputs), log_(log), step_start_(Clock::now()), window_start_(step_start_) {}

void ProgressMeter::begin_step() { step_start_ = Clock::now(); }

void ProgressMeter::stop_clock() {
  last_step_s_ = seconds_between(step_start_, Clock::now());
  if (clocked_steps_++ == 0) first_step_s_ = last_step_s_;
  train_s_ += last_step_s_;
}

void ProgressMeter::log_step(const StepReport& s) {
  window_peak_ = std::max(window_peak_, s.peak_memory_bytes);
  run_peak_ = std::max(run_peak_, s.peak_memory_bytes);
  window_loss_ += s.loss;
  ++window_steps_;

  using Json = nlohmann::ordered_json;
  const double rate = o_.tokens_per_step / std::max(last_step_s_, 1e-9);
  Json rec;
  rec["kind"] = "train";
  rec["step"] = s.step;
  rec["loss"] = s.loss;
  rec["lr"] = s.lr;
  rec["grad_norm"] = s.grad_norm >= 0 ? Json(s.grad_norm) : Json();
  rec["tokens"] = static_cast<int64_t>(o_.tokens_per_step) * s.step;
  rec["tokens_per_s"] = rate;
  rec["mfu"] = o_.peak_flops > 0 ? Json(rate * o_.flops_per_token / o_.peak_flops) : Json();
  rec["peak_memory_bytes"] = s.peak_memory_bytes;
  rec["time_s"] = total_train_s();
  if (outputs_) outputs_->log_train(rec.dump(), s.step, s.loss, s.lr, s.grad_norm, rate);

  const bool last = s.step == o_.max_steps;
  if (s.step != o_.start_step + 1 && s.step % o_.log_every != 0 && !last) return;
  const Clock::time_point now = Clock::now();
  const double window_rate =
      o_.tokens_per_step * static_cast<double>(window_steps_) / std::max(seconds_between(window_start_, now), 1e-9);
  // A compiled run's first step traces and compiles; its time says nothing about the steps to come.
  const double timed_steps = static_cast<double>(s.step - o_.start_step) - (o_.compiled ? 1 : 0);
  const double timed_s = train_s_ - (o_.compiled ? first_step_s_ : 0);
  const double eta =
      timed_steps > 0 ? timed_s / timed_steps * static_cast<double>(o_.max_steps - s.step) : (last ? 0 : -1);
  const double window_mfu = o_.peak_flops > 0 ? window_rate * o_.flops_per_token / o_.peak_flops : -1;
  log_ << progress_line(s.step, o_.max_steps, window_loss_ / static_cast<double>(window_steps_), s.lr, s.grad_norm,
                        window_rate, window_mfu, static_cast<double>(window_peak_), eta)
       << "\n"
       << std::flush;
  window_loss_ = 0;
  window_steps_ = 0;
  window_peak_ = 0;
  window_start_ = Clock::now();
}

void ProgressMeter::summarize(TrainSummary& r) const {
  r.train_s = total_train_s();
  const int64_t run_steps = r.steps - o_.start_step;
  if (run_steps <= 0) return;
  r.tokens_per_s = o_.tokens_per_step * static_cast<double>(run_steps) / std::max(train_s_, 1e-9);
  if (o_.peak_flops > 0) r.mfu = *r.tokens_per_s * o_.flops_per_token / o_.peak_flops;
}

void ProgressMeter::log_done(const TrainSummary& r) const {
  log_ << "done | " << done_steps_text(r.steps, o_.start_step, train_s_, r.train_s) << " | loss ";
  char buf[200];
  std::snprintf(buf, sizeof buf, "%.3f -> %.3f | %s tok/s | saved %s\n", r.first_loss, r.final_loss,
                r.tokens_per_s ? format_count(*r.tokens_per_s).c_str() : "-",
                r.checkpoints.empty() ? "-" : r.checkpoints.front().c_str());
  log_ << buf << std::flush;
}

}  // namespace ingot::recipes
