// Line plots as PNG, drawn with cairo (anti-aliased lines, real text): panels stacked over one shared x axis,
// "nice" ticks, a legend per panel. Used for the loss and learning-rate figure a run writes at the end
// (loss.png) and by `ingot plot RUN_DIR...`, which overlays several runs.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ingot::recipes {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite y values are skipped
  uint8_t rgb[3] = {31, 119, 180};
  bool markers = false;  // a dot on every point (sparse series such as eval losses)
  double width = 2.2;    // line width in pixels (0: markers only)
};

// One panel of a figure: its y axis label, height in pixels and series.
struct PlotPanel {
  std::string y_label;
  int height = 0;
  std::vector<PlotSeries> series;
};

// Up to about `max_ticks` round values (1, 2 or 5 times a power of ten) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int max_ticks);
// A tick label: "0", "250", "2.5", "0.001", "1e+06".
std::string tick_label(double v, double step);

// Draws the panels top to bottom under `title`, sharing the x range (ticks and `x_label` under the last one),
// and writes an RGB PNG atomically. Throws ingot::Error naming the file.
void write_plot_png(const std::string& path, const std::string& title, const std::string& x_label,
                    const std::vector<PlotPanel>& panels, int width = 800);

// Reads a metrics.jsonl (recipes/metrics.h) and draws train loss (raw and smoothed) and eval loss against the
// step into `png_path` (800 x 500) and, when the records hold the learning rate, an lr panel below it
// (800 x 680 in all). Throws when the log has no train records.
void plot_metrics_file(const std::string& metrics_path, const std::string& png_path, const std::string& title);

// Several runs in one figure, one colour each: smoothed train loss (a line) and eval loss (dots) above, the
// learning rate below. Throws naming a log without train records.
struct PlotRun {
  std::string name;          // legend label, e.g. the run directory's name
  std::string metrics_path;  // its metrics.jsonl
};
void plot_runs(const std::vector<PlotRun>& runs, const std::string& png_path);

}  // namespace ingot::recipes
