// The executor's side of a compiled kernel: a step that gathers a lowered group's inputs from the value
// environment, allocates its outputs (or, for the optimizer update, writes in place where the graph allows
// it) and calls the kernel through the C ABI of compile/codegen/common/kernel_spec.h.
#pragma once

#include <functional>
#include <vector>

#include "compile/exec/executor.h"
#include "compile/lower/lower_kernel.h"

namespace ingot::compiler {

// A compiled kernel of either backend (codegen::cpu::CpuKernel, codegen::cuda::CudaKernel): buffer pointers
// live on the kernel's device, syms and scalars on the host.
using KernelCall = std::function<void(void* const* bufs, const int64_t* syms, const double* scalars)>;
// The same kernel reading its scalars from device memory (CUDA multi-tensor kernels only:
// codegen::cuda::CudaKernel::launch_reading_device_scalars).
using DeviceScalarsCall = std::function<void(void* const* bufs, const int64_t* syms, const double* device_scalars)>;

// The step of a lowered group. An optimizer update given `device_call` also gets GroupKernel::host_scalars.
GroupKernel make_kernel_step(const Graph& g, const LoweredGroup& lg, KernelCall kernel,
                             DeviceScalarsCall device_call = {});

}  // namespace ingot::compiler
