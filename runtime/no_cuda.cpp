// Built instead of the CUDA sources when INGOT_CUDA is off: every CUDA entry point throws a clear error, so
// the rest of the code needs no #ifdefs.
#include "runtime/cuda_runtime.h"
#include "runtime/kernels/kernels.h"

namespace ingot {

[[noreturn]] static void no_cuda(const char* what) {
  INGOT_FAIL(what, ": ingot was built without CUDA (reconfigure with -DINGOT_CUDA=ON on a machine with nvcc)");
}

int cuda_device_count() { return 0; }
Allocator& cuda_allocator(int) { no_cuda("cuda_allocator"); }

namespace kernels::cuda {
#define INGOT_KERNEL(name, params) \
  void name params { no_cuda("kernel " #name); }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "runtime/kernels/kernel_list.inc"
#pragma GCC diagnostic pop
#undef INGOT_KERNEL
}  // namespace kernels::cuda

}  // namespace ingot
