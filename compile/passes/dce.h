// Dead-code elimination. Invariant afterwards: every remaining node has an output that reaches a root (a
// function output, a write-back or a grad out). Test: tests/compile/passes/test_passes.cpp (Dce.*).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct DceOptions {
  Device target = Device::cpu();
};

bool dce(Graph& g, const DceOptions& o);

}  // namespace ingot::compiler::passes
