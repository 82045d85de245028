// Run outputs: metrics log, loss plot, TensorBoard event files and the op profiler.
#include <gtest/gtest.h>
#include <png.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/ops.h"
#include "recipes/metrics.h"
#include "recipes/plot.h"
#include "recipes/profile.h"
#include "recipes/tfevents.h"
#include "recipes/train.h"
#include "runtime/file_util.h"

namespace ingot::recipes {
namespace {

namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size()); });
}

// An RGB image, row-major, 3 bytes per pixel.
struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  const uint8_t* at(int x, int y) const { return &rgb[(static_cast<size_t>(y) * width + x) * 3]; }
};

// Decodes a PNG with libpng's simplified API into RGB bytes.
Image read_png(const std::string& path) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  EXPECT_TRUE(png_image_begin_read_from_file(&img, path.c_str())) << path;
  img.format = PNG_FORMAT_RGB;
  Image out;
  out.width = static_cast<int>(img.width);
  out.height = static_cast<int>(img.height);
  out.rgb.resize(PNG_IMAGE_SIZE(img));
  EXPECT_TRUE(png_image_finish_read(&img, nullptr, out.rgb.data(), 0, nullptr));
  return out;
}

TEST(Metrics, ProgressLineHasEveryFieldAndFormatsUnits) {
  std::string l = progress_line(20, 300, 2.3456, 3e-4, 0.8412, 12345, 0.312, 1.25 * 1024 * 1024 * 1024, 41);
  EXPECT_EQ(l, "step 20/300 | loss 2.346 | lr 3.0e-04 | gnorm 0.841 | 12.3k tok/s | MFU 31.2% | mem peak 1.25 GiB | "
               "ETA 0:41");
  EXPECT_EQ(progress_line(1, 2, 1, 1e-3, -1, 950, -1, -1, 3725),
            "step 1/2 | loss 1.000 | lr 1.0e-03 | 950 tok/s | ETA 1:02:05");
  EXPECT_EQ(progress_line(1, 2, 1, 1e-3, -1, 950, -1, -1, -1), "step 1/2 | loss 1.000 | lr 1.0e-03 | 950 tok/s | ETA -");
  EXPECT_EQ(format_bytes(512 * 1024), "512 KiB");
}

TEST(Metrics, AFailedRunsRecordsAfterItsLastCheckpointMoveAside) {
  TempDir dir("ingot_metrics_aside");
  {
    MetricsLog log(dir.file("metrics.jsonl"));
    for (int step = 1; step <= 5; ++step)
      log.append("{\"kind\":\"train\",\"step\":" + std::to_string(step) + ",\"loss\":1}");
    EXPECT_EQ(log.set_aside_after(3, dir.file("metrics.failed.jsonl")), 2);
  }
  std::vector<MetricPoint> kept = read_metrics(dir.file("metrics.jsonl"));
  std::vector<MetricPoint> moved = read_metrics(dir.file("metrics.failed.jsonl"));
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept.back().step, 3);
  ASSERT_EQ(moved.size(), 2u);
  EXPECT_EQ(moved.front().step, 4);
}

TEST(Metrics, FlopsPerTokenAndPeakFollowTheStatedFormulas) {
  EXPECT_DOUBLE_EQ(transformer_flops_per_token(1000, 0, 2, 64, 32), 6000.0 + 12.0 * 2 * 64 * 32);
  // Frozen weights run the forward and input-gradient products only (issue 24: a LoRA base is ~4N, not 6N).
  EXPECT_DOUBLE_EQ(transformer_flops_per_token(10, 1000, 2, 64, 32), 60.0 + 4000.0 + 12.0 * 2 * 64 * 32);
  EXPECT_EQ(peak_flops(false, false, 0), 0.0);
  EXPECT_EQ(peak_flops(true, true, 0), 989.4e12);
  EXPECT_EQ(peak_flops(false, false, 2.5), 2.5e12);
}

TEST(Metrics, LogAppendsAndAResumeDropsRecordsAfterTheCheckpoint) {
  TempDir dir("ingot_metrics_test");
  std::string path = dir.file("m.jsonl");
  {
    MetricsLog log(path);
    for (int s = 1; s <= 5; ++s) log.append("{\"kind\":\"train\",\"step\":" + std::to_string(s) + ",\"loss\":" +
                                            std::to_string(6 - s) + "}");
    log.append("{\"kind\":\"eval\",\"step\":5,\"val_loss\":1.5}");
  }
  {
    MetricsLog resumed(path, 3);
    resumed.append("{\"kind\":\"train\",\"step\":4,\"loss\":0.5}");
  }
  std::vector<MetricPoint> pts = read_metrics(path);
  ASSERT_EQ(pts.size(), 4u);
  EXPECT_EQ(pts[2].step, 3);
  EXPECT_EQ(pts[3].value, 0.5);
  MetricsLog fresh(path);  // a fresh run starts a fresh log
  EXPECT_TRUE(read_metrics(path).empty());
}

TEST(Plot, NiceTicksAreRoundAndCoverTheRange) {
  EXPECT_EQ(nice_ticks(0, 300, 8), (std::vector<double>{0, 50, 100, 150, 200, 250, 300}));
  std::vector<double> t = nice_ticks(1.37, 2.91, 7);  // raw step 0.257 rounds up to 0.5
  ASSERT_EQ(t.size(), 3u);
  EXPECT_NEAR(t[0], 1.5, 1e-12);
  EXPECT_NEAR(t[1] - t[0], 0.5, 1e-12);
  EXPECT_EQ(nice_ticks(1.37, 2.91, 12).size(), 8u);  // step 0.2: 1.4 ... 2.8
  EXPECT_GE(t.front(), 1.37);
  EXPECT_LE(t.back(), 2.91);
  EXPECT_EQ(tick_label(250, 50), "250");
  EXPECT_EQ(tick_label(1.4000000000000001, 0.2), "1.4");
  EXPECT_EQ(tick_label(0.0005, 0.0005), "0.0005");
}

TEST(Plot, TheLossCurveIsAPngWithAxesAndAFallingLine) {
  TempDir dir("ingot_plot_test");
  std::string metrics;
  for (int s = 1; s <= 100; ++s)
    metrics += "{\"kind\":\"train\",\"step\":" + std::to_string(s) + ",\"loss\":" + std::to_string(5.0 / std::sqrt(s)) +
               "}\n";
  metrics += "{\"kind\":\"eval\",\"step\":100,\"val_loss\":0.6}\nnot json\n";
  write_text(dir.file("metrics.jsonl"), metrics);
  plot_metrics_file(dir.file("metrics.jsonl"), dir.file("loss.png"), "test run");
  Image img = read_png(dir.file("loss.png"));
  ASSERT_EQ(img.width, 800);
  ASSERT_EQ(img.height, 500);
  auto px = [&](int x, int y) { return &img.rgb[(static_cast<size_t>(y) * img.width + x) * 3]; };
  // The x axis is a black row across the plot; find it from the bottom.
  int axis_y = -1;
  for (int y = img.height - 1; y > 0 && axis_y < 0; --y) {
    int black = 0;
    for (int x = 0; x < img.width; ++x) black += px(x, y)[0] == 0 && px(x, y)[1] == 0 && px(x, y)[2] == 0;
    if (black > img.width / 2) axis_y = y;
  }
  ASSERT_GT(axis_y, img.height / 2);
  // The smoothed series color appears; its topmost pixel is left of its bottommost one (the loss falls).
  int top_x = -1, top_y = img.height, bottom_x = -1, bottom_y = -1;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width - 150; ++x) {  // skip the legend at the top right
      const uint8_t* p = px(x, y);
      if (p[0] == 31 && p[1] == 119 && p[2] == 180) {
        if (y < top_y) top_y = y, top_x = x;
        if (y > bottom_y) bottom_y = y, bottom_x = x;
      }
    }
  ASSERT_GE(top_x, 0);
  EXPECT_LT(top_x, bottom_x);
  EXPECT_GT(bottom_y - top_y, 100);
}

// The rows where more than half the pixels are black: the x axes of a figure's panels, top to bottom.
std::vector<int> axis_rows(const Image& img) {
  std::vector<int> rows;
  for (int y = 0; y < img.height; ++y) {
    int black = 0;
    for (int x = 0; x < img.width; ++x) black += img.at(x, y)[0] == 0 && img.at(x, y)[1] == 0 && img.at(x, y)[2] == 0;
    if (black > img.width / 2) rows.push_back(y);
  }
  return rows;
}

// How many pixels between rows y0 and y1 (and left of the legend) have exactly colour `c`.
int count_color(const Image& img, int y0, int y1, const uint8_t (&c)[3]) {
  int n = 0;
  for (int y = y0; y < y1; ++y)
    for (int x = 0; x < img.width - 150; ++x)
      n += img.at(x, y)[0] == c[0] && img.at(x, y)[1] == c[1] && img.at(x, y)[2] == c[2];
  return n;
}

std::string metrics_with_lr(int steps, double peak_lr, double loss_scale) {
  std::string m;
  for (int s = 1; s <= steps; ++s)
    m += "{\"kind\":\"train\",\"step\":" + std::to_string(s) +
         ",\"loss\":" + std::to_string(loss_scale / std::sqrt(s)) +
         ",\"lr\":" + std::to_string(peak_lr * std::min(1.0, s / 10.0)) + "}\n";
  return m;
}

TEST(Plot, TheLearningRateGetsAPanelBelowTheLoss) {
  TempDir dir("ingot_plot_test");
  write_text(dir.file("metrics.jsonl"), metrics_with_lr(100, 3e-4, 5.0));
  EXPECT_DOUBLE_EQ(read_metrics(dir.file("metrics.jsonl"))[4].lr, 1.5e-4);
  plot_metrics_file(dir.file("metrics.jsonl"), dir.file("loss.png"), "test run");
  Image img = read_png(dir.file("loss.png"));
  ASSERT_EQ(img.width, 800);
  ASSERT_EQ(img.height, 680);
  const std::vector<int> axes = axis_rows(img);
  ASSERT_EQ(axes.size(), 2u) << "one x axis per panel";
  EXPECT_LT(axes[0], 500);
  EXPECT_GT(axes[1], 600);
  const uint8_t loss_blue[3] = {31, 119, 180}, lr_green[3] = {44, 160, 44};
  EXPECT_GT(count_color(img, 0, axes[0], loss_blue), 200) << "the smoothed loss, in the top panel";
  EXPECT_EQ(count_color(img, axes[0] + 1, img.height, loss_blue), 0);
  EXPECT_GT(count_color(img, axes[0] + 1, axes[1], lr_green), 200) << "the lr, in the bottom panel";
  EXPECT_EQ(count_color(img, 0, axes[0], lr_green), 0);
}

TEST(Plot, SeveralRunsOverlayInOneColourEach) {
  TempDir dir("ingot_plot_test");
  write_text(dir.file("a.jsonl"), metrics_with_lr(50, 3e-4, 5.0));
  write_text(dir.file("b.jsonl"),
             metrics_with_lr(80, 1e-3, 4.0) + "{\"kind\":\"eval\",\"step\":80,\"val_loss\":0.6}\n");
  plot_runs({{"a", dir.file("a.jsonl")}, {"b", dir.file("b.jsonl")}}, dir.file("both.png"));
  Image img = read_png(dir.file("both.png"));
  const std::vector<int> axes = axis_rows(img);
  ASSERT_EQ(axes.size(), 2u);
  const uint8_t blue[3] = {31, 119, 180}, orange[3] = {255, 127, 14};
  for (int panel = 0; panel < 2; ++panel) {
    const int y0 = panel ? axes[0] + 1 : 0, y1 = axes[panel];
    EXPECT_GT(count_color(img, y0, y1, blue), 100) << "run a in panel " << panel;
    EXPECT_GT(count_color(img, y0, y1, orange), 100) << "run b in panel " << panel;
  }
  try {
    plot_runs({{"a", dir.file("a.jsonl")}, {"none", dir.file("none.jsonl")}}, dir.file("x.png"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("none.jsonl"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.file("x.png")));
}

TEST(Plot, AnEmptyLogIsAnErrorNamingTheFile) {
  TempDir dir("ingot_plot_test");
  write_text(dir.file("metrics.jsonl"), "{\"kind\":\"eval\",\"step\":1,\"val_loss\":2}\n");
  try {
    plot_metrics_file(dir.file("metrics.jsonl"), dir.file("loss.png"), "t");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl: no training records to plot"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(dir.file("loss.png")));
}

TEST(TfEvents, RecordsRoundTripWithValidChecksums) {
  TempDir dir("ingot_tfevents_test");
  std::string path;
  {
    EventWriter w(dir.file("tb"));
    path = w.path();
    w.scalars(1, {{"train/loss", 2.5}, {"train/lr", 1e-3}});
    w.scalars(2, {{"train/loss", 2.25}});
  }
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  std::string version;
  std::vector<EventScalar> s = read_event_file(path, &version);
  EXPECT_EQ(version, "brain.Event:2");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].tag, "train/loss");
  EXPECT_EQ(s[0].value, 2.5f);
  EXPECT_EQ(s[1].value, 1e-3f);
  EXPECT_EQ(s[2].step, 2);
  // A flipped data byte fails the record's checksum.
  std::string bytes = read_file(path);
  bytes[bytes.size() - 6] ^= 1;
  write_text(path, bytes);
  EXPECT_THROW(read_event_file(path), Error);
}

TEST(Profiler, RecordsEachOpWithShapesAndWritesAChromeTrace) {
  TempDir dir("ingot_profile_test");
  OpProfiler prof;
  Tensor a = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector({1, 0, 0, 1, 1, 1}, {3, 2});
  prof.start(7);
  Tensor c = add(matmul(a, b), 1.0);
  prof.stop();
  Tensor after = mul(c, c);  // not recorded
  ASSERT_GE(prof.events().size(), 2u);
  EXPECT_EQ(prof.events()[0].name.find("matmul") != std::string::npos || prof.events()[0].name.find("mm") != std::string::npos, true)
      << prof.events()[0].name;
  EXPECT_EQ(prof.events()[0].shapes, "[2,3] x [3,2] -> [2,2]");
  EXPECT_EQ(prof.events()[0].step, 7);
  EXPECT_EQ(op_profiler_hook(), nullptr);
  std::string trace = prof.write(dir.path(), 5);
  nlohmann::json j = nlohmann::json::parse(read_file(trace));
  int ops = 0, steps = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    (e["cat"] == "op" ? ops : steps) += 1;
  }
  EXPECT_EQ(ops, static_cast<int>(prof.events().size()));
  EXPECT_EQ(steps, 1);
  std::string table = read_file(dir.file("top_ops.txt"));
  EXPECT_NE(table.find("calls"), std::string::npos);
  EXPECT_NE(table.find(prof.events()[0].name), std::string::npos) << table;
}

TEST(RunOutputs, APretrainRunWritesMetricsPlotEventsAndProfile) {
  TempDir dir("ingot_outputs_test");
  std::string text;
  for (int i = 0; i < 30; ++i) text += "And the evening and the morning were the first day. ";
  write_text(dir.file("t.txt"), text);
  Config c = Config::parse(
      "device: cpu\nmax_steps: 6\nseed: 1\nmodel: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 8}\n"
      "train: {batch_size: 4, warmup_steps: 1, log_every: 2, eval_every: 3, eval_batches: 2}\n"
      "logging: {tensorboard: true, peak_tflops: 0.05}\nprofile: {enabled: true, start_step: 2, num_steps: 2, top_k: 4}\n",
      "o.yaml");
  c.apply_override("data.path=" + dir.file("t.txt"));
  c.apply_override("output_dir=" + dir.file("run"));
  c.validate(pretrain_schema());
  std::ostringstream log;
  TrainSummary r = run_pretrain(resolve_pretrain(c), log);
  EXPECT_NE(log.str().find("| MFU "), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("| mem "), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("eval | step 3 | val_loss"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("profile | steps 2..3"), std::string::npos) << log.str();
  EXPECT_GT(r.mfu.value_or(0), 0.0);
  std::vector<MetricPoint> pts = read_metrics(r.metrics_log);
  int train = 0, eval = 0;
  for (const MetricPoint& p : pts) (p.kind == "train" ? train : eval) += 1;
  EXPECT_EQ(train, 6);
  EXPECT_EQ(eval, 2);  // step 3 and the final eval
  EXPECT_TRUE(fs::exists(r.loss_plot));
  // loss, lr, tokens/s and the gradient norm per step, and two evals.
  EXPECT_EQ(read_event_file(fs::directory_iterator(r.tensorboard_dir)->path().string()).size(), 6u * 4 + 2);
  nlohmann::json trace = nlohmann::json::parse(read_file(r.profile_trace));
  std::set<int64_t> steps;
  for (const auto& e : trace["traceEvents"])
    if (e.value("cat", "") == "op") steps.insert(e["args"]["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::set<int64_t>{2, 3}));
  nlohmann::json summary = nlohmann::json::parse(read_file(dir.file("run/summary.json")));
  for (const char* key : {"best_loss", "mfu", "checkpoints", "metrics_log", "loss_plot", "profile_trace"})
    EXPECT_TRUE(summary.contains(key)) << key;
}

}  // namespace
}  // namespace ingot::recipes
