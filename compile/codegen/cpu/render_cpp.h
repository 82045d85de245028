// Renders KernelSpecs to C++ source for the system compiler (see compile/codegen/common/kernel_spec.h for the
// semantics and the calling convention). The generated code depends on nothing but the C++ standard library
// and OpenMP, so a .so built from it can be loaded by any ingot process.
//
// Shape of the generated code:
//   Pointwise     adjacent dims that are contiguous in every buffer are merged first; the outer dims run as
//                 one OpenMP loop, the innermost dim is an `omp simd` loop (with fewer than 4 rows per
//                 thread, each row is split over the threads instead).
//   RowReduction  one OpenMP loop over rows; per row, one `omp simd reduction` loop per reduction phase (a
//                 phase holds the reductions whose inputs are ready: softmax has two, max then sum), then one
//                 epilogue loop for the element outputs; row outputs are stored once per row. A kernel with
//                 a single row (a full reduction) splits its column loops over threads instead.
//   MultiTensor   one OpenMP parallel region; each tensor of the list is a work-shared `omp for simd` loop
//                 (nowait: tensors are independent).
// Work below kParallelThreshold elements stays on the calling thread (no fork/join cost for tiny kernels).
#pragma once

#include <string>

#include "compile/codegen/common/kernel_spec.h"

namespace ingot::codegen::cpu {

inline constexpr int64_t kParallelThreshold = 1 << 15;

// The helpers every translation unit starts with (dtype conversions, vector math declarations).
std::string render_preamble();

// One kernel as an extern "C" function named `symbol`. `spec` is canonicalized and validated here.
std::string render_kernel(const KernelSpec& spec, const std::string& symbol);

// A fingerprint of this renderer: the preamble and the code it produces for a fixed set of probe kernels
// that use every op and kind. Part of the kernel cache key, so a changed renderer never loads libraries
// built from an older one, even under the same ingot version.
const std::string& renderer_fingerprint();

}  // namespace ingot::codegen::cpu
