// AdamW with 8-bit moments on the GPU (adamw8bit_multi; format in runtime/kernels/quant8.h): one fused kernel
// launch per parameter tensor that dequantizes, updates and requantizes its moments and updates it.
//
// Approach: a warp owns one 256-element quantization block at a time (8 warps a CUDA block, grid-stride over the
// blocks), lane l holding elements l, l + 32, ..., l + 224 in registers (coalesced loads and byte stores). Each
// lane dequantizes its moments through the two maps staged in shared memory, updates them and the parameter,
// the warp takes each moment's new absmax with shuffles (no __syncthreads after the maps are staged), and each
// lane requantizes its 8 values by binary search over the map (quant8_nearest, shared with the CPU kernel).
// Numerics: the CPU kernel's f32 operations in the same order, each rounded separately (__fmul_rn and friends,
// never an FMA), with the same host-side constants, and the same search: CPU and GPU agree bit for bit.
// Memory bound: per element it reads 4 (p) + 2..4 (g) + 2 (codes) bytes and writes 4 + 2.
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
static_assert(kBlock == 256, "the maps are staged one value a thread");

// kernels

// p is f32, or bf16 (p_dtype) rounded stochastically (Note [Stochastic rounding], scalar_math.h).
__global__ void adamw8bit_kernel(void* __restrict__ p, DType p_dtype, const void* __restrict__ g, DType g_dtype,
                                 uint8_t* __restrict__ q1, float* __restrict__ a1, uint8_t* __restrict__ q2,
                                 float* __restrict__ a2, const float* __restrict__ map1, const float* __restrict__ map2,
                                 int64_t n, AdamWConsts c) {
  __shared__ float s1[256], s2[256];
  s1[threadIdx.x] = map1[threadIdx.x];
  s2[threadIdx.x] = map2[threadIdx.x];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t blocks = ceil_div(n, kQuant8Block);
  for (int64_t b = blockIdx.x * static_cast<int64_t>(kWarps) + warp; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t lo = b * kQuant8Block;
    const float old1 = a1[b], old2 = a2[b];
    float m[kPerLane], v[kPerLane];
    float max1 = 0.0f, max2 = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t j = lo + lane + 32 * k;
      m[k] = v[k] = 0.0f;
      if (j < n) {
        const float gj = __fmul_rn(load_dyn<float>(g, g_dtype, j), c.scale);
        const float mj = __fadd_rn(__fmul_rn(c.b1, __fmul_rn(s1[q1[j]], old1)), __fmul_rn(c.one_minus_b1, gj));
        const float vj =
            __fadd_rn(__fmul_rn(c.b2, __fmul_rn(s2[q2[j]], old2)), __fmul_rn(__fmul_rn(c.one_minus_b2, gj), gj));
        const float step =
            __fdiv_rn(__fmul_rn(c.lr, __fdiv_rn(mj, c.bc1)), __fadd_rn(__fsqrt_rn(__fdiv_rn(vj, c.bc2)), c.eps));
        const float out = __fsub_rn(__fmul_rn(load_dyn<float>(p, p_dtype, j), c.decay), step);
        if (p_dtype == DType::bf16)
          store_dyn(p, DType::bf16, j, ig_math::round_bf16_stochastic(out, ig_math::stochastic_salt(j, c.step)));
        else
          static_cast<float*>(p)[j] = out;
        m[k] = mj;
        v[k] = vj;
        max1 = fmaxf(max1, fabsf(mj));
        max2 = fmaxf(max2, fabsf(vj));
      }
    }
    // Every lane read old1/old2 before the shuffles, which join the warp; lane 0 writes the new values after.
    max1 = warp_reduce(max1, MaxOp{});
    max2 = warp_reduce(max2, MaxOp{});
    if (lane == 0) {
      a1[b] = max1;
      a2[b] = max2;
    }
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t j = lo + lane + 32 * k;
      if (j < n) {
        q1[j] = static_cast<uint8_t>(quant8_nearest(s1, max1 > 0.0f ? __fdiv_rn(m[k], max1) : 0.0f));
        q2[j] = static_cast<uint8_t>(quant8_nearest(s2, max2 > 0.0f ? __fdiv_rn(v[k], max2) : 0.0f));
      }
    }
  }
}

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
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    if (n == 0) continue;
    const unsigned grid = grid_for(quant8_blocks(n), kWarps, ctx.device);
    adamw8bit_kernel<<<grid, kBlock, 0, ctx.stream>>>(
        params[i].data_ptr(), params[i].dtype(), grads[i].data_ptr(), grads[i].dtype(),
        static_cast<uint8_t*>(m_codes[i].data_ptr()), m_absmax[i].data<float>(),
        static_cast<uint8_t*>(v_codes[i].data_ptr()), v_absmax[i].data<float>(), signed_map.data<float>(),
        unsigned_map.data<float>(), n, c);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace ingot::kernels::cuda
