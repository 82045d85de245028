// FullyShardedDataParallel (eager ZeRO-3): every rank holds 1/world of every parameter; a unit's weights are
// whole only while it computes.
//
//   FullyShardedDataParallel fsdp(model, ctx.group);             // broadcasts rank 0's weights, then shards
//   optim::AdamW opt(fsdp.optimizer_params(), ...);               // one flat shard per unit
//   for (...) {
//     model.loss(x, y).backward();   // units gathered before their forward and backward, grads reduce-scattered
//     fsdp.synchronize();            // waits; this rank's chunks are added into the shards' .grad
//     opt.step();                    // updates the shards only: nothing to write back
//     fsdp.zero_grad();
//   }
//
// Units: every child of an nn::ModuleList (the transformer blocks of models/) is a unit; the parameters
// outside them form the embeddings unit and the head unit (Note [Embeddings and head are units]). A unit's
// parameters become views of one flat storage (its padded layout is a distributed::BucketPlan, rank r owning
// chunk r, as ZeRO-1's buckets), whose bytes exist only while the unit is gathered:
//   embeddings         gathered when the model's forward starts, freed when the first block starts (a lookup's
//                      backward reads no weights, so nothing gathers them for the backward); an untied table
//                      whose rows split over the ranks is looked up where it lies instead (Note
//                      [Vocabulary-parallel embeddings])
//   block forward      pre-hook: all-gather; post-hook: free again (reshard_after_forward) and put a boundary
//                      on the output whose backward gathers once more before the block's backward runs
//   head               gathered when the last block's forward ends, kept until its gradients are reduced (its
//                      backward follows at once)
//   backward           when a unit's last parameter gradient arrived (post-accumulate hooks) its weights are
//                      freed and its gradients flattened into one buffer (the .grad tensors dropped), which is
//                      reduce-scattered asynchronously, in unit order from the last to the first (every rank
//                      issues the same collectives in the same order); the buffer goes once the reduction is done
//   no grad (eval)     every unit is freed right after its forward
//
// Note [Embeddings and head are units]: with blocks, the embedding tables outside them (nn::Embedding: GPT-2's
// wte and wpe, Llama's embed_tokens) are one unit and everything else outside them (final norm, lm_head) another,
// so at most one block, or the head, is gathered beside the one computing, never the vocabulary tables all step.
// Tied word embeddings (GPT-2's head multiplies by wte): the table stays in the embeddings unit, which the head
// gathers again for its forward and keeps until its backward is done (the last block's boundary frees it). A head
// is taken to be tied when no parameter of the head unit has the shape of an embedding table (an lm_head is
// [vocab, dim] like the token table). A model without blocks or without embedding tables keeps one root unit of
// everything outside the blocks, gathered from its forward until its gradients are reduced.
// On CUDA with NCCL the eager protocol relies on the process group's ordering (a collective waits for the work
// queued on its input stream before it writes a freshly allocated unit) and, by default, on the host waiting for
// each gather one block ahead, the compute stream alone waiting for it (FsdpOptions::prefetch, the default: Note
// [Eager prefetch]; without it the host waits for each gather and nothing overlaps eagerly). Run on 2 and 4
// H200s: tests/gpu/test_fsdp_multi_gpu.cpp, bench/RESULTS.md 2026-11-26 and 2026-11-27.
// Compiled (ingot::compile of a step using this wrapper): while the step is traced the hooks record each unit's
// all-gather and reduce-scatter as graph nodes instead (Note [ZeRO-3 in a traced step],
// fsdp_compiled.cpp), and the compiler reshards, prefetches one unit ahead and overlaps the reductions.
// Every backward reduces (gradient accumulation sums into the shards' .grad, there is no no_sync), so every
// rank must run the same number of backwards using the same parameters. Module::to() and raw reads of a
// parameter outside its unit's forward or backward see no data: unshard() first.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "distributed/buckets.h"
#include "distributed/process_group.h"
#include "runtime/tensor.h"

namespace ingot::nn {
class Module;
}

namespace ingot::distributed {

struct FsdpOptions {
  bool broadcast_parameters = true;  // copy rank `root`'s parameters to every rank before sharding
  int root = 0;
  // false: a block's weights stay gathered from its forward until its gradients are reduced (one all-gather
  // per block and step instead of two, the whole model at the end of the forward).
  bool reshard_after_forward = true;
  // Note [The last blocks kept]: with reshard_after_forward, the last `keep_last_blocks` blocks are not resharded
  // after their forward: their backward comes first, right after the head's, and would gather them again at once.
  // Each kept block costs its gathered weights from its forward to its backward (the activations' peak) and saves
  // one all-gather per step (FSDP2's reshard_after_forward=False on the last block, as torchtitan sets it). 0 keeps
  // none; more than the blocks keeps all (as reshard_after_forward false).
  int keep_last_blocks = 0;
  // Note [Eager prefetch]: eagerly, a block's pre-forward hook also issues the next block's all-gather, and a
  // block's pre-backward boundary the previous block's (when that block's own boundary is pending), so each
  // gather runs while the block before it (in that pass) computes; on GPUs only the compute stream waits for a
  // gather, not the host. Two blocks' weights are gathered at once instead of one (FSDP2's implicit prefetch
  // holds the same). Every rank issues the same collectives in the same order, as without it. A prefetch its
  // pass never used (a forward that stops before the block, a backward that does not reach it) is freed when
  // the model's forward ends, when synchronize() ends the backward and before the next forward. Compiled steps
  // prefetch by their own schedule either way. On by default since measured on GPUs (bench/RESULTS.md 2026-11-27:
  // GPT-2 124M eager ZeRO-3 15-17% faster per step at 2 and 4 H200s, the 8B fine-tune 17%); false gathers each
  // block when it is used, with the host waiting for it.
  bool prefetch = true;
  // Note [Vocabulary-parallel embeddings]: an untied token table outside the blocks (Llama's embed_tokens, alone in
  // the embeddings unit) whose rows split evenly over the ranks is never gathered. Rank r's shard is rows
  // [r V/N, (r+1) V/N) of it, so the lookup all-gathers the ids (N x B x T), looks them up in the rank's own rows
  // (zeros for the others' rows) and sums the results over the ranks with a reduce-scatter that hands each rank
  // its own tokens (N x B x T x D in the weights' dtype); the backward all-gathers the output's gradient and adds
  // it into the rank's rows in f32 (x 1/N: the average over the ranks), which is this rank's averaged gradient
  // already. On Llama-3-8B at 4 ranks and 2 x 2048 tokens that moves ~0.3 GB per step instead of the table's
  // gather (1.05 GB bf16) and its gradient's reduce-scatter (2.1 GB f32), at the step's edges where nothing
  // hides them. The values are those of the gathered lookup; the gradient is summed in f32 over every rank's
  // tokens (the gathered path sums each rank's in the weights' dtype first). Megatron-LM's VocabParallelEmbedding
  // and torchtitan's RowwiseParallel embedding do the same. false gathers the table as any unit.
  bool vocab_parallel_embeddings = true;
  // Note [Parameters without bytes]: parameters built by nn::SkipInit without bytes (shape, dtype and device,
  // no data) are not broadcast and give their unit zeros: the shards get their values from load_shards() or a
  // sharded checkpoint. The constructor makes one unit whole at a time, so such a model is never whole on a
  // rank (tests/distributed/test_zero.cpp).
  // The dtype gradients are reduced in (nullopt: the parameters'), as DdpOptions::reduce_dtype.
  // Note [Reduced gradients keep their precision]: a reduction wider than the weights (f32 for bf16 weights, what
  // FSDP2's MixedPrecisionPolicy(reduce_dtype=f32) does) leaves the shards' .grad in that dtype, so the f32
  // masters' update reads the f32 average itself; rounding it to bf16 first would change the update (by up to
  // 2^-9 relative per element with SGD, tests/distributed/test_zero.cpp). A narrower one is widened back.
  std::optional<DType> reduce_dtype;
  // The dtype each rank's gradients cross the wire in, when narrower than reduce_dtype (nullopt: reduce_dtype's):
  // they are rounded to it (bf16 for bf16 weights: the gradients FSDP2 computes in param_dtype) and summed in
  // reduce_dtype where they arrive (Note [Narrow wire, wide sum], process_group.h). bf16 with reduce_dtype f32 is
  // FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32) numerics at half of an f32 reduction's bytes;
  // unset, the gradients stay f32 from the products to the sum (more precise than FSDP2's). Not wider than
  // reduce_dtype.
  std::optional<DType> reduce_wire_dtype;
};

class FullyShardedDataParallel {
 public:
  FullyShardedDataParallel(nn::Module& model, std::shared_ptr<ProcessGroup> group, FsdpOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // This rank's flat shard of each unit (leaves, in unit order): what the optimizer updates.
  std::vector<Tensor> optimizer_params() const;
  // Finishes the last backward: issues the reductions of units whose parameters got no gradient (zeros),
  // waits for all of them and adds this rank's averaged chunks into the shards' .grad.
  void synchronize();
  void zero_grad();  // drops the shards' .grad
  // Note [Updates in the backward] (fsdp_compiled.cpp): compiled steps only. While a step is traced, once a unit's
  // gradient reduction is waited for (`lag` units later, as compile.unit_reduction_lag does) its shard's .grad is
  // set and `update(unit)` runs the optimizer on it then and there (only that shard has a .grad); synchronize()
  // sets the others' (the vocabulary-parallel table's, the last `lag` units'), which the step's own update takes.
  void update_in_backward(std::function<void(size_t unit)> update, int lag);

  // Note [Shards cast from their masters]: with f32 masters of the shards (optim::MasterWeights over
  // optimizer_params(), same layout), each unit's gathers read its master, cast to the unit's dtype just before
  // the all-gather (eagerly a temporary; compiled, inside all_gather_unit_start), and the shards lose their bytes:
  // no bf16 copy of the weights beside the f32 masters, as FSDP2's MixedPrecisionPolicy(param_dtype=bf16) keeps
  // f32 shards only. The same weights: the shards were always the masters rounded (MasterWeights::copy_to_model,
  // which skips shards without bytes). Afterwards the shards keep their shapes and take gradients, but hold no
  // values: read the masters instead (a checkpoint's weights are the masters rounded); load_shards() refuses.
  void gather_from_masters(const std::vector<Tensor>& masters);
  // Units as bucket plans over model.parameters() indices, in unit order (embeddings, blocks, head; or root,
  // blocks): the layout of the shards, which sharded checkpoints save and load rank by rank
  // (recipes/sharded_checkpoint.h: by parameter, so any layout resumes any other).
  const std::vector<BucketPlan>& layout() const;
  // The parameter (model.parameters() index) whose table is looked up where its rows lie (Note
  // [Vocabulary-parallel embeddings]); nullopt when no table is.
  std::optional<size_t> vocab_parallel_table() const;
  // Eager: the most bytes of whole unit weights gathered at once since the last reset_peaks() (padding included).
  int64_t peak_gathered_bytes() const;
  // Eager: the most bytes of flattened unit gradients alive at once (made, or reducing until the device finished
  // reading them) since the last reset_peaks(): at most Note [Reductions in flight]'s count plus the unit being made.
  int64_t peak_reducing_bytes() const;
  void reset_peaks();
  // Fills this rank's shards from a source of parameter slices (shard-wise loading: models::HFSliceReader reads
  // only their bytes): read(i, begin, end, dst) puts elements [begin, end) of the flattened value of parameter i
  // (model.parameters() order) into dst, a view of the shard in the parameter's dtype. Local, no collective; the
  // units' padding stays zero. f32 masters made from the shards before this call must be made again.
  void load_shards(const std::function<void(size_t param, int64_t begin, int64_t end, Tensor& dst)>& read);
  // Parameter i's whole value (model.parameters() order) assembled from `shards` (one flat tensor per unit, in
  // layout() order: optimizer_params() or same-layout copies of them such as f32 masters) on rank `root`, in the
  // shards' dtype; undefined on the other ranks. Collective: every rank calls it with the same i. Only the
  // parameter's own elements move (a broadcast from each other rank whose chunk holds some of them), so `root`
  // holds one whole tensor beyond its shards and the others at most one chunk's piece (the streamed HF export).
  Tensor gather_param(size_t i, const std::vector<Tensor>& shards, int root = 0) const;
  // Ends sharding: every parameter gets its whole value in storage of its own again and the hooks go quiet
  // (collective). The model is then as it was before wrapping, with the trained weights.
  void unshard();

  struct State;

 private:
  std::shared_ptr<State> state_;  // shared with the hooks, which hold it weakly
};

}  // namespace ingot::distributed
