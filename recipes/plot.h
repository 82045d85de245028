// Line plots as PNG (libpng), drawn here: axes, "nice" ticks with labels in a built-in 5x7 pixel font,
// a legend, and one polyline per series. Used for the loss curve a run writes at the end (loss.png) and by
// `ingot plot RUN_DIR`.
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
};

// An RGB image, row-major, 3 bytes per pixel.
struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Up to about `max_ticks` round values (1, 2 or 5 times a power of ten) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int max_ticks);
// A tick label: "0", "250", "2.5", "0.001", "1e+06".
std::string tick_label(double v, double step);

Image render_line_plot(const std::string& title, const std::string& x_label, const std::string& y_label,
                       const std::vector<PlotSeries>& series, int width = 800, int height = 500);
// Writes an 8-bit RGB PNG atomically; throws ingot::Error naming the file.
void write_png(const std::string& path, const Image& image);

// Reads a metrics.jsonl (recipes/metrics.h) and draws train loss (raw and smoothed) and eval loss against
// the step into `png_path`. Throws when the log has no train records.
void plot_metrics_file(const std::string& metrics_path, const std::string& png_path, const std::string& title);

}  // namespace ingot::recipes
