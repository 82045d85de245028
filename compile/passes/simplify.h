// Algebraic simplification and constant folding. Invariant afterwards: no node returns one of its inputs
// unchanged (compile/lower/lowering.h identity_input: clone, contiguous, x*1, x+0, same-shape reshape/expand;
// its uses read the input instead), and no node whose inputs are all Constant inputs and whose outputs have at
// most fold_limit_elems elements remains: it is evaluated now and its outputs become Constant inputs. The
// bypassed nodes are left for dce. Test: tests/compile/passes/test_passes.cpp (Simplify.*).
#pragma once

#include <cstdint>

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct SimplifyOptions {
  Device target = Device::cpu();
  int64_t fold_limit_elems = 1 << 16;
};

bool simplify(Graph& g, const SimplifyOptions& o);

}  // namespace ingot::compiler::passes
