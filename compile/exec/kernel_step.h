// The executor's side of a compiled kernel: a step that gathers a lowered group's inputs from the value
// environment, allocates its outputs (or, for the optimizer update, writes in place where the graph allows
// it) and calls the kernel through the C ABI of compile/codegen/common/kernel_spec.h.
#pragma once

#include <functional>
#include <vector>

#include "compile/lower/lower_kernel.h"

namespace ingot::compiler {

using KernelStepFn = std::function<void(std::vector<Tensor>& env)>;
// A compiled kernel of either backend (codegen::cpu::CpuKernel, codegen::cuda::CudaKernel): buffer pointers
// live on the kernel's device, syms and scalars on the host.
using KernelCall = std::function<void(void* const* bufs, const int64_t* syms, const double* scalars)>;

KernelStepFn make_kernel_step(const Graph& g, const LoweredGroup& lg, KernelCall kernel);

}  // namespace ingot::compiler
