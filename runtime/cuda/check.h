// Checked CUDA / cuBLAS calls and a device guard, for ingot's CUDA sources (runtime/cuda, runtime/kernels/cuda,
// compile/codegen/cuda). A failing call throws ingot::Error naming the call, file:line and the library's own
// error string; nothing here ever exits the process.
//   CUDA_CHECK(cudaMemcpyAsync(...));
//   my_kernel<<<grid, block, 0, stream>>>(...); CUDA_CHECK_LAUNCH();
//   CUBLAS_CHECK(cublasLtMatmul(...));
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "runtime/cuda_runtime.h"
#include "runtime/error.h"

namespace ingot::cuda::detail {
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* expr, cudaError_t err);
[[noreturn]] void throw_cublas_error(const char* file, int line, const char* expr, cublasStatus_t status);
}  // namespace ingot::cuda::detail

#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    cudaError_t _ingot_err = (expr);                                                  \
    if (_ingot_err != cudaSuccess) [[unlikely]]                                       \
      ::ingot::cuda::detail::throw_cuda_error(__FILE__, __LINE__, #expr, _ingot_err); \
  } while (0)

// After a kernel launch: reports bad launch configurations (and earlier asynchronous faults) right here.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                      \
    cublasStatus_t _ingot_st = (expr);                                                      \
    if (_ingot_st != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                    \
      ::ingot::cuda::detail::throw_cublas_error(__FILE__, __LINE__, #expr, _ingot_st);      \
  } while (0)

namespace ingot::cuda {

// Makes `device` current for the guard's lifetime and restores the previous device afterwards. Kernels launch
// under a guard for their tensors' device, so calling code may have any device current.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) CUDA_CHECK(cudaSetDevice(device));
    cur_ = device;
  }
  ~DeviceGuard() {
    if (prev_ != cur_) cudaSetDevice(prev_);  // destructor: cannot throw; a failure here resurfaces later
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0, cur_ = 0;
};

// The current stream of `device` as a cudaStream_t.
//
// Note [Null streams name the current device]
// Unless set_current_stream was called, the current stream of every device is its legacy default stream, whose
// handle is nullptr, and the CUDA runtime resolves a null handle on the thread's *current* device. A call that
// takes such a handle (a launch, an event record or stream wait, a stream sync) must run with the stream's
// device current (DeviceGuard), or it acts on another device's stream. Kernel launches do (LaunchContext);
// missing it in the NCCL group's device-side wait made compiled DDP drift on every rank but 0 whose thread still
// had device 0 current (bench/RESULTS.md 2026-11-26: the compute stream of cuda:1 never waited for the
// all-reduce, so the optimizer read a bucket NCCL was still writing).
inline cudaStream_t raw_stream(int device) { return static_cast<cudaStream_t>(current_stream(device).handle); }

}  // namespace ingot::cuda
