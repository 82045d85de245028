// An embedding's gradient added to another gradient of the same weight without a zero-filled buffer in between.
// Invariant afterwards: no add reads an index_add that nothing else reads together with a value of that
// index_add's shape and dtype; each such pair is one index_add_accumulate node (autograd/ops/index_fused.h)
// taking the other value as its base. Test: tests/compile/passes/test_accumulate_index_add.cpp.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct AccumulateIndexAddOptions {
  Device target = Device::cpu();
};

bool accumulate_index_add(Graph& g, const AccumulateIndexAddOptions& o);

}  // namespace ingot::compiler::passes
