// Compiled ZeRO-3: FullyShardedDataParallel inside a traced training step (Note [ZeRO-3 in a traced step],
// fsdp_compiled.cpp). While ingot::compile traces the step, fsdp.cpp's hooks call these instead of running the
// eager protocol, so the units' all-gathers and reduce-scatters become nodes of the step's one graph.
// Internal to distributed/.
#pragma once

#include <cstddef>
#include <memory>

#include "distributed/fsdp.h"

namespace ingot::distributed::fsdp_traced {

// A unit's forward begins: its flat weights are all-gathered from the shards as a graph value and its
// parameters become views of that value. `regather`: the backward gets a gather of its own
// (reshard_after_forward; compile/passes/unit_gathers.cpp). `fresh`: a new gather even if this round has one
// (tied embeddings gathered again for the head, so the first gathered value dies after the lookup).
void gather(FullyShardedDataParallel::State& s, size_t unit, bool regather, bool fresh = false);
// The unit's parameters become views of its gathered value (the traced run's), as gather() leaves them.
void point_at_traced(FullyShardedDataParallel::State& s, size_t unit);
// The embeddings were looked up: their parameters point at the eager storage again and the traced run frees
// its gathered bytes (the graph frees its value after its last reader).
void put_back(FullyShardedDataParallel::State& s, size_t unit);
// A unit's forward ended with `out`: its parameters point at the eager storage again (a kept unit's only at its
// reduction: Note [Checkpointed units read the gathered value], fsdp_compiled.cpp), and the gathered value is
// kept (saved for the backward) until synchronize() when a backward follows. `regather` (reshard_after_forward):
// the traced run frees the gathered bytes now and gathers them again before the unit's backward, through an
// identity on `out` (returned; undefined otherwise) that compile/passes/unit_gathers.cpp removes from the graph;
// `ends_head` (the last block, tied embeddings): that identity also frees the embeddings' bytes the head read.
Tensor forward_done(const std::weak_ptr<FullyShardedDataParallel::State>& state, size_t unit, bool regather,
                    const Tensor& out, bool ends_head = false);
// Parameter `param` (model.parameters() order) got its gradient: once all of its unit's did, the unit's
// gradients are reduce-scattered into its shard's .grad.
void on_grad(FullyShardedDataParallel::State& s, size_t param);
// After a backward: the units not reduced yet (parameters without a gradient count as zeros), last first.
void synchronize(FullyShardedDataParallel::State& s);

}  // namespace ingot::distributed::fsdp_traced
