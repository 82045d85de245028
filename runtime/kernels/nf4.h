// NF4: the 4-bit NormalFloat weight format of QLoRA (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of
// Quantized LLMs"), laid out as bitsandbytes stores it (quantize_4bit with quant_type "nf4", blocksize 64,
// compress_statistics on), written from the paper and that format, not from its code.
//
// A weight of n elements (n a multiple of 64) is cut into blocks of 64 consecutive elements (row-major).
//   absmax[b]  = max |w| over block b                                   (f32, one per block)
//   code[i]    = the index of the codebook value nearest to w[i] * (1 / absmax[b]); a value exactly between two
//                codebook values takes the lower one, as bitsandbytes' comparisons against midpoints do
//   bytes      = two codes a byte, element 2k in the high nibble of byte k (bitsandbytes' uint8 layout)
// Double quantization (QLoRA section 3, "Double Quantization") stores the absmax values in 8 bits:
//   offset     = mean(absmax)                                        (one f32 per tensor)
//   scale[c]   = max |absmax - offset| over chunk c of 256 blocks    (f32, one per 256 blocks)
//   qabs[b]    = the index of the dynamic-map value nearest to (absmax[b] - offset) * (1 / scale[c])
// and dequantization is
//   absmax'[b] = map[qabs[b]] * scale[c] + offset,   w'[i] = codebook[code[i]] * absmax'[b]
// in f32 with separate roundings (no fused multiply-add), so the CPU and CUDA kernels agree bit for bit. The
// 8-bit map is bitsandbytes' signed dynamic map (create_dynamic_map: 7 exponent bits, linear fractions; see
// nf4_absmax_map()). Memory: 0.5 byte per weight + 1 byte per 64 + 4 bytes per 16384: 4.127 bits a weight.
//
// Packed bytes live in i32 tensors (ingot has no u8 dtype): the byte order in memory is the layout above, and
// integer tensors are left alone by Module::to(dtype) and moved as bytes by to(device).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "runtime/tensor.h"

// The 16 NF4 values (QLoRA appendix E; bitsandbytes' get_4bit_type("nf4")), ascending: code 7 is exactly 0.
#define INGOT_NF4_CODEBOOK                                                                                    \
  -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,          \
      -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,      \
      0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,                \
      0.7229568362236023f, 1.0f

namespace ingot {

constexpr int64_t kNf4BlockSize = 64;         // weights per absmax
constexpr int64_t kNf4AbsmaxBlockSize = 256;  // absmax values per second-level scale

inline constexpr std::array<float, 16> kNf4Codebook = {INGOT_NF4_CODEBOOK};

// The index of the codebook value nearest to x (x is expected in [-1, 1]; ties take the lower code).
int nf4_encode(float x);

// bitsandbytes' signed dynamic 8-bit map (create_dynamic_map(signed=True, max_exponent_bits=7)), 256 values
// ascending in [-0.99297, 1]: for e = 0..6, the 2^e midpoints of linspace(0.1, 1, 2^e + 1) times 10^(e - 6),
// with both signs, plus 0 and 1. Computed in f32 as torch does.
const std::array<float, 256>& nf4_absmax_map();

// A weight in NF4 (see the layout above). Handles, not copies: to(device) returns moved handles.
struct Nf4Tensor {
  Tensor codes;          // i32 [n / 8]: the packed 4-bit codes
  Tensor absmax_codes;   // i32 [ceil(blocks / 4)]: one 8-bit code per block, in bytes
  Tensor absmax_scales;  // f32 [ceil(blocks / 256)]
  Tensor absmax_map;     // f32 [256]: nf4_absmax_map()
  float absmax_offset = 0.0f;
  Shape shape;           // of the dense weight
  DType dtype = DType::f32;  // of the dense weight it was made from
  std::string name;      // for error messages ("model.layers.0.self_attn.q_proj.weight")

  bool defined() const { return codes.defined(); }
  int64_t numel() const { return ingot::numel(shape); }
  int64_t blocks() const { return numel() / kNf4BlockSize; }
  Device device() const { return codes.device(); }
  // Bytes held: codes, absmax codes, second-level scales and the map (what a quantized model keeps).
  size_t nbytes() const;
  Nf4Tensor to(Device d) const;
};

// Quantizes a floating weight (f32, bf16 or f16, any device; the work runs on the CPU) to NF4 on w's device.
// Errors name `name`: a dtype other than f32/bf16/f16, an element count that is not a multiple of 64.
Nf4Tensor nf4_quantize(const Tensor& w, const std::string& name);

// The dense weight (q.shape) in `dtype` (f32, bf16 or f16) on q's device.
Tensor nf4_dequantize(const Nf4Tensor& q, DType dtype);

}  // namespace ingot
