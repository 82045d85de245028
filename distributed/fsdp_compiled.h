// Compiled ZeRO-3: FullyShardedDataParallel inside a traced training step (Note [ZeRO-3 in a traced step],
// fsdp_compiled.cpp). While ingot::compile traces the step, fsdp.cpp's hooks call these instead of running the
// eager protocol, so the units' all-gathers and reduce-scatters become nodes of the step's one graph.
// Internal to distributed/.
#pragma once

#include <cstddef>

#include "distributed/fsdp.h"

namespace ingot::distributed::fsdp_traced {

// A unit's forward begins: its flat weights are all-gathered from the shards as a graph value and its
// parameters become views of that value. `regather`: the backward gets a gather of its own
// (reshard_after_forward; compile/passes/unit_gathers.cpp).
void gather(FullyShardedDataParallel::State& s, size_t unit, bool regather);
// A unit's forward ended: its parameters point at the eager storage again; the gathered value is kept (saved
// for the backward) until synchronize() unless `backward_follows` is false.
void forward_done(FullyShardedDataParallel::State& s, size_t unit, bool backward_follows);
// After a backward: each unit's gradients reduce-scattered (last unit first) into its shard's .grad.
void synchronize(FullyShardedDataParallel::State& s);

}  // namespace ingot::distributed::fsdp_traced
