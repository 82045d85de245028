// Common-subexpression elimination. Invariant afterwards: no two nodes apply equivalent primitives
// (Primitive::equivalent: same op and attributes) to the same input values; the later one's outputs are
// replaced by the earlier one's. Test: tests/compile/passes/test_passes.cpp (Cse.*).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct CseOptions {
  Device target = Device::cpu();
};

bool cse(Graph& g, const CseOptions& o);

}  // namespace ingot::compiler::passes
