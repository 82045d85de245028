#include "recipes/compiled_step.h"

#include "runtime/error.h"

namespace ingot::recipes {

CompileOptions compile_options(const CompileSettings& c) {
  CompileOptions o;
  if (c.mode == "default") o.mode = CompileMode::Default;
  else if (c.mode == "reduce-overhead") o.mode = CompileMode::ReduceOverhead;
  else if (c.mode == "max-autotune") o.mode = CompileMode::MaxAutotune;
  else INGOT_FAIL("compile.mode: expected default, reduce-overhead or max-autotune, got '", c.mode, "'");
  o.fullgraph = c.fullgraph;
  o.dynamic = c.dynamic ? DynamicMode::True : DynamicMode::False;
  o.memory_budget = c.memory_budget;
  o.cache_dir = c.cache_dir;
  o.name = "train_step";
  return o;
}

}  // namespace ingot::recipes
