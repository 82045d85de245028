#include "recipes/plot.h"

#include <png.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <map>

#include "recipes/metrics.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::recipes {

namespace {

// 5x7 glyphs, one byte per row, bit 4 = leftmost column. Only the characters plots need.
const std::map<char, std::array<uint8_t, 7>>& font() {
  static const std::map<char, std::array<uint8_t, 7>> f = {
      {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
      {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
      {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
      {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
      {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
      {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
      {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}}, {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
      {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
      {'/', {0x01, 0x01, 0x02, 0x04, 0x08, 0x10, 0x10}}, {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
      {'a', {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}}, {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}},
      {'c', {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}}, {'d', {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}},
      {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}}, {'f', {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}},
      {'g', {0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E}}, {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}},
      {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}}, {'j', {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C}},
      {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}}, {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
      {'m', {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}}, {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}},
      {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}}, {'p', {0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10}},
      {'q', {0x00, 0x00, 0x0D, 0x13, 0x0F, 0x01, 0x01}}, {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}},
      {'s', {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E}}, {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}},
      {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}}, {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}},
      {'w', {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}}, {'x', {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}},
      {'y', {0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E}}, {'z', {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}},
  };
  return f;
}

constexpr int kGlyphW = 6;  // 5 columns + 1 of spacing

struct Canvas {
  Image img;
  Canvas(int w, int h) {
    img.width = w;
    img.height = h;
    img.rgb.assign(static_cast<size_t>(w) * h * 3, 255);
  }
  void set(int x, int y, const uint8_t c[3]) {
    if (x < 0 || y < 0 || x >= img.width || y >= img.height) return;
    uint8_t* p = &img.rgb[(static_cast<size_t>(y) * img.width + x) * 3];
    p[0] = c[0];
    p[1] = c[1];
    p[2] = c[2];
  }
  void rect(int x0, int y0, int x1, int y1, const uint8_t c[3]) {
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x) set(x, y, c);
  }
  // Bresenham, `thick` pixels wide.
  void line(int x0, int y0, int x1, int y1, const uint8_t c[3], int thick = 1) {
    int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
    for (;;) {
      rect(x0 - (thick - 1) / 2, y0 - (thick - 1) / 2, x0 + thick / 2, y0 + thick / 2, c);
      if (x0 == x1 && y0 == y1) break;
      int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }
  // Text with its top-left corner at (x, y); characters without a glyph are drawn as spaces.
  void text(int x, int y, const std::string& s, const uint8_t c[3]) {
    for (char ch : s) {
      char k = (ch >= 'A' && ch <= 'Z') ? static_cast<char>(ch - 'A' + 'a') : ch;
      auto it = font().find(k);
      if (it != font().end())
        for (int row = 0; row < 7; ++row)
          for (int col = 0; col < 5; ++col)
            if (it->second[row] & (0x10 >> col)) set(x + col, y + row, c);
      x += kGlyphW;
    }
  }
  // Text rotated 90 degrees counter-clockwise, reading upwards from (x, y) (its bottom-left corner).
  void text_up(int x, int y, const std::string& s, const uint8_t c[3]) {
    for (char ch : s) {
      char k = (ch >= 'A' && ch <= 'Z') ? static_cast<char>(ch - 'A' + 'a') : ch;
      auto it = font().find(k);
      if (it != font().end())
        for (int row = 0; row < 7; ++row)
          for (int col = 0; col < 5; ++col)
            if (it->second[row] & (0x10 >> col)) set(x + row, y - col, c);
      y -= kGlyphW;
    }
  }
};

int text_width(const std::string& s) { return static_cast<int>(s.size()) * kGlyphW - 1; }

const uint8_t kBlack[3] = {0, 0, 0};
const uint8_t kGrid[3] = {228, 228, 228};
const uint8_t kGray[3] = {90, 90, 90};

// libpng reports errors by longjmp; this function owns no C++ objects that need unwinding past setjmp.
bool write_png_rows(std::FILE* f, int w, int h, png_bytep* rows) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, static_cast<png_uint_32>(w), static_cast<png_uint_32>(h), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

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

Image render_line_plot(const std::string& title, const std::string& x_label, const std::string& y_label,
                       const std::vector<PlotSeries>& series, int width, int height) {
  Canvas cv(width, height);
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const PlotSeries& s : series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  if (x_hi == x_lo) x_hi = x_lo + 1;
  if (y_hi == y_lo) y_lo -= 0.5, y_hi += 0.5;
  const double y_pad = 0.05 * (y_hi - y_lo);
  y_lo -= y_pad;
  y_hi += y_pad;
  std::vector<double> xt = nice_ticks(x_lo, x_hi, 8), yt = nice_ticks(y_lo, y_hi, 7);
  const double x_step = xt.size() > 1 ? xt[1] - xt[0] : 1, y_step = yt.size() > 1 ? yt[1] - yt[0] : 1;
  int label_w = 0;
  for (double v : yt) label_w = std::max(label_w, text_width(tick_label(v, y_step)));
  const int left = 24 + label_w + 8, right = width - 20, top = 34, bottom = height - 44;
  auto px = [&](double x) { return left + static_cast<int>(std::lround((x - x_lo) / (x_hi - x_lo) * (right - left))); };
  auto py = [&](double y) { return bottom - static_cast<int>(std::lround((y - y_lo) / (y_hi - y_lo) * (bottom - top))); };

  for (double v : xt) {
    int x = px(v);
    if (x < left || x > right) continue;
    cv.line(x, top, x, bottom, kGrid);
    cv.line(x, bottom, x, bottom + 4, kBlack);
    std::string l = tick_label(v, x_step);
    cv.text(x - text_width(l) / 2, bottom + 8, l, kBlack);
  }
  for (double v : yt) {
    int y = py(v);
    if (y < top || y > bottom) continue;
    cv.line(left, y, right, y, kGrid);
    cv.line(left - 4, y, left, y, kBlack);
    std::string l = tick_label(v, y_step);
    cv.text(left - 8 - text_width(l), y - 3, l, kBlack);
  }
  cv.line(left, top, left, bottom, kBlack);
  cv.line(left, bottom, right, bottom, kBlack);
  cv.text((left + right - text_width(title)) / 2, 12, title, kBlack);
  cv.text((left + right - text_width(x_label)) / 2, height - 16, x_label, kGray);
  cv.text_up(6, (top + bottom + text_width(y_label)) / 2, y_label, kGray);

  int legend_y = top + 8;
  for (const PlotSeries& s : series) {
    bool have_prev = false;
    int x0 = 0, y0 = 0;
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      int x1 = px(x), y1 = py(y);
      if (have_prev) cv.line(x0, y0, x1, y1, s.rgb, 2);
      if (s.markers) cv.rect(x1 - 2, y1 - 2, x1 + 2, y1 + 2, s.rgb);
      x0 = x1;
      y0 = y1;
      have_prev = true;
    }
    int lx = right - 10 - text_width(s.name) - 26;
    cv.line(lx, legend_y + 3, lx + 18, legend_y + 3, s.rgb, 2);
    cv.text(lx + 24, legend_y, s.name, kBlack);
    legend_y += 12;
  }
  return cv.img;
}

void write_png(const std::string& path, const Image& image) {
  INGOT_CHECK(image.width > 0 && image.height > 0 &&
                  image.rgb.size() == static_cast<size_t>(image.width) * image.height * 3,
              "write_png '", path, "': bad image size");
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (int y = 0; y < image.height; ++y)
    rows[y] = const_cast<png_bytep>(&image.rgb[static_cast<size_t>(y) * image.width * 3]);
  write_file_atomic(path, [&](std::FILE* f) {
    INGOT_CHECK(write_png_rows(f, image.width, image.height, rows.data()), "libpng failed to encode the image");
  });
}

void plot_metrics_file(const std::string& metrics_path, const std::string& png_path, const std::string& title) {
  PlotSeries train{"train loss", {}, {174, 199, 232}, false};
  PlotSeries smooth{"train (smoothed)", {}, {31, 119, 180}, false};
  PlotSeries eval{"val loss", {}, {255, 127, 14}, true};
  for (const MetricPoint& p : read_metrics(metrics_path))
    (p.kind == "eval" ? eval : train).points.emplace_back(static_cast<double>(p.step), p.value);
  INGOT_CHECK(!train.points.empty(), metrics_path, ": no training records to plot");
  std::sort(train.points.begin(), train.points.end());
  // An exponential moving average with a span of ~2% of the run shows the trend under the per-step noise.
  const double alpha = std::min(1.0, 2.0 / (1.0 + std::max(1.0, 0.02 * static_cast<double>(train.points.size()))));
  double ema = train.points[0].second;
  for (auto [x, y] : train.points) {
    ema = alpha * y + (1 - alpha) * ema;
    smooth.points.emplace_back(x, ema);
  }
  std::vector<PlotSeries> series{train, smooth};
  if (!eval.points.empty()) series.push_back(eval);
  write_png(png_path, render_line_plot(title, "step", "loss", series));
}

}  // namespace ingot::recipes
