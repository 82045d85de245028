// The per-op profiler of the `profile:` config section. Eager mode has no kernels of its own to name, so
// it times each Primitive application through apply()'s profiling hook (autograd/primitive.h): forward ops,
// the ops backward runs (VJPs are ordinary ops) and the optimizer's fused update. On CUDA the device is
// synchronized before and after every op while profiling, so each duration covers the op's kernels (this
// serializes the GPU: profiled steps run slower than the others).
//
// Note [Ops timed on the device]: with device timing (profile.device_timing, bench --profile-events) nothing is
// synchronized: a CUDA event is recorded on the device's current stream before and after every op, and the
// step's events are read once it ends. Each duration is then the stream's time from the op's first kernel being
// reached to its last one ending, with the GPU running as in unprofiled steps: beside the communication of a
// data-parallel step (NCCL on its own stream) too, which is what tells which kernels slow down there. Host-side
// gaps show as time no op covers. The events are on the profiled device's current stream: ops on another device,
// or inside a CUDA graph capture, are not timed this way. Each step's stop() waits for its last event.
//
// Output: a Chrome-trace JSON (open it in Perfetto, ui.perfetto.dev, or chrome://tracing) with one complete
// event per op plus one per profiled step, and a top-ops table (calls, total, mean, share of op time).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/primitive.h"

namespace ingot::recipes {

class OpProfiler : public OpProfilerHook {
 public:
  OpProfiler();
  // Note [Ops timed on the device]: ops timed by events on CUDA device `cuda_index`'s current stream; with
  // `cuda_index` < 0 as OpProfiler() (host clock, devices synchronized around every op).
  explicit OpProfiler(int cuda_index);
  ~OpProfiler() override;  // uninstalls itself if still installed
  // Installs / uninstalls the hook; ops between the two are recorded as part of step `step`.
  void start(int64_t step);
  void stop();
  bool active() const { return active_; }

  void begin_op(const Primitive& p) override;
  void end_op(const Primitive& p, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) override;
  void begin_kernel(const std::string& name) override;
  void end_kernel(const std::string& name, const std::vector<Tensor>& outputs) override;

  struct Event {
    std::string name, shapes;  // op name, "[4,8] x [8,16] -> [4,16]"
    int64_t step = 0;
    double start_us = 0, dur_us = 0;
  };
  const std::vector<Event>& events() const { return events_; }

  std::string chrome_trace_json() const;
  // The `top_k` ops by total time: "op  calls  total ms  mean us  %".
  std::string top_ops_table(int top_k) const;
  // Writes trace.json and top_ops.txt into `dir` (atomically); returns the trace path.
  std::string write(const std::string& dir, int top_k) const;

 private:
  using Clock = std::chrono::steady_clock;
  double now_us() const;
  void sync_device(const std::vector<Tensor>& tensors) const;
  // Device timing: records the next event of the pool on the device's current stream; returns its index.
  size_t record_event();
  void open(double host_us);
  // launched_nothing (a view): with device timing the op gets no end event of its own and times 0.
  void close(std::string name, std::string shapes, double host_us, bool launched_nothing = false);
  Clock::time_point origin_;
  int device_ = -1;  // >= 0: Note [Ops timed on the device]
  struct Timed {  // an op waiting for its step's events to be read
    std::string name, shapes;
    int64_t step;
    size_t begin, end;
  };
  std::vector<std::shared_ptr<void>> pool_;  // cuda::Event, reused every step
  size_t next_event_ = 0, step_event_ = 0;
  std::vector<size_t> open_events_;
  std::vector<Timed> timed_;
  bool active_ = false;
  int64_t step_ = 0;
  double step_start_us_ = 0;
  std::vector<double> open_;  // start times of ops in flight (ops nest when one calls another)
  std::vector<Event> events_;
  std::vector<Event> steps_;
};

}  // namespace ingot::recipes
