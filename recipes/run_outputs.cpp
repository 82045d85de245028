#include "recipes/run_outputs.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <ostream>
#include <utility>
#include <vector>

#include "recipes/metrics.h"
#include "recipes/plot.h"
#include "recipes/profile.h"
#include "recipes/tfevents.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

RunOutputs::RunOutputs(const RunSettings& run, int64_t resumed_step, std::ostream& log) : run_(run), log_(log) {
  metrics_path_ = (fs::path(run.output_dir) / "metrics.jsonl").string();
  metrics_ = std::make_unique<MetricsLog>(metrics_path_, resumed_step);
  if (run.tensorboard) events_ = std::make_unique<EventWriter>((fs::path(run.output_dir) / "tensorboard").string());
  if (run.profile.enabled)
    profiler_ = run.profile.device_timing && run.device.is_cuda() ? std::make_unique<OpProfiler>(run.device.index)
                                                                   : std::make_unique<OpProfiler>();
}

RunOutputs::~RunOutputs() = default;

void RunOutputs::begin_step(int64_t step) {
  if (profiler_ && step >= run_.profile.start_step && step < run_.profile.start_step + run_.profile.num_steps)
    profiler_->start(step);
}

void RunOutputs::end_step(int64_t step) {
  if (!profiler_ || !profiler_->active()) return;
  profiler_->stop();
  if (step + 1 < run_.profile.start_step + run_.profile.num_steps) return;
  const std::string dir = (fs::path(run_.output_dir) / "profile").string();
  trace_path_ = profiler_->write(dir, static_cast<int>(run_.profile.top_k));
  log_ << "profile | steps " << run_.profile.start_step << ".." << step << " | " << profiler_->events().size()
       << " ops | " << trace_path_ << " (open in ui.perfetto.dev)\n"
       << profiler_->top_ops_table(static_cast<int>(run_.profile.top_k)) << std::flush;
}

void RunOutputs::log_train(const std::string& json, int64_t step, double loss, double lr, double grad_norm,
                           double tokens_per_s) {
  metrics_->append(json);
  if (!events_) return;
  std::vector<std::pair<std::string, double>> scalars = {
      {"train/loss", loss}, {"train/lr", lr}, {"train/tokens_per_s", tokens_per_s}};
  if (grad_norm >= 0) scalars.emplace_back("train/grad_norm", grad_norm);
  events_->scalars(step, scalars);
}

void RunOutputs::abandon(int64_t saved_step) {
  const std::string failed = (fs::path(run_.output_dir) / "metrics.failed.jsonl").string();
  if (int64_t n = metrics_->set_aside_after(saved_step, failed); n > 0)
    log_ << "metrics | the run failed: " << n << " record(s) after step " << saved_step
         << " (its last checkpoint) moved from metrics.jsonl to " << failed << "\n"
         << std::flush;
}

void RunOutputs::log_eval(int64_t step, double val_loss) {
  nlohmann::ordered_json rec;
  rec["kind"] = "eval";
  rec["step"] = step;
  rec["val_loss"] = val_loss;
  metrics_->append(rec.dump());
  if (events_) events_->scalars(step, {{"eval/loss", val_loss}});
}

void RunOutputs::finish(TrainSummary& r) {
  if (run_.plot) {
    std::string png = (fs::path(run_.output_dir) / "loss.png").string();
    std::string title = run_.recipe + ": " + fs::path(run_.output_dir).filename().string();
    plot_metrics_file(metrics_path_, png, title);
    r.loss_plot = png;
  }
  if (events_) r.tensorboard_dir = fs::path(events_->path()).parent_path().string();
  r.profile_trace = trace_path_;
}

}  // namespace ingot::recipes
