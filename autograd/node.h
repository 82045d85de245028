// The tape: one Node per recorded primitive application. Edges point from a node to the producers of its
// inputs (another node's output, or a leaf tensor whose .grad accumulates).
#pragma once

#include <memory>
#include <source_location>
#include <vector>

#include "autograd/primitive.h"

namespace ingot {

struct Node;
struct CheckpointRegion;  // autograd/checkpoint.cpp

struct Edge {
  std::shared_ptr<Node> fn;          // producer node, or null
  int output_nr = 0;                 // which output of fn
  std::shared_ptr<TensorImpl> leaf;  // set when the input is a leaf that requires grad
  bool valid() const { return fn || leaf; }
};

struct Node {
  std::shared_ptr<Primitive> prim;
  VjpContext ctx;
  std::vector<Edge> next;  // one per input
  std::vector<TensorMeta> output_meta;
  std::vector<uint64_t> saved_versions;  // version of each saved input when recorded
  uint64_t seq = 0;                      // creation order; backward runs newest first among ready nodes
  bool released = false;                 // saved tensors freed after a backward without retain_graph
  // Set when recorded inside checkpoint(): ctx holds no saved tensors until the region recomputes them
  // (Note [Checkpoint regions], autograd/checkpoint.h); region_index is this node's place in the region.
  std::shared_ptr<CheckpointRegion> region;
  size_t region_index = 0;
  std::source_location loc;
};

}  // namespace ingot
