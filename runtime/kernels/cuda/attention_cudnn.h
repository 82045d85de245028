// cuDNN's fused flash attention (SDPA) forward and backward, built through the cuDNN graph backend API, used by
// attention.cu when INGOT_ATTENTION is cudnn or auto. Shapes and masking are those of attention_fwd /
// attention_bwd in kernel_list.inc; lse is the same tensor either way, so a forward from one implementation
// and a backward from the other agree.
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>
#include <string>
#include <utility>

#include "runtime/tensor.h"

namespace ingot::kernels::cuda::cudnn_attention {

// Empty when the fused kernels can run this case; otherwise why not (dtype, head dim, mask alignment).
std::string unsupported_reason(const Tensor& q, const Tensor& k, const Tensor& lse, bool causal);

// Empty when cuDNN can read / write these tensors in place; otherwise why not (Note [Layouts] in the .cu).
std::string layout_reason(std::initializer_list<std::pair<const char*, const Tensor*>> tensors);

// Any layout that layout_reason accepts. out [B, Hq, T, D], lse [B, Hq, T] f32 = attention of q [B, Hq, T, D] over k, v [B, Hkv, S, D]. Throws
// ingot::Error when cuDNN finds no engine for the graph (the plan is cached per shape either way).
void forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
             double scale, cudaStream_t stream);
// dq, dk, dv from dout and the forward's out and lse; throws like forward.
void backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, bool causal, double scale,
              cudaStream_t stream);

}  // namespace ingot::kernels::cuda::cudnn_attention
