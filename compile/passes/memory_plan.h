// Memory planning, an analysis of the scheduled graph: the size of one arena in which every intermediate buffer
// gets a place, two buffers overlapping only if their live ranges are disjoint, blocks reused best-fit once dead.
// Test: tests/compile/passes/test_passes.cpp (MemoryPlan.*), tests/compile/exec/test_buffer_reuse.cpp.
#pragma once

#include <cstdint>

#include "compile/ir/graph.h"

namespace ingot::compiler::passes {

struct MemoryPlan {
  int64_t arena_bytes = 0;     // planned peak (the arena size)
  int64_t unplanned_peak = 0;  // peak of live intermediate bytes with a fresh allocation per value
};
MemoryPlan memory_plan(const Graph& g);

}  // namespace ingot::compiler::passes
