// The recipes' `compile:` section mapped onto ingot::compile (compile/api.h).
#pragma once

#include "compile/api.h"
#include "recipes/run_settings.h"

namespace ingot::recipes {

// compile.mode default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs; compile.dynamic true makes sequence and batch dims
// symbolic from the first call (false: recompile on a new shape, as torch.compile(dynamic=False)).
CompileOptions compile_options(const CompileSettings& c);

}  // namespace ingot::recipes
