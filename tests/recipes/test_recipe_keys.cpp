// Every recipe's config keys are defined once, in its schema (recipes/config.h): the defaults written there
// pass the schema's own checks, resolving a config reads no key the schema leaves out, a value that cannot be
// read resolves to the schema's default, and the config hash a resume checks leaves out the keys the schema
// marks not_in_config_hash().
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "recipes/registry.h"
#include "recipes/train.h"
#include "recipes/train_loop.h"
#include "recipes/train_state.h"

namespace ingot::recipes {
namespace {

std::string joined(const ConfigErrors& errors) {
  std::string s;
  for (const std::string& m : errors.messages()) s += "\n  " + m;
  return s;
}

TEST(RecipeKeys, EverySchemaDefaultPassesTheSchemaCheck) {
  for (const Recipe& r : all_recipes()) {
    const ConfigSchema& schema = r.schema();
    Config c = Config::defaults(schema);
    ConfigErrors errors;
    c.validate(schema, errors);
    // Only the required keys, which have no default, are reported.
    for (const ConfigKey& k : schema.keys())
      EXPECT_EQ(errors.has_error_for(k.path), k.required) << r.name << ": " << k.path;
    size_t required = 0;
    for (const ConfigKey& k : schema.keys()) required += k.required;
    EXPECT_EQ(errors.size(), required) << r.name << joined(errors);
  }
}

TEST(RecipeKeys, ResolvingReadsOnlyKeysTheSchemaLists) {
  for (const Recipe& r : all_recipes()) {
    Config c = Config::defaults(r.schema());
    ConfigErrors errors;
    c.validate(r.schema(), errors);
    // Config problems (the missing required keys) are recorded; reading an unlisted key throws ingot::Error.
    EXPECT_NO_THROW(r.check(c, errors)) << r.name;
  }
}

// The other half of "defined once": a key the schema declares (with a default and help text that `ingot run
// --help` shows) but no resolver reads would be a setting that silently does nothing.
TEST(RecipeKeys, EveryKeyTheSchemaDeclaresIsReadByItsRecipe) {
  for (const Recipe& r : all_recipes()) {
    Config c = Config::defaults(r.schema());
    ConfigErrors errors;
    c.validate(r.schema(), errors);
    r.check(c, errors);
    for (const ConfigKey& k : r.schema().keys()) {
      // The registry reads `recipe` to choose the recipe (recipes/registry.h); eval and generate need no more.
      if (k.path == "recipe" && (r.name == "eval" || r.name == "generate")) continue;
      EXPECT_TRUE(c.read_keys().count(k.path)) << r.name << ": " << k.path << " is declared but never read";
    }
  }
}

// The bug this guards against: the schema said train.grad_clip 1.0 and train.min_lr 1e-4 while the reader's own
// fallbacks said 0 and 0.
TEST(RecipeKeys, AnUnreadableTrainValueResolvesToTheSchemaDefault) {
  for (const char* name : {"pretrain", "full_finetune", "lora_finetune"}) {
    const ConfigSchema& schema = find_recipe(name)->schema();
    Config good = Config::defaults(schema), bad = Config::defaults(schema);
    for (const ConfigKey& k : schema.keys())
      if (k.path.rfind("train.", 0) == 0 && k.type != ConfigType::StringList) bad.apply_override(k.path + "=[1, 2]");
    ConfigErrors good_errors, bad_errors;
    good.validate(schema, good_errors);
    bad.validate(schema, bad_errors);
    const TrainOptions want = resolve_train_options(good, good_errors);
    const TrainOptions got = resolve_train_options(bad, bad_errors);
    EXPECT_TRUE(bad_errors.has_error_for("train.grad_clip")) << name;
    EXPECT_EQ(got.batch_size, want.batch_size) << name;
    EXPECT_EQ(got.grad_accum, want.grad_accum) << name;
    EXPECT_EQ(got.warmup_steps, want.warmup_steps) << name;
    EXPECT_EQ(got.log_every, want.log_every) << name;
    EXPECT_EQ(got.eval_every, want.eval_every) << name;
    EXPECT_EQ(got.eval_batches, want.eval_batches) << name;
    EXPECT_EQ(got.lr, want.lr) << name;
    EXPECT_EQ(got.min_lr, want.min_lr) << name;
    EXPECT_EQ(got.weight_decay, want.weight_decay) << name;
    EXPECT_EQ(got.beta1, want.beta1) << name;
    EXPECT_EQ(got.beta2, want.beta2) << name;
    EXPECT_EQ(got.grad_clip, want.grad_clip) << name;
    EXPECT_EQ(got.lr_schedule, want.lr_schedule) << name;
  }
  const TrainOptions pretrain = [] {
    Config c = Config::defaults(pretrain_schema());
    ConfigErrors errors;
    c.validate(pretrain_schema(), errors);
    return resolve_train_options(c, errors);
  }();
  EXPECT_EQ(pretrain.grad_clip, 1.0);
  EXPECT_EQ(pretrain.min_lr, 1e-4);
}

// Checkpoints record the hash of the entries training_config_entries keeps; the keys it leaves out are the
// ones it left out before the schema carried the mark, so those checkpoints still resume.
TEST(RecipeKeys, TheResumeHashLeavesOutTheKeysThatDoNotChangeTheMath) {
  const std::set<std::string> exact = {"output_dir",       "resume",          "resume_from",
                                       "max_steps",        "overwrite_output_dir", "resume_schedule",
                                       "device",           "train.log_every", "train.eval_every",
                                       "train.eval_batches", "train.activation_checkpointing",
                                       "train.activation_checkpointing_layers", "train.loss_chunks"};
  const std::vector<std::string> sections = {"checkpoint.", "logging.", "profile.", "distributed.", "compile."};
  for (const char* name : {"pretrain", "full_finetune", "lora_finetune"}) {
    const ConfigSchema& schema = find_recipe(name)->schema();
    Config c = Config::defaults(schema);
    const std::map<std::string, std::string> hashed = training_config_entries(c);
    for (const ConfigKey& k : schema.keys()) {
      bool left_out = exact.count(k.path) > 0;
      for (const std::string& s : sections) left_out |= k.path.rfind(s, 0) == 0;
      EXPECT_EQ(k.in_config_hash, !left_out) << name << ": " << k.path;
      if (!k.required) {
        EXPECT_EQ(hashed.count(k.path), k.in_config_hash ? 1u : 0u) << name << ": " << k.path;
      }
    }
  }
}

}  // namespace
}  // namespace ingot::recipes
