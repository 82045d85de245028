#include "recipes/metrics.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

MetricsLog::MetricsLog(const std::string& path, int64_t keep_until_step) : path_(path) {
  std::error_code ec;
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  INGOT_CHECK(!ec, "cannot create the directory of metrics log '", path, "': ", ec.message());
  if (keep_until_step >= 0 && fs::exists(path, ec)) {
    std::istringstream in(read_file(path));
    std::string kept, line;
    while (std::getline(in, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<int64_t>() <= keep_until_step)
        kept += line + "\n";
    }
    write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, kept.data(), kept.size()); });
  } else if (keep_until_step < 0) {
    // A fresh run starts a fresh log.
    fs::remove(path, ec);
  }
  f_ = std::fopen(path.c_str(), "ab");
  INGOT_CHECK(f_ != nullptr, "cannot open metrics log '", path, "' for writing: ", std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::append(const std::string& json_line) {
  std::string line = json_line + "\n";
  INGOT_CHECK(std::fwrite(line.data(), 1, line.size(), f_) == line.size() && std::fflush(f_) == 0,
              "cannot append to metrics log '", path_, "': ", std::strerror(errno));
}

int64_t MetricsLog::set_aside_after(int64_t step, const std::string& moved_to) {
  if (f_) std::fclose(f_);
  f_ = nullptr;
  std::istringstream in(read_file(path_));
  std::string kept, moved, line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool later = j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                       j["step"].get<int64_t>() > step;
    (later ? moved : kept) += line + "\n";
    n += later;
  }
  if (n == 0) return 0;
  write_file_atomic(moved_to, [&](std::FILE* f) { write_bytes(f, moved.data(), moved.size()); });
  write_file_atomic(path_, [&](std::FILE* f) { write_bytes(f, kept.data(), kept.size()); });
  return n;
}

std::vector<MetricPoint> read_metrics(const std::string& path, int64_t* bad_lines) {
  std::istringstream in(read_file(path));
  std::vector<MetricPoint> out;
  std::string line;
  int64_t bad = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
      ++bad;
      continue;
    }
    std::string kind = j.value("kind", "train");
    const char* field = kind == "eval" ? "val_loss" : "loss";
    if (!j.contains(field) || !j[field].is_number()) {
      ++bad;
      continue;
    }
    MetricPoint p{kind, j["step"].get<int64_t>(), j[field].get<double>()};
    if (kind != "eval" && j.contains("lr") && j["lr"].is_number()) p.lr = j["lr"].get<double>();
    out.push_back(p);
  }
  if (bad_lines) *bad_lines = bad;
  return out;
}

double transformer_flops_per_token(int64_t trained_params, int64_t frozen_params, int64_t n_layer, int64_t seq_len,
                                   int64_t d_model) {
  return 6.0 * static_cast<double>(trained_params) + 4.0 * static_cast<double>(frozen_params) +
         12.0 * static_cast<double>(n_layer) * static_cast<double>(seq_len) * static_cast<double>(d_model);
}

double peak_flops(bool cuda, bool bf16, double configured_tflops) {
  if (configured_tflops > 0) return configured_tflops * 1e12;
  if (!cuda) return 0;
  return bf16 ? 989.4e12 : 494.7e12;
}

std::string format_count(double n) {
  char buf[32];
  if (n >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

std::string format_duration(double seconds) {
  int64_t t = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return buf;
}

std::string format_bytes(double bytes) {
  char buf[32];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  else if (bytes >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.0f KiB", bytes / 1024.0);
  return buf;
}

std::string progress_line(int64_t step, int64_t total, double loss, double lr, double grad_norm, double tokens_per_s,
                          double mfu, double memory_bytes, double eta_s) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.3f | lr %.1e", static_cast<long long>(step),
                static_cast<long long>(total), loss, lr);
  std::string s = buf;
  if (grad_norm >= 0) {
    std::snprintf(buf, sizeof buf, " | gnorm %.3g", grad_norm);
    s += buf;
  }
  s += " | " + format_count(tokens_per_s) + " tok/s";
  if (mfu >= 0) {
    std::snprintf(buf, sizeof buf, " | MFU %.1f%%", 100.0 * mfu);
    s += buf;
  }
  if (memory_bytes >= 0) s += " | mem peak " + format_bytes(memory_bytes);
  s += " | ETA " + (eta_s >= 0 ? format_duration(eta_s) : std::string("-"));
  return s;
}

}  // namespace ingot::recipes
