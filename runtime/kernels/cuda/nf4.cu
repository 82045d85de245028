// NF4 dequantization on the GPU (format: runtime/kernels/nf4.h), the just-in-time half of a QLoRA projection:
// nf4_linear (autograd/ops/nf4_linear.cpp) dequantizes one weight into a scratch buffer of the compute dtype
// and hands it to the matmul kernel (cuBLASLt), which frees it after the product.
//
// Approach: one thread per 32-bit word of codes (8 weights, 4 bytes); a 64-block is 8 consecutive threads, which
// each recompute its absmax from the 8-bit code, the chunk scale and the offset (three cached loads) instead of
// sharing it through shared memory. The absmax is map[q] * scale + offset with __fmul_rn / __fadd_rn, never an
// FMA, and each weight codebook[c] * absmax rounded once, so the result equals the CPU kernel's bit for bit.
// Memory bound: reads 0.5 byte and writes 2 (bf16) per weight.
// Note [NF4 codebook and stores]: the 16-entry codebook is indexed by each thread's own codes, so a warp reads up to
// 16 different entries at once: from __constant__ memory, whose cache serves one address per cycle, those reads
// serialize; from shared memory they are one bank each. A thread's 8 results go out as whole 16-byte stores (one for
// bf16/f16, two for f32) when the output is 16-byte aligned (scratch buffers are), else element by element. The QLoRA
// 8B step spent ~44 ms more than bf16 LoRA's for ~40 GB of dequantization (~0.9 TB/s; twenty-eighth session, before
// this change; not yet measured after it).
//   out [n] (f32/bf16/f16), codes [n / 8] i32, absmax_codes [>= n / 256] i32, absmax_scales [>= n / 16384] f32,
//   absmax_map [256] f32.
#include "runtime/kernels/cuda/common.cuh"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/nf4.h"

namespace ingot::kernels::cuda {
namespace {

constexpr int kBlock = 256;

__constant__ float c_nf4_codebook[16] = {INGOT_NF4_CODEBOOK};

// kernels

template <typename T, bool kVector>
__global__ void nf4_dequantize_kernel(T* __restrict__ out, const uint32_t* __restrict__ codes,
                                      const uint8_t* __restrict__ absmax_codes,
                                      const float* __restrict__ absmax_scales, const float* __restrict__ map,
                                      float offset, int64_t words) {
  constexpr int64_t kWordsPerBlock = kNf4BlockSize / 8;
  __shared__ float codebook[16];  // Note [NF4 codebook and stores]
  if (threadIdx.x < 16) codebook[threadIdx.x] = c_nf4_codebook[threadIdx.x];
  __syncthreads();
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = w / kWordsPerBlock;
    const float absmax = __fadd_rn(__fmul_rn(__ldg(map + __ldg(absmax_codes + b)),
                                             __ldg(absmax_scales + b / kNf4AbsmaxBlockSize)),
                                   offset);
    const uint32_t word = __ldg(codes + w);
    float v[8];
#pragma unroll
    for (int byte = 0; byte < 4; ++byte) {
      // Little-endian: byte k of the word is byte 4w + k of the packed codes; its high nibble comes first.
      const uint32_t c = (word >> (8 * byte)) & 0xffu;
      v[2 * byte] = __fmul_rn(codebook[c >> 4], absmax);
      v[2 * byte + 1] = __fmul_rn(codebook[c & 15u], absmax);
    }
    T* o = out + w * 8;
    if constexpr (!kVector) {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = from_acc<T>(v[i]);
    } else if constexpr (sizeof(T) == 4) {
      reinterpret_cast<float4*>(o)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(o)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      union {
        uint4 whole;
        T parts[8];
      } pack;
#pragma unroll
      for (int i = 0; i < 8; ++i) pack.parts[i] = from_acc<T>(v[i]);
      *reinterpret_cast<uint4*>(o) = pack.whole;
    }
  }
}

}  // namespace

// launchers

void nf4_dequantize(const Tensor& out, const Tensor& codes, const Tensor& absmax_codes, const Tensor& absmax_scales,
                    const Tensor& absmax_map, double absmax_offset) {
  check_same_device("nf4_dequantize", {&out, &codes, &absmax_codes, &absmax_scales, &absmax_map});
  const int64_t n = out.numel(), nb = n / kNf4BlockSize;
  INGOT_INTERNAL_CHECK(out.is_contiguous() && n % kNf4BlockSize == 0 && codes.numel() * 8 == n &&
                           absmax_codes.numel() * 4 >= nb &&
                           absmax_scales.numel() * kNf4AbsmaxBlockSize >= nb && absmax_map.numel() == 256,
                       "nf4_dequantize kernel: operands do not describe ", shape_str(out.shape()));
  if (n == 0) return;
  LaunchContext ctx(out);
  const int64_t words = n / 8;
  const unsigned grid = grid_for(words, kBlock, ctx.device);
  const bool aligned = reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;  // Note [NF4 codebook and stores]
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = aligned ? nf4_dequantize_kernel<T, true> : nf4_dequantize_kernel<T, false>;
    kernel<<<grid, kBlock, 0, ctx.stream>>>(
        static_cast<T*>(out.data_ptr()), static_cast<const uint32_t*>(codes.data_ptr()),
        static_cast<const uint8_t*>(absmax_codes.data_ptr()), absmax_scales.data<float>(), absmax_map.data<float>(),
        static_cast<float>(absmax_offset), words);
  };
  switch (out.dtype()) {
    case DType::f32: launch(float{}); break;
    case DType::bf16: launch(bf16{}); break;
    case DType::f16: launch(half{}); break;
    default: INGOT_FAIL("nf4_dequantize: expected an f32, bf16 or f16 output, got ", dtype_name(out.dtype()));
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace ingot::kernels::cuda
