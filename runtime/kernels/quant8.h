// Block-wise 8-bit quantization with the dynamic (tree) map, the state format of 8-bit optimizers (Dettmers et
// al. 2021, "8-bit Optimizers via Block-wise Quantization"), laid out as bitsandbytes' blockwise optimizers keep
// it; written from the paper and that format, not from its code.
//
// A tensor of n f32 values is cut into blocks of kQuant8Block = 256 consecutive elements (the last one may be
// shorter; 256 is bitsandbytes' block for its blockwise optimizers, 2048 was the paper's):
//   absmax[b] = max |x| over block b                                                  (f32, one per block)
//   code[i]   = the index of the map value nearest to x[i] * (1 / absmax[b]) (f32 reciprocal and product,
//               held within [-1, 1]: quant8_normalize; a value exactly between two map values takes the lower
//               index); any code when absmax[b] is 0
//   x'[i]     = map[code[i]] * absmax[b]
// Codes are bytes, held in i32 tensors of ceil(n / 4) elements (ingot has no u8 dtype): byte i of the tensor's
// memory is element i's code. A block of zeros (absmax 0) decodes to zeros whatever its codes, so zero-filled
// codes and absmax are the zero state.
//
// The maps (bitsandbytes' create_dynamic_map with 7 exponent bits, 8 bits in all), 256 values ascending:
//   signed   (first moment):  for e = 0..6, the 2^e midpoints of linspace(0.1, 1, 2^e + 1) times 10^(e - 6),
//                             with both signs, plus 0 and 1: [-0.99297, 1], 0 at index 127
//   unsigned (second moment): for e = 0..6, the 2^(e+1) midpoints of linspace(0.1, 1, 2^(e+1) + 1) times
//                             10^(e - 6), plus 0 and 1: [0, 1], 0 at index 0
// Each decade [10^(e-7), 10^(e-6)] of magnitudes gets twice the values of the one below it: small moments keep
// their relative precision, which a linear map loses (the paper's section 2.2). Computed in f32 as torch does.
//
// State bytes of a tensor of n elements with both moments quantized: 2 * (4 ceil(n / 4) + 4 ceil(n / 256)),
// about 2.03 bytes an element against 8 for f32 AdamW. Tensors under kQuant8MinElements elements keep f32
// state (bitsandbytes' min_8bit_size): their share of the memory is small and their statistics are noisy.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/kernels/kernels.h"

namespace ingot {

constexpr int64_t kQuant8Block = 256;
constexpr int64_t kQuant8MinElements = 4096;

// The signed and unsigned dynamic maps described above.
const std::array<float, 256>& quant8_signed_map();
const std::array<float, 256>& quant8_unsigned_map();

// Elements of the i32 tensor holding the codes of n values, and blocks (absmax values) of n values.
constexpr int64_t quant8_code_words(int64_t n) { return (n + 3) / 4; }
constexpr int64_t quant8_blocks(int64_t n) { return (n + kQuant8Block - 1) / kQuant8Block; }

// The index of the value of the ascending 256-value `map` nearest to x; a tie takes the lower index. Binary
// search plus one comparison of distances, the same float operations on the host and on a GPU (no products to
// contract), so both find the same code. The GPU kernel starts its search nearer (quant8_lower_bound from a
// table of lower bounds, adamw8bit.cu) and ends with the same quant8_pick, so it finds the same code too.
//
// The first index whose value is >= x (256 if none; NaN gives 0): the count of values below x, in eight halving
// steps without a data-dependent branch (a conditional add), which the host runs ~4x faster than a branching
// search on random moments (the checkpoints' requantization, Note [8-bit state element by element]).
INGOT_HD int quant8_lower_bound(const float* map, float x) {
  int lo = 0;
  for (int half = 128; half >= 1; half >>= 1) lo += map[lo + half - 1] < x ? half : 0;
  return lo;
}
// The nearer of map[lo - 1] and map[lo] given lo = quant8_lower_bound(map, x).
INGOT_HD int quant8_pick(const float* map, float x, int lo) {
  if (lo == 0) return 0;
  if (lo == 256) return 255;
  return (map[lo] - x) < (x - map[lo - 1]) ? lo : lo - 1;
}
INGOT_HD int quant8_nearest(const float* map, float x) { return quant8_pick(map, x, quant8_lower_bound(map, x)); }

// A block's values normalized for the search: one f32 division a block (quant8_inverse), then a product an element,
// held within [-1, 1] (the product of the absmax itself may land an ulp beyond 1; every map lies within [-1, 1],
// so the nearest code is unchanged, and NaN becomes -1). A division an element cost the GPU kernel ~10% of its time.
INGOT_HD float quant8_inverse(float absmax) {
#if defined(__CUDA_ARCH__)
  return absmax > 0.0f ? __fdiv_rn(1.0f, absmax) : 0.0f;
#else
  return absmax > 0.0f ? 1.0f / absmax : 0.0f;
#endif
}
INGOT_HD float quant8_normalize(float x, float inverse) { return fminf(fmaxf(x * inverse, -1.0f), 1.0f); }

// `map` as the [256] f32 tensor on `device` that adamw8bit_multi takes.
Tensor quant8_map_tensor(const std::array<float, 256>& map, Device device = Device::cpu());

// Host quantization of n f32 values (format above): codes [n] bytes, absmax [quant8_blocks(n)].
void quant8_quantize(const float* x, int64_t n, const float* map, uint8_t* codes, float* absmax);
// x'[0..n) from codes and absmax.
void quant8_dequantize(const uint8_t* codes, const float* absmax, int64_t n, const float* map, float* out);

// adamw8bit_multi's operand checks for parameter i (kernel_list.inc); user-facing errors name the operand.
void check_adamw8bit_operands(size_t i, const Tensor& p, const Tensor& g, const Tensor& m_codes, const Tensor& m_absmax,
                              const Tensor& v_codes, const Tensor& v_absmax);
void check_quant8_map(const Tensor& map, const char* which);

}  // namespace ingot
