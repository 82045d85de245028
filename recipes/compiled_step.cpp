#include "recipes/compiled_step.h"

#include <algorithm>
#include <limits>

#include "runtime/error.h"

namespace ingot::recipes {

CompileOptions compile_options(const CompileSettings& c, bool update_per_parameter) {
  CompileOptions o;
  const std::optional<CompileMode> mode = parse_compile_mode(c.mode);
  INGOT_CHECK(mode, "compile.mode: expected default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs, got '", c.mode, "'");
  o.mode = *mode;
  o.fullgraph = c.fullgraph;
  o.dynamic = c.dynamic ? DynamicMode::True : DynamicMode::False;
  o.memory_budget = c.memory_budget;
  o.split_update = update_per_parameter;
  // A lag of at least the number of units leaves every wait at the backward's end, as 0 does, so clamping a
  // huge value to int keeps its meaning.
  o.unit_reduction_lag = static_cast<int>(std::min<int64_t>(c.unit_reduction_lag, std::numeric_limits<int>::max()));
  o.cache_dir = c.cache_dir;
  o.name = "train_step";
  return o;
}

}  // namespace ingot::recipes
