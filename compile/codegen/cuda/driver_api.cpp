#include "compile/codegen/cuda/driver_api.h"

#include <cuda_runtime_api.h>

#include "runtime/error.h"

namespace ingot::codegen::cuda::driver {

namespace {

// The ABI version we ask for: the toolkit we were built with, so each entry point has the signature of
// the cuda.h we compiled against (the driver keeps older versions of changed functions under the same name).
template <typename Fn>
void resolve(Fn& slot, const char* symbol) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, CUDART_VERSION, cudaEnableDefault, &status);
  INGOT_CHECK(e == cudaSuccess && status == cudaDriverEntryPointSuccess && p != nullptr,
              "[codegen] cannot resolve the CUDA driver function ", symbol, " (", cudaGetErrorString(e),
              status == cudaDriverEntryPointVersionNotSufficent ? "; the installed driver is older than the toolkit"
                                                                : "",
              ")");
  slot = reinterpret_cast<Fn>(p);
}

Api load() {
  Api a;
  resolve(a.get_error_string, "cuGetErrorString");
  resolve(a.ctx_get_current, "cuCtxGetCurrent");
  resolve(a.ctx_get_device, "cuCtxGetDevice");
  resolve(a.ctx_synchronize, "cuCtxSynchronize");
  resolve(a.module_load_data, "cuModuleLoadData");
  resolve(a.module_get_function, "cuModuleGetFunction");
  resolve(a.launch_kernel, "cuLaunchKernel");
  resolve(a.mem_alloc, "cuMemAlloc");
  resolve(a.mem_free, "cuMemFree");
  resolve(a.memcpy_htod, "cuMemcpyHtoD");
  return a;
}

}  // namespace

const Api& api() {
  static const Api a = load();
  return a;
}

}  // namespace ingot::codegen::cuda::driver
