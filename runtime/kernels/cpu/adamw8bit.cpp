// AdamW with 8-bit moments on the CPU (adamw8bit_multi; format in runtime/kernels/quant8.h). One 256-element
// block per iteration, blocks of large tensors spread over threads: dequantize both moments, update them and the
// parameter with adamw_multi's f32 arithmetic in its order, take the new absmax of each moment, requantize.
//
// params [n] f32, grads [n] any float dtype, codes i32 [ceil(n / 4)] (bytes), absmax f32 [ceil(n / 256)].
#include <algorithm>
#include <cmath>

#include "runtime/kernels/adamw_consts.h"
#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/quant8.h"
#include "runtime/kernels/scalar_math.h"

namespace ingot::kernels::cpu {

void adamw8bit_multi(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                     const std::vector<Tensor>& m_codes, const std::vector<Tensor>& m_absmax,
                     const std::vector<Tensor>& v_codes, const std::vector<Tensor>& v_absmax, const Tensor& signed_map,
                     const Tensor& unsigned_map, const AdamWArgs& args) {
  INGOT_INTERNAL_CHECK(grads.size() == params.size() && m_codes.size() == params.size() &&
                       m_absmax.size() == params.size() && v_codes.size() == params.size() &&
                       v_absmax.size() == params.size());
  const AdamWConsts c = kernels::adamw_consts(args, "adamw8bit_multi");
  check_quant8_map(signed_map, "signed");
  check_quant8_map(unsigned_map, "unsigned");
  const float* map1 = signed_map.data<float>();
  const float* map2 = unsigned_map.data<float>();
  for (size_t i = 0; i < params.size(); ++i) {
    check_adamw8bit_operands(i, params[i], grads[i], m_codes[i], m_absmax[i], v_codes[i], v_absmax[i]);
    // bf16 parameters (no f32 masters) are rounded stochastically (Note [Stochastic rounding], scalar_math.h).
    const bool sr = params[i].dtype() == DType::bf16;
    float* p32 = sr ? nullptr : params[i].data<float>();
    bf16_t* p16 = sr ? params[i].data<bf16_t>() : nullptr;
    auto* q1 = static_cast<uint8_t*>(m_codes[i].data_ptr());
    auto* q2 = static_cast<uint8_t*>(v_codes[i].data_ptr());
    float* a1 = m_absmax[i].data<float>();
    float* a2 = v_absmax[i].data<float>();
    const int64_t n = params[i].numel(), blocks = quant8_blocks(n);
    dispatch_dtype(grads[i].dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* g = grads[i].data<T>();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t lo = b * kQuant8Block, len = std::min(kQuant8Block, n - lo);
        float m[kQuant8Block], v[kQuant8Block];
        float max1 = 0.0f, max2 = 0.0f;
        for (int64_t j = 0; j < len; ++j) {
          const int64_t k = lo + j;
          const float gj = load_one<float>(g + k) * c.scale;
          const float mj = c.b1 * (map1[q1[k]] * a1[b]) + c.one_minus_b1 * gj;
          const float vj = c.b2 * (map2[q2[k]] * a2[b]) + c.one_minus_b2 * gj * gj;
          const float pk = sr ? load_one<float>(p16 + k) : p32[k];
          const float out = pk * c.decay - c.lr * (mj / c.bc1) / (std::sqrt(vj / c.bc2) + c.eps);
          if (sr) store_one(p16 + k, ig_math::round_bf16_stochastic(out, ig_math::stochastic_salt(k, c.step)));
          else p32[k] = out;
          m[j] = mj;
          v[j] = vj;
          max1 = std::max(max1, std::fabs(mj));
          max2 = std::max(max2, std::fabs(vj));
        }
        a1[b] = max1;
        a2[b] = max2;
        const float inv1 = quant8_inverse(max1), inv2 = quant8_inverse(max2);
        for (int64_t j = 0; j < len; ++j) {
          q1[lo + j] = static_cast<uint8_t>(quant8_nearest(map1, quant8_normalize(m[j], inv1)));
          q2[lo + j] = static_cast<uint8_t>(quant8_nearest(map2, quant8_normalize(v[j], inv2)));
        }
      }
    });
  }
}

}  // namespace ingot::kernels::cpu
