// Graph::str(): an SSA listing a person can read, e.g.
//   graph(in: 3, ops: 2, out: 1, write-backs: 0)
//     %0: f32[4, 8] = arg0
//     %1: f32[8] = captured "param fc.bias"
//     %2: f32[4, 8] = add(%0, %1)                          # model.cpp:12
//     %3: f32[4, 8] = gelu_tanh(%2)  {group 0}             # model.cpp:13
//     return %3
#include <sstream>

#include "compile/ir/graph.h"

namespace ingot::compiler {
namespace {
std::string base_name(const char* path) {
  std::string p(path);
  const size_t s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}
}  // namespace

std::string Graph::str() const {
  std::ostringstream os;
  os << "graph(in: " << inputs.size() << ", ops: " << nodes.size() << ", out: " << outputs.size()
     << ", write-backs: " << writebacks.size() << ", grads: " << grad_outs.size() << ")\n";
  for (const Symbol& s : symbols) {
    os << "  sym " << s.name << " in [" << s.min << ", ";
    if (s.max == INT64_MAX) os << "inf";
    else os << s.max;
    os << "]\n";
  }
  for (const GraphInput& in : inputs) {
    os << "  %" << in.value << ": " << value_meta_str(*this, in.value) << " = " << role_name(in.role);
    if (in.role == InputRole::Arg) os << in.arg;
    else os << " \"" << in.name << "\"";
    if (in.jit >= 0) os << " (bound just in time, group " << in.jit << ")";
    os << "\n";
  }
  for (const Node& n : nodes) {
    std::ostringstream line;
    line << "  ";
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (k) line << ", ";
      line << "%" << n.outputs[k];
    }
    if (n.outputs.size() == 1) line << ": " << value_meta_str(*this, n.outputs[0]);
    line << " = " << n.prim->name() << "(";
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (k) line << ", ";
      if (n.inputs[k] < 0) line << "none";
      else line << "%" << n.inputs[k];
    }
    line << ")";
    std::ostringstream attrs;
    n.prim->print_attrs(attrs);
    if (!attrs.str().empty()) line << " {" << attrs.str() << "}";
    if (n.group >= 0) line << " [group " << n.group << "]";
    for (int32_t o : n.outputs)
      if (const Value& v = values[static_cast<size_t>(o)]; v.placed_in >= 0)
        line << " [%" << o << " in %" << v.placed_in << " at " << v.placed_at << "]";
    std::string l = line.str();
    os << l;
    if (l.size() < 72) os << std::string(72 - l.size(), ' ');
    os << "  # " << base_name(n.loc.file_name()) << ":" << n.loc.line() << "\n";
  }
  os << "  return";
  for (size_t k = 0; k < outputs.size(); ++k) os << (k ? ", %" : " %") << outputs[k];
  os << "\n";
  for (const WriteBack& w : writebacks)
    os << "  write-back %" << w.value << " -> " << inputs.at(static_cast<size_t>(w.input)).name << "\n";
  for (const GradOut& g : grad_outs) {
    os << "  grad ";
    if (g.value >= 0) os << "%" << g.value;
    else os << "none";
    os << " -> " << (g.param && !g.param->name.empty() ? g.param->name : "param") << ".grad\n";
  }
  return os.str();
}

}  // namespace ingot::compiler
