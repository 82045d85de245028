// Split-and-continue for functions with graph breaks. The first call traces (compile/trace/trace.h) and finds the
// breaks; every later call runs the function itself with its ops deferred: apply() records each primitive
// into a pending segment (the Tracer in Defer mode) and hands back outputs that have the right metadata but
// no values yet. A break flushes: an item()/to_vector() of a pending value, an op with no lowering (which
// then runs eagerly on real inputs), a raw copy that needs pending data, and the end of the function. A
// flush compiles the segment through the pipeline (once per structure: Note [Segment cache key]), runs it,
// gives the deferred tensors that are still referenced their values (Note [Deferred outputs]) and writes
// parameters and optimizer state back; then the function continues.
//
// Note [Deferred outputs]: an op's stand-in outputs are allocated at once from its shape rule (so views,
// and the optimizers' `dst.copy_(v); on_assign(dst, v)` pattern, see a real buffer), and at the flush each
// one that is still referenced receives its value: the stand-in's Storage takes over the executor's buffer
// when that buffer is a contiguous result nobody else holds (no copy; the stand-in's allocation is freed),
// otherwise the value is copied in. Versions are left alone (the fill is not an in-place update: saved
// tensors stay valid for backward). Stand-ins nobody references any more (temporaries) are not outputs, so
// the pipeline fuses them away. Peak memory is eager's live set plus the executor's at a flush.
//
// Raw copies (runtime/tensor.h raw-access hook): copy_ from a pending value into a same-shaped persistent
// tensor becomes a write-back (the segment's assignment), any other raw read of pending data, or a raw
// write into a tensor the pending segment reads, flushes first. Host code that reads data through
// data_ptr()/data<T>()/item_at() directly bypasses both seams and would see a stand-in's uninitialized buffer:
// inside a compiled function, read values with item()/to_vector() or a copy.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "compile/api.h"
#include "compile/exec/executor.h"
#include "compile/trace/trace.h"

namespace ingot::compiler {

// What one compiled segment holds (explain, stats).
struct SegmentInfo {
  int64_t ops_before = 0, ops_after = 0, fused_groups = 0, kernels = 0, launches = 0, compute_ops = 0;
  bool node_by_node = false;  // its ops run one by one (eager kernels, eager order): its compile failed, or it
                              // changed structure past recompile_limit
};

// The compiled segments of one compiled function, keyed by Note [Segment cache key].
struct SegmentCache {
  struct Entry {
    std::shared_ptr<Executable> exe;
    SegmentInfo info;
  };
  std::map<uint64_t, Entry> entries;
  std::map<int64_t, int64_t> keys_at;  // segment position in a call -> structures compiled there
  std::set<std::string> warned;  // one-time warnings already printed
};

// Runs fn(args) split at its graph breaks (see above) and returns its results. Sets stats.graphs and
// stats.segments for this call, adds break sites not seen before to stats.graph_breaks, and counts segment
// compiles (stats.segments_compiled) and their kernels.
std::vector<Tensor> run_segmented(const StepFn& fn, const std::vector<Tensor>& args, SegmentCache& cache,
                                  const CompileOptions& opts, CompileStats& stats);

}  // namespace ingot::compiler
