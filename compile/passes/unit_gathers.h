// unit_gathers: compiled ZeRO-3's gathers of FSDP units' weights (all_gather_start nodes with
// UnitCollectiveAttrs, distributed/fsdp_compiled.cpp), resharded and prefetched one unit ahead.
// Tests: tests/compile/passes/test_unit_gathers.cpp (UnitGathers.*: a hand-built graph),
// tests/distributed/test_fsdp_compiled.cpp (CompiledFsdp.*: counts in the graph, schedule order).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct UnitGathersOptions {
  Device target = Device::cpu();
};

// Afterwards:
// (a) reshard: no backward node reads (directly or through forward views) the gathered value of a unit gather
//     marked regather; those readers read a gather of their own (a copy of the start, its wait and the views,
//     placed before its first backward reader), so the forward's gathered weights die after their last forward
//     reader instead of living until the backward;
// (b) prefetch: the unit gathers, ordered by their first reader ("windows"), each read the previous window's
//     gathered value as an ordering token (an input after the shard that the start does not read), or, for the
//     first backward window after a forward one, the first output of the first opaque backward node after the
//     previous window's first reader. A start is scheduled early (schedule_class) but only once its token
//     exists, and a wait late, so unit k+1's gather is issued when unit k's weights arrived (as unit k begins
//     to compute) and not before: one unit in flight beyond the one computing.
// (c) no fsdp_unit_boundary node remains (the traced run's identity that gathered a unit again before its
//     backward; its readers read its input).
// A graph without unit gathers is unchanged.
bool unit_gathers(Graph& g, const UnitGathersOptions& o);

}  // namespace ingot::compiler::passes
