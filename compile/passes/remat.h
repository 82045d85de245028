// Rematerialization under a memory budget (greedy on cheap ops). Invariant afterwards: with budget < 1, forward
// values saved for the backward whose producer is a short chain (depth <= 4) of nodes cheap to recompute
// (Primitive::cheap_to_recompute: pointwise ops, views, row norms; a node of several outputs is recomputed whole,
// its other outputs unread) are recomputed right before their first backward reader, largest first, until the bytes kept across the
// forward/backward boundary are at most budget x the original; backward nodes read the recomputed copies and no
// chosen value is alive across the boundary. `recomputed_bytes`, if given, receives the bytes no longer kept, and
// `saved_bytes` the bytes saved across the boundary before the pass (CompileStats and INGOT_LOGS=passes show both).
// At any budget, when the step's ops become generated kernels, saved values that cost nothing to remake are
// remade first (Note [Saved values remade for free], remat.cpp).
// Test: tests/compile/passes/test_passes.cpp (Remat.*).
#pragma once

#include <cstdint>

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct RematOptions {
  Device target = Device::cpu();
  double budget = 1.0;  // CompileOptions::memory_budget; >= 1 recomputes only what is free
  // Whether pointwise ops become generated kernels (CompileBackend other than Eager): only then does a remade
  // pointwise value fuse into the kernel of its backward readers, which makes it free.
  bool generated = false;
};

bool remat(Graph& g, const RematOptions& o, int64_t* recomputed_bytes = nullptr, int64_t* saved_bytes = nullptr);

}  // namespace ingot::compiler::passes
