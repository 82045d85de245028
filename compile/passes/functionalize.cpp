// Functionalization (invariant: functionalize.h). The tracer already turns every in-place update of a persistent
// tensor into a pure value plus a write-back (compile/trace/trace.cpp: on_assign) and every gradient accumulation
// into ops, so the graph has no mutation; what is left is dropping the write-backs that change nothing.
#include "compile/passes/functionalize.h"

#include <set>

namespace ingot::compiler::passes {

bool functionalize(Graph& g, const FunctionalizeOptions&) {
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
