#include "runtime/kernels/nf4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"

namespace ingot {

namespace {

constexpr std::array<float, 15> nf4_midpoints() {
  std::array<float, 15> m{};
  for (size_t i = 0; i < m.size(); ++i) m[i] = (kNf4Codebook[i] + kNf4Codebook[i + 1]) / 2.0f;
  return m;
}
constexpr std::array<float, 15> kNf4Midpoints = nf4_midpoints();

std::array<float, 256> make_absmax_map() {
  std::vector<float> v;
  for (int e = 0; e < 7; ++e) {
    const int n = (1 << e) + 1;  // boundaries
    // torch.linspace in f32: the first half counts up from the start, the second half down from the end.
    const float start = 0.1f, end = 1.0f, step = (end - start) / static_cast<float>(n - 1);
    std::vector<float> b(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
      b[static_cast<size_t>(i)] = i < n / 2 ? start + step * static_cast<float>(i)
                                            : end - step * static_cast<float>(n - 1 - i);
    const float scale = static_cast<float>(std::pow(10.0, e - 6));
    for (int i = 0; i + 1 < n; ++i) {
      const float mean = (b[static_cast<size_t>(i)] + b[static_cast<size_t>(i) + 1]) / 2.0f;
      v.push_back(scale * mean);
      v.push_back(-(scale * mean));
    }
  }
  v.push_back(0.0f);
  v.push_back(1.0f);
  INGOT_INTERNAL_CHECK(v.size() == 256, "nf4: the dynamic map has ", v.size(), " values, not 256");
  std::sort(v.begin(), v.end());
  std::array<float, 256> out{};
  std::copy(v.begin(), v.end(), out.begin());
  return out;
}

// The index of the value of the ascending `map` nearest to x (ties take the lower index).
int nearest_in_map(const std::array<float, 256>& map, float x) {
  const auto it = std::lower_bound(map.begin(), map.end(), x);
  if (it == map.begin()) return 0;
  if (it == map.end()) return 255;
  const int hi = static_cast<int>(it - map.begin());
  return (*it - x) < (x - map[static_cast<size_t>(hi) - 1]) ? hi : hi - 1;
}

// Contiguous f32 values of w on the CPU.
std::vector<float> host_floats(const Tensor& w) {
  Tensor c = w.to(Device::cpu()).contiguous_raw();
  return kernels::cpu::load_all<float>(c);
}

}  // namespace

int nf4_encode(float x) {
  int c = 0;
  for (float m : kNf4Midpoints) c += x > m;
  return c;
}

const std::array<float, 256>& nf4_absmax_map() {
  static const std::array<float, 256> map = make_absmax_map();
  return map;
}

size_t Nf4Tensor::nbytes() const {
  return codes.nbytes() + absmax_codes.nbytes() + absmax_scales.nbytes() + absmax_map.nbytes();
}

Nf4Tensor Nf4Tensor::to(Device d) const {
  Nf4Tensor q = *this;
  q.codes = codes.to(d);
  q.absmax_codes = absmax_codes.to(d);
  q.absmax_scales = absmax_scales.to(d);
  q.absmax_map = absmax_map.to(d);
  return q;
}

Nf4Tensor nf4_quantize(const Tensor& w, const std::string& name) {
  INGOT_CHECK(w.dtype() == DType::f32 || w.dtype() == DType::bf16 || w.dtype() == DType::f16, "nf4: ", name,
              " is ", dtype_name(w.dtype()), shape_str(w.shape()), "; NF4 quantizes f32, bf16 or f16 weights");
  const int64_t n = w.numel();
  INGOT_CHECK(n > 0 && n % kNf4BlockSize == 0, "nf4: ", name, " ", shape_str(w.shape()), " has ", n,
              " elements, not a positive multiple of the block size ", kNf4BlockSize,
              "; leave it unquantized or pad it");
  const std::vector<float> x = host_floats(w);
  const int64_t nb = n / kNf4BlockSize;
  const int64_t nc = (nb + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize;

  Nf4Tensor q;
  q.shape = w.shape();
  q.dtype = w.dtype();
  q.name = name;
  q.codes = empty({n / 8}, DType::i32);
  q.absmax_codes = zeros({(nb + 3) / 4}, DType::i32);
  q.absmax_scales = empty({nc}, DType::f32);
  q.absmax_map = empty({256}, DType::f32);
  auto* codes = static_cast<uint8_t*>(q.codes.data_ptr());
  auto* acodes = static_cast<uint8_t*>(q.absmax_codes.data_ptr());
  auto* scales = q.absmax_scales.data<float>();
  const std::array<float, 256>& map = nf4_absmax_map();
  std::memcpy(q.absmax_map.data_ptr(), map.data(), sizeof(float) * 256);

  std::vector<float> absmax(static_cast<size_t>(nb));
#pragma omp parallel for schedule(static) if (n >= kernels::cpu::kParallelGrain)
  for (int64_t b = 0; b < nb; ++b) {
    const float* v = x.data() + b * kNf4BlockSize;
    float m = 0.0f;
    for (int64_t i = 0; i < kNf4BlockSize; ++i) m = std::max(m, std::fabs(v[i]));
    absmax[static_cast<size_t>(b)] = m;
    // An all-zero block encodes 0 (code 7) and dequantizes to 0 whatever its absmax becomes.
    const float inv = m > 0.0f ? 1.0f / m : 0.0f;
    uint8_t* out = codes + b * (kNf4BlockSize / 2);
    for (int64_t i = 0; i < kNf4BlockSize; i += 2)
      out[i / 2] = static_cast<uint8_t>((nf4_encode(v[i] * inv) << 4) | nf4_encode(v[i + 1] * inv));
  }

  double sum = 0.0;
  for (float a : absmax) sum += a;
  q.absmax_offset = static_cast<float>(sum / static_cast<double>(nb));
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t lo = c * kNf4AbsmaxBlockSize, hi = std::min(nb, lo + kNf4AbsmaxBlockSize);
    float s = 0.0f;
    for (int64_t b = lo; b < hi; ++b) s = std::max(s, std::fabs(absmax[static_cast<size_t>(b)] - q.absmax_offset));
    scales[c] = s;
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int64_t b = lo; b < hi; ++b)
      acodes[b] = static_cast<uint8_t>(nearest_in_map(map, (absmax[static_cast<size_t>(b)] - q.absmax_offset) * inv));
  }
  return w.device().is_cpu() ? q : q.to(w.device());
}

Tensor nf4_dequantize(const Nf4Tensor& q, DType dtype) {
  INGOT_CHECK(q.defined(), "nf4_dequantize: the NF4 tensor is empty");
  INGOT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, "nf4_dequantize: ", q.name,
              " can be dequantized to f32, bf16 or f16, not ", dtype_name(dtype));
  Tensor out = empty(q.shape, dtype, q.device());
  INGOT_KERNEL_CALL(q.device(), nf4_dequantize, out, q.codes, q.absmax_codes, q.absmax_scales, q.absmax_map,
                    static_cast<double>(q.absmax_offset));
  return out;
}

}  // namespace ingot
