// unit_reductions: compiled ZeRO-3's reduce-scatters of FSDP units' gradients (reduce_scatter starts with
// UnitCollectiveAttrs, distributed/fsdp_compiled.cpp), each waited for a bounded number of units after its start.
// Tests: tests/compile/passes/test_unit_reductions.cpp (UnitReductions.*: a hand-built graph),
// tests/distributed/test_fsdp_compiled.cpp (CompiledFsdp.*: the traced step's schedule),
// tests/distributed/test_fsdp_memory.cpp (FsdpMemory.*: the step's peak).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct UnitReductionsOptions {
  Device target = Device::cpu();
  int lag = 1;  // CompileOptions::unit_reduction_lag; < 1 leaves the graph unchanged
};

// Note [Unit reductions are waited for a unit later]
// The trace records a unit's reduce-scatter start as soon as its gradients are complete, and every wait when the
// backward ends (fsdp_traced::synchronize). The start's input, the unit's whole flattened gradient, stays allocated
// until its wait: the collective holds it (NCCL: until a stream waits for it; inside a CUDA graph capture nothing
// else releases it). With the waits last, every unit's input was alive at the backward's end (8B Llama on 4 GPUs:
// 14 units, 13.4 GB of rank 0's peak).
// Afterwards, with lag L >= 1: taking the unit reduce-scatter starts in node order s_0, s_1, ..., the wait of s_i
// also reads s_{i+L}'s result, an ordering token its eval does not read, unless s_{i+L} comes after that wait in
// node order (the graph stays topological, and s_{i+L} cannot depend on the wait; this leaves the last L waits of
// a backward followed by another backward in the same step where they were). schedule (schedule.h) runs a wait
// holding a token as soon as it is ready: right after s_{i+L} is issued. So at most L + 1 unit reduce-scatter
// inputs are alive at any point of the schedule, and s_i has had the L units' backward before s_{i+L} to finish
// (L >= 1: a wait never directly follows its own start). A graph without unit reduce-scatters is unchanged.
bool unit_reductions(Graph& g, const UnitReductionsOptions& o);

}  // namespace ingot::compiler::passes
