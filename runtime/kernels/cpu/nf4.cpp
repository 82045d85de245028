// NF4 dequantization on the CPU (format: runtime/kernels/nf4.h). out [n] = codebook[code[i]] * absmax[i / 64],
// absmax[b] = map[qabs[b]] * scale[b / 256] + offset. One 64-block per iteration; blocks spread over threads.
#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/nf4.h"

namespace ingot::kernels::cpu {

void nf4_dequantize(const Tensor& out, const Tensor& codes, const Tensor& absmax_codes, const Tensor& absmax_scales,
                    const Tensor& absmax_map, double absmax_offset) {
  const int64_t n = out.numel(), nb = n / kNf4BlockSize;
  INGOT_INTERNAL_CHECK(out.is_contiguous() && n % kNf4BlockSize == 0 && codes.numel() * 8 == n &&
                           absmax_codes.numel() * 4 >= nb &&
                           absmax_scales.numel() * kNf4AbsmaxBlockSize >= nb && absmax_map.numel() == 256,
                       "nf4_dequantize kernel: operands do not describe ", shape_str(out.shape()));
  const auto* q = static_cast<const uint8_t*>(codes.data_ptr());
  const auto* qa = static_cast<const uint8_t*>(absmax_codes.data_ptr());
  const float* scales = absmax_scales.data<float>();
  const float* map = absmax_map.data<float>();
  const float offset = static_cast<float>(absmax_offset);
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) {
      T* o = out.data<T>();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
      for (int64_t b = 0; b < nb; ++b) {
        // Product rounded before the sum (the x86-64 baseline this builds for has no FMA), as the CUDA kernel's
        // __fmul_rn / __fadd_rn.
        const float absmax = map[qa[b]] * scales[b / kNf4AbsmaxBlockSize] + offset;
        const uint8_t* qb = q + b * (kNf4BlockSize / 2);
        T* ob = o + b * kNf4BlockSize;
        for (int64_t i = 0; i < kNf4BlockSize / 2; ++i) {
          store_one(ob + 2 * i, kNf4Codebook[qb[i] >> 4] * absmax);
          store_one(ob + 2 * i + 1, kNf4Codebook[qb[i] & 15] * absmax);
        }
      }
    } else {
      INGOT_FAIL("nf4_dequantize: expected an f32, bf16 or f16 output, got ", dtype_name(out.dtype()));
    }
  });
}

}  // namespace ingot::kernels::cpu
