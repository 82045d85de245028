// The few CUDA driver-API entry points the CUDA codegen needs (module loading, launching, context queries),
// resolved at run time through cudart's cudaGetDriverEntryPointByVersion instead of linking libcuda.
// Why: libcuda.so.1 ships with the NVIDIA driver, not the toolkit. A binary linked against the toolkit's
// stub needs libcuda.so.1 just to start, so every program (tests, the CLI on a CPU-only machine) would fail
// to load where no driver is installed. Resolved lazily, CPU-only machines never touch the driver.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

namespace ingot::codegen::cuda::driver {

// Each entry is pinned to the ABI version whose signature we call (PFN_<name>_v<version> of cudaTypedefs.h):
// asking for "the toolkit's version" would silently hand back newer variants with other signatures
// (CUDA 13's cuCtxGetDevice and cuCtxSynchronize take a context argument).
struct Api {
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxGetDevice_v2000 ctx_get_device = nullptr;
  PFN_cuCtxSynchronize_v2000 ctx_synchronize = nullptr;
  PFN_cuModuleLoadData_v2000 module_load_data = nullptr;
  PFN_cuModuleGetFunction_v2000 module_get_function = nullptr;
  PFN_cuLaunchKernel_v4000 launch_kernel = nullptr;
  PFN_cuMemAlloc_v3020 mem_alloc = nullptr;
  PFN_cuMemFree_v3020 mem_free = nullptr;
  PFN_cuMemcpyHtoD_v3020 memcpy_htod = nullptr;
  PFN_cuMemcpyHtoDAsync_v3020 memcpy_htod_async = nullptr;
  PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor_v6050 occupancy_max_active_blocks = nullptr;
};

// The resolved table; the first call resolves every entry and throws, naming the symbol, when the driver
// (or one entry point) is missing.
const Api& api();

}  // namespace ingot::codegen::cuda::driver
