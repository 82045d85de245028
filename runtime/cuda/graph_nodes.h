// Rewrites of a captured CUDA graph before it is instantiated (runtime/cuda/runtime.cpp's end_capture).
#pragma once

#include <cuda_runtime.h>

namespace ingot::cuda::detail {

// Note [Small memsets in CUDA graphs]: replaces every memset node of at most kSmallMemsetBytes of the current
// device's memory with a one-block kernel node that writes the same bytes, keeping the node's edges. Returns
// how many were replaced.
inline constexpr size_t kSmallMemsetBytes = 256;
int small_memsets_to_kernels(cudaGraph_t graph);

}  // namespace ingot::cuda::detail
