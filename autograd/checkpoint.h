// Activation checkpointing: a region of the forward (a decoder block) keeps for its backward only its inputs; the
// tensors its ops saved are dropped as they are recorded and made again, all at once, by running the region's
// function a second time when the backward first needs one of them (torch.utils.checkpoint's non-reentrant
// form). The recomputation runs inside the backward, so a traced step records it there: the compiled graph is
// checkpointed the same way (Note [Recomputed nodes], compile/ir/graph.h).
//
// Note [Checkpoint regions]: checkpoint() records, for every tape node its function makes, its index in the
// region and keeps none of its saved tensors. The first backward node of the region to run calls the function
// again on the region's inputs (detached, with their requires_grad) with grad mode on, so every op makes the
// same decision about what to save as it made in the forward; the i-th node made then hands its saved tensors
// to the region's i-th node. The function must therefore record the same ops in the same order both times
// (it may close over other tensors; parameters and tables made outside are read, not copied). Host values
// that a second run would draw anew (dropout's (seed, offset)) are replayed: checkpoint_replay().
// Regions do not nest (an inner checkpoint() inside a region runs its function plainly).
// Test: tests/autograd/test_checkpoint.cpp (ActivationCheckpoint.*).
#pragma once

#include <functional>
#include <vector>

#include "autograd/primitive.h"

namespace ingot {

struct Node;

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// fn(inputs), keeping for the backward only `inputs`. Without grad mode, or inside another region, plainly
// fn(inputs). fn is kept until the backward recomputes: capture tensors by value, never stack references.
std::vector<Tensor> checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs);

// True while a region's function runs again in the backward (the tracer marks the ops it records then).
bool recomputing();

// make() outside a region; inside one, make() in the forward and the same tensor again when recomputing, for
// host-made values whose second making would differ (random draws).
Tensor checkpoint_replay(const std::function<Tensor()>& make);

namespace detail {
// apply()'s seam: a node recorded while a region runs (its saved tensors go to, or come from, the region).
void checkpoint_on_record(Node& node);
// The engine's seam: node's saved tensors, recomputing its region first if needed.
void checkpoint_restore(Node& node, bool retain_graph);
}  // namespace detail

}  // namespace ingot
