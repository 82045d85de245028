#include "recipes/memory_advice.h"

#include <sstream>

namespace ingot::recipes {

std::string memory_advice(const MemoryAdviceInput& in) {
  const TrainOptions& o = in.opts;
  std::ostringstream os;
  auto say = [&](const std::string& setting, const std::string& why) { os << "\n  " << setting << "  (" << why << ")"; };
  os << "to use less GPU memory, set:";
  if (in.world_size > 1 && in.zero_stage < 3)
    say("distributed.zero_stage=3", "weights, gradients and optimizer state sharded over the " +
                                        std::to_string(in.world_size) + " GPUs");
  if (o.checkpointing == models::Checkpointing::none)
    say("train.activation_checkpointing=blocks", "each block's activations made again in the backward: ~1 more forward");
  else if (o.checkpointing_layers > 0)
    say("train.activation_checkpointing_layers=0", "checkpoint every block, not the first " +
                                                       std::to_string(o.checkpointing_layers));
  if (in.frozen_base && !in.quantized_base)
    say("lora.quantize_base=nf4", "QLoRA: the frozen weights in 4 bits, ~1/4 of bf16's bytes");
  if (!in.frozen_base) {
    if (o.optimizer == "adamw") say("optimizer.name=adamw8bit", "8-bit moments: a quarter of AdamW's f32 state");
    if (in.dtype == DType::bf16 && o.master_weights)
      say("train.master_weights=false", "no f32 copy of the weights; bf16 updates rounded stochastically");
    if (!o.optimizer_in_backward)
      say("train.optimizer_in_backward=true train.grad_clip=0",
          "each parameter updated as soon as its gradient is complete: no step holds all the gradients");
    if (!o.optimizer_offload && in.world_size == 1)
      say("train.optimizer_offload=true", "with train.optimizer_in_backward: the optimizer's state in host memory, "
                                          "copied over PCIe for each update");
    if (!o.trained_head_in_chunks)
      say("train.trained_head_in_chunks=true", "the output head's logits a chunk of rows at a time");
  }
  say("a smaller train.batch_size with a larger train.gradient_accumulation_steps",
      "the same batch per update in smaller pieces; now " + std::to_string(o.batch_size) + " x " +
          std::to_string(o.grad_accum));
  return os.str();
}

std::string weights_advice(const WeightsAdviceInput& in) {
  std::ostringstream os;
  os.precision(3);
  os << "the model's " << dtype_name(in.dtype) << " weights (" << static_cast<double>(in.bytes) / 1e9
     << " GB) do not fit on the GPU; to hold them in less memory, set:";
  if (in.dtype == DType::f32) os << "\n  dtype=bf16  (half the bytes; without train.master_weights=false a "
                                    "full fine-tune keeps f32 masters beside them)";
  if (in.lora && !in.quantized_base) os << "\n  lora.quantize_base=nf4  (QLoRA: the frozen weights in 4 bits)";
  os << "\n  distributed.zero_stage=3 under `ingot launch --nproc-per-node N`  (each of N GPUs holds 1/N of them)";
  return os.str();
}

}  // namespace ingot::recipes
