#include "compile/explain.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "autograd/ops/attrs.h"
#include "autograd/ops/sum_pieces.h"
#include "autograd/primitive_multi_tensor.h"
#include "autograd/primitive_collective.h"
#include "compile/ir/graph.h"
#include "compile/lower/lowering.h"

namespace ingot {
namespace {
std::string mib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}
std::string ms(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f ms", v);
  return buf;
}
}  // namespace

namespace compiler {
namespace {

// Where the pieces an exchange brings (waited at node `w`) are summed: by a sum_pieces op, or by the optimizer update
// that reads them (Note [Pieces read by the update], compile/passes/pieces_into_update.h). Views followed.
std::string pieces_summed_by(const Graph& g, const std::vector<std::vector<int32_t>>& readers, int32_t w) {
  std::vector<int32_t> work;
  if (w >= 0) work.push_back(g.nodes[static_cast<size_t>(w)].outputs[0]);
  while (!work.empty()) {
    const int32_t v = work.back();
    work.pop_back();
    for (int32_t r : readers[static_cast<size_t>(v)]) {
      const Node& x = g.nodes[static_cast<size_t>(r)];
      if (std::optional<SumPiecesInfo> sum = as_sum_pieces(*x.prim))
        return "summed in " + std::string(dtype_name(sum->into)) + " after the wait";
      if (as_multi_tensor_update(*x.prim)) return "summed in f32 by the optimizer update";
      if (x.prim->fusion_kind() == FusionKind::View)
        for (int32_t o : x.outputs) work.push_back(o);
    }
  }
  return "the pieces summed where they are read";
}

}  // namespace

// Note [Collectives in explain]: each collective start of the scheduled graph, one line: what it moves (an FSDP
// unit's weights or gradients, or a gradient bucket), where it is issued and waited for, and the compute it
// overlaps: the non-view ops scheduled between its start and its wait, named by the unit whose weights they (or
// the nearest op before them that reads a unit's weights) read, forward or backward.
std::vector<std::string> describe_collectives(const Graph& g) {
  std::vector<std::string> out;
  const size_t n = g.nodes.size();
  std::vector<std::string> label(n);
  const std::vector<std::vector<int32_t>> readers = g.readers();
  // A start's own wait reads its buffer first; another wait may read it after as an ordering token
  // (compile/passes/unit_reductions.h).
  auto wait_of = [&](size_t s) -> int32_t {
    const int32_t out = g.nodes[s].outputs[0];
    for (int32_t r : readers[static_cast<size_t>(out)]) {
      const Node& x = g.nodes[static_cast<size_t>(r)];
      if (is_collective_wait(*x.prim) && x.inputs[0] == out) return r;
    }
    return -1;
  };
  // Which unit's weights each node reads (through the views of a unit gather's result).
  for (size_t s = 0; s < n; ++s) {
    const UnitCollectiveAttrs* a = match<UnitCollectiveAttrs>(*g.nodes[s].prim);
    if (!a || !is_all_gather_start(*g.nodes[s].prim)) continue;
    const int32_t w = wait_of(s);
    if (w < 0) continue;
    std::vector<int32_t> work{g.nodes[static_cast<size_t>(w)].outputs[0]};
    while (!work.empty()) {
      const int32_t v = work.back();
      work.pop_back();
      for (int32_t r : readers[static_cast<size_t>(v)]) {
        const Node& x = g.nodes[static_cast<size_t>(r)];
        if (schedule_class(*x.prim) != 0) continue;  // a later gather's ordering token
        if (x.prim->fusion_kind() == FusionKind::View && x.forward == g.nodes[s].forward) {
          for (int32_t o : x.outputs) work.push_back(o);
          continue;
        }
        label[static_cast<size_t>(r)] = a->name + (x.forward ? " forward" : " backward");
      }
    }
  }
  std::string current = "step start";
  std::vector<std::string> at(n);
  for (size_t i = 0; i < n; ++i) {
    if (!label[i].empty()) current = label[i];
    else if (!g.nodes[i].forward && current.size() > 8 && current.compare(current.size() - 8, 8, " forward") == 0)
      current = "backward";  // the loss gradient and the head's before any unit's backward reads weights
    at[i] = current;
  }
  for (size_t s = 0; s < n; ++s) {
    const Node& start = g.nodes[s];
    if (schedule_class(*start.prim) >= 0) continue;
    const int32_t w = wait_of(s);
    std::ostringstream line;
    std::string kind(start.prim->name());
    kind = kind.substr(0, kind.size() - 6);  // "_start"
    line << "op " << s << ": " << kind;
    if (const UnitCollectiveAttrs* a = match<UnitCollectiveAttrs>(*start.prim)) {
      line << " of unit " << a->name;
      if (is_all_gather_start(*start.prim))
        line << (start.forward ? " (weights for forward" : " (weights again for backward")
             << (a->regather && start.forward ? ", resharded after it)" : ")");
      else if (kind == "exchange")  // Note [Pieces read by the update] (compile/passes/pieces_into_update.h)
        line << " (its gradients, sent in " << dtype_name(g.values.at(static_cast<size_t>(start.inputs[0])).dtype)
             << ", " << pieces_summed_by(g, readers, w) << ")";
      else if (const DType sent = g.values.at(static_cast<size_t>(start.inputs[0])).dtype,
               summed = g.values.at(static_cast<size_t>(start.outputs[0])).dtype;
               sent != summed)  // Note [Narrow wire, wide sum] (distributed/process_group.h)
        line << " (its gradients, sent in " << dtype_name(sent) << ", summed in " << dtype_name(summed) << ")";
      else
        line << " (its gradients, in " << dtype_name(sent) << ")";
    } else {
      line << " of " << value_meta_str(g, start.inputs[0]);
      if (const CollectivePurposeAttrs* p = match<CollectivePurposeAttrs>(*start.prim))
        line << " (" << p->what << ")";
    }
    if (w < 0) {
      line << ", never waited for";
      out.push_back(line.str());
      continue;
    }
    line << ", waited at op " << w << "; overlaps ";
    int64_t ops = 0;
    std::vector<std::string> with;
    for (size_t i = s + 1; i < static_cast<size_t>(w); ++i) {
      const Node& x = g.nodes[i];
      if (x.prim->fusion_kind() == FusionKind::View || schedule_class(*x.prim) != 0) continue;
      ++ops;
      if (std::find(with.begin(), with.end(), at[i]) == with.end()) with.push_back(at[i]);
    }
    if (ops == 0) {
      line << "nothing (exposed)";
    } else {
      line << ops << (ops == 1 ? " op" : " ops") << ": ";
      for (size_t k = 0; k < with.size(); ++k) line << (k ? ", " : "") << with[k];
    }
    out.push_back(line.str());
  }
  return out;
}

}  // namespace compiler

std::string explain_report(const CompiledFunction& f) {
  const CompileStats& s = f.stats();
  const CompileOptions& o = f.options();
  std::ostringstream os;
  os << "compiled function '" << o.name << "'\n";
  os << "  graphs: " << s.graphs << (s.graph_breaks.empty() ? " (the whole step is one graph)" : "") << "\n";
  os << "  graph breaks: " << s.graph_breaks.size() << "\n";
  for (const std::string& b : s.graph_breaks) os << "    " << b << "\n";
  if (!s.graph_breaks.empty()) {
    os << "    -> split there (fullgraph=false): after the first call (traced, eager) each piece runs as one "
       << "compiled graph, " << s.segments_compiled << " segment graphs compiled so far\n";
    for (const std::string& seg : s.segments) os << "    " << seg << "\n";
  }
  os << "  ops: " << s.ops_before << " traced, " << s.ops_after << " after passes\n";
  os << "  fusion: " << s.fused_groups << " groups, " << s.kernels << " run as generated kernels; " << s.launches
     << " launches per call (eager: " << s.compute_ops << " non-view ops)\n";
  os << "  kernels: " << s.kernels_generated << " generated, " << s.kernels_reused << " reused ("
     << s.kernels_disk_hits << " from the disk cache)\n";
  os << "  recompiles: " << s.recompiles << " (limit " << o.recompile_limit << "), shape specializations: "
     << s.specializations << "\n";
  for (const std::string& r : s.recompile_reasons) os << "    " << r << "\n";
  os << "  planned peak memory (intermediates): " << mib(s.planned_peak_bytes) << " arena, "
     << mib(s.unplanned_peak_bytes) << " live at peak\n";
  if (recomputation_to_report(o.memory_budget, s.recomputed_bytes))
    os << "  recomputed in the backward (memory_budget " << o.memory_budget << "): " << mib(s.recomputed_bytes)
       << " of the " << mib(s.saved_for_backward_bytes) << " of forward values the backward reads\n";
  if (!s.collectives.empty()) {
    os << "  collectives: " << s.collectives.size() << " per call, each issued early and waited for late:\n";
    for (const std::string& c : s.collectives) os << "    " << c << "\n";
  }
  os << "  compile time: trace " << ms(s.time.trace_ms) << ", passes " << ms(s.time.passes_ms) << ", lower "
     << ms(s.time.lower_ms) << ", codegen " << ms(s.time.codegen_ms) << ", total " << ms(s.time.total_ms) << "\n";
  // A call that traces (the first one, and each recompile) runs the function while recording it: it is neither a
  // compiled call nor an eager fallback, and the sum must show it (it read "calls: 2 (1 compiled, 0 eager)").
  const int64_t traced = s.calls - s.compiled_calls - s.eager_calls;
  os << "  calls: " << s.calls << " (" << traced << " traced while compiling, " << s.compiled_calls << " compiled, "
     << s.eager_calls << " eager)\n";
  return os.str();
}

std::string explain(const CompiledFunction::Fn& fn, const std::vector<Tensor>& args, CompileOptions opts) {
  CompiledFunction f = compile(fn, std::move(opts));
  f(args);
  return explain_report(f);
}

}  // namespace ingot
