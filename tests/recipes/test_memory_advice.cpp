// recipes/memory_advice.h: a step that ran out of GPU memory lists the memory-saving keys the run has not set (and
// only those), each a key some recipe's schema defines with a value it accepts, a smaller batch always last.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <set>
#include <string>

#include "recipes/memory_advice.h"
#include "recipes/registry.h"

namespace ingot::recipes {
namespace {

bool has(const std::string& advice, const std::string& setting) {
  return advice.find("\n  " + setting + "  (") != std::string::npos;
}

// Every "key=value" the advice names is a key of the full fine-tune or LoRA recipe whose value validates; returns how
// many it checked.
int expect_real_keys(const std::string& advice) {
  const std::regex setting(R"(([a-z_]+(?:\.[a-z_]+)*)=([a-z0-9]+))");
  int checked = 0;
  for (auto it = std::sregex_iterator(advice.begin(), advice.end(), setting); it != std::sregex_iterator(); ++it) {
    const std::string key = (*it)[1], value = (*it)[2];
    bool known = false;
    for (const Recipe& r : all_recipes()) {
      if (r.name != "full_finetune" && r.name != "lora_finetune") continue;
      for (const ConfigKey& k : r.schema().keys()) {
        if (k.path != key) continue;
        Config c = Config::defaults(r.schema());
        c.apply_override(key + "=" + value);
        ConfigErrors errors;
        c.validate(r.schema(), errors);
        known = known || !errors.has_error_for(key);
      }
    }
    EXPECT_TRUE(known) << key << "=" << value << " is not a key with a valid value\n" << advice;
    ++checked;
  }
  return checked;
}

TEST(MemoryAdvice, AFullFineTuneWithNothingSetGetsEveryKeyMostSavingFirst) {
  MemoryAdviceInput in;
  in.opts.optimizer = "adamw";
  in.opts.batch_size = 4;
  in.dtype = DType::bf16;
  const std::string a = memory_advice(in);
  EXPECT_EQ(a.rfind("to use less GPU memory, set:", 0), 0u) << a;
  for (const char* s : {"train.activation_checkpointing=blocks", "optimizer.name=adamw8bit",
                        "train.master_weights=false", "train.optimizer_in_backward=true train.grad_clip=0",
                        "train.optimizer_offload=true", "train.trained_head_in_chunks=true"})
    EXPECT_TRUE(has(a, s)) << s << "\n" << a;
  EXPECT_FALSE(has(a, "distributed.zero_stage=3")) << a;  // one process
  EXPECT_FALSE(has(a, "lora.quantize_base=nf4")) << a;     // nothing frozen
  EXPECT_LT(a.find("activation_checkpointing"), a.find("adamw8bit")) << a;
  EXPECT_NE(a.find("a smaller train.batch_size with a larger train.gradient_accumulation_steps  (the same batch per "
                   "update in smaller pieces; now 4 x 1)"),
            std::string::npos)
      << a;
  EXPECT_EQ(expect_real_keys(a), 7) << a;  // train.grad_clip=0 beside train.optimizer_in_backward=true
}

TEST(MemoryAdvice, KeysAlreadySetAreNotSuggestedAgain) {
  MemoryAdviceInput in;
  in.opts.optimizer = "adamw8bit";
  in.opts.master_weights = false;
  in.opts.optimizer_in_backward = in.opts.optimizer_offload = in.opts.trained_head_in_chunks = true;
  in.opts.checkpointing = models::Checkpointing::blocks;
  in.dtype = DType::bf16;
  const std::string a = memory_advice(in);
  EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 1) << a;  // the smaller batch alone
  EXPECT_TRUE(has(a, "a smaller train.batch_size with a larger train.gradient_accumulation_steps")) << a;
  in.opts.checkpointing_layers = 8;  // only the first 8 blocks checkpointed
  EXPECT_TRUE(has(memory_advice(in), "train.activation_checkpointing_layers=0")) << memory_advice(in);
}

TEST(MemoryAdvice, LoraGetsQloraNotOptimizerKeysAndSeveralGpusGetZero3) {
  MemoryAdviceInput lora;
  lora.opts.optimizer = "adamw";
  lora.frozen_base = true;
  const std::string a = memory_advice(lora);
  EXPECT_TRUE(has(a, "lora.quantize_base=nf4")) << a;
  for (const char* s : {"optimizer.name=adamw8bit", "train.optimizer_offload=true", "train.trained_head_in_chunks=true"})
    EXPECT_FALSE(has(a, s)) << s << "\n" << a;
  lora.quantized_base = true;
  EXPECT_FALSE(has(memory_advice(lora), "lora.quantize_base=nf4"));
  expect_real_keys(a);

  MemoryAdviceInput ddp;
  ddp.opts.optimizer = "adamw8bit";
  ddp.world_size = 4;
  const std::string d = memory_advice(ddp);
  EXPECT_TRUE(has(d, "distributed.zero_stage=3")) << d;
  EXPECT_NE(d.find("sharded over the 4 GPUs"), std::string::npos) << d;
  EXPECT_FALSE(has(d, "train.optimizer_offload=true")) << d;  // one process's only
  ddp.zero_stage = 3;
  EXPECT_FALSE(has(memory_advice(ddp), "distributed.zero_stage=3"));
  expect_real_keys(d);
}

TEST(MemoryAdvice, WeightsThatDoNotFitGetWhatShrinksOrSpreadsThem) {
  const std::string f32_lora = weights_advice({.bytes = 32'120'000'000, .dtype = DType::f32, .lora = true});
  EXPECT_EQ(f32_lora.rfind("the model's f32 weights (32.1 GB) do not fit on the GPU; to hold them in less memory, "
                           "set:", 0),
            0u)
      << f32_lora;
  for (const char* s : {"dtype=bf16", "lora.quantize_base=nf4",
                        "distributed.zero_stage=3 under `ingot launch --nproc-per-node N`"})
    EXPECT_TRUE(has(f32_lora, s)) << s << "\n" << f32_lora;
  const std::string bf16_qlora =
      weights_advice({.bytes = 5'000'000'000, .dtype = DType::bf16, .lora = true, .quantized_base = true});
  EXPECT_FALSE(has(bf16_qlora, "dtype=bf16")) << bf16_qlora;
  EXPECT_FALSE(has(bf16_qlora, "lora.quantize_base=nf4")) << bf16_qlora;
  EXPECT_TRUE(has(bf16_qlora, "distributed.zero_stage=3 under `ingot launch --nproc-per-node N`")) << bf16_qlora;
  EXPECT_EQ(expect_real_keys(f32_lora), 4) << f32_lora;  // train.master_weights=false in dtype's line
}

}  // namespace
}  // namespace ingot::recipes
