// The CUDA runtime pieces the rest of ingot needs: streams, events, copies, device selection. Implemented
// in runtime/cuda/*.cu, or by runtime/no_cuda.cpp (throwing) in CPU-only builds. The header itself needs
// no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace ingot::cuda {

// An opaque cudaStream_t. A null handle is the legacy default stream.
struct Stream {
  void* handle = nullptr;
  int device = 0;
};

class Event {
 public:
  Event();  // created with timing enabled on the current device
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(Stream s);
  void synchronize();
  void wait(Stream s);  // s waits for this event
  float elapsed_ms(const Event& end) const;  // from this event to `end`

 private:
  void* handle_ = nullptr;
};

void set_device(int index);
int current_device();
Stream create_stream(int device);      // non-blocking
void destroy_stream(Stream s);
Stream current_stream(int device);     // the stream eager kernels of `device` launch on
// A stream's scheduling priority, and the range `device` offers as {lowest, highest} (CUDA: lower numbers are
// higher priorities).
int stream_priority(Stream s);
std::pair<int, int> stream_priority_range(int device);
void set_current_stream(Stream s);
// Makes `s` its device's current stream for the scope's lifetime, the previous one again after (exceptions too).
class StreamScope {
 public:
  explicit StreamScope(Stream s) : prev_(current_stream(s.device)) { set_current_stream(s); }
  ~StreamScope() { set_current_stream(prev_); }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  Stream prev_;
};
void synchronize_stream(Stream s);
void synchronize_device(int device);

// CUDA graphs (compile's reduce-overhead mode). Capture is relaxed: the caching allocator may cudaMalloc a new
// segment while a stream captures. A capture that fails (an op that cannot be captured) is ended with
// abort_capture, which also clears the non-sticky error so the caller can run the same work without a graph.
void begin_capture(Stream s);
bool is_capturing(Stream s);
void* end_capture(Stream s);  // returns an instantiated graph (cudaGraphExec_t)
void abort_capture(Stream s);
void launch_graph(void* exec, Stream s);
void destroy_graph(void* exec);

// Stalls `s` for `ms` on a host callback: work queued behind it waits, so a benchmark can queue a whole step
// before the GPU starts it and time the step without the host's launch time in it.
void hold_stream(Stream s, double ms);

// The range an external profiler records when started with profiling off (ncu --profile-from-start off).
void profiler_start();
void profiler_stop();

// Page-locked host memory (what lets a host-to-device copy run asynchronously, overlapping kernels).
void* host_alloc_pinned(size_t nbytes);
void host_free_pinned(void* p);
// Host-to-device copy on stream `s`, returning at once: `src` must be pinned and left untouched until the
// copy is done (an event recorded on `s` after it says when).
void copy_to_device_async(void* dst, const void* src, size_t nbytes, Stream s);
// Device-to-host copy on stream `s`, returning at once: `dst` must be pinned and not read until the copy is done.
void copy_to_host_async(void* dst, const void* src, size_t nbytes, Stream s);

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
// Copies on the current stream of the device involved, then waits for it when host memory is involved.
void memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind, int device);

}  // namespace ingot::cuda
