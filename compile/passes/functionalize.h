// Functionalization. Invariant afterwards: no write-back writes a captured tensor's own input value back (a
// no-op), and no two write-backs target one input. Roots that alias captured buffers are copied by the executor
// before write-backs run. Test: tests/compile/passes/test_passes.cpp (Functionalize.*).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct FunctionalizeOptions {
  Device target = Device::cpu();
};

bool functionalize(Graph& g, const FunctionalizeOptions& o);

}  // namespace ingot::compiler::passes
