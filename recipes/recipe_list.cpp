#include "recipes/recipe_list.h"

#include "recipes/train.h"

namespace ingot::recipes {

std::vector<Recipe> make_recipe_list() {
  std::vector<Recipe> list;
  list.push_back({"pretrain", "train a GPT-2 from scratch on a text file (byte tokens)", pretrain_schema,
                  [](const Config& cfg, ConfigErrors& errors) { resolve_pretrain(cfg, errors); },
                  [](const Config& cfg, std::ostream& log) {
                    return summary_json(run_pretrain(resolve_pretrain(cfg), log));
                  }});
  return list;
}

}  // namespace ingot::recipes
