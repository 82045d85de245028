// An own bf16 product for Hopper (sm_90a: TMA loads, wgmma) with the two GELU epilogues of a GPT MLP, for the
// shapes where cuBLASLt's fused-epilogue kernels are slow (Note [Own GELU products on Hopper], gemm_sm90.cu).
//
// out[m, n] = sum_k a[m, k] * B[n, k], f32 accumulation, every operand row-major and contiguous:
//   a   [m, k] bf16
//   b   [n, k] bf16 when b_kmajor, else [k, n] (a linear's weight as the forward stores it, read transposed)
//   GeluAuxBias: pre = acc + bias[n] (bf16, written to aux), out = gelu_tanh(acc + bias[n])
//   DGelu:       out = acc * gelu_tanh'(aux[m, n]); with dbias also dbias[n] = sum over m of out (bf16, summed in
//                f32 from the unrounded values; the bias gradient), through `workspace`: (m / 128) x n f32 partial
//                sums, one row per 128-row block, summed in a fixed order by a second kernel
// Returns false, launching nothing, where this kernel does not apply (not an sm_90 device, m not a multiple of 256,
// n of 128 or k of 64, pointers not 16-byte aligned, dbias without kDGelu or without room for its partial sums);
// the caller then runs cuBLASLt.
#pragma once

namespace ingot::kernels::cuda::sm90 {

enum class GeluEpilogue { kGeluAuxBias, kDGelu };

struct GeluGemm {
  GeluEpilogue epilogue;
  int m, n, k;
  const void* a;
  const void* b;
  bool b_kmajor;
  void* out;
  void* aux;
  const void* bias;  // kGeluAuxBias only
  void* dbias = nullptr;  // kDGelu only, optional
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Whether `device` runs this kernel (compute capability 9.0, built with sm_90a code).
bool available(int device);
// On unless INGOT_SM90_GELU_GEMM=0 (then cuBLASLt's epilogues run, for comparison); tests switch it directly.
bool enabled();
void set_enabled(bool on);
bool applies(const GeluGemm& g);
// Launches on `stream` (a cudaStream_t; nullptr is the default stream) if enabled() and applies(g) on the current
// device; false otherwise. Without CUDA (runtime/no_cuda.cpp) nothing is available and nothing launches.
bool gelu_gemm(const GeluGemm& g, void* stream);

}  // namespace ingot::kernels::cuda::sm90
