// Collectives as autograd primitives: a traced training step records them as graph nodes, so the gradient
// all-reduce of DistributedDataParallel lands in the same compiled graph as the forward, the backward and the
// optimizer update (compile/'s executor runs the node through the process group like any extern op).
#pragma once

#include <memory>
#include <optional>

#include "autograd/ops/attrs.h"
#include "distributed/process_group.h"
#include "runtime/tensor.h"

namespace ingot::distributed {

// The average of `flat` over the ranks of `group` (a new tensor; `flat` is not modified): all_reduce_start
// followed at once by its collective_wait. Not differentiable. Every rank must call it with the same shape,
// in the same order.
Tensor all_reduce_avg(const Tensor& flat, std::shared_ptr<ProcessGroup> group);
// The same average split in two graph nodes so that the communication overlaps the rest of the step:
// all_reduce_start issues it and returns the buffer being reduced (not to be read yet); collective_wait
// returns that buffer once the reduction is done (CUDA: the current stream waits, the host does not). The
// compiler's scheduler issues starts as soon as their inputs exist and waits as late as their consumers
// allow (compile/lower/lowering.h: schedule_class).
Tensor all_reduce_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group);
Tensor collective_wait(const Tensor& pending);
// ZeRO-1's pair, each a start and a wait like the all-reduce. reduce_scatter_start: this rank's chunk
// (numel / world elements, chunk `rank`) of the average of `flat` over the ranks (pending until its
// collective_wait); flat.numel() must divide by the world size. all_gather_start: the concatenation of every
// rank's `chunk`, rank order (pending likewise). reduce_scatter_avg and all_gather are each start + wait.
Tensor reduce_scatter_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group);
Tensor all_gather_start(const Tensor& chunk, std::shared_ptr<ProcessGroup> group);
// The reduce-scatter of the sum instead of the average (pending likewise): vocabulary-parallel lookups, where
// one rank holds each token's row and the others contribute zeros (Note [Vocabulary-parallel embeddings],
// distributed/fsdp.h).
// `purpose`: what it is for, which explain says (CollectivePurposeAttrs; the same text on every rank).
Tensor reduce_scatter_sum_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group, std::string purpose = "");
// all_gather_start saying what it is for.
Tensor all_gather_start(const Tensor& chunk, std::shared_ptr<ProcessGroup> group, std::string purpose);
Tensor reduce_scatter_avg(const Tensor& flat, std::shared_ptr<ProcessGroup> group);
Tensor all_gather(const Tensor& chunk, std::shared_ptr<ProcessGroup> group);
// Compiled ZeRO-3's pair (distributed/fsdp_compiled.cpp): the same starts, with the FSDP unit they serve in
// their typed attributes (autograd/ops/attrs.h: UnitCollectiveAttrs), so the compiler can tell a unit's gathers
// apart (compile/passes/unit_gathers.cpp gives the backward its own gather and orders the prefetches) and
// explain can list them. Inputs of an all_gather_unit_start after the first are ordering tokens: the start runs
// once they exist and reads nothing of them. `as`: the shard is cast to that dtype just before it is gathered
// (a f32 master shard gathered as bf16 weights: Note [Shards cast from their masters], distributed/fsdp.h); the
// gathered value has that dtype.
Tensor all_gather_unit_start(const Tensor& shard, std::shared_ptr<ProcessGroup> group, UnitCollectiveAttrs unit,
                             std::optional<DType> as = std::nullopt);
// `into`: a dtype wider than flat's (f32 for bf16 gradients) the average is summed in, from every rank's values as
// they are in flat (Note [Narrow wire, wide sum], distributed/process_group.h); the result has that dtype.
Tensor reduce_scatter_unit_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group, UnitCollectiveAttrs unit,
                                 std::optional<DType> into = std::nullopt);
// The exchange half of that reduce-scatter alone (ProcessGroup::exchange_chunks): flat's chunks cross in flat's
// dtype and the result holds the other ranks' pieces of this rank's chunk (world - 1 chunks, rank order). The
// caller sums them with its own piece (autograd/ops/sum_pieces.h), so that the optimizer update can read the
// pieces itself (Note [Pieces read by the update], compile/passes/pieces_into_update.h). A world of two or more.
Tensor exchange_unit_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group, UnitCollectiveAttrs unit);

}  // namespace ingot::distributed
