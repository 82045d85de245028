// Gradients made in their data-parallel bucket (invariant: bucket_views.h).
//
// Why: DDP's traced step concatenates each bucket's gradients into the flat buffer the all-reduce reads
// (distributed/ddp.cpp, Note [DDP in a traced step]): every gradient byte was read and written once more per step
// (GPT-2 124M in a world of one: 32.55 ms with DDP vs 31.04 ms without, issue 21). Placing each gradient in its
// slice of the bucket makes the concatenation a view; the all-reduce then still runs in place on the bucket
// (Note [In-place bucket reductions], distributed/collective_ops.cpp) once the pieces are dead.
#include "compile/passes/bucket_views.h"

#include <optional>
#include <set>

#include "autograd/ops/attrs.h"
#include "autograd/ops/bucket_view.h"
#include "autograd/primitive_collective.h"
#include "compile/passes/decompose_norm_bwd.h"

namespace ingot::compiler::passes {
namespace {

int64_t numel_of(const Value& v) {
  int64_t n = 1;
  for (const Dim& d : v.shape) n *= d.value;
  return n;
}

// An all-reduce start, or with `reduce_scatters` a reduce-scatter start too.
bool reduction_start(const Primitive& p, bool reduce_scatters) {
  return reduce_scatters ? is_reduction_start(p) : is_start_of(p, CollectiveOp::AllReduce);
}

// Whether the cat's result is reduced, as itself or through one cast (DDP's and ZeRO's reduce_dtype). ZeRO's
// reduce-scatters only with BucketViewOptions::reduce_scatters (the default): there the bucket, made at its first
// gradient, is alive through more of the backward than the separate gradients were (compiled ZeRO-3's planned peak
// rose 2%).
bool feeds_reduction(const Graph& g, int32_t flat, const std::vector<std::vector<int32_t>>& readers,
                     bool reduce_scatters) {
  for (int32_t r : readers[static_cast<size_t>(flat)]) {
    const Node& n = g.nodes[static_cast<size_t>(r)];
    if (reduction_start(*n.prim, reduce_scatters)) return true;
    if (match<CastAttrs>(*n.prim))
      for (int32_t r2 : readers[static_cast<size_t>(n.outputs[0])])
        if (reduction_start(*g.nodes[static_cast<size_t>(r2)].prim, reduce_scatters)) return true;
  }
  return false;
}

// The values that hold piece `piece` (itself, then back through reshapes to the value a computing node makes),
// or empty when that node cannot write into a given buffer or one of them may not be placed.
std::vector<int32_t> piece_chain(const Graph& g, int32_t piece, DType dtype, const BucketViewOptions& o,
                                 const std::set<int32_t>& taken, const std::vector<int32_t>& uses) {
  std::vector<int32_t> chain;
  int32_t v = piece;
  while (true) {
    const Value& val = g.values[static_cast<size_t>(v)];
    if (val.producer < 0 || val.dtype != dtype || val.placed_in >= 0 || g.is_root(v) || taken.count(v)) return {};
    for (const Dim& d : val.shape)
      if (d.is_symbolic()) return {};
    chain.push_back(v);
    const Node& n = g.nodes[static_cast<size_t>(val.producer)];
    // A reshape of a dense value is a view of it (ReshapeAttrs also names expand, which changes the count).
    if (match<ReshapeAttrs>(*n.prim) && n.inputs.size() == 1 && n.inputs[0] >= 0 &&
        numel_of(g.values[static_cast<size_t>(n.inputs[0])]) == numel_of(val)) {
      v = n.inputs[0];
      continue;
    }
    // The fuser's rule for what becomes a generated kernel (a CUDA norm backward summing dw, db: fuse.cpp).
    const FusionKind fk =
        o.target.is_cuda() && column_sum_norm_bwd(g, n) ? FusionKind::Reduction : n.prim->fusion_kind();
    const bool kernel = o.generated && (fk == FusionKind::Pointwise || fk == FusionKind::Reduction);
    if (fk == FusionKind::View || !(kernel || n.prim->writes_given_outputs())) return {};
    // An op that adds into its input's buffer (a tied embedding's gradient into the head's) finds the input
    // already in the slice when that input's producer is placed there too, so nothing is copied; the input must
    // be read nowhere else, since the op overwrites it.
    const std::optional<size_t> k = n.prim->reusable_input();
    if (!kernel && k && *k < n.inputs.size() && n.inputs[*k] >= 0 && uses[static_cast<size_t>(n.inputs[*k])] == 1 &&
        numel_of(g.values[static_cast<size_t>(n.inputs[*k])]) == numel_of(val)) {
      std::vector<int32_t> rest = piece_chain(g, n.inputs[*k], dtype, o, taken, uses);
      chain.insert(chain.end(), rest.begin(), rest.end());
    }
    return chain;
  }
}

}  // namespace

bool bucket_views(Graph& g, const BucketViewOptions& o) {
  const std::vector<int32_t> uses = g.use_counts();
  const std::vector<std::vector<int32_t>> readers = g.readers();
  bool changed = false;
  for (Node& cat : g.nodes) {
    const CatAttrs* along = match<CatAttrs>(*cat.prim);
    if (!along || along->dim != 0 || cat.inputs.size() < 2 || cat.outputs.size() != 1) continue;
    const int32_t flat = cat.outputs[0];
    const Value& out = g.values[static_cast<size_t>(flat)];
    if (out.shape.size() != 1 || out.shape[0].is_symbolic() || !feeds_reduction(g, flat, readers, o.reduce_scatters)) continue;
    std::vector<std::pair<std::vector<int32_t>, int64_t>> places;  // a piece's chain, its first element
    std::set<int32_t> taken;
    int64_t at = 0;
    for (int32_t piece : cat.inputs) {
      std::vector<int32_t> chain;
      if (piece >= 0) chain = piece_chain(g, piece, out.dtype, o, taken, uses);
      if (chain.empty()) break;
      taken.insert(chain.begin(), chain.end());
      places.emplace_back(std::move(chain), at);
      at += numel_of(g.values[static_cast<size_t>(piece)]);
    }
    if (places.size() != cat.inputs.size()) continue;
    for (const auto& [chain, first] : places)
      for (int32_t v : chain) {
        g.values[static_cast<size_t>(v)].placed_in = flat;
        g.values[static_cast<size_t>(v)].placed_at = first;
      }
    cat.prim = make_bucket_view();
    changed = true;
  }
  return changed;
}

}  // namespace ingot::compiler::passes
