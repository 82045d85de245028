// Functionalization. The tracer already turns every in-place update of a persistent tensor into a pure value
// plus a write-back (compile/trace/trace.cpp: on_assign) and every gradient accumulation into ops, so the graph
// has no mutation. Invariant afterwards: no write-back writes a captured tensor's own input value back (a
// no-op), and no two write-backs target one input. Roots that alias captured buffers are copied by the
// executor before write-backs run. Test: tests/compile/test_passes.cpp (Functionalize.*).
#include <set>

#include "compile/passes/passes.h"

namespace ingot::compiler::passes {

bool functionalize(Graph& g) {
  std::vector<WriteBack> kept;
  std::set<int32_t> targets;
  for (const WriteBack& w : g.writebacks) {
    if (g.inputs[static_cast<size_t>(w.input)].value == w.value) continue;
    INGOT_INTERNAL_CHECK(targets.insert(w.input).second, "functionalize: two write-backs into input ", w.input);
    kept.push_back(w);
  }
  const bool changed = kept.size() != g.writebacks.size();
  g.writebacks = std::move(kept);
  return changed;
}

}  // namespace ingot::compiler::passes
