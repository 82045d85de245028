// Note [Own GELU products on Hopper]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A GPT MLP's first product carries the GELU: forward, pre = x @ W^T + b and g = gelu(pre) (cuBLASLt's
// GELU_AUX_BIAS); backward, dpre = (dg @ W2) * gelu'(pre) (DGELU). On an H200 (GPT-2 b16, 16384 x 3072 x 768)
// cuBLASLt's kernels for these take 154 and 157 us against 102-106 us for plain products of the same size
// (ncu: 55% against 90% SM throughput): their epilogue, the tanh on 50M values and two 100 MB outputs, does not
// overlap their main loop. 24 of them per step cost ~1.2 ms more than their arithmetic.
//
// This kernel is built for that. Persistent, one CTA per SM, CTAs in clusters of two: a producer warp issues TMA
// copies of 128 x 64 A and B tiles (B's shared by the cluster, below) into a 4-stage ring of 128-byte-swizzled
// shared memory; two consumer warpgroups each own whole 128 x 128 output tiles (alternate tiles of the CTA's
// sequence) and take turns issuing their products (2 x wgmma.m64n128k16 per 16-wide k step), handing the turn
// over as soon as a tile's products are issued. So one
// consumer's epilogue (bias, GELU with tanh.approx, whose ~2^-11 relative error is below bf16's 2^-8) runs while
// the other's products keep the tensor cores busy ("ping-pong"). The epilogue writes each 64 x 64 quarter tile
// into shared memory with stmatrix, in TMA's swizzled box layout, and TMA writes it out (GeluAuxBias: two slots, so
// one quarter is written while the last one is read out); DGelu's aux tile is read by TMA into the staging while
// the products run, read back with ldmatrix and overwritten in place. The bias is where the sums start.
//
// What the epilogue costs is instructions: one warpgroup runs it while the other issues products, and it must end
// before they do. ncu's per-instruction samples of the first version (generic 4-byte stores of each value pair,
// descriptors rebuilt in vector registers and moved to uniform ones before each wgmma, a bias add and a 9-FMA GELU
// per value) showed the epilogue as long as the main loop and each product issue waiting on its descriptor chain.
// stmatrix / ldmatrix (a quarter of the store instructions, 32-bit shared addresses), the shorter GELU forms,
// and a warp-uniform consumer index (descriptors then live in uniform registers: ~50 instead of ~110
// instructions per 64-wide k block) took the harness from 163-170 / 182-211 us to 129-139 / 131-145 us
// (GeluAuxBias / DGelu; cuBLASLt 187-189 / 183-195 us in the same runs). What the samples showed next was the
// main loop waiting for its TMA loads, with the producer waiting for free stages: the loads in flight are slow
// to land (five stages instead of four did not help: 138-140 / 143-157 us). So CTAs work in pairs (a cluster of
// two) on vertically adjacent tiles and each loads half of their common B tile, multicast into both: 132-143 /
// 133-149 us against 148-151 / 145-158 us for the single-CTA version in the same run, and in the step (H200,
// reduce-overhead, A/B against cuBLASLt's epilogues) -0.41 ms instead of -0.36 ms. The samples still show the
// loads as the limit: each SM takes in 32 KB per 128 x 128 x 64 step either way.
//
// What did not work (H200, harness numbers, 16384 x 3072 x 768): two non-persistent CTAs per SM (each with 2
// warpgroups of 64 rows) ran in lock-step, both in their epilogues at once: 250-310 us with stores straight from
// registers (4-byte stores, half-filled sectors), 175 us with TMA stores; the same main loop without any epilogue
// ran 114 us. Copying the staged tile out with 16-byte thread stores instead of TMA: 175-185 us. Five stages
// instead of four (before the uniform index): 148-157 us against 131-151 us.
//
// B comes either K-major ([n, k]: the forward's weight) or MN-major ([k, n]: the backward reads W2 as stored);
// wgmma reads the latter transposed from shared memory (imm-trans-b), TMA filling it as two 64-column boxes.
#include "runtime/kernels/cuda/gemm_sm90.h"
#include "runtime/kernels/cuda/common.cuh"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string_view>

namespace ingot::kernels::cuda::sm90 {
namespace {

using bf16 = __nv_bfloat16;
using bf162 = __nv_bfloat162;

constexpr int kBM = 128, kBN = 128, kBK = 64;
constexpr uint32_t kStages = 4;
constexpr int kThreads = 3 * 128;  // a producer warpgroup (one thread issues copies) and two consumer warpgroups
constexpr int kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kStageBytes = kABytes + kBBytes;
constexpr int kStagingBytes = 32768;  // per consumer: 4 boxes of 64 x 64 bf16
constexpr int kBarriers = 2 * kStages + 4;
constexpr int kColSumBytes = 4 * 64 * 4;  // per consumer: each warp's sums of one 64-column box
constexpr int kSmemBytes =
    kStages * kStageBytes + 2 * kStagingBytes + 2 * kColSumBytes + 1024 /* alignment slack */ + kBarriers * 8;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define INGOT_SM90A 1
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#ifdef INGOT_SM90A
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t a = smem_u32(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
  }
}
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
      ::"r"(dst), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// The same box into the same shared-memory offset of every CTA in `mask`, each CTA's barrier at `bar`'s offset
// counting the bytes that land there.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                   uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4}], [%2], %5;" ::"r"(dst),
      "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}

// Arrives on the barrier at `bar`'s offset in CTA `rank` of the cluster (this one included). CTA-scope release
// (the default): what it orders, this warpgroup's wgmma reads of the stage, has completed by the time it runs;
// .release.cluster adds a cluster-wide fence per call, which stalled each k block (ncu: ERRBAR, 2x the time).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

__device__ __forceinline__ void tma_store(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1)
               : "memory");
}

// A barrier over one consumer warpgroup (ids 2 and 3; constant ids, as a register id makes ptxas reserve all 16).
__device__ __forceinline__ void consumer_sync(int c) {
  if (c == 0)
    asm volatile("bar.sync 2, 128;" ::: "memory");
  else
    asm volatile("bar.sync 3, 128;" ::: "memory");
}

// A shared-memory matrix descriptor for a 128-byte-swizzled tile (1024-byte-aligned atoms of 8 rows x 128 bytes).
// The start address sits in the low 14 bits (address / 16), so a descriptor moves through a buffer by adding
// byte offsets / 16 to it: the main loop builds three once and adds constants.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16 |
         static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32 | uint64_t{1} << 62;
}

template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, %66;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "n"(kTransB)
      : "memory");
}

// Four 8 x 8 bf16 matrices to / from shared memory; lane t names row t % 8 of matrix t / 8, and lane l holds
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of each: the layout of a wgmma accumulator's n8 blocks.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const bf162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }

__device__ __forceinline__ float tanh_fast(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// gelu_tanh(x) = x/2 (1 + tanh(u)), u = k0 (x + 0.044715 x^3) = x (k0 + k1 x^2); its derivative
// 1/2 + t/2 + x (1 - t^2) (k0 / 2 + 3 k1 / 2 x^2), t = tanh(u): written as the few FMAs the epilogue can afford.
constexpr float kK0 = 0.7978845608028654f, kK1 = 0.7978845608028654f * 0.044715f;
__device__ __forceinline__ float gelu(float x) {
  const float t = tanh_fast(x * fmaf(kK1, x * x, kK0));
  const float hx = 0.5f * x;
  return fmaf(hx, t, hx);
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float x2 = x * x;
  const float t = tanh_fast(x * fmaf(kK1, x2, kK0));
  const float q = x * fmaf(1.5f * kK1, x2, 0.5f * kK0);
  return fmaf(q, fmaf(-t, t, 1.0f), fmaf(0.5f, t, 0.5f));
}
#endif  // INGOT_SM90A

// Persistent, in clusters of two CTAs (one per SM) that work on tile pairs in step: pair p is column block p % nt
// of row blocks 2 (p / nt) and 2 (p / nt) + 1, CTA r of the cluster taking the latter's r. Both need the same B
// tile, so each loads one half of it and TMA multicasts that into both CTAs' shared memory: a quarter less L2
// traffic than each loading its own. Cluster k takes pairs k, k + K, k + 2K, ... (K clusters), consumer
// warpgroup c the even (c = 0) or odd (c = 1) ones of that sequence; the clusters working at one time share a
// few A row blocks and all of B, which stay in L2.
// kColSums (DGelu): each tile's column sums of out go to row m0 / 128 of `partial` ([m / 128, n] f32).
template <bool kBKMajor, GeluEpilogue kEpi, bool kColSums = false>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
    gelu_gemm_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                     const __grid_constant__ CUtensorMap tout, const __grid_constant__ CUtensorMap taux,
                     const bf16* bias, float* partial, int pairs, int nt, int k) {
#ifdef INGOT_SM90A
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t sbase = smem_u32(smem);
  const uint32_t staging = sbase + kStages * kStageBytes;
  float* colsum = reinterpret_cast<float*>(smem + kStages * kStageBytes + 2 * kStagingBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes + 2 * kStagingBytes + 2 * kColSumBytes);
  uint64_t* empty = full + kStages;
  uint64_t* turn = empty + kStages;      // turn[c]: consumer c may issue its next tile's products
  uint64_t* aux_full = turn + 2;         // aux_full[c]: DGelu's aux tile has landed in c's staging
  const int tid = threadIdx.x, wg = tid / 128;
  const int nk = k / kBK;
  const int cluster = blockIdx.x / 2, clusters = gridDim.x / 2;
  uint32_t rank;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));

  if (tid == 0) {
    for (uint32_t s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2);  // freed when both CTAs' consumers are done with it: both CTAs' loads write it
    }
    for (int c = 0; c < 2; ++c) {
      mbar_init(&turn[c], 1);
      mbar_init(&aux_full[c], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();  // the other CTA's barriers are set up before anything arrives on them

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      uint32_t q = 0;  // stages filled so far, over all of this CTA's tiles
      for (int p = cluster; p < pairs; p += clusters) {
        const int m0 = ((p / nt) * 2 + rank) * kBM, n0 = (p % nt) * kBN;
        for (int kb = 0; kb < nk; ++kb, ++q) {
          const uint32_t s = q % kStages;
          if (q >= kStages) mbar_wait(&empty[s], (q / kStages - 1) & 1);
          const uint32_t sa = sbase + s * kStageBytes, sb = sa + kABytes;
          mbar_expect_tx(&full[s], kStageBytes);  // A, and both halves of B (one from the other CTA)
          tma_load(sa, &ta, &full[s], kb * kBK, m0);
          // B's half r: rows n0 + 64r of a K-major B, columns n0 + 64r of an MN-major one; 8 KB either way.
          if constexpr (kBKMajor)
            tma_load_multicast(sb + rank * (kBBytes / 2), &tb, &full[s], kb * kBK, n0 + rank * 64, 0x3);
          else
            tma_load_multicast(sb + rank * (kBBytes / 2), &tb, &full[s], n0 + rank * 64, kb * kBK, 0x3);
        }
      }
    }
  } else {  // consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    // c through a shuffle: the compiler then knows it is warp-uniform, and so are the stage indices and
    // descriptors derived from it, which stay in uniform registers instead of being moved there before each wgmma.
    const int c = __shfl_sync(0xFFFFFFFFu, wg - 1, 0), ctid = tid % 128, warp = ctid / 32, lane = tid % 32;
    const uint32_t staging_c = staging + c * kStagingBytes;
    // Descriptors of stage 0's A tile (its lower 64 rows are 64 x 128 bytes further) and B tile. MN-major B: each
    // 64-column half of the tile is its own 8 KB block of 64 k-rows x 128 bytes, a k16 step 16 rows down both.
    const uint64_t desc_a = sw128_desc(sbase, 16, 1024);
    const uint64_t desc_b = sw128_desc(sbase + kABytes, kBKMajor ? 16 : kBBytes / 2, 1024);
    // Where this lane's row of its stmatrix / ldmatrix matrix lies in a 64 x 64 staging box (128-byte swizzled, as
    // TMA lays boxes out): matrix t / 8 of an x4 is n8 block 2p + t / 16, rows 8 ((t / 8) % 2) + t % 8 of the
    // warp's 16; block 2p's offset is this one with 2p XORed into the 16-byte chunk bits.
    const int mrow = warp * 16 + ((lane / 8) % 2) * 8 + lane % 8;
    const uint32_t lane_off = mrow * 128 + ((((lane / 16) ^ lane) & 7) << 4);
    int turns = 0, aux_loads = 0;
    auto release = [&](uint32_t stage) {  // both CTAs' producers wait for this stage of both CTAs
      if (ctid == 0) {
        mbar_arrive_cluster(&empty[stage], 0);
        mbar_arrive_cluster(&empty[stage], 1);
      }
    };
    for (int j = c, p = cluster + c * clusters; p < pairs; j += 2, p += 2 * clusters) {
      const int m0 = ((p / nt) * 2 + rank) * kBM, n0 = (p % nt) * kBN;
      // Accumulator fragment of m64nNk16: in n8 block i, lane l of warp w holds columns 8i + 2(l % 4) + {0, 1}
      // of rows 16w + l / 4 (acc[4i], acc[4i + 1]) and 16w + l / 4 + 8 (acc[4i + 2], acc[4i + 3]). GeluAuxBias
      // starts the sums at the bias, which spares the epilogue an add per value.
      float acc[2][64];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float2 bv = make_float2(0.0f, 0.0f);
        if constexpr (kEpi == GeluEpilogue::kGeluAuxBias)
          bv = __bfloat1622float2(*reinterpret_cast<const bf162*>(bias + n0 + i * 8 + (lane % 4) * 2));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          acc[h][4 * i] = acc[h][4 * i + 2] = bv.x;
          acc[h][4 * i + 1] = acc[h][4 * i + 3] = bv.y;
        }
      }

      // Ping-pong: products of consecutive tiles alternate between the consumers, so one's epilogue runs while
      // the other's products do. Consumer 0 starts; each hands the turn over once its products are issued.
      if (j > 0) mbar_wait(&turn[c], turns++ & 1);
      if constexpr (kEpi == GeluEpilogue::kDGelu) {
        // The whole aux tile (four 64 x 64 boxes, 32 KB) lands in the staging while the products run; the
        // epilogue overwrites each value with its result in place and TMA writes that out.
        if (ctid == 0) {
          asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the last tile's stores have read it
          mbar_expect_tx(&aux_full[c], 32768);
          for (int b = 0; b < 4; ++b)
            tma_load(staging_c + b * 8192, &taux, &aux_full[c], n0 + (b % 2) * 64, m0 + (b / 2) * 64);
        }
      }
      uint32_t q = j * nk;  // unsigned: stage and phase are a mask and a shift
      for (int kb = 0; kb < nk; ++kb, ++q) {
        const uint32_t s = q % kStages;
        mbar_wait(&full[s], (q / kStages) & 1);
        const uint64_t stage = s * (kStageBytes >> 4);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          const uint64_t da = desc_a + stage + kk * 2;
          const uint64_t db = desc_b + stage + (kBKMajor ? kk * 2 : kk * 128);
          wgmma_m64n128k16<kBKMajor ? 0 : 1>(acc[0], da, db);
          wgmma_m64n128k16<kBKMajor ? 0 : 1>(acc[1], da + (64 * 128 >> 4), db);
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        if (kb > 0) release((q - 1) % kStages);  // the previous stage's products retired
      }
      if (ctid == 0) mbar_arrive(&turn[1 - c]);
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      release((q - 1) % kStages);

      // Epilogue, one 64 x 64 quarter (h, x) at a time (both halves h of a 64-column box x in turn), through a
      // 64 x 64 box of staging that TMA writes out. GeluAuxBias: out's and aux's boxes in one of two 16 KB slots,
      // so one quarter is written while the last one's stores read. DGelu: in place over the aux tile loaded
      // above (box 2h + x).
      if constexpr (kEpi == GeluEpilogue::kDGelu) mbar_wait(&aux_full[c], aux_loads++ & 1);
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        float cs[16];  // kColSums: this thread's sums of its 16 columns of box x (n8 block b, column e: 2b + e)
#pragma unroll
        for (int i = 0; i < 16; ++i) cs[i] = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t box_out, box_aux;
          if constexpr (kEpi == GeluEpilogue::kGeluAuxBias) {
            box_out = staging_c + h * 16384;
            box_aux = box_out + 8192;
            if (ctid == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");  // this slot read out
            consumer_sync(c);
          } else {
            box_out = box_aux = staging_c + (2 * h + x) * 8192;
          }
#pragma unroll
          for (int p = 0; p < 4; ++p) {
            const float* v = &acc[h][32 * x + 8 * p];  // n8 blocks 8x + 2p and 8x + 2p + 1
            const uint32_t off = lane_off ^ ((2 * p) << 4);
            if constexpr (kEpi == GeluEpilogue::kGeluAuxBias) {
              stmatrix_x4(box_aux + off, pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]),
                          pack_bf16(v[6], v[7]));
              stmatrix_x4(box_out + off, pack_bf16(gelu(v[0]), gelu(v[1])), pack_bf16(gelu(v[2]), gelu(v[3])),
                          pack_bf16(gelu(v[4]), gelu(v[5])), pack_bf16(gelu(v[6]), gelu(v[7])));
            } else {
              uint32_t a[4];
              ldmatrix_x4(box_aux + off, a);
              float d[8];
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                d[2 * e] = v[2 * e] * gelu_grad(bf16_lo(a[e]));
                d[2 * e + 1] = v[2 * e + 1] * gelu_grad(bf16_hi(a[e]));
              }
              stmatrix_x4(box_out + off, pack_bf16(d[0], d[1]), pack_bf16(d[2], d[3]), pack_bf16(d[4], d[5]),
                          pack_bf16(d[6], d[7]));
              if constexpr (kColSums) {  // d[0..3]: block 2p rows r, r + 8; d[4..7]: block 2p + 1
                cs[4 * p] += d[0] + d[2];
                cs[4 * p + 1] += d[1] + d[3];
                cs[4 * p + 2] += d[4] + d[6];
                cs[4 * p + 3] += d[5] + d[7];
              }
            }
          }
          if constexpr (kColSums) {
            if (h == 1) {
              // The 8 lanes of one l % 4 hold the same 16 columns (other rows): three halving exchanges leave
              // each with the whole warp's sums of 2 of them, columns 8b + 2(l % 4) + {0, 1}, b = l / 4.
              float r8[8], r4[4], r2[2];
              const bool b16 = lane & 16, b8 = lane & 8, b4 = lane & 4;
#pragma unroll
              for (int i = 0; i < 8; ++i)
                r8[i] = (b16 ? cs[8 + i] : cs[i]) + __shfl_xor_sync(0xFFFFFFFFu, b16 ? cs[i] : cs[8 + i], 16);
#pragma unroll
              for (int i = 0; i < 4; ++i)
                r4[i] = (b8 ? r8[4 + i] : r8[i]) + __shfl_xor_sync(0xFFFFFFFFu, b8 ? r8[i] : r8[4 + i], 8);
#pragma unroll
              for (int i = 0; i < 2; ++i)
                r2[i] = (b4 ? r4[2 + i] : r4[i]) + __shfl_xor_sync(0xFFFFFFFFu, b4 ? r4[i] : r4[2 + i], 4);
              const int col = 8 * (lane / 4) + 2 * (lane % 4);
              *reinterpret_cast<float2*>(&colsum[(c * 4 + warp) * 64 + col]) = make_float2(r2[0], r2[1]);
            }
          }
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the stores, visible to TMA
          consumer_sync(c);
          if (ctid == 0) {
            tma_store(&tout, box_out, n0 + x * 64, m0 + h * 64);
            if constexpr (kEpi == GeluEpilogue::kGeluAuxBias) tma_store(&taux, box_aux, n0 + x * 64, m0 + h * 64);
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
          }
          // The four warps' sums of box x, in a fixed order; the colsum rows are next written two barriers on.
          if constexpr (kColSums) {
            if (h == 1 && ctid < 64) {
              const float* w = &colsum[c * 4 * 64 + ctid];
              partial[static_cast<size_t>(m0 / kBM) * (nt * kBN) + n0 + x * 64 + ctid] =
                  (w[0] + w[64]) + (w[128] + w[192]);
            }
          }
        }
      }
    }
    if (ctid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // smem outlives TMA's reads
  }
  cluster_sync();  // neither CTA exits while the other may still write its shared memory or arrive on its barriers
#endif  // INGOT_SM90A
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encoder() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &st) !=
            cudaSuccess ||
        st != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A row-major [outer, inner] bf16 matrix read in boxes of [box_outer, box_inner] (box_inner * 2 = 128 bytes).
bool tensor_map(CUtensorMap* map, const void* base, uint64_t outer, uint64_t inner, uint32_t box_outer,
                uint32_t box_inner) {
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {inner * 2};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem[2] = {1, 1};
  return encoder()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, elem,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// dbias[c] = the sum of partial's rows at column c, in a fixed order: 8 row groups per column, then their sums.
__global__ void __launch_bounds__(256) column_sums(const float* partial, int rows, int n, bf16* dbias) {
  __shared__ float part[8][32];
  const int col = blockIdx.x * 32 + threadIdx.x % 32, group = threadIdx.x / 32;
  float s = 0.0f;
  for (int r = group; r < rows; r += 8) s += partial[static_cast<size_t>(r) * n + col];
  part[group][threadIdx.x % 32] = s;
  __syncthreads();
  if (group == 0) {
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) t += part[i][threadIdx.x];
    dbias[col] = __float2bfloat16(t);
  }
}

template <bool kBKMajor, GeluEpilogue kEpi, bool kColSums = false>
cudaError_t launch(const GeluGemm& g, cudaStream_t stream, int clusters, const CUtensorMap& ta,
                   const CUtensorMap& tb, const CUtensorMap& tout, const CUtensorMap& taux) {
  auto* kernel = gelu_gemm_kernel<kBKMajor, kEpi, kColSums>;
  const int pairs = (g.m / (2 * kBM)) * (g.n / kBN);
  float* partial = kColSums ? static_cast<float*>(g.workspace) : nullptr;
  kernel<<<2 * std::min(pairs, clusters), kThreads, kSmemBytes, stream>>>(
      ta, tb, tout, taux, static_cast<const bf16*>(g.bias), partial, pairs, g.n / kBN, g.k);
  if (kColSums) column_sums<<<g.n / 32, 256, 0, stream>>>(partial, g.m / kBM, g.n, static_cast<bf16*>(g.dbias));
  return cudaGetLastError();
}

struct DeviceInfo {
  int state = 0;     // 0 unknown, 1 runs the kernel, 2 does not
  int clusters = 0;  // CTA pairs resident at once (at most half the SMs: how the GPCs' SMs pair up decides)
};

// How many two-CTA clusters of the kernel fit on the current device at once.
int max_clusters() {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(2, 1, 1);
  config.blockDim = dim3(kThreads, 1, 1);
  config.dynamicSmemBytes = kSmemBytes;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, gelu_gemm_kernel<true, GeluEpilogue::kGeluAuxBias>, &config) !=
      cudaSuccess)
    return 0;
  return n;
}

// The six instantiations' shared-memory limit is raised on each device before its first launch.
bool allow_shared_memory() {
  for (const void* k : {reinterpret_cast<const void*>(gelu_gemm_kernel<true, GeluEpilogue::kGeluAuxBias>),
                        reinterpret_cast<const void*>(gelu_gemm_kernel<false, GeluEpilogue::kGeluAuxBias>),
                        reinterpret_cast<const void*>(gelu_gemm_kernel<true, GeluEpilogue::kDGelu>),
                        reinterpret_cast<const void*>(gelu_gemm_kernel<false, GeluEpilogue::kDGelu>),
                        reinterpret_cast<const void*>(gelu_gemm_kernel<true, GeluEpilogue::kDGelu, true>),
                        reinterpret_cast<const void*>(gelu_gemm_kernel<false, GeluEpilogue::kDGelu, true>)})
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) != cudaSuccess) return false;
  return true;
}

// Whether `device` runs the kernel, checked once per device; the device is made current for the check.
DeviceInfo& device_info(int device) {
  static std::mutex mu;
  static DeviceInfo known[64];
  static DeviceInfo none{2, 0};
  if (device < 0 || device >= 64) return none;
  std::lock_guard<std::mutex> lk(mu);
  DeviceInfo& d = known[device];
  if (d.state == 0) {
#ifdef INGOT_SM90A_BUILT
    cudaDeviceProp p{};
    cudaFuncAttributes fa{};
    int previous = -1;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device &&
                          cudaSetDevice(device) == cudaSuccess;
    const bool ok = cudaGetDeviceProperties(&p, device) == cudaSuccess && p.major == 9 && p.minor == 0 &&
                    encoder() != nullptr &&
                    cudaFuncGetAttributes(&fa, gelu_gemm_kernel<true, GeluEpilogue::kGeluAuxBias>) == cudaSuccess &&
                    fa.binaryVersion == 90 && allow_shared_memory() && (d.clusters = max_clusters()) > 0;
    if (switched) cudaSetDevice(previous);
#else
    const bool ok = false;  // built without sm_90a code: the kernel body is empty
#endif
    d.state = ok ? 1 : 2;
  }
  return d;
}

std::atomic<int> g_enabled{-1};  // -1: not read from the environment yet

}  // namespace

// Note [Hopper-only paths] (common.cuh): INGOT_HOPPER=0 turns this kernel off like a GPU other than sm_90.
bool available(int device) { return hopper_paths(device) && device_info(device).state == 1; }

bool enabled() {
  int e = g_enabled.load();
  if (e < 0) {
    const char* v = std::getenv("INGOT_SM90_GELU_GEMM");
    e = (v && std::string_view(v) == "0") ? 0 : 1;
    g_enabled.store(e);
  }
  return e == 1;
}

void set_enabled(bool on) { g_enabled.store(on ? 1 : 0); }

bool applies(const GeluGemm& g) {
  return g.m > 0 && g.n > 0 && g.k > 0 && g.m % (2 * kBM) == 0 && g.n % kBN == 0 && g.k % kBK == 0 && aligned16(g.a) &&
         aligned16(g.b) && aligned16(g.out) && aligned16(g.aux) &&
         (g.epilogue != GeluEpilogue::kGeluAuxBias || (g.bias && aligned16(g.bias))) &&
         (!g.dbias || (g.epilogue == GeluEpilogue::kDGelu && g.workspace && aligned16(g.workspace) &&
                       g.workspace_bytes >= static_cast<size_t>(g.m / kBM) * g.n * sizeof(float)));
}

bool gelu_gemm(const GeluGemm& g, void* stream_ptr) {
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  int device = -1;
  if (!enabled() || !applies(g) || cudaGetDevice(&device) != cudaSuccess || !available(device)) return false;
  // Note [SM carve-out] (runtime/sm_budget.h): the persistent grid keeps to its share of the SMs left beside
  // communication kernels, so all its CTAs fit in one wave next to theirs.
  const int clusters = std::max(1, device_info(device).clusters * usable_sms(device) / sm_count(device));
  CUtensorMap ta, tb, tout, taux;
  if (!tensor_map(&ta, g.a, g.m, g.k, kBM, kBK) || !tensor_map(&tout, g.out, g.m, g.n, 64, 64) ||
      !tensor_map(&taux, g.aux, g.m, g.n, 64, 64))
    return false;
  // B in 64-wide halves along n (one per CTA of a cluster).
  if (g.b_kmajor ? !tensor_map(&tb, g.b, g.n, g.k, kBN / 2, kBK) : !tensor_map(&tb, g.b, g.k, g.n, kBK, kBN / 2))
    return false;
  cudaError_t e;
  if (g.epilogue == GeluEpilogue::kGeluAuxBias)
    e = g.b_kmajor ? launch<true, GeluEpilogue::kGeluAuxBias>(g, stream, clusters, ta, tb, tout, taux)
                   : launch<false, GeluEpilogue::kGeluAuxBias>(g, stream, clusters, ta, tb, tout, taux);
  else if (g.dbias)
    e = g.b_kmajor ? launch<true, GeluEpilogue::kDGelu, true>(g, stream, clusters, ta, tb, tout, taux)
                   : launch<false, GeluEpilogue::kDGelu, true>(g, stream, clusters, ta, tb, tout, taux);
  else
    e = g.b_kmajor ? launch<true, GeluEpilogue::kDGelu>(g, stream, clusters, ta, tb, tout, taux)
                   : launch<false, GeluEpilogue::kDGelu>(g, stream, clusters, ta, tb, tout, taux);
  return e == cudaSuccess;
}

}  // namespace ingot::kernels::cuda::sm90
