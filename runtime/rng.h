// Philox4x32-10 counter-based RNG (Salmon et al., SC'11). A (seed, counter) pair gives four 32-bit words;
// the same functions run on the host and in CUDA kernels, so CPU and GPU draw identical numbers for the same
// seed and offset. Element i of a tensor uses counter offset + i/4, lane i%4.
#pragma once

#include <cmath>
#include <cstdint>
#include <mutex>

#include "runtime/device.h"
#include "runtime/dtype.h"  // INGOT_HD

namespace ingot {

struct Philox4 {
  uint32_t v[4];
};

INGOT_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

INGOT_HD Philox4 philox4x32_10(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
    philox_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

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
