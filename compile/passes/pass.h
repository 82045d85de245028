// What the passes share. A pass is `bool NAME(Graph&, const NAMEOptions&)` in compile/passes/NAME.{h,cpp}: it
// returns whether it changed the graph, its header states what holds afterwards and names its test, and its
// options struct starts with `target`, the device the step's kernels run on (pass_target), so a rewrite made for
// one backend (cuBLASLt epilogues, CUDA column sums, multi-tensor parameter casts) is decided from the options.
// compile/pipeline.cpp runs the passes in order.
#pragma once

#include "compile/ir/graph.h"

namespace ingot::compiler::passes {

// The device the passes optimize `g` for: the GPU its values are on (the first one when they are on several:
// such a graph runs op by op), else the CPU.
inline Device pass_target(const Graph& g) {
  for (const Value& v : g.values)
    if (!v.device.is_cpu()) return v.device;
  return Device::cpu();
}

}  // namespace ingot::compiler::passes
