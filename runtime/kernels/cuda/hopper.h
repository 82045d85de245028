// Which GPUs take the kernels written for Hopper (a host-side query: .cpp files and tests include it too).
#pragma once

namespace ingot::kernels::cuda {

// Note [Hopper-only paths]: whether the kernels written for sm_90 (the own wgmma GELU product, the cross-entropy
// rows staged by bulk copies) may run on `device`: compute capability 9 or newer (the wgmma product also asks for
// exactly 9.0) and INGOT_HOPPER not set to 0. Every such path asks this first and otherwise takes its general
// kernel (cuBLASLt, the unstaged fused kernel), so other GPUs run the same ops; INGOT_HOPPER=0 takes the general
// kernels on a Hopper too, to prove them there.
bool hopper_paths(int device);
// Compute capability major version of `device` (cached; common.cu).
int compute_major(int device);

}  // namespace ingot::kernels::cuda
