// QLoRA (Dettmers et al. 2023): the frozen base projections of a model kept in NF4 (runtime/kernels/nf4.h),
// LoRA adapters trained on top in the model's own dtype, as peft + bitsandbytes do.
//
// quantize_base_nf4() replaces the weight of every nn::LoRALinear (adapted or not; lm_head stays dense, as
// transformers keeps it) with an NF4 copy and empties the `weight` parameter: it stays registered with its
// dtype and device but holds zero elements, so Module::to moves and casts nothing big, state_dict() and
// num_parameters() no longer see the base values, and loading a checkpoint into it is a shape error naming
// it. The LoRALinear then computes its base product with nf4_linear (autograd/ops/nf4_linear.h): the weight is
// dequantized just in time for each product. Embeddings, norms and lm_head stay dense.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/nn/lora.h"

namespace ingot::models {

struct QuantizedBase {
  int64_t tensors = 0;        // weights quantized
  int64_t parameters = 0;     // their elements
  int64_t bytes = 0;          // NF4 bytes held (codes, absmax codes, scales, maps)
  int64_t dense_bytes = 0;    // what they held before, in the dtype they had
  std::vector<std::string> names;  // "model.layers.0.self_attn.q_proj.weight", ...
};

// Quantizes every LoRALinear base weight of `model` but `skip` (last name components, default lm_head) to NF4
// on the weight's device. Errors name the tensor: a weight whose element count is not a multiple of 64, a
// dtype other than f32/bf16/f16, a module already quantized.
QuantizedBase quantize_base_nf4(nn::Module& model, const std::vector<std::string>& skip = {"lm_head"});

// What is quantized now (zeros when nothing is): the numbers memory reports show.
QuantizedBase quantized_base(const nn::Module& model);

// Moves the NF4 weights to `d` (Module::to moves the rest of the model, not these).
void quantized_base_to(nn::Module& model, Device d);

// Gives every quantized projection a dense weight again: the dequantized values in the placeholder's dtype (or
// zeros with `dequantize` false, for a caller about to load the original checkpoint into them) and drops the
// NF4 copies. Export uses this to merge the adapters into the original bf16 weights.
void restore_dense_base(nn::Module& model, bool dequantize = true);

}  // namespace ingot::models
