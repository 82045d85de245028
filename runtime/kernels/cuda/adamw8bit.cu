// AdamW with 8-bit moments on the GPU (adamw8bit_multi; format in runtime/kernels/quant8.h): one fused kernel
// launch per parameter tensor that dequantizes, updates and requantizes its moments and updates it.
//
// Approach: a warp owns one 256-element quantization block at a time (8 warps a CUDA block, grid-stride over the
// blocks), lane l holding the 8 consecutive elements 8l .. 8l + 7 in registers, loaded and stored 16 bytes at a
// time (codes 8) where the block is whole and the tensors aligned, one by one elsewhere. Each lane dequantizes
// its moments through the two maps staged in shared memory, updates them and the parameter, the warp takes each
// moment's new absmax with shuffles (no __syncthreads after the staging), and each lane requantizes its 8 values.
// Types are template parameters (no per-element dtype switch), and whole blocks run a copy of the body whose
// element count is a constant (no per-element branch: 7% of the time). Occupancy: 4 blocks an SM (64 registers,
// a few bytes spilled) take 2.25 ms where the 66 registers the compiler picks alone (3 blocks) take 3.2 and 5
// blocks (48 registers) 2.20 (bench_cuda_kernels, H200, 2026-11-28).
//
// Note [Requantizing from a table of lower bounds]
// The kernel is bound by instructions, not bytes (ncu, 2026-11-28: ~360 instructions an element, 14 bytes;
// 0.5 TB/s), and an 8-step binary search over each 256-value map, twice an element, was a third of them, each
// step waiting on the shared-memory load before. The search's answer lo(x) (quant8_lower_bound: the first index
// whose value is >= x) only grows with x, so a table of lo at the least value of a range of x is a lower bound for
// every x in that range, and scanning up from it while map[lo] < x finds lo(x) exactly: the same code as the CPU's
// binary search (quant8_pick ends both). The ranges cut |x| in [2^-26, 1] at its exponent and top 7 mantissa bits
// (the float's bits are monotonic in |x|; 26 x 128 ranges, one more below 2^-26 and one for 1 itself), a table a
// sign and a map: 13 KB, made once per call by a small kernel from the maps on the device and staged in shared
// memory by every block. A range holds at most one or two map values (the densest, the unsigned map's top decade,
// is 0.007 apart; a range there is 0.0039 wide), so the scan takes one or two steps; |x| > 1 and NaN (never from
// quant8_normalize) take the binary search.
//
// Numerics: the CPU kernel's f32 operations in the same order, each rounded separately (__fmul_rn and friends,
// never an FMA), with the same host-side constants, and the same codes: CPU and GPU agree bit for bit.
// Memory: per element it reads 4 (p) + 2..4 (g) + 2 (codes) bytes and writes 4 + 2.
//   p [n] f32 or bf16, g [n] any float dtype, codes i32 [ceil(n / 4)] (bytes), absmax f32 [ceil(n / 256)],
//   maps f32 [256].
#include "runtime/kernels/adamw_consts.h"
#include "runtime/kernels/cuda/common.cuh"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/quant8.h"
#include "runtime/kernels/scalar_math.h"

namespace ingot::kernels::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;
constexpr int kPerLane = static_cast<int>(kQuant8Block) / 32;
static_assert(kBlock == 256 && kPerLane == 8, "the maps are staged one value a thread; a lane holds 16 bytes of bf16");

// Note [Requantizing from a table of lower bounds]: the ranges of |x| and the tables' layout.
constexpr int kMantissaBits = 7;
constexpr int kShift = 23 - kMantissaBits;
constexpr unsigned kWidth = 1u << kShift;          // bits of |x| per range
constexpr unsigned kLowBits = (127u - 26u) << 23;  // 2^-26: smaller magnitudes share range 0
constexpr unsigned kOneBits = 127u << 23;          // 1.0: the last range
constexpr int kKeys = 26 * (1 << kMantissaBits) + 2;
constexpr int kStride = (kKeys + 15) / 16 * 16;  // a table's bytes, a whole number of 16-byte loads
constexpr int kTableBytes = 4 * kStride;         // signed map: x >= 0, x < 0; unsigned map: x >= 0, x < 0

// Table t = 2 * map + (x < 0), entry k: lo at the least x of range k (for x < 0, the greatest magnitude).
__global__ void quant8_tables_kernel(const float* __restrict__ map1, const float* __restrict__ map2,
                                     uint8_t* __restrict__ tables) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= kTableBytes) return;
  const int which = t / kStride, k = t % kStride;
  if (k >= kKeys) {
    tables[t] = 0;
    return;
  }
  const bool negative = which & 1;
  const unsigned bits =
      negative ? (k == 0 ? kLowBits - 1 : kLowBits + k * kWidth - 1) : (k == 0 ? 0u : kLowBits + (k - 1) * kWidth);
  const float x = negative ? -__uint_as_float(bits) : __uint_as_float(bits);
  // lo = 256 (x above every value) fits no byte; 255 is as good a lower bound.
  tables[t] = static_cast<uint8_t>(min(quant8_lower_bound(which < 2 ? map1 : map2, x), 255));
}

// quant8_nearest(map, x) from the table of lower bounds of x's sign (`tables`: the map's two).
__device__ __forceinline__ int quant8_code(const float* map, const uint8_t* tables, float x) {
  const unsigned b = __float_as_uint(x), a = b & 0x7FFFFFFFu;
  int lo;
  if (a <= kOneBits) {
    const int key = a < kLowBits ? 0 : static_cast<int>((a - kLowBits) >> kShift) + 1;
    lo = tables[(b >> 31) * kStride + key];
    while (lo < 256 && map[lo] < x) ++lo;
  } else {
    lo = quant8_lower_bound(map, x);
  }
  return quant8_pick(map, x, lo);
}

// 8 consecutive values of T at x as f32: 16-byte loads when `vec` (x aligned), else one by one up to `count`.
template <typename T>
__device__ __forceinline__ void load8(const T* x, bool vec, int count, float (&out)[kPerLane]) {
  alignas(16) T v[kPerLane];
  if (vec) {
#pragma unroll
    for (int c = 0; c < static_cast<int>(sizeof v / 16); ++c)
      reinterpret_cast<uint4*>(v)[c] = reinterpret_cast<const uint4*>(x)[c];
  } else {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) v[k] = k < count ? x[k] : T{};
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) out[k] = to_acc<float>(v[k]);
}

template <typename T>
__device__ __forceinline__ void store8(T* x, bool vec, int count, const float (&in)[kPerLane]) {
  alignas(16) T v[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) v[k] = from_acc<T>(in[k]);
  if (vec) {
#pragma unroll
    for (int c = 0; c < static_cast<int>(sizeof v / 16); ++c)
      reinterpret_cast<uint4*>(x)[c] = reinterpret_cast<const uint4*>(v)[c];
  } else {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k)
      if (k < count) x[k] = v[k];
  }
}

// p is float, or bf16 rounded stochastically (Note [Stochastic rounding], scalar_math.h); g any float type.
// `aligned`: p and g on 16 bytes, the codes on 8, so whole blocks take the 16-byte path.
template <typename P, typename G>
__global__ void __launch_bounds__(kBlock, 4)
    adamw8bit_kernel(P* __restrict__ p, const G* __restrict__ g, uint8_t* __restrict__ q1, float* __restrict__ a1,
                     uint8_t* __restrict__ q2, float* __restrict__ a2, const float* __restrict__ map1,
                     const float* __restrict__ map2, const uint8_t* __restrict__ tables, int64_t n, AdamWConsts c,
                     bool aligned) {
  __shared__ float s1[256], s2[256];
  __shared__ alignas(16) uint8_t st[kTableBytes];
  s1[threadIdx.x] = map1[threadIdx.x];
  s2[threadIdx.x] = map2[threadIdx.x];
  for (int i = threadIdx.x; i < kTableBytes / 16; i += kBlock)
    reinterpret_cast<uint4*>(st)[i] = reinterpret_cast<const uint4*>(tables)[i];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t blocks = ceil_div(n, kQuant8Block);
  for (int64_t b = blockIdx.x * static_cast<int64_t>(kWarps) + warp; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * kWarps) {
    // Whole blocks of aligned tensors take the 16-byte path; the choice is the warp's (the shuffles below need
    // the whole warp on one path).
    const bool whole = aligned && (b + 1) * kQuant8Block <= n;
    auto lane_block = [&](auto whole_tag) {
      constexpr bool kWhole = decltype(whole_tag)::value;
      const int64_t i0 = b * kQuant8Block + kPerLane * lane;
      const int64_t left = n - i0;
      // kWhole: the count is a constant, so the unrolled loops below carry no per-element branch.
      const int count = kWhole ? kPerLane : left <= 0 ? 0 : left >= kPerLane ? kPerLane : static_cast<int>(left);
      const float old1 = a1[b], old2 = a2[b];
      float pv[kPerLane], gv[kPerLane], m[kPerLane], v[kPerLane];
      load8(p + i0, kWhole, count, pv);
      load8(g + i0, kWhole, count, gv);
      alignas(8) uint8_t c1[kPerLane], c2[kPerLane];  // moved 8 bytes at a time
      if constexpr (kWhole) {
        *reinterpret_cast<uint2*>(c1) = *reinterpret_cast<const uint2*>(q1 + i0);
        *reinterpret_cast<uint2*>(c2) = *reinterpret_cast<const uint2*>(q2 + i0);
      } else {
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) {
          c1[k] = k < count ? q1[i0 + k] : 0;
          c2[k] = k < count ? q2[i0 + k] : 0;
        }
      }
      float max1 = 0.0f, max2 = 0.0f;
      // i0 is a multiple of 8: one Philox call rounds the lane's 8 elements (Note [Stochastic rounding]).
      ig_math::Philox4 noise{};
      if constexpr (std::is_same_v<P, bf16>) noise = ig_math::stochastic_block(ig_math::stochastic_salt(i0, c.step));
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        m[k] = v[k] = 0.0f;
        if (k < count) {
          const float gj = __fmul_rn(gv[k], c.scale);
          const float mj = __fadd_rn(__fmul_rn(c.b1, __fmul_rn(s1[c1[k]], old1)), __fmul_rn(c.one_minus_b1, gj));
          const float vj =
              __fadd_rn(__fmul_rn(c.b2, __fmul_rn(s2[c2[k]], old2)), __fmul_rn(__fmul_rn(c.one_minus_b2, gj), gj));
          const float step =
              __fdiv_rn(__fmul_rn(c.lr, __fdiv_rn(mj, c.bc1)), __fadd_rn(__fsqrt_rn(__fdiv_rn(vj, c.bc2)), c.eps));
          const float out = __fsub_rn(__fmul_rn(pv[k], c.decay), step);
          if constexpr (std::is_same_v<P, bf16>)
            pv[k] = ig_math::round_bf16_with(out, ig_math::stochastic_bits(noise, k));
          else
            pv[k] = out;
          m[k] = mj;
          v[k] = vj;
          max1 = fmaxf(max1, fabsf(mj));
          max2 = fmaxf(max2, fabsf(vj));
        }
      }
      store8(p + i0, kWhole, count, pv);
      // Every lane read old1/old2 before the shuffles, which join the warp; lane 0 writes the new values after.
      max1 = warp_reduce(max1, MaxOp{});
      max2 = warp_reduce(max2, MaxOp{});
      if (lane == 0) {
        a1[b] = max1;
        a2[b] = max2;
      }
      const float inv1 = quant8_inverse(max1), inv2 = quant8_inverse(max2);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        c1[k] = static_cast<uint8_t>(quant8_code(s1, st, quant8_normalize(m[k], inv1)));
        c2[k] = static_cast<uint8_t>(quant8_code(s2, st + 2 * kStride, quant8_normalize(v[k], inv2)));
      }
      if constexpr (kWhole) {
        *reinterpret_cast<uint2*>(q1 + i0) = *reinterpret_cast<const uint2*>(c1);
        *reinterpret_cast<uint2*>(q2 + i0) = *reinterpret_cast<const uint2*>(c2);
      } else {
#pragma unroll
        for (int k = 0; k < kPerLane; ++k)
          if (k < count) {
            q1[i0 + k] = c1[k];
            q2[i0 + k] = c2[k];
          }
      }
    };
    if (whole)
      lane_block(std::true_type{});
    else
      lane_block(std::false_type{});
  }
}

bool aligned_to(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

// launchers

void adamw8bit_multi(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                     const std::vector<Tensor>& m_codes, const std::vector<Tensor>& m_absmax,
                     const std::vector<Tensor>& v_codes, const std::vector<Tensor>& v_absmax, const Tensor& signed_map,
                     const Tensor& unsigned_map, const AdamWArgs& args) {
  INGOT_INTERNAL_CHECK(grads.size() == params.size() && m_codes.size() == params.size() &&
                       m_absmax.size() == params.size() && v_codes.size() == params.size() &&
                       v_absmax.size() == params.size());
  const AdamWConsts c = kernels::adamw_consts(args, "adamw8bit_multi");
  if (params.empty()) return;
  check_quant8_map(signed_map, "signed");
  check_quant8_map(unsigned_map, "unsigned");
  check_same_device("adamw8bit_multi", {&params[0], &signed_map, &unsigned_map});
  for (size_t i = 0; i < params.size(); ++i) {
    check_adamw8bit_operands(i, params[i], grads[i], m_codes[i], m_absmax[i], v_codes[i], v_absmax[i]);
    check_same_device("adamw8bit_multi",
                      {&params[0], &params[i], &grads[i], &m_codes[i], &m_absmax[i], &v_codes[i], &v_absmax[i]});
  }
  LaunchContext ctx(params[0]);
  // Note [Requantizing from a table of lower bounds]; freed in stream order after the launches below.
  Tensor tables = empty({kTableBytes}, DType::b8, params[0].device());
  auto* tables_ptr = static_cast<uint8_t*>(tables.data_ptr());
  quant8_tables_kernel<<<ceil_div(kTableBytes, kBlock), kBlock, 0, ctx.stream>>>(
      signed_map.data<float>(), unsigned_map.data<float>(), tables_ptr);
  CUDA_CHECK_LAUNCH();
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    if (n == 0) continue;
    auto* q1 = static_cast<uint8_t*>(m_codes[i].data_ptr());
    auto* q2 = static_cast<uint8_t*>(v_codes[i].data_ptr());
    const bool aligned = aligned_to(params[i].data_ptr(), 16) && aligned_to(grads[i].data_ptr(), 16) &&
                         aligned_to(q1, 8) && aligned_to(q2, 8);
    const unsigned grid = grid_for(quant8_blocks(n), kWarps, ctx.device);
    auto launch = [&](auto p_type, auto g_type) {
      using P = decltype(p_type);
      using G = decltype(g_type);
      adamw8bit_kernel<P, G><<<grid, kBlock, 0, ctx.stream>>>(
          static_cast<P*>(params[i].data_ptr()), static_cast<const G*>(grads[i].data_ptr()), q1,
          m_absmax[i].data<float>(), q2, v_absmax[i].data<float>(), signed_map.data<float>(),
          unsigned_map.data<float>(), tables_ptr, n, c, aligned);
    };
    dispatch_float(grads[i].dtype(), "adamw8bit_multi", [&](auto g_type) {
      if (params[i].dtype() == DType::bf16)
        launch(bf16{}, g_type);
      else
        launch(float{}, g_type);
    });
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace ingot::kernels::cuda
