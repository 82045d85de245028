// Optimizer updates per gradient bucket. Invariant afterwards: no adamw_update node reads gradients that come
// from two different collective waits (data parallel: one update per gradient bucket, run as soon as its bucket
// is reduced); a graph without collectives is unchanged. Horizontal fusion must then keep the updates apart
// (the pipeline fuses with horizontal = false when this pass split anything).
// Tests: tests/distributed/test_ddp_compiled.cpp (CompiledDdp.*), tests/gpu/test_ddp_multi_gpu.cpp (DdpOnGpus.PerBucket*).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct BucketUpdateOptions {
  Device target = Device::cpu();
};

bool split_update_by_bucket(Graph& g, const BucketUpdateOptions& o);

// Whether two of the graph's updates read gradients from different collective waits: updates per bucket or unit
// as traced (Note [Updates in the backward], distributed/fsdp_compiled.cpp) or as this pass left them, which
// horizontal fusion must keep apart too.
bool updates_per_bucket(const Graph& g);

}  // namespace ingot::compiler::passes
