// Shared machinery of the CUDA eager kernels (include from .cu files only): the device storage type of each
// DType, conversions to the accumulation type (f32 for f32/bf16/f16, f64 for f64, matching the CPU kernels),
// warp/block reductions, and the launch context that selects the tensors' device and current stream.
//
// Conversions to bf16/f16 from double go through float, as the CPU kernels do (runtime/kernels/cpu/loops.h),
// so both backends round identically.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "runtime/cuda/check.h"
#include "runtime/kernels/cuda/hopper.h"
#include "runtime/sm_budget.h"
#include "runtime/tensor.h"

namespace ingot::kernels::cuda {

using bf16 = __nv_bfloat16;
using half = __half;

// Calls f(T{}) with T the device storage type of a floating dtype: float, double, bf16, half.
template <typename F>
decltype(auto) dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(bf16{});
    case DType::f16: return f(half{});
    default: break;
  }
  INGOT_FAIL(op, ": expected a floating dtype (f32, f64, bf16, f16), got ", dtype_name(t));
}

// The type arithmetic on T runs in.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename Acc, typename T>
__device__ __forceinline__ Acc to_acc(T v) {
  if constexpr (std::is_same_v<T, bf16>) return static_cast<Acc>(__bfloat162float(v));
  else if constexpr (std::is_same_v<T, half>) return static_cast<Acc>(__half2float(v));
  else return static_cast<Acc>(v);
}

template <typename T, typename Acc>
__device__ __forceinline__ T from_acc(Acc v) {
  if constexpr (std::is_same_v<T, bf16>) return __float2bfloat16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, half>) return __float2half(static_cast<float>(v));
  else return static_cast<T>(v);
}

// Element `i` of a buffer whose dtype is known only at run time. The switch is uniform across a warp, so it
// costs a few instructions, not divergence; it keeps one kernel per op family instead of one per dtype mix.
template <typename Acc>
__device__ __forceinline__ Acc load_dyn(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::f32: return static_cast<Acc>(static_cast<const float*>(base)[i]);
    case DType::f64: return static_cast<Acc>(static_cast<const double*>(base)[i]);
    case DType::bf16: return static_cast<Acc>(__bfloat162float(static_cast<const bf16*>(base)[i]));
    case DType::f16: return static_cast<Acc>(__half2float(static_cast<const half*>(base)[i]));
    case DType::i32: return static_cast<Acc>(static_cast<const int32_t*>(base)[i]);
    case DType::i64: return static_cast<Acc>(static_cast<const int64_t*>(base)[i]);
    case DType::b8: return static_cast<const uint8_t*>(base)[i] ? Acc(1) : Acc(0);
  }
  return Acc(0);
}

template <typename Acc>
__device__ __forceinline__ void store_dyn(void* base, DType dt, int64_t i, Acc v) {
  switch (dt) {
    case DType::f32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::f64: static_cast<double*>(base)[i] = static_cast<double>(v); break;
    case DType::bf16: static_cast<bf16*>(base)[i] = __float2bfloat16(static_cast<float>(v)); break;
    case DType::f16: static_cast<half*>(base)[i] = __float2half(static_cast<float>(v)); break;
    case DType::i32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::i64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::b8: static_cast<uint8_t*>(base)[i] = v != Acc(0); break;
  }
}

// Reductions within a warp / a block. block_reduce needs blockDim.x a multiple of 32 (up to 1024) and must be
// reached by every thread of the block; every thread gets the result.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = partial[0];
  for (int w = 1; w < nwarps; ++w) v = op(v, partial[w]);
  return v;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Multiprocessors of `device` (cached). Grids sized by the SM count take ingot::usable_sms(device) instead, the
// count less the SM carve-out left to communication (Note [SM carve-out], runtime/sm_budget.h).
int sm_count(int device);
// The most dynamic shared memory one block may opt in to on `device`, in bytes (cached).
int shared_bytes_optin(int device);
// hopper_paths(device): Note [Hopper-only paths], runtime/kernels/cuda/hopper.h.
// Peak DRAM bandwidth per SM in GB/s, from the memory clock and bus width (H100 SXM ~25, H200 ~37).
double dram_gbps_per_sm(int device);
// Blocks for a grid-stride loop over n items with `block` threads each: enough for ~8 blocks per usable SM at most.
unsigned grid_for(int64_t n, int block, int device);

// Puts the device of `t` current for the launch and names its current stream:
//   LaunchContext ctx(out);  kernel<<<grid, block, 0, ctx.stream>>>(...);  CUDA_CHECK_LAUNCH();
struct LaunchContext {
  explicit LaunchContext(const Tensor& t)
      : device(cuda_index(t)), guard(device), stream(ingot::cuda::raw_stream(device)) {}
  static int cuda_index(const Tensor& t) {
    INGOT_INTERNAL_CHECK(t.device().is_cuda(), "CUDA kernel given a tensor on ", t.device().str());
    return t.device().index;
  }
  int device;
  ingot::cuda::DeviceGuard guard;
  cudaStream_t stream;
};

// Checks that every defined tensor lives on the device of the first one (kernel_list.inc's contract).
void check_same_device(const char* op, std::initializer_list<const Tensor*> ts);

}  // namespace ingot::kernels::cuda
