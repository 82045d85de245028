// Graph::verify(): the invariants every pass must keep.
//   - every value id is in range and defined exactly once (by one input or one node output);
//   - nodes are in topological order: a node reads only inputs and outputs of earlier nodes;
//   - no node reads a value whose producer was removed;
//   - roots (outputs, write-backs, grad outs) are defined values; a write-back targets a Captured input
//     with the value's dtype and shape, at most once per input;
//   - an input bound just in time is Captured and names a group of Graph::just_in_time;
//   - every node's recorded output metadata agrees with its primitive's infer() on its input metadata
//     (checked with the traced sizes);
//   - fusion groups hold each node at most once and nodes name their group;
//   - a placed value (Note [Values placed in buckets]) fits its 1-d buffer, whose dtype it has.
#include <set>

#include "compile/ir/graph.h"

namespace ingot::compiler {

#define VERIFY(cond, ...) INGOT_CHECK(cond, "[compile] graph verify: ", __VA_ARGS__)

void Graph::verify() const {
  std::vector<int> defined(values.size(), 0);
  for (size_t i = 0; i < values.size(); ++i) VERIFY(values[i].id == static_cast<int32_t>(i), "value ", i, " has id ", values[i].id);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int32_t v = inputs[i].value;
    VERIFY(v >= 0 && v < static_cast<int32_t>(values.size()), "input ", i, " names value ", v, " out of range");
    VERIFY(values[v].producer == -1 && values[v].input_index == static_cast<int32_t>(i), "input ", i,
           " value %", v, " is not marked as that input");
    ++defined[static_cast<size_t>(v)];
  }
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    VERIFY(node.id == static_cast<int32_t>(n), "node ", n, " has id ", node.id);
    VERIFY(node.prim != nullptr, "node ", n, " has no primitive");
    std::vector<TensorMeta> in_meta;
    for (int32_t i : node.inputs) {
      if (i < 0) {
        in_meta.push_back(TensorMeta{});
        continue;
      }
      VERIFY(i < static_cast<int32_t>(values.size()), "node ", n, " (", node.prim->name(), ") reads value ", i,
             " out of range");
      VERIFY(defined[static_cast<size_t>(i)] == 1, "node ", n, " (", node.prim->name(), ") reads %", i,
             " before it is defined (not topological, or its producer was removed)");
      const Value& v = values[static_cast<size_t>(i)];
      in_meta.push_back(TensorMeta{trace_shape(v.shape), v.dtype, v.device});
    }
    for (int32_t o : node.outputs) {
      VERIFY(o >= 0 && o < static_cast<int32_t>(values.size()), "node ", n, " writes value ", o, " out of range");
      VERIFY(values[static_cast<size_t>(o)].producer == static_cast<int32_t>(n), "node ", n, " output %", o,
             " names producer ", values[static_cast<size_t>(o)].producer);
      ++defined[static_cast<size_t>(o)];
      VERIFY(defined[static_cast<size_t>(o)] == 1, "value %", o, " is defined twice");
    }
    std::vector<TensorMeta> want = node.prim->infer(in_meta);
    VERIFY(want.size() == node.outputs.size(), "node ", n, " (", node.prim->name(), ") has ", node.outputs.size(),
           " outputs, infer gives ", want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      const Value& v = values[static_cast<size_t>(node.outputs[k])];
      VERIFY(want[k].dtype == v.dtype && want[k].shape == trace_shape(v.shape), "node ", n, " (",
             node.prim->name(), ") output ", k, " is ", value_meta_str(*this, v.id), ", infer gives ",
             dtype_name(want[k].dtype), shape_str(want[k].shape));
    }
  }
  auto root = [&](int32_t v, const char* what) {
    VERIFY(v >= 0 && v < static_cast<int32_t>(values.size()) && defined[static_cast<size_t>(v)] == 1, what, " %", v,
           " is not a defined value");
  };
  for (int32_t o : outputs) root(o, "output");
  std::set<int32_t> written;
  for (const WriteBack& w : writebacks) {
    root(w.value, "write-back");
    VERIFY(w.input >= 0 && w.input < static_cast<int32_t>(inputs.size()) &&
               inputs[static_cast<size_t>(w.input)].role == InputRole::Captured,
           "write-back of %", w.value, " targets input ", w.input, ", which is not a captured tensor");
    VERIFY(written.insert(w.input).second, "input ", w.input, " is written back twice");
    const Value& dst = values[static_cast<size_t>(inputs[static_cast<size_t>(w.input)].value)];
    const Value& src = values[static_cast<size_t>(w.value)];
    VERIFY(dst.dtype == src.dtype && dst.shape == src.shape, "write-back %", w.value, " ",
           value_meta_str(*this, w.value), " into ", value_meta_str(*this, dst.id), " differs in dtype or shape");
  }
  for (const GradOut& g : grad_outs)
    if (g.value >= 0) root(g.value, "grad out");
  for (const GraphInput& in : inputs)
    if (in.jit >= 0)
      VERIFY(in.role == InputRole::Captured && in.jit < static_cast<int32_t>(just_in_time.size()) && in.jit_index >= 0,
             "input '", in.name, "' is bound just in time by group ", in.jit, " of ", just_in_time.size(),
             " but is not a captured tensor of a group");
  for (const Value& v : values) {
    if (v.placed_in < 0) continue;
    VERIFY(v.placed_in < static_cast<int32_t>(values.size()) && defined[static_cast<size_t>(v.placed_in)] == 1,
           "%", v.id, " is placed in %", v.placed_in, ", which is not a defined value");
    const Value& b = values[static_cast<size_t>(v.placed_in)];
    int64_t n = 1;
    for (const Dim& d : v.shape) n *= d.value;
    VERIFY(b.dtype == v.dtype && b.shape.size() == 1 && v.placed_at >= 0 && v.placed_at + n <= b.shape[0].value,
           "%", v.id, " ", value_meta_str(*this, v.id), " does not fit ", value_meta_str(*this, b.id),
           " from element ", v.placed_at);
  }
  std::set<int32_t> grouped;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (int32_t n : groups[gi].nodes) {
      VERIFY(n >= 0 && n < static_cast<int32_t>(nodes.size()), "group ", gi, " names node ", n, " out of range");
      VERIFY(grouped.insert(n).second, "node ", n, " is in two fusion groups");
      VERIFY(nodes[static_cast<size_t>(n)].group == static_cast<int32_t>(gi), "node ", n, " is in group ", gi,
             " but names group ", nodes[static_cast<size_t>(n)].group);
    }
}

}  // namespace ingot::compiler
