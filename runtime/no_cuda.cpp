// Built instead of the CUDA sources when INGOT_CUDA is off: every CUDA entry point throws a clear error, so
// the rest of the code needs no #ifdefs.
#include "runtime/cuda_runtime.h"
#include "runtime/kernels/cuda/gemm_sm90.h"
#include "runtime/kernels/cuda/hopper.h"
#include "runtime/kernels/kernels.h"
#include "runtime/sm_budget.h"

namespace ingot {

[[noreturn]] static void no_cuda(const char* what) {
  INGOT_FAIL(what, ": ingot was built without CUDA (reconfigure with -DINGOT_CUDA=ON on a machine with nvcc)");
}

int cuda_device_count() { return 0; }
Allocator& cuda_allocator(int) { no_cuda("cuda_allocator"); }

namespace cuda {
Event::Event() { no_cuda("cuda::Event"); }
Event::~Event() = default;
void Event::record(Stream) { no_cuda("cuda::Event::record"); }
void Event::synchronize() { no_cuda("cuda::Event::synchronize"); }
void Event::wait(Stream) { no_cuda("cuda::Event::wait"); }
float Event::elapsed_ms(const Event&) const { no_cuda("cuda::Event::elapsed_ms"); }
void set_device(int) { no_cuda("cuda::set_device"); }
int current_device() { no_cuda("cuda::current_device"); }
int multiprocessor_count(int) { no_cuda("cuda::multiprocessor_count"); }
Stream create_stream(int) { no_cuda("cuda::create_stream"); }
void destroy_stream(Stream) { no_cuda("cuda::destroy_stream"); }
Stream current_stream(int) { no_cuda("cuda::current_stream"); }
void set_current_stream(Stream) { no_cuda("cuda::set_current_stream"); }
void synchronize_stream(Stream) { no_cuda("cuda::synchronize_stream"); }
int stream_priority(Stream) { no_cuda("cuda::stream_priority"); }
std::pair<int, int> stream_priority_range(int) { no_cuda("cuda::stream_priority_range"); }
void begin_capture(Stream) { no_cuda("cuda::begin_capture"); }
bool is_capturing(Stream) { return false; }
void* end_capture(Stream) { no_cuda("cuda::end_capture"); }
void abort_capture(Stream) {}
void launch_graph(void*, Stream) { no_cuda("cuda::launch_graph"); }
void hold_stream(Stream, double) { no_cuda("cuda::hold_stream"); }
void destroy_graph(void*) {}
void synchronize_device(int) { no_cuda("cuda::synchronize_device"); }
void* host_alloc_pinned(size_t) { no_cuda("cuda::host_alloc_pinned"); }
void host_free_pinned(void*) {}
void copy_to_device_async(void*, const void*, size_t, Stream) { no_cuda("cuda::copy_to_device_async"); }
void copy_to_host_async(void*, const void*, size_t, Stream) { no_cuda("cuda::copy_to_host_async"); }
void profiler_start() { no_cuda("cuda::profiler_start"); }
void profiler_stop() { no_cuda("cuda::profiler_stop"); }
void memcpy(void*, const void*, size_t, CopyKind, int) { no_cuda("cuda::memcpy"); }
}  // namespace cuda

namespace kernels::cuda {
#define INGOT_KERNEL(name, params) \
  void name params { no_cuda("kernel " #name); }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "runtime/kernels/kernel_list.inc"
#pragma GCC diagnostic pop
#undef INGOT_KERNEL
bool hopper_paths(int) { return false; }
int compute_major(int) { return 0; }
namespace sm90 {
bool available(int) { return false; }
bool enabled() { return false; }
void set_enabled(bool) {}
bool applies(const GeluGemm&) { return false; }
bool gelu_gemm(const GeluGemm&, void*) { return false; }
}  // namespace sm90
}  // namespace kernels::cuda

}  // namespace ingot
