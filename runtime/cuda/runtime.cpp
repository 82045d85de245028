// runtime/cuda_runtime.h on the CUDA runtime API: device selection, streams, events, copies, and the
// error reporting behind CUDA_CHECK / CUBLAS_CHECK.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <cuda_profiler_api.h>

#include "runtime/cuda/check.h"
#include "runtime/cuda/graph_nodes.h"
#include "runtime/device.h"
#include "runtime/sm_budget.h"

namespace ingot {

int cuda_device_count() {
  // Asked once: the answer cannot change within a process (CUDA reads CUDA_VISIBLE_DEVICES at init). With no
  // driver or no GPU the runtime reports an error, which here simply means "no devices".
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear it so the next checked call does not see it
      return 0;
    }
    return n;
  }();
  return count;
}

namespace cuda {
namespace detail {

void throw_cuda_error(const char* file, int line, const char* expr, cudaError_t err) {
  cudaGetLastError();  // non-sticky errors would otherwise be reported again by the next launch check
  throw Error(ingot::detail::str_cat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                                     ") in ", expr, " at ", file, ":", line));
}

void throw_cublas_error(const char* file, int line, const char* expr, cublasStatus_t status) {
  throw Error(ingot::detail::str_cat("cuBLAS error ", cublasGetStatusName(status), " (",
                                     cublasGetStatusString(status), ") in ", expr, " at ", file, ":", line));
}

}  // namespace detail

namespace {

void check_device(int device, const char* what) {
  int n = cuda_device_count();
  INGOT_CHECK(device >= 0 && device < n, what, ": CUDA device ", device, " does not exist (", n,
              " device(s) visible)");
}

// Current stream per device, per thread (as in PyTorch): a thread that sets a stream does not redirect the
// kernels of other threads. Starts as the legacy default stream.
std::vector<Stream>& thread_streams() {
  thread_local std::vector<Stream> streams;
  if (streams.empty()) {
    int n = cuda_device_count();
    for (int i = 0; i < n; ++i) streams.push_back(Stream{nullptr, i});
  }
  return streams;
}

}  // namespace

Event::Event() {
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreate(&e));
  handle_ = e;
}

Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

// A Stream{nullptr, d} is the legacy default stream of device d, but the runtime resolves a null handle on the
// *current* device: the device is made current first (Note [Null streams name the current device], check.h).
void Event::record(Stream s) {
  DeviceGuard g(s.device);
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(s.handle)));
}

void Event::synchronize() { CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_))); }

void Event::wait(Stream s) {
  DeviceGuard g(s.device);
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s.handle), static_cast<cudaEvent_t>(handle_), 0));
}

float Event::elapsed_ms(const Event& end) const {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_), static_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

void set_device(int index) {
  check_device(index, "set_device");
  CUDA_CHECK(cudaSetDevice(index));
}

int current_device() {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

int multiprocessor_count(int device) {
  check_device(device, "multiprocessor_count");
  // Asked on every kernel launch that sizes its grid by it (runtime/sm_budget.h): one query per device.
  static std::vector<std::atomic<int>> known(static_cast<size_t>(cuda_device_count()));
  std::atomic<int>& n = known[static_cast<size_t>(device)];
  if (int v = n.load(std::memory_order_relaxed); v > 0) return v;
  int v = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device));
  n.store(v);
  return v;
}

Stream create_stream(int device) {
  check_device(device, "create_stream");
  DeviceGuard g(device);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream{s, device};
}

void destroy_stream(Stream s) {
  if (!s.handle) return;  // the default stream is not ours to destroy
  DeviceGuard g(s.device);
  CUDA_CHECK(cudaStreamDestroy(static_cast<cudaStream_t>(s.handle)));
}

Stream current_stream(int device) {
  check_device(device, "current_stream");
  return thread_streams()[static_cast<size_t>(device)];
}

void set_current_stream(Stream s) {
  check_device(s.device, "set_current_stream");
  thread_streams()[static_cast<size_t>(s.device)] = s;
}

void begin_capture(Stream s) {
  DeviceGuard g(s.device);
  CUDA_CHECK(cudaStreamBeginCapture(static_cast<cudaStream_t>(s.handle), cudaStreamCaptureModeRelaxed));
}

int stream_priority(Stream s) {
  DeviceGuard g(s.device);
  int p = 0;
  CUDA_CHECK(cudaStreamGetPriority(static_cast<cudaStream_t>(s.handle), &p));
  return p;
}

std::pair<int, int> stream_priority_range(int device) {
  DeviceGuard g(device);
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return {least, greatest};
}

bool is_capturing(Stream s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(s.handle), &st));
  return st != cudaStreamCaptureStatusNone;
}

void* end_capture(Stream s) {
  DeviceGuard g(s.device);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(s.handle), &graph));
  try {
    detail::small_memsets_to_kernels(graph);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  CUDA_CHECK(err);
  return exec;
}

void abort_capture(Stream s) {
  DeviceGuard g(s.device);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;  // not is_capturing: an abort must not throw
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(s.handle), &st) == cudaSuccess &&
      st != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(static_cast<cudaStream_t>(s.handle), &graph) == cudaSuccess && graph)
      cudaGraphDestroy(graph);
  }
  cudaGetLastError();
}

void launch_graph(void* exec, Stream s) {
  DeviceGuard g(s.device);
  CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(s.handle)));
}

void hold_stream(Stream s, double ms) {
  DeviceGuard g(s.device);
  // Each hold carries its own length (a shared static would let a later call change an earlier hold's).
  auto* hold_ms = new double(ms);
  const cudaError_t e = cudaLaunchHostFunc(
      static_cast<cudaStream_t>(s.handle),
      [](void* p) {
        std::unique_ptr<double> len(static_cast<double*>(p));
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*len));
      },
      hold_ms);
  if (e != cudaSuccess) delete hold_ms;
  CUDA_CHECK(e);
}

void destroy_graph(void* exec) {
  if (exec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
}

void profiler_start() { CUDA_CHECK(cudaProfilerStart()); }
void profiler_stop() { CUDA_CHECK(cudaProfilerStop()); }

void synchronize_stream(Stream s) {
  DeviceGuard g(s.device);
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle)));
}

void synchronize_device(int device) {
  check_device(device, "synchronize_device");
  DeviceGuard g(device);
  CUDA_CHECK(cudaDeviceSynchronize());
}

void* host_alloc_pinned(size_t nbytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(nbytes, 1), cudaHostAllocDefault));
  return p;
}

void host_free_pinned(void* p) {
  if (p) CUDA_CHECK(cudaFreeHost(p));
}

void copy_to_device_async(void* dst, const void* src, size_t nbytes, Stream s) {
  if (nbytes == 0) return;
  DeviceGuard g(s.device);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(s.handle)));
}

void copy_to_host_async(void* dst, const void* src, size_t nbytes, Stream s) {
  if (nbytes == 0) return;
  DeviceGuard g(s.device);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s.handle)));
}

void memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind, int device) {
  if (nbytes == 0) return;
  check_device(device, "memcpy");
  DeviceGuard g(device);
  cudaStream_t s = raw_stream(device);
  cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                      : cudaMemcpyDeviceToDevice;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, k, s));
  // Host memory is pageable and owned by the caller: it must be done with before we return.
  if (kind != CopyKind::DeviceToDevice) CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace cuda
}  // namespace ingot
