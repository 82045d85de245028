// What a run that ran out of GPU memory could set to need less: the memory-saving keys it has not set, most saving
// first, each with what it trades (recipes/trainer.cpp appends it to a step's out-of-memory error). Pure: tested in
// tests/recipes/test_memory_advice.cpp.
#pragma once

#include <string>

#include "recipes/train_loop.h"

namespace ingot::recipes {

struct MemoryAdviceInput {
  TrainOptions opts;
  DType dtype = DType::f32;
  bool frozen_base = false;  // LoRA / QLoRA: most weights get no gradient
  bool quantized_base = false;  // lora.quantize_base is set
  int world_size = 1;
  int zero_stage = 0;
};

// "to use less GPU memory, set:" and one indented line per key not set yet, a smaller batch last.
std::string memory_advice(const MemoryAdviceInput& in);

// When the weights alone do not fit (moving a loaded checkpoint to the GPU ran out): what makes them smaller, or
// spreads them. `bytes` is what they take now.
struct WeightsAdviceInput {
  int64_t bytes = 0;
  DType dtype = DType::f32;
  bool lora = false, quantized_base = false;
};
std::string weights_advice(const WeightsAdviceInput& in);

}  // namespace ingot::recipes
