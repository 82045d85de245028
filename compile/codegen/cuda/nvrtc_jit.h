// NVRTC: CUDA C++ source to a cubin for one GPU architecture, several programs compiled side by side. Needs
// no GPU (only libnvrtc), so generated code can be checked on any machine with the toolkit.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace ingot::codegen::cuda {

// The compute capability of a device as NVRTC's arch number: 90 for sm_90 (queried from the CUDA runtime).
int device_arch(int device);

// "nvrtc 13.0": part of every cubin's cache key (a new NVRTC may generate other code).
std::string nvrtc_version();

struct NvrtcProgram {
  std::string name;    // e.g. "ingot_kernels_0.cu": what NVRTC's diagnostics call the source
  std::string source;
};

// Options used for every program: --gpu-architecture=sm_<arch> -default-device --std=c++17 --fmad=true
// (no fast math: IEEE division and square roots, denormals kept).
std::vector<std::string> nvrtc_options(int arch);

// Compiles each program to a cubin for sm_<arch>, running up to `max_parallel` NVRTC compilations at once
// (threads). Throws ingot::Error for the first failing program, with NVRTC's log and, for each error it
// names, the offending line of the generated source. `on_done(i)`, when given, is called (serialized) as
// each program i finishes.
std::vector<std::string> compile_cubins(const std::vector<NvrtcProgram>& programs, int arch, int max_parallel,
                                        const std::function<void(size_t)>& on_done = {});

}  // namespace ingot::codegen::cuda
