#include "recipes/recipe_list.h"

#include <iostream>

#include "recipes/eval.h"
#include "recipes/finetune.h"
#include "recipes/generate.h"
#include "recipes/train.h"

namespace ingot::recipes {

std::vector<Recipe> make_recipe_list() {
  std::vector<Recipe> list;
  list.push_back({"pretrain", "train a GPT-2 from scratch on a text file (byte tokens)", pretrain_schema,
                  [](const Config& cfg, ConfigErrors& errors) { resolve_pretrain(cfg, errors); },
                  [](const Config& cfg, std::ostream& log) {
                    return summary_json(run_pretrain(resolve_pretrain(cfg), log));
                  }});
  auto finetune = [](const Config& cfg, std::ostream& log) {
    return summary_json(run_finetune(resolve_finetune(cfg), log));
  };
  auto check_finetune = [](const Config& cfg, ConfigErrors& errors) { resolve_finetune(cfg, errors); };
  list.push_back({"full_finetune", "fine-tune every weight of a Hugging Face checkpoint; exports output_dir/hf",
                  full_finetune_schema, check_finetune, finetune});
  list.push_back({"lora_finetune",
                  "train LoRA adapters on a frozen Hugging Face checkpoint; exports a PEFT adapter (+ merged model)",
                  lora_finetune_schema, check_finetune, finetune});
  list.push_back({"eval", "perplexity of a Hugging Face checkpoint (and adapter) on a data file", eval_schema,
                  [](const Config& cfg, ConfigErrors& errors) { resolve_eval(cfg, errors); },
                  [](const Config& cfg, std::ostream& log) { return eval_json(run_eval(resolve_eval(cfg), log)); }});
  list.push_back({"generate", "continue a prompt with a Hugging Face checkpoint (greedy or sampled, KV cache)",
                  generate_schema, [](const Config& cfg, ConfigErrors& errors) { resolve_generate(cfg, errors); },
                  [](const Config& cfg, std::ostream& log) {
                    GenerateResult r = run_generate(resolve_generate(cfg), log);
                    std::cout << r.completion << "\n" << std::flush;  // the product, on stdout
                    return generate_json(r);
                  }});
  return list;
}

}  // namespace ingot::recipes
