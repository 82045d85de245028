// Splitting the optimizer update under a memory budget. Invariant afterwards: with budget < 1, no adamw_update
// node updates more than one parameter, and each sits right after every reader of its parameter and optimizer
// state, so each gradient dies as soon as its update ran. Test: tests/compile/passes/test_passes.cpp (SplitUpdate.*).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct SplitUpdateOptions {
  Device target = Device::cpu();
  double budget = 1.0;  // >= 1 changes nothing
};

bool split_update(Graph& g, const SplitUpdateOptions& o);

}  // namespace ingot::compiler::passes
