// The executor's side of a compiled kernel: a step that gathers a lowered group's inputs from the value
// environment, allocates its outputs (or, for the optimizer update, writes in place where the graph allows
// it) and calls the kernel through the C ABI of compile/codegen/kernel_spec.h.
#pragma once

#include <functional>
#include <vector>

#include "compile/codegen/cpu/cpu_codegen.h"
#include "compile/lower_kernel.h"

namespace ingot::compiler {

using KernelStepFn = std::function<void(std::vector<Tensor>& env)>;

KernelStepFn make_kernel_step(const Graph& g, const LoweredGroup& lg, codegen::cpu::CpuKernel kernel);

}  // namespace ingot::compiler
