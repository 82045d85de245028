// The graph passes, one per file. Each is `bool <name>(Graph&, ...)`, returns whether it changed the graph,
// and states what holds afterwards. compile/pipeline.cpp runs them in order.
#pragma once

#include <cstdint>
#include <vector>

#include "compile/ir/graph.h"

namespace ingot::compiler::passes {

// dce.cpp: every remaining node has an output that reaches a root (output, write-back, grad out).
bool dce(Graph& g);
// cse.cpp: no two nodes apply equivalent primitives to the same inputs.
bool cse(Graph& g);
// simplify.cpp: no node returns one of its inputs unchanged (identity ops are bypassed), and no node whose
// inputs are all Constant inputs and whose outputs are small remains (it is evaluated now: constant folding).
bool simplify(Graph& g, int64_t fold_limit_elems = 1 << 16);
// functionalize.cpp: write-backs whose value already is the target's input value are dropped, and no root
// aliases another root's buffer through a view of a captured tensor (such values are materialized with a
// copy node before the write-backs run).
bool functionalize(Graph& g);
// decompose_norm_bwd.cpp: no layer_norm_bwd / rms_norm_bwd node computes dx together with dw or db, except
// on CUDA, where one kernel computes all three (Note [Column sums in row reductions]) when they fit: each
// is a dx-only node (a reduction over the last dim) then a dw/db-only node (a reduction over the leading
// dims) on the same inputs and output values; a single-input pointwise producer of dy (the cast of a bf16
// gradient) is duplicated for the dw/db node. Run after the last cse, which would merge the copy back.
bool decompose_norm_bwd(Graph& g);
// decompose_norm_bwd.cpp: whether `n` is a norm backward computing dx with dw and/or db that one CUDA kernel
// computes whole (Note [Column sums in row reductions]); fuse treats it as a reduction, the pass keeps it.
bool column_sum_norm_bwd(const Graph& g, const Node& n);
// matmul_epilogue.cpp: on CUDA graphs (any graph with cpu_too), no gelu_tanh_grad reads (directly or through a
// reshape) a 2-D matmul's output that nothing else reads: the pair is one matmul_dgelu node, which with
// with_dbias also produces the row sum of the GELU gradient (a bias gradient) when the graph computed it; with
// forward_gelu, no gelu_tanh reads (directly or through a reshape) a linear with a bias: the pair is one
// linear_gelu node; no cast to f32 reads a bf16 / f16 matmul read nowhere else (one widened matmul writes f32).
bool fuse_matmul_epilogues(Graph& g, bool cpu_too = false, bool with_dbias = false, bool forward_gelu = true);
// pack_attention_grads.cpp: no cat concatenates the three gradients of one attention_bwd node (each permuted to
// [B, T, H, D] and flattened, read nowhere else); each such group is one attention_bwd_packed node.
bool pack_attention_grads(Graph& g);
// accumulate_index_add.cpp: no add reads an index_add read nowhere else and a value of its shape and dtype;
// each such pair is one index_add_accumulate node scattering into that value.
bool accumulate_index_add(Graph& g);
// remat.cpp: with budget < 1, forward values saved for backward whose producer is cheap (pointwise/view)
// are recomputed in backward instead of kept, until the bytes kept across the forward/backward boundary
// are at most budget x the original. Returns the bytes no longer kept in `saved_bytes` if given.
bool remat(Graph& g, double budget, int64_t* saved_bytes = nullptr);
// split_update.cpp: with budget < 1, every AdamW update updates one parameter and runs right after the last
// reader of its parameter and state, so gradients die early instead of all living until the step's end.
bool split_update(Graph& g, double budget);
// bucket_updates.cpp: no AdamW update reads gradients coming from two different collective waits (data
// parallel: one update per gradient bucket, run as soon as its bucket is reduced).
bool split_update_by_bucket(Graph& g);
// fuse.cpp: every node is in at most one FusionGroup; a group is (a) a chain/DAG of pointwise nodes with one
// output shape, (b) a row reduction with its pointwise prologue and epilogue, or (c) all multi-tensor
// optimizer updates (horizontal fusion; with horizontal=false each update is its own group); groups never
// create a cycle between groups.
bool fuse(Graph& g, bool horizontal = true);
// schedule.cpp: nodes are in a topological order in which every fusion group is contiguous, otherwise
// keeping the traced order (which frees activations as backward consumes them).
bool schedule(Graph& g);

// fuse.cpp, Note [Column sums]: whether `n` is a row sum of a tall bf16 / f16 CUDA matrix with no pointwise
// producer, which fuse leaves to the eager reduce kernel (and matmul_epilogues may widen to f32).
bool eager_column_sum(const Graph& g, const Node& n);

// memory_plan.cpp: the size of one arena holding every intermediate value, a block reused once its value is
// dead and no two values live at the same time overlapping.
struct MemoryPlan {
  int64_t arena_bytes = 0;     // planned peak (the arena size)
  int64_t unplanned_peak = 0;  // peak of live intermediate bytes with a fresh allocation per value
};
MemoryPlan memory_plan(const Graph& g);

// fuse_cross_entropy.cpp: no cross_entropy node has a cross_entropy_bwd reader of its lse (same logits, target,
// attributes) whose dloss it does not reach; each such pair is one cross_entropy_fused node (loss, lse, dlogits).
bool fuse_cross_entropy(Graph& g);

}  // namespace ingot::compiler::passes
