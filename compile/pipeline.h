// The spine of the compiler: the passes in order, each timed, logged when it changed the graph
// (INGOT_LOGS=passes) and verified in debug builds, then the step plan the executor runs.
#pragma once

#include "compile/api.h"
#include "compile/exec/executor.h"

namespace ingot::compiler {

// Optimizes `g` and builds its executable; fills the pass and memory fields of `stats`.
std::shared_ptr<Executable> build_executable(Graph g, const CompileOptions& opts, CompileStats& stats);

}  // namespace ingot::compiler
