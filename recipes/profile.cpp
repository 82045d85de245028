#include "recipes/profile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "runtime/cuda_runtime.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

namespace {

std::string shape_text(const Tensor& t) {
  if (!t.defined()) return "-";
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) {  // appended piece by piece: GCC 12 warns (-Wrestrict) on a + chain
    if (i) s += ',';
    s += std::to_string(t.size(i));
  }
  return s + "]";
}

std::string shapes_of(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  std::string s;
  for (size_t i = 0; i < inputs.size() && i < 6; ++i) s += (i ? " x " : "") + shape_text(inputs[i]);
  if (inputs.size() > 6) s += " x ... (" + std::to_string(inputs.size()) + " inputs)";
  s += " -> ";
  for (size_t i = 0; i < outputs.size() && i < 3; ++i) s += (i ? ", " : "") + shape_text(outputs[i]);
  if (outputs.size() > 3) s += ", ...";
  return s;
}

}  // namespace

OpProfiler::OpProfiler() : origin_(Clock::now()) {}

OpProfiler::OpProfiler(int cuda_index) : origin_(Clock::now()), device_(cuda_index) {}

OpProfiler::~OpProfiler() {
  if (op_profiler_hook() == this) set_op_profiler_hook(nullptr);
}

double OpProfiler::now_us() const { return std::chrono::duration<double, std::micro>(Clock::now() - origin_).count(); }

void OpProfiler::sync_device(const std::vector<Tensor>& tensors) const {
  if (device_ >= 0) return;  // Note [Ops timed on the device]: nothing waits
  for (const Tensor& t : tensors)
    if (t.defined() && t.device().is_cuda()) {
      cuda::synchronize_device(t.device().index);
      return;
    }
}

void OpProfiler::start(int64_t step) {
  INGOT_CHECK(!active_, "OpProfiler::start: already recording step ", step_);
  INGOT_CHECK(op_profiler_hook() == nullptr, "OpProfiler::start: another profiler is installed");
  step_ = step;
  step_start_us_ = now_us();
  active_ = true;
  if (device_ >= 0) {
    next_event_ = 0;  // the events of earlier steps were read by their stop()
    timed_.clear();
    open_events_.clear();
    step_event_ = record_event();
  }
  set_op_profiler_hook(this);
}

void OpProfiler::stop() {
  if (!active_) return;
  set_op_profiler_hook(nullptr);
  active_ = false;
  open_.clear();
  if (device_ < 0) {
    steps_.push_back({"step " + std::to_string(step_), "", step_, step_start_us_, now_us() - step_start_us_});
    return;
  }
  // Note [Ops timed on the device]: the step's events are read once its last one was reached.
  auto event = [&](size_t i) { return static_cast<cuda::Event*>(pool_[i].get()); };
  const size_t last = record_event();
  event(last)->synchronize();
  const cuda::Event& origin = *event(step_event_);
  for (const Timed& t : timed_) {
    const double start = origin.elapsed_ms(*event(t.begin)) * 1e3, end = origin.elapsed_ms(*event(t.end)) * 1e3;
    events_.push_back({t.name, t.shapes, t.step, step_start_us_ + start, end - start});
  }
  timed_.clear();
  open_events_.clear();
  const double step_us = origin.elapsed_ms(*event(last)) * 1e3;
  steps_.push_back({"step " + std::to_string(step_), "", step_, step_start_us_, step_us});
}

size_t OpProfiler::record_event() {
  if (next_event_ == pool_.size()) {  // an event belongs to the device current when it is made
    const int was = cuda::current_device();
    cuda::set_device(device_);
    pool_.push_back(std::make_shared<cuda::Event>());
    cuda::set_device(was);
  }
  static_cast<cuda::Event*>(pool_[next_event_].get())->record(cuda::current_stream(device_));
  return next_event_++;
}

void OpProfiler::open(double host_us) {
  if (device_ >= 0) open_events_.push_back(record_event());
  else open_.push_back(host_us);
}

void OpProfiler::close(std::string name, std::string shapes, double host_us, bool launched_nothing) {
  if (device_ >= 0) {
    if (open_events_.empty()) return;  // started mid-op
    const size_t begin = open_events_.back();
    open_events_.pop_back();
    // A view launched nothing: its end is its begin, so the two events' own ~3 us on the stream are not
    // counted as the op's (every reshape and slice showed ~3 us: bench/RESULTS.md 2026-11-27).
    timed_.push_back({std::move(name), std::move(shapes), step_, begin, launched_nothing ? begin : record_event()});
    return;
  }
  if (open_.empty()) return;  // started mid-op
  const double start = open_.back();
  open_.pop_back();
  events_.push_back({std::move(name), std::move(shapes), step_, start, host_us - start});
}

void OpProfiler::begin_op(const Primitive&) {
  // The op's inputs are not visible here; syncing every visible GPU would be needed for exactness, but the
  // previous op's end_op already synchronized its device, which is the one this op runs on.
  open(now_us());
}

void OpProfiler::end_op(const Primitive& p, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  sync_device(outputs);
  // A view op whose every output shares an input's storage launched nothing (a reshape that had to copy has
  // storage of its own; an in-place op shares it too, but is no view op).
  bool view = p.fusion_kind() == FusionKind::View && !outputs.empty();
  for (size_t k = 0; view && k < outputs.size(); ++k) {
    const Tensor& o = outputs[k];
    view = o.defined() && std::any_of(inputs.begin(), inputs.end(), [&](const Tensor& i) {
             return i.defined() && o.storage() == i.storage();
           });
  }
  close(std::string(p.name()), shapes_of(inputs, outputs), now_us(), view);
}

void OpProfiler::begin_kernel(const std::string&) { open(now_us()); }

void OpProfiler::end_kernel(const std::string& name, const std::vector<Tensor>& outputs) {
  sync_device(outputs);
  close(name, shapes_of({}, outputs), now_us());
}

std::string OpProfiler::chrome_trace_json() const {
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", "ingot eager ops"}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", "steps"}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 1}, {"args", {{"name", "ops"}}}});
  for (const Event& s : steps_)
    events.push_back(
        {{"name", s.name}, {"ph", "X"}, {"pid", 0}, {"tid", 0}, {"ts", s.start_us}, {"dur", s.dur_us}, {"cat", "step"}});
  for (const Event& e : events_)
    events.push_back({{"name", e.name},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", 1},
                      {"ts", e.start_us},
                      {"dur", e.dur_us},
                      {"cat", "op"},
                      {"args", {{"shapes", e.shapes}, {"step", e.step}}}});
  nlohmann::ordered_json j;
  j["traceEvents"] = std::move(events);
  j["displayTimeUnit"] = "ms";
  return j.dump() + "\n";
}

std::string OpProfiler::top_ops_table(int top_k) const {
  struct Agg {
    int64_t calls = 0;
    double total_us = 0;
  };
  std::map<std::string, Agg> by_name;
  double all = 0;
  for (const Event& e : events_) {
    Agg& a = by_name[e.name];
    ++a.calls;
    a.total_us += e.dur_us;
    all += e.dur_us;
  }
  std::vector<std::pair<std::string, Agg>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.total_us > b.second.total_us; });
  size_t w = 2;
  for (const auto& [name, a] : rows) w = std::max(w, name.size());
  std::ostringstream os;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-*s %8s %11s %10s %7s\n", static_cast<int>(w), "op", "calls", "total ms", "mean us",
                "share");
  os << buf;
  for (size_t i = 0; i < rows.size() && i < static_cast<size_t>(top_k); ++i) {
    const auto& [name, a] = rows[i];
    std::snprintf(buf, sizeof buf, "%-*s %8lld %11.3f %10.1f %6.1f%%\n", static_cast<int>(w), name.c_str(),
                  static_cast<long long>(a.calls), a.total_us / 1e3, a.total_us / static_cast<double>(a.calls),
                  all > 0 ? 100.0 * a.total_us / all : 0.0);
    os << buf;
  }
  std::snprintf(buf, sizeof buf,
                "(%zu ops, %.3f ms of op time over %zu profiled step(s); nested ops count in both%s)\n",
                events_.size(), all / 1e3, steps_.size(),
                device_ >= 0 ? "; timed on the device by events, nothing synchronized" : "");
  os << buf;
  return os.str();
}

std::string OpProfiler::write(const std::string& dir, int top_k) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  INGOT_CHECK(!ec, "cannot create profile directory '", dir, "': ", ec.message());
  std::string trace = (fs::path(dir) / "trace.json").string();
  std::string json = chrome_trace_json();
  write_file_atomic(trace, [&](std::FILE* f) { write_bytes(f, json.data(), json.size()); });
  std::string table = top_ops_table(top_k);
  write_file_atomic((fs::path(dir) / "top_ops.txt").string(),
                    [&](std::FILE* f) { write_bytes(f, table.data(), table.size()); });
  return trace;
}

}  // namespace ingot::recipes
