// Philox4x32-10 counter-based RNG (Salmon et al., SC'11). A (seed, counter) pair gives four 32-bit words;
// the same functions run on the host and in CUDA kernels, so CPU and GPU draw identical numbers for the same
// seed and offset. Element i of a tensor uses counter offset + i/4, lane i%4.
#pragma once

#include <cmath>
#include <cstdint>
#include <mutex>

#include "runtime/device.h"
#include "runtime/dtype.h"  // INGOT_HD
#include "runtime/kernels/scalar_math.h"

namespace ingot {

// Philox4 and philox4x32_10 are defined once, in the header the generated kernels include.
using ig_math::Philox4;
using ig_math::philox4x32_10;

// Uniform in [0, 1) with 24 bits of mantissa; identical on host and device.
INGOT_HD float philox_uniform(uint64_t seed, uint64_t index) {
  Philox4 r = philox4x32_10(seed, index >> 2);
  return static_cast<float>(r.v[index & 3] >> 8) * (1.0f / 16777216.0f);
}

// Standard normal via Box-Muller on lanes (0,1) / (2,3) of one counter; element pairs share a counter.
INGOT_HD float philox_normal(uint64_t seed, uint64_t index) {
  Philox4 r = philox4x32_10(seed, index >> 2);
  uint32_t lane = static_cast<uint32_t>(index & 3);
  uint32_t a = r.v[lane & 2u], b = r.v[(lane & 2u) + 1];
  float u1 = (static_cast<float>(a >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  float u2 = static_cast<float>(b >> 8) * (1.0f / 16777216.0f);
  float rad = sqrtf(-2.0f * logf(u1));
  float th = 6.283185307179586f * u2;
  return (lane & 1u) ? rad * sinf(th) : rad * cosf(th);
}

// The state a program draws from: a seed and a running offset (in elements, rounded up to counters of 4),
// one per device. Reserving advances the offset so successive draws never overlap.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t s) {
    std::lock_guard<std::mutex> g(mu_);
    seed_ = s;
    offset_ = 0;
  }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t o) { offset_ = o; }
  // Reserves n elements' worth of counters; returns the starting element offset.
  uint64_t reserve(uint64_t n) {
    std::lock_guard<std::mutex> g(mu_);
    uint64_t o = offset_;
    offset_ += (n + 3) / 4 * 4;
    return o;
  }

 private:
  uint64_t seed_ = 0, offset_ = 0;
  std::mutex mu_;
};

Generator& default_generator(Device d);
// Seeds the generators of every device.
void manual_seed(uint64_t seed);

}  // namespace ingot
