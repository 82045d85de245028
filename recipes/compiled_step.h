// The recipes' `compile:` section mapped onto ingot::compile (compile/api.h).
#pragma once

#include "compile/api.h"
#include "recipes/run_settings.h"

namespace ingot::recipes {

// compile.mode default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs; compile.dynamic true makes sequence and batch dims
// symbolic from the first call (false: recompile on a new shape, as torch.compile(dynamic=False)).
// update_per_parameter: one optimizer update per parameter, each where the trace put it (Note [Each parameter
// updated in its backward], recipes/train_step.cpp).
CompileOptions compile_options(const CompileSettings& c, bool update_per_parameter = false);

}  // namespace ingot::recipes
