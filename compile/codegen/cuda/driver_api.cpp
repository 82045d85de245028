#include "compile/codegen/cuda/driver_api.h"

#include <cuda_runtime_api.h>

#include "runtime/error.h"

namespace ingot::codegen::cuda::driver {

namespace {

template <typename Fn>
void resolve(Fn& slot, const char* symbol, unsigned version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &status);
  INGOT_CHECK(e == cudaSuccess && status == cudaDriverEntryPointSuccess && p != nullptr,
              "[codegen] cannot resolve the CUDA driver function ", symbol, " (ABI ", version, "): ",
              cudaGetErrorString(e),
              status == cudaDriverEntryPointVersionNotSufficent ? "; the installed driver is too old" : "");
  slot = reinterpret_cast<Fn>(p);
}

Api load() {
  Api a;
  resolve(a.get_error_string, "cuGetErrorString", 6000);
  resolve(a.ctx_get_current, "cuCtxGetCurrent", 4000);
  resolve(a.ctx_get_device, "cuCtxGetDevice", 2000);
  resolve(a.ctx_synchronize, "cuCtxSynchronize", 2000);
  resolve(a.module_load_data, "cuModuleLoadData", 2000);
  resolve(a.module_get_function, "cuModuleGetFunction", 2000);
  resolve(a.launch_kernel, "cuLaunchKernel", 4000);
  resolve(a.mem_alloc, "cuMemAlloc", 3020);
  resolve(a.mem_free, "cuMemFree", 3020);
  resolve(a.memcpy_htod, "cuMemcpyHtoD", 3020);
  resolve(a.memcpy_htod_async, "cuMemcpyHtoDAsync", 3020);
  resolve(a.occupancy_max_active_blocks, "cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050);
  return a;
}

}  // namespace

const Api& api() {
  static const Api a = load();
  return a;
}

}  // namespace ingot::codegen::cuda::driver
