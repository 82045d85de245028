// Tracing: runs a function once, eagerly, with an autograd TraceObserver installed, and records every
// primitive it applies (the forward, the VJPs that loss.backward() runs, the optimizer's fused update,
// gradient accumulation) into ONE Graph. The eager run is real: its results are the results of this call.
//
// Note [Tensor identity while tracing]: a tensor is matched to its graph value by its view identity
// (storage, offset, shape, strides, dtype), not by TensorImpl, because autograd saves detached aliases for
// backward and the VJPs read those. Tensors that no traced op produced become graph inputs: the caller's
// args (by position), host inputs the optimizer registers, and everything else by handle, classified when
// the trace ends: still referenced elsewhere (parameters, optimizer state) -> Captured, read at every run;
// referenced only by the trace (a ones() made by backward) -> Constant. An in-place write to a captured
// tensor (on_assign) becomes a write-back; views of it taken before the write are stale and any later read
// of one is an error (the eager result would differ from the functional graph's).
//
// Graph breaks: a host read of a traced value (item(), to_vector(): data-dependent control flow) and ops
// excluded with disallow_in_graph (every primitive can otherwise run from a graph) are recorded with the user's
// source line and the reason. The first call's trace only finds them; later calls of a function with breaks
// split it there and run the pieces compiled (compile/trace/segments.h).
#pragma once

#include <functional>
#include <source_location>
#include <string>
#include <vector>

#include "compile/ir/graph.h"

namespace ingot::compiler {

using StepFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct GraphBreak {
  std::string reason;
  std::string file;
  int line = 0;
  std::string str() const;  // "file.cpp:12: reason"
};

struct TraceResult {
  Graph graph;
  std::vector<Tensor> outputs;  // the eager results of the traced call
  std::vector<GraphBreak> breaks;
  std::string defer_blocker;    // why later calls could not run split into segments (empty: they can)
};

// Keeps primitive `op_name` out of compiled graphs (torch's disallow_in_graph): a call of it is a graph break
// and runs eagerly, `reason` is what reports say. For custom ops whose kernels must see real data.
void disallow_in_graph(std::string op_name, std::string reason);

// Runs fn(args) eagerly and records it. Throws what fn throws (the trace is discarded). With fullgraph, the
// first graph break throws at once ("[compile] fullgraph: graph break at file:line: reason"), before the
// rest of the function has run.
TraceResult trace(const StepFn& fn, const std::vector<Tensor>& args, bool fullgraph = false);

}  // namespace ingot::compiler
