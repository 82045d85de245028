#include "runtime/kernels/quant8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/error.h"
#include "runtime/tensor.h"

namespace ingot {
namespace {

// torch.linspace(start, end, n) in f32: the first half counts up from the start, the second half down from the end.
std::vector<float> linspace_f32(float start, float end, int n) {
  const float step = (end - start) / static_cast<float>(n - 1);
  std::vector<float> b(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    b[static_cast<size_t>(i)] =
        i < n / 2 ? start + step * static_cast<float>(i) : end - step * static_cast<float>(n - 1 - i);
  return b;
}

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8).
std::array<float, 256> dynamic_map(bool is_signed) {
  std::vector<float> v;
  for (int e = 0; e < 7; ++e) {
    const int boundaries = (1 << (is_signed ? e : e + 1)) + 1;
    const std::vector<float> b = linspace_f32(0.1f, 1.0f, boundaries);
    const float scale = static_cast<float>(std::pow(10.0, e - 6));
    for (int i = 0; i + 1 < boundaries; ++i) {
      const float mean = (b[static_cast<size_t>(i)] + b[static_cast<size_t>(i) + 1]) / 2.0f;
      v.push_back(scale * mean);
      if (is_signed) v.push_back(-(scale * mean));
    }
  }
  v.push_back(0.0f);
  v.push_back(1.0f);
  INGOT_INTERNAL_CHECK(v.size() == 256, "quant8: the dynamic map has ", v.size(), " values, not 256");
  std::sort(v.begin(), v.end());
  std::array<float, 256> out{};
  std::copy(v.begin(), v.end(), out.begin());
  return out;
}

}  // namespace

const std::array<float, 256>& quant8_signed_map() {
  static const std::array<float, 256> map = dynamic_map(true);
  return map;
}

const std::array<float, 256>& quant8_unsigned_map() {
  static const std::array<float, 256> map = dynamic_map(false);
  return map;
}

// Blocks are independent, so threads split them and the codes do not depend on the thread count. Checkpoints of
// 8-bit state under ZeRO pass through here for every parameter (Note [8-bit state element by element],
// optim/adamw8bit.cpp): 2 billion elements a rank for an 8B model on four GPUs.
constexpr int64_t kQuant8ParallelGrain = 1 << 16;

void quant8_quantize(const float* x, int64_t n, const float* map, uint8_t* codes, float* absmax) {
  const int64_t blocks = quant8_blocks(n);
#pragma omp parallel for schedule(static) if (n >= kQuant8ParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kQuant8Block, hi = std::min(n, lo + kQuant8Block);
    float m = 0.0f;
    for (int64_t i = lo; i < hi; ++i) m = std::max(m, std::fabs(x[i]));
    absmax[b] = m;
    const float inv = quant8_inverse(m);
    for (int64_t i = lo; i < hi; ++i) codes[i] = static_cast<uint8_t>(quant8_nearest(map, quant8_normalize(x[i], inv)));
  }
}

void check_adamw8bit_operands(size_t i, const Tensor& p, const Tensor& g, const Tensor& m_codes, const Tensor& m_absmax,
                              const Tensor& v_codes, const Tensor& v_absmax) {
  INGOT_CHECK((p.dtype() == DType::f32 || p.dtype() == DType::bf16) && p.is_contiguous(), "adamw8bit_multi: parameter ",
              i, " must be a contiguous f32 or bf16 tensor, got ", dtype_name(p.dtype()), shape_str(p.shape()));
  INGOT_CHECK(is_floating(g.dtype()) && g.is_contiguous() && g.shape() == p.shape(), "adamw8bit_multi: grad ", i,
              " must be a contiguous float tensor of shape ", shape_str(p.shape()), ", got ", dtype_name(g.dtype()),
              shape_str(g.shape()));
  const int64_t n = p.numel();
  for (const Tensor* c : {&m_codes, &v_codes})
    INGOT_CHECK(c->dtype() == DType::i32 && c->is_contiguous() && c->numel() == quant8_code_words(n),
                "adamw8bit_multi: the codes of parameter ", i, " must be a contiguous i32 tensor of ",
                quant8_code_words(n), " elements (4 codes each), got ", dtype_name(c->dtype()), shape_str(c->shape()));
  for (const Tensor* a : {&m_absmax, &v_absmax})
    INGOT_CHECK(a->dtype() == DType::f32 && a->is_contiguous() && a->numel() == quant8_blocks(n),
                "adamw8bit_multi: the absmax of parameter ", i, " must be a contiguous f32 tensor of ",
                quant8_blocks(n), " elements (one per ", kQuant8Block, "-element block), got ", dtype_name(a->dtype()),
                shape_str(a->shape()));
}

void check_quant8_map(const Tensor& map, const char* which) {
  INGOT_CHECK(map.defined() && map.dtype() == DType::f32 && map.is_contiguous() && map.numel() == 256,
              "adamw8bit_multi: the ", which, " map must be a contiguous f32 tensor of 256 values");
}

Tensor quant8_map_tensor(const std::array<float, 256>& map, Device device) {
  Tensor t = empty({256}, DType::f32);
  std::copy(map.begin(), map.end(), t.data<float>());
  return t.to(device);
}

void quant8_dequantize(const uint8_t* codes, const float* absmax, int64_t n, const float* map, float* out) {
#pragma omp parallel for schedule(static) if (n >= kQuant8ParallelGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = map[codes[i]] * absmax[i / kQuant8Block];
}

}  // namespace ingot
