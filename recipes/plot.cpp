#include "recipes/plot.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "recipes/metrics.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::recipes {

namespace {

constexpr double kFontSize = 12;
constexpr int kTitleHeight = 30, kPanelGap = 14, kBottomMargin = 42, kRightMargin = 20;

struct Rgb {
  double r, g, b;
};
const Rgb kBlack{0, 0, 0}, kGrid{0.9, 0.9, 0.9}, kGray{0.35, 0.35, 0.35};

void set_color(cairo_t* cr, const Rgb& c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }
void set_color(cairo_t* cr, const uint8_t c[3]) { cairo_set_source_rgb(cr, c[0] / 255.0, c[1] / 255.0, c[2] / 255.0); }

double text_width(cairo_t* cr, const std::string& s) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  return e.x_advance;
}

// Text with its baseline's left end at (x, y).
void text(cairo_t* cr, double x, double y, const std::string& s, const Rgb& c) {
  set_color(cr, c);
  cairo_move_to(cr, x, y);
  cairo_show_text(cr, s.c_str());
}

// A 1-pixel line on pixel centres, so axes and grid lines stay crisp.
void hline(cairo_t* cr, double x0, double x1, int y, const Rgb& c) {
  set_color(cr, c);
  cairo_set_line_width(cr, 1);
  cairo_move_to(cr, x0, y + 0.5);
  cairo_line_to(cr, x1, y + 0.5);
  cairo_stroke(cr);
}
void vline(cairo_t* cr, int x, double y0, double y1, const Rgb& c) {
  set_color(cr, c);
  cairo_set_line_width(cr, 1);
  cairo_move_to(cr, x + 0.5, y0);
  cairo_line_to(cr, x + 0.5, y1);
  cairo_stroke(cr);
}

struct Range {
  double lo = INFINITY, hi = -INFINITY;
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  // Empty ranges become [0, 1], single values a unit around them.
  void settle() {
    if (!std::isfinite(lo)) lo = 0, hi = 1;
    if (hi == lo) lo -= 0.5, hi += 0.5;
  }
};

std::vector<std::pair<double, double>> finite_points(const PlotSeries& s) {
  std::vector<std::pair<double, double>> out;
  for (auto [x, y] : s.points)
    if (std::isfinite(x) && std::isfinite(y)) out.emplace_back(x, y);
  return out;
}

// One panel between pixel rows top and bottom; x ticks labelled when `x_labels`.
void draw_panel(cairo_t* cr, const PlotPanel& panel, const Range& xr, int left, int right, int top, int bottom,
                bool x_labels) {
  Range yr;
  for (const PlotSeries& s : panel.series)
    for (auto [x, y] : s.points) yr.add(y);
  yr.settle();
  const double pad = 0.05 * (yr.hi - yr.lo);
  yr.lo -= pad;
  yr.hi += pad;
  auto px = [&](double x) { return left + (x - xr.lo) / (xr.hi - xr.lo) * (right - left); };
  auto py = [&](double y) { return bottom - (y - yr.lo) / (yr.hi - yr.lo) * (bottom - top); };

  const std::vector<double> xt = nice_ticks(xr.lo, xr.hi, 8), yt = nice_ticks(yr.lo, yr.hi, panel.height > 250 ? 7 : 4);
  const double x_step = xt.size() > 1 ? xt[1] - xt[0] : 1, y_step = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double v : xt) {
    const int x = static_cast<int>(std::lround(px(v)));
    if (x < left || x > right) continue;
    vline(cr, x, top, bottom, kGrid);
    vline(cr, x, bottom, bottom + 4, kBlack);
    if (x_labels) {
      const std::string l = tick_label(v, x_step);
      text(cr, x - text_width(cr, l) / 2, bottom + 17, l, kBlack);
    }
  }
  for (double v : yt) {
    const int y = static_cast<int>(std::lround(py(v)));
    if (y < top || y > bottom) continue;
    hline(cr, left, right, y, kGrid);
    hline(cr, left - 4, left, y, kBlack);
    const std::string l = tick_label(v, y_step);
    text(cr, left - 8 - text_width(cr, l), y + 4, l, kBlack);
  }
  vline(cr, left, top, bottom + 1, kBlack);
  hline(cr, left, right + 1, bottom, kBlack);
  // The y label, reading upwards along the left edge.
  cairo_save(cr);
  cairo_translate(cr, 16, (top + bottom + text_width(cr, panel.y_label)) / 2);
  cairo_rotate(cr, -M_PI / 2);
  text(cr, 0, 0, panel.y_label, kGray);
  cairo_restore(cr);

  cairo_save(cr);
  cairo_rectangle(cr, left, top, right - left + 1, bottom - top + 1);
  cairo_clip(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
  for (const PlotSeries& s : panel.series) {
    const auto pts = finite_points(s);
    set_color(cr, s.rgb);
    if (s.width > 0 && pts.size() > 1) {
      cairo_set_line_width(cr, s.width);
      cairo_move_to(cr, px(pts[0].first), py(pts[0].second));
      for (size_t i = 1; i < pts.size(); ++i) cairo_line_to(cr, px(pts[i].first), py(pts[i].second));
      cairo_stroke(cr);
    }
    if (s.markers)
      for (auto [x, y] : pts) {
        cairo_arc(cr, px(x), py(y), 3.5, 0, 2 * M_PI);
        cairo_fill(cr);
      }
  }
  cairo_restore(cr);

  // The legend, top right inside the panel, on a white box so curves under it stay apart from it.
  double legend_w = 0;
  for (const PlotSeries& s : panel.series) legend_w = std::max(legend_w, text_width(cr, s.name));
  legend_w += 40;
  const double lx = right - 10 - legend_w, row = 16;
  cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
  cairo_rectangle(cr, lx - 6, top + 4, legend_w + 10, row * static_cast<double>(panel.series.size()) + 6);
  cairo_fill(cr);
  double ly = top + 4 + row - 3;
  for (const PlotSeries& s : panel.series) {
    set_color(cr, s.rgb);
    if (s.width > 0) {
      cairo_set_line_width(cr, s.width);
      cairo_move_to(cr, lx, ly - 4);
      cairo_line_to(cr, lx + 24, ly - 4);
      cairo_stroke(cr);
    }
    if (s.markers) {
      cairo_arc(cr, lx + 12, ly - 4, 3.5, 0, 2 * M_PI);
      cairo_fill(cr);
    }
    text(cr, lx + 32, ly, s.name, kBlack);
    ly += row;
  }
}

cairo_status_t write_to_file(void* closure, const unsigned char* data, unsigned int length) {
  return std::fwrite(data, 1, length, static_cast<std::FILE*>(closure)) == length ? CAIRO_STATUS_SUCCESS
                                                                                  : CAIRO_STATUS_WRITE_ERROR;
}

// An exponential moving average with a span of ~2% of the run shows the trend under the per-step noise.
PlotSeries smoothed(const std::vector<std::pair<double, double>>& points, const std::string& name,
                    const uint8_t rgb[3]) {
  PlotSeries s{name, {}, {rgb[0], rgb[1], rgb[2]}};
  const double alpha = std::min(1.0, 2.0 / (1.0 + std::max(1.0, 0.02 * static_cast<double>(points.size()))));
  double ema = points.empty() ? 0 : points[0].second;
  for (auto [x, y] : points) {
    ema = alpha * y + (1 - alpha) * ema;
    s.points.emplace_back(x, ema);
  }
  return s;
}

// The train losses, learning rates and eval losses of one metrics.jsonl, sorted by step.
struct RunCurves {
  std::vector<std::pair<double, double>> train, lr, eval;
};

RunCurves read_curves(const std::string& metrics_path) {
  RunCurves c;
  for (const MetricPoint& p : read_metrics(metrics_path)) {
    const double step = static_cast<double>(p.step);
    if (p.kind == "eval") {
      c.eval.emplace_back(step, p.value);
    } else {
      c.train.emplace_back(step, p.value);
      if (std::isfinite(p.lr)) c.lr.emplace_back(step, p.lr);
    }
  }
  INGOT_CHECK(!c.train.empty(), metrics_path, ": no training records to plot");
  std::sort(c.train.begin(), c.train.end());
  std::sort(c.lr.begin(), c.lr.end());
  std::sort(c.eval.begin(), c.eval.end());
  return c;
}

constexpr int kLossHeight = 500 - kTitleHeight - kBottomMargin, kLrHeight = 180 - kPanelGap;

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  if (!(hi > lo)) return {lo};
  double raw = (hi - lo) / std::max(1, max_ticks - 1);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step)
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

std::string tick_label(double v, double step) {
  char buf[32];
  if (v != 0 && (std::abs(v) >= 1e6 || std::abs(v) < 1e-4)) {
    std::snprintf(buf, sizeof buf, "%.2g", v);
    return buf;
  }
  int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  std::snprintf(buf, sizeof buf, "%.*f", std::min(decimals, 6), v);
  return buf;
}

void write_plot_png(const std::string& path, const std::string& title, const std::string& x_label,
                    const std::vector<PlotPanel>& panels, int width) {
  INGOT_CHECK(!panels.empty() && width > 0, "write_plot_png '", path, "': nothing to draw");
  int height = kTitleHeight + kBottomMargin;
  for (size_t i = 0; i < panels.size(); ++i) height += panels[i].height + (i ? kPanelGap : 0);
  std::unique_ptr<cairo_surface_t, void (*)(cairo_surface_t*)> surface(
      cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height), cairo_surface_destroy);
  std::unique_ptr<cairo_t, void (*)(cairo_t*)> owner(cairo_create(surface.get()), cairo_destroy);
  cairo_t* cr = owner.get();
  INGOT_CHECK(cairo_status(cr) == CAIRO_STATUS_SUCCESS, "write_plot_png '", path,
              "': cairo: ", cairo_status_to_string(cairo_status(cr)));
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, kFontSize);

  Range xr;
  for (const PlotPanel& p : panels)
    for (const PlotSeries& s : p.series)
      for (auto [x, y] : s.points)
        if (std::isfinite(y)) xr.add(x);
  xr.settle();
  // One left edge for every panel: room for the widest y tick label of any of them.
  double label_w = 0;
  for (const PlotPanel& p : panels) {
    Range yr;
    for (const PlotSeries& s : p.series)
      for (auto [x, y] : s.points) yr.add(y);
    yr.settle();
    const std::vector<double> yt = nice_ticks(yr.lo - 0.05 * (yr.hi - yr.lo), yr.hi + 0.05 * (yr.hi - yr.lo), 7);
    for (double v : yt) label_w = std::max(label_w, text_width(cr, tick_label(v, yt.size() > 1 ? yt[1] - yt[0] : 1)));
  }
  const int left = 30 + static_cast<int>(label_w) + 8, right = width - kRightMargin;
  int top = kTitleHeight;
  for (size_t i = 0; i < panels.size(); ++i) {
    const bool last = i + 1 == panels.size();
    draw_panel(cr, panels[i], xr, left, right, top, top + panels[i].height, last);
    top += panels[i].height + kPanelGap;
  }
  cairo_set_font_size(cr, kFontSize + 2);
  text(cr, (left + right - text_width(cr, title)) / 2, 20, title, kBlack);
  cairo_set_font_size(cr, kFontSize);
  text(cr, (left + right - text_width(cr, x_label)) / 2, height - 8, x_label, kGray);
  cairo_surface_flush(surface.get());
  write_file_atomic(path, [&](std::FILE* f) {
    const cairo_status_t st = cairo_surface_write_to_png_stream(surface.get(), write_to_file, f);
    INGOT_CHECK(st == CAIRO_STATUS_SUCCESS, "cairo failed to encode the image: ", cairo_status_to_string(st));
  });
}

void plot_metrics_file(const std::string& metrics_path, const std::string& png_path, const std::string& title) {
  const RunCurves c = read_curves(metrics_path);
  const uint8_t blue[3] = {31, 119, 180};
  PlotPanel loss{"loss", kLossHeight, {}};
  loss.series.push_back({"train loss", c.train, {174, 199, 232}, false, 1.2});
  loss.series.push_back(smoothed(c.train, "train (smoothed)", blue));
  if (!c.eval.empty()) loss.series.push_back({"val loss", c.eval, {255, 127, 14}, true, 1.5});
  std::vector<PlotPanel> panels{loss};
  if (!c.lr.empty()) panels.push_back({"learning rate", kLrHeight, {{"lr", c.lr, {44, 160, 44}}}});
  write_plot_png(png_path, title, "step", panels);
}

void plot_runs(const std::vector<PlotRun>& runs, const std::string& png_path) {
  // matplotlib's tab10 colours.
  static const uint8_t kColors[][3] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                                       {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
                                       {188, 189, 34},  {23, 190, 207}};
  PlotPanel loss{"loss (smoothed; dots: val)", kLossHeight, {}}, lr{"learning rate", kLrHeight, {}};
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunCurves c = read_curves(runs[i].metrics_path);
    const uint8_t* rgb = kColors[i % std::size(kColors)];
    loss.series.push_back(smoothed(c.train, runs[i].name, rgb));
    if (!c.eval.empty()) loss.series.push_back({runs[i].name + " val", c.eval, {rgb[0], rgb[1], rgb[2]}, true, 0});
    if (!c.lr.empty()) lr.series.push_back({runs[i].name, c.lr, {rgb[0], rgb[1], rgb[2]}});
  }
  std::vector<PlotPanel> panels{loss};
  if (!lr.series.empty()) panels.push_back(lr);
  write_plot_png(png_path, std::to_string(runs.size()) + " runs", "step", panels);
}

}  // namespace ingot::recipes
