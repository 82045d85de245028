// The few CUDA driver-API entry points the CUDA codegen needs (module loading, launching, context queries),
// resolved at run time through cudart's cudaGetDriverEntryPointByVersion instead of linking libcuda.
// Why: libcuda.so.1 ships with the NVIDIA driver, not the toolkit. A binary linked against the toolkit's
// stub needs libcuda.so.1 just to start, so every program (tests, the CLI on a CPU-only machine) would fail
// to load where no driver is installed. Resolved lazily, CPU-only machines never touch the driver.
#pragma once

#include <cuda.h>

namespace ingot::codegen::cuda::driver {

struct Api {
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_get_device)(CUdevice*) = nullptr;
  CUresult (*ctx_synchronize)() = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void**, void**) = nullptr;
  CUresult (*mem_alloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*mem_free)(CUdeviceptr) = nullptr;
  CUresult (*memcpy_htod)(CUdeviceptr, const void*, size_t) = nullptr;
};

// The resolved table; the first call resolves every entry and throws, naming the symbol, when the driver
// (or one entry point) is missing.
const Api& api();

}  // namespace ingot::codegen::cuda::driver
