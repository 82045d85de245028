// Optimizer updates per gradient bucket. In a data-parallel step every gradient is a view of a reduced bucket
// (distributed/ddp.cpp, Note [DDP in a traced step]). One multi-tensor update over all parameters waits for the
// last bucket's reduction, so the whole update runs after all the communication, and the reduction of the last
// bucket (made when the backward ends: the embeddings) is exposed in full. Split per bucket, the update of
// bucket k runs while the buckets after it are still being reduced: schedule.cpp runs a ready update before
// the next (late) collective_wait. Invariant: bucket_updates.h.
#include "compile/passes/bucket_updates.h"

#include <map>

#include "autograd/ops/attrs.h"
#include "autograd/ops/sum_pieces.h"
#include "autograd/primitive_collective.h"
#include "autograd/primitive_multi_tensor.h"

namespace ingot::compiler::passes {

namespace {

// The collective_wait node whose result `v` is a view or cast of, or -1.
int32_t source_wait(const Graph& g, int32_t v) {
  while (v >= 0) {
    const int32_t p = g.values[static_cast<size_t>(v)].producer;
    if (p < 0) return -1;
    const Node& n = g.nodes[static_cast<size_t>(p)];
    if (is_collective_wait(*n.prim)) return p;
    // A narrow wire's sum (Note [Pieces read by the update]): its bucket is the exchange's, which one of its pieces
    // comes from (the others are this rank's own piece, a view of the gradients before their reduction).
    if (as_sum_pieces(*n.prim)) {
      for (int32_t in : n.inputs)
        if (const int32_t w = source_wait(g, in); w >= 0) return w;
      return -1;
    }
    const bool passes_through =
        n.prim->fusion_kind() == FusionKind::View || match<CastAttrs>(*n.prim) || match<CopyAttrs>(*n.prim);
    if (!passes_through || n.inputs.empty()) return -1;
    v = n.inputs[0];
  }
  return -1;
}

}  // namespace

bool updates_per_bucket(const Graph& g) {
  int32_t first = -2;  // the wait the first update's first gradient comes from
  for (const Node& n : g.nodes) {
    const SplittableUpdate* update = as_splittable_update(*n.prim);
    if (!update || update->tensors() == 0) continue;
    const int32_t w = source_wait(g, n.inputs[1 + update->tensors()]);
    if (w < 0) continue;
    if (first == -2) first = w;
    else if (w != first) return true;
  }
  return false;
}

bool split_update_by_bucket(Graph& g, const BucketUpdateOptions&) {
  // Per node: the parameters of each bucket (in the bucket order), for the updates that split.
  std::vector<std::vector<std::vector<size_t>>> split(g.nodes.size());
  bool any = false;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const SplittableUpdate* update = as_splittable_update(*n.prim);
    const size_t count = update ? update->tensors() : 0;
    if (count < 2) continue;
    std::map<int32_t, size_t> bucket_of_wait;
    std::vector<std::vector<size_t>> buckets;
    for (size_t t = 0; t < count; ++t) {
      const int32_t w = source_wait(g, n.inputs[1 + count + t]);
      auto [it, fresh] = bucket_of_wait.emplace(w, buckets.size());
      if (fresh) buckets.emplace_back();
      buckets[it->second].push_back(t);
    }
    if (buckets.size() < 2) continue;
    split[i] = std::move(buckets);
    any = true;
  }
  if (!any) return false;
  std::vector<Node> nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (split[i].empty()) {
      nodes.push_back(std::move(n));
      continue;
    }
    const SplittableUpdate& update = *as_splittable_update(*n.prim);
    const size_t count = update.tensors();
    const size_t shared_at = 1 + update.input_slots() * count;
    for (const std::vector<size_t>& members : split[i]) {
      Node u;
      u.prim = update.for_tensors(members.size());
      u.loc = n.loc;
      u.forward = n.forward;
      u.inputs = {n.inputs[0]};
      for (size_t s = 0; s < update.input_slots(); ++s)
        for (size_t t : members) u.inputs.push_back(n.inputs[1 + s * count + t]);
      for (size_t k = 0; k < update.shared_inputs(); ++k) u.inputs.push_back(n.inputs[shared_at + k]);
      for (size_t s = 0; s < update.output_slots(); ++s)
        for (size_t t : members) u.outputs.push_back(n.outputs[s * count + t]);
      nodes.push_back(std::move(u));
    }
  }
  g.nodes = std::move(nodes);
  g.renumber_nodes();
  return true;
}

}  // namespace ingot::compiler::passes
