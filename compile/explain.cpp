#include "compile/explain.h"

#include <cstdio>
#include <sstream>

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
