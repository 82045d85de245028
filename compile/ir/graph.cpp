#include "compile/ir/graph.h"

#include <sstream>

#include "runtime/sha256.h"

namespace ingot::compiler {

SymShape concrete_shape(const Shape& s) {
  SymShape r;
  r.reserve(s.size());
  for (int64_t d : s) r.push_back(Dim{d, -1});
  return r;
}

Shape trace_shape(const SymShape& s) {
  Shape r;
  r.reserve(s.size());
  for (const Dim& d : s) r.push_back(d.value);
  return r;
}

const char* role_name(InputRole r) {
  switch (r) {
    case InputRole::Arg: return "arg";
    case InputRole::Captured: return "captured";
    case InputRole::Constant: return "const";
    case InputRole::Host: return "host";
  }
  return "?";
}

const char* group_kind_name(GroupKind k) {
  switch (k) {
    case GroupKind::Pointwise: return "pointwise";
    case GroupKind::RowReduction: return "row_reduction";
    case GroupKind::MultiTensor: return "multi_tensor";
  }
  return "?";
}

int32_t Graph::add_value(DType dtype, Device device, SymShape shape) {
  Value v;
  v.id = static_cast<int32_t>(values.size());
  v.dtype = dtype;
  v.device = device;
  v.shape = std::move(shape);
  values.push_back(std::move(v));
  return values.back().id;
}

int32_t Graph::add_input(InputRole role, DType dtype, Device device, SymShape shape, std::string name) {
  const int32_t v = add_value(dtype, device, std::move(shape));
  GraphInput in;
  in.value = v;
  in.role = role;
  in.name = std::move(name);
  values[v].input_index = static_cast<int32_t>(inputs.size());
  inputs.push_back(std::move(in));
  return v;
}

int32_t Graph::add_node(std::shared_ptr<Primitive> prim, std::vector<int32_t> ins, const std::vector<TensorMeta>& outs,
                        std::source_location loc) {
  Node n;
  n.id = static_cast<int32_t>(nodes.size());
  n.prim = std::move(prim);
  n.inputs = std::move(ins);
  n.loc = loc;
  for (size_t k = 0; k < outs.size(); ++k) {
    const int32_t v = add_value(outs[k].dtype, outs[k].device, concrete_shape(outs[k].shape));
    values[v].producer = n.id;
    values[v].output_index = static_cast<int32_t>(k);
    n.outputs.push_back(v);
  }
  nodes.push_back(std::move(n));
  return nodes.back().id;
}

void Graph::replace_uses(int32_t from, int32_t to) {
  for (Node& n : nodes)
    for (int32_t& i : n.inputs)
      if (i == from) i = to;
  for (int32_t& o : outputs)
    if (o == from) o = to;
  for (WriteBack& w : writebacks)
    if (w.value == from) w.value = to;
  for (GradOut& g : grad_outs)
    if (g.value == from) g.value = to;
}

std::vector<int32_t> Graph::use_counts() const {
  std::vector<int32_t> uses(values.size(), 0);
  for (const Node& n : nodes)
    for (int32_t i : n.inputs)
      if (i >= 0) ++uses[static_cast<size_t>(i)];
  for (int32_t o : outputs) ++uses[static_cast<size_t>(o)];
  for (const WriteBack& w : writebacks) ++uses[static_cast<size_t>(w.value)];
  for (const GradOut& g : grad_outs)
    if (g.value >= 0) ++uses[static_cast<size_t>(g.value)];
  return uses;
}

std::vector<std::vector<int32_t>> Graph::readers() const {
  std::vector<std::vector<int32_t>> r(values.size());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int32_t v : nodes[i].inputs)
      if (v >= 0 && (r[static_cast<size_t>(v)].empty() || r[static_cast<size_t>(v)].back() != static_cast<int32_t>(i)))
        r[static_cast<size_t>(v)].push_back(static_cast<int32_t>(i));
  return r;
}

bool Graph::is_root(int32_t value) const {
  for (int32_t o : outputs)
    if (o == value) return true;
  for (const WriteBack& w : writebacks)
    if (w.value == value) return true;
  for (const GradOut& g : grad_outs)
    if (g.value == value) return true;
  return false;
}

std::optional<Device> compute_device(const Graph& g) {
  std::optional<Device> cuda;
  for (const Value& v : g.values) {
    if (v.device.is_cpu()) continue;
    if (cuda && *cuda != v.device) return std::nullopt;
    cuda = v.device;
  }
  return cuda ? *cuda : Device::cpu();
}

void Graph::rewrite_nodes(std::map<size_t, Node> replace, const std::vector<bool>& drop) {
  std::vector<Node> kept;
  kept.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i < drop.size() && drop[i]) continue;
    auto it = replace.find(i);
    kept.push_back(it != replace.end() ? std::move(it->second) : std::move(nodes[i]));
  }
  nodes = std::move(kept);
  renumber_nodes();
}

void Graph::renumber_nodes() {
  for (size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].id = static_cast<int32_t>(i);
    for (int32_t v : nodes[i].outputs) values[static_cast<size_t>(v)].producer = static_cast<int32_t>(i);
  }
  // Values of removed nodes keep a stale producer; mark them orphaned so verify() catches any use.
  std::vector<bool> live(values.size(), false);
  for (const Node& n : nodes)
    for (int32_t v : n.outputs) live[static_cast<size_t>(v)] = true;
  for (Value& v : values)
    if (v.producer >= 0 && !live[static_cast<size_t>(v.id)]) v.producer = -2;
  for (FusionGroup& fg : groups) fg.nodes.clear();
  groups.clear();
  for (Node& n : nodes) n.group = -1;
}

uint64_t Graph::structural_hash() const {
  Key64 k;
  auto meta = [&](const Value& v) {
    k.add(static_cast<uint64_t>(v.dtype));
    k.add(static_cast<uint64_t>(v.device.type) * 131 + static_cast<uint64_t>(v.device.index));
    k.add(v.shape.size());
    for (const Dim& d : v.shape) k.add(d.is_symbolic() ? 1 : 0).add(d.is_symbolic() ? static_cast<uint64_t>(d.sym) : static_cast<uint64_t>(d.value));
  };
  for (const GraphInput& in : inputs) {
    k.add(static_cast<uint64_t>(in.role)).add(static_cast<uint64_t>(in.arg + 1));
    meta(values[static_cast<size_t>(in.value)]);
  }
  k.add(nodes.size());
  for (const Node& n : nodes) {
    k.add(n.prim->name()).add(exact_attrs(*n.prim));  // Note [Exact attributes]
    k.add(n.inputs.size());
    for (int32_t i : n.inputs) k.add(static_cast<uint64_t>(i + 1));
    k.add(n.outputs.size());
    for (int32_t o : n.outputs) meta(values[static_cast<size_t>(o)]);
    k.add(n.recomputed ? 1 : 0);  // CSE treats them apart (Note [Recomputed nodes])
  }
  k.add(outputs.size());
  for (int32_t o : outputs) k.add(static_cast<uint64_t>(o));
  k.add(writebacks.size());
  for (const WriteBack& w : writebacks) k.add(static_cast<uint64_t>(w.input)).add(static_cast<uint64_t>(w.value));
  k.add(grad_outs.size());
  for (const GradOut& g : grad_outs) k.add(static_cast<uint64_t>(g.value + 1));
  k.add(symbols.size());
  for (const Symbol& sym : symbols) k.add(static_cast<uint64_t>(sym.min)).add(static_cast<uint64_t>(sym.max));
  return k.value();
}

std::string value_meta_str(const Graph& g, int32_t id) {
  if (id < 0) return "none";
  const Value& v = g.values.at(static_cast<size_t>(id));
  std::ostringstream os;
  os << dtype_name(v.dtype) << "[";
  for (size_t i = 0; i < v.shape.size(); ++i) {
    if (i) os << ", ";
    if (v.shape[i].is_symbolic()) os << g.symbols.at(static_cast<size_t>(v.shape[i].sym)).name;
    else os << v.shape[i].value;
  }
  os << "]";
  if (!v.device.is_cpu()) os << "@" << v.device.str();
  return os.str();
}

}  // namespace ingot::compiler
