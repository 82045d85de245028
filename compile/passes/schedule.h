// Scheduling. Invariant afterwards: nodes are in a topological order in which every fusion group's members are
// contiguous (so a group runs as one kernel); among ready nodes the one earliest in the traced order goes first,
// except that collective starts (and the views and concatenations that only feed them) go before other ready
// work and waits after it; a wait that reads an ordering token after its pending buffer (unit_reductions.h) goes
// as early as a start, i.e. right after the collective that is its token is issued.
// Tests: tests/compile/passes/test_passes.cpp (Schedule.*), tests/compile/passes/test_unit_reductions.cpp.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct ScheduleOptions {
  Device target = Device::cpu();
};

bool schedule(Graph& g, const ScheduleOptions& o);

}  // namespace ingot::compiler::passes
