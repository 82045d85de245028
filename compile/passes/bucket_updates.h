// Optimizer updates per gradient bucket. Invariant afterwards: each of the last separate_last buckets (all of them
// when it is 0) has an update of its own that reads no gradient of another collective wait, and the buckets before
// them share one update (data parallel: each update runs as soon as its buckets are reduced); a graph without
// collectives is unchanged. Horizontal fusion must then keep the updates apart (the pipeline fuses with
// horizontal = false when this pass split anything).
// Tests: tests/distributed/test_ddp_compiled.cpp (CompiledDdp.*), tests/gpu/test_ddp_multi_gpu.cpp.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct BucketUpdateOptions {
  Device target = Device::cpu();
  // How many of the last buckets (in the order of their waits) keep an update each; the buckets before them share
  // one (0: one update per bucket). Note [Leading buckets share an update], bucket_updates.cpp.
  int separate_last = 0;
};

bool split_update_by_bucket(Graph& g, const BucketUpdateOptions& o);

}  // namespace ingot::compiler::passes
