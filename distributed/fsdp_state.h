// FullyShardedDataParallel's state (internal to distributed/): the units and the eager protocol's bookkeeping,
// shared by fsdp.cpp (eager hooks) and fsdp_compiled.cpp (the same units inside a traced step).
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/nn/layers.h"
#include "autograd/ops.h"
#include "distributed/fsdp.h"
#include "runtime/allocator_census.h"
#include "runtime/cuda_runtime.h"

namespace ingot::distributed {

namespace fsdp_detail {

// One FSDP unit: see fsdp.h.
struct Unit {
  std::string name;  // "root" or the block's module path ("transformer.h.0")
  BucketPlan plan;   // parameter indices (model.parameters() order) and their offsets in the flat layout
  // The unit's weights, whole: every parameter of the unit is a view of it. Its bytes exist only while the
  // unit is gathered; the Storage object itself (and so every view, saved-for-backward ones included) lives on.
  std::shared_ptr<Storage> storage;
  DType dtype = DType::f32;
  Device device;
  Tensor shard;                  // this rank's chunk of the flat weights: a leaf the optimizer updates
  // Note [Shards cast from their masters] (fsdp.h): the f32 master of `shard` its gathers are cast from, when the
  // shard itself has no bytes (gather_from_masters); undefined otherwise.
  Tensor master;
  Tensor flat_grad, shard_grad;  // this round's whole flattened gradient (until reduced) and this rank's average
  std::shared_ptr<Work> work;
  // Eager: the all-gather that fills `storage`, until something waited for it (Note [Eager prefetch], fsdp.h).
  std::shared_ptr<Work> gather_work;
  // The storage's version before that gather (Note [Gathered weights keep their version]).
  uint64_t gather_version = 0;
  // Eager: pre-backward boundaries made for this unit whose backward has not run yet; a backward prefetches the
  // unit only while one is pending (a block that ran without gradients has none and is not gathered again).
  int boundaries = 0;
  int pending = 0;    // parameters still without a gradient this round
  bool gathered = false;
  // Compiled ZeRO-3, while a step is traced: the all-gathered flat weights the parameters are views of until
  // their gradients are reduced (Note [ZeRO-3 in a traced step], fsdp_compiled.cpp); undefined otherwise.
  Tensor traced;
  // The unit's earlier gathered values of this round (tied embeddings gathered again for the head), kept
  // referenced until the reduction for the same reason as `traced`.
  std::vector<Tensor> traced_earlier;
  Tensor traced_reduction;  // compiled ZeRO-3, while tracing: the started reduce-scatter of this round's gradients
  // ... or, with a narrow wire, the started exchange of its pieces, and the flattened gradient that holds this rank's
  // own piece (Note [Pieces read by the update], compile/passes/pieces_into_update.h).
  Tensor traced_flat;
  // Note [Vocabulary-parallel embeddings] (fsdp.h): the unit is one [vocab, dim] table whose shard is rows
  // [rank * rows, (rank + 1) * rows) of rows * world; looked up where it lies, never gathered or reduce-scattered.
  bool vocab_parallel = false;
  int64_t rows = 0, dim = 0;
  // This round's gradient of the shard's rows summed over every rank's tokens (f32, f64 for f64 weights), made
  // by the lookups' backward (eagerly, or as graph values while a step is traced): synchronize() scales it by
  // 1/world into the shard's .grad.
  Tensor vocab_grad;

  Tensor flat() const {
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = storage;
    impl->shape = Shape{plan.padded_numel};
    impl->strides = contiguous_strides(impl->shape);
    impl->dtype = dtype;
    return Tensor(impl);
  }
};

}  // namespace fsdp_detail

struct FullyShardedDataParallel::State {
  using Unit = fsdp_detail::Unit;
  std::shared_ptr<ProcessGroup> group;
  FsdpOptions options;
  std::vector<Tensor> params;
  std::vector<std::string> names;
  std::vector<size_t> unit_of;
  std::vector<bool> ready;  // per parameter: its gradient was flattened into its unit's buffer this round
  std::vector<Unit> units;  // in forward order: embeddings (or root), the blocks, the head
  std::vector<BucketPlan> plans;
  // The units outside the blocks (Note [Embeddings and head are units], fsdp.h): either `root`, or `embed` and
  // `head` (each unset when it has no parameters).
  std::optional<size_t> root, embed, head;
  bool head_reads_embed = false;  // tied embeddings: the head's forward and backward read `embed` too
  std::optional<size_t> first_block, last_block;
  // Note [Vocabulary-parallel embeddings]: the table's module (its lookup replaced) and the leaf that makes each
  // lookup's output require a gradient (its own gradient is never made).
  nn::Embedding* vocab_module = nullptr;
  Tensor vocab_anchor;
  bool in_forward = false;        // between the model's forward hooks
  int heads_awaiting_backward = 0;  // tied: head forwards of this round whose backward has not run yet
  int64_t gathered_bytes = 0, peak_gathered_bytes = 0;  // eager: the units' whole weights that have bytes
  // This round's averaged gradient of a vocabulary-parallel unit's shard, in the shard's gradient dtype (zeros
  // when no lookup ran a backward). Eagerly and while tracing alike.
  Tensor vocab_shard_grad(const Unit& u) const {
    const int64_t chunk = u.rows * u.dim;
    if (!u.vocab_grad.defined()) return zeros({chunk}, grad_dtype(u), u.device);
    return cast(mul(reshape(u.vocab_grad, {chunk}), 1.0 / group->size()), grad_dtype(u));
  }

  // Eager: the units' flattened gradients alive (made, reducing or waiting to be reduced) and their peak.
  int64_t reducing_bytes = 0, peak_reducing_bytes = 0;
  static constexpr int kReductionsInFlight = 2;  // Note [Reductions in flight]
  size_t next_issue = 0;    // reductions are issued from the last unit to the first
  bool round_active = false;
  bool active = true;       // false after unshard(): every hook is quiet
  // Note [Updates in the backward] (fsdp_compiled.cpp): called while tracing with a unit whose shard's .grad was
  // just set (its update runs there, not after the backward); the units reduced and not yet waited for, oldest
  // first, and how many units later each is waited for.
  std::function<void(size_t unit)> update_unit;
  int update_lag = 1;
  std::vector<size_t> awaiting_update;

  // Note [Gathered weights keep their version]: the backward engine checks that a saved input was not written
  // since it was recorded. Gathering again before the backward rewrites the bytes a forward read, with the
  // same values (the shards change only in the optimizer step), so the storage's version is kept.
  void gather(Unit& u) {
    start_gather(u);
    await_gather(u);
  }

  // Issues u's all-gather into freshly allocated bytes (a collective: every rank issues the same ones in the same
  // order); the weights may be read once await_gather(u) ran.
  void start_gather(Unit& u) {
    if (u.gathered) return;
    u.gather_version = u.storage->version;
    const census::Owner owner("ZeRO-3: gathered unit weights (eager)");
    u.storage->data = allocator_for(u.device).allocate(u.storage->nbytes);
    Tensor full = u.flat();
    // The version is put back once the gather was waited for (await_gather), not here: a backend's worker may
    // count the write while the gather runs (Gloo).
    u.gather_work = gather_into(full, u);
    u.gathered = true;
    gathered_bytes += static_cast<int64_t>(u.storage->nbytes);
    peak_gathered_bytes = std::max(peak_gathered_bytes, gathered_bytes);
  }

  // Note [Eager prefetch] (fsdp.h): with prefetch on a GPU only the current stream waits for the gather (the
  // host goes on queueing the unit's kernels); otherwise the host waits, as without prefetch.
  void await_gather(Unit& u) {
    if (!u.gather_work) return;
    const std::shared_ptr<Work> w = std::move(u.gather_work);
    if (options.prefetch && u.device.is_cuda()) w->block_stream(cuda::current_stream(u.device.index));
    else w->wait();
    u.storage->version = u.gather_version;  // a backend may count the write when the collective completes (Gloo)
  }

  // Issues the gather of unit `next` ahead of its use, when prefetching and `next` is a block.
  void prefetch(size_t next) {
    if (options.prefetch && first_block && *first_block <= next && next <= *last_block) start_gather(units[next]);
  }

  // A prefetched gather nothing waited for is stale once its pass ended (a forward that did not run the block,
  // a backward that never reached it): freed, so no later forward computes with weights from before an update.
  void release_unused_prefetches() {
    for (Unit& u : units)
      if (u.gather_work) release(u);
  }

  // Gathers `u` into `full`: from its shard, or from its master cast to the unit's dtype (a temporary; on the comm
  // stream with NCCL, Note [Gathers cast on the comm stream]).
  std::shared_ptr<Work> gather_into(Tensor& full, const Unit& u) const {
    return group->all_gather_cast(full, u.master.defined() ? u.master : u.shard);  // same dtype: a plain gather
  }

  void release(Unit& u) {
    await_gather(u);  // a prefetched gather never used: its bytes are freed only once it wrote them
    if (u.gathered) gathered_bytes -= static_cast<int64_t>(u.storage->nbytes);
    u.storage->data.reset();
    u.gathered = false;
  }

  // The dtype gradients are summed in, and the one they cross the wire in (reduce_wire_dtype when narrower: Note
  // [Narrow wire, wide sum], process_group.h).
  DType reduce_dtype(const Unit& u) const { return options.reduce_dtype.value_or(u.dtype); }
  DType wire_dtype(const Unit& u) const {
    const DType sum = reduce_dtype(u);
    const std::optional<DType> w = options.reduce_wire_dtype;
    return w && itemsize(*w) < itemsize(sum) ? *w : sum;
  }

  // The dtype of a shard's .grad: the reduction's when it is wider than the weights' (reduce_dtype f32 with bf16
  // weights), so the f32 average reaches the f32 masters' update unrounded, as FSDP2 keeps it; else the weights'
  // (a bf16 reduction of f32 weights is widened back). Note [Reduced gradients keep their precision].
  DType grad_dtype(const Unit& u) const {
    const DType reduce = reduce_dtype(u);
    return itemsize(reduce) > itemsize(u.dtype) ? reduce : u.dtype;
  }

  // Every parameter of `u` has its gradient: the weights are no longer needed, the gradients are flattened
  // (zeros for parameters without one) and dropped.
  void unit_done(Unit& u) {
    release(u);
    const census::Owner owner("ZeRO-3: flattened unit gradients (eager)");
    u.flat_grad = zeros({u.plan.padded_numel}, wire_dtype(u), u.device);
    reducing_bytes += static_cast<int64_t>(u.flat_grad.nbytes());
    peak_reducing_bytes = std::max(peak_reducing_bytes, reducing_bytes);
    for (size_t k = 0; k < u.plan.params.size(); ++k) {
      Tensor& p = params[u.plan.params[k]];
      Tensor g = p.grad();
      if (g.defined())
        u.flat_grad.as_strided(p.shape(), contiguous_strides(p.shape()), u.plan.offsets[k]).copy_(g);
      p.zero_grad();
    }
    issue_ready();
  }

  // Strictly from the last unit to the first, whatever order the units completed in: the collective sequence
  // must be identical on every rank. A buffer whose reduction finished is dropped at once.
  void issue_ready() {
    while (next_issue < units.size()) {
      Unit& u = units[units.size() - 1 - next_issue];
      if (u.vocab_parallel) {  // its gradient is this rank's already: nothing to reduce
        ++next_issue;
        continue;
      }
      if (u.pending > 0) break;
      u.shard_grad = empty({u.plan.padded_numel / group->size()}, reduce_dtype(u), u.device);
      u.work = reduce_bucket_async(*group, u.flat_grad, &u.shard_grad);  // widened when the wire is narrower
      ++next_issue;
    }
    for (Unit& u : units)
      if (u.flat_grad.defined() && u.work && u.work->is_completed()) drop_flat_grad(u);
    // Note [Reductions in flight]: a host that runs ahead of the device (prefetched gathers block no host wait)
    // would find every reduction still running and keep every unit's flattened gradient: on an 8B model 0.87 GB
    // of f32 per block, +7 GB at the peak (bench/RESULTS.md 2026-11-27). Beyond the kReductionsInFlight newest,
    // the oldest buffer is dropped after the compute stream (not the host) was made to wait for its reduction:
    // the allocator may hand its block to the next allocation on that stream only once NCCL read it.
    // The compute stream stalls only when communication is that many units behind, as FSDP2's does.
    int live = 0;
    for (const Unit& u : units) live += u.flat_grad.defined() && u.work ? 1 : 0;
    for (size_t i = units.size(); i-- > 0 && live > kReductionsInFlight;) {  // issue order: the last unit first
      Unit& u = units[i];
      if (!u.flat_grad.defined() || !u.work) continue;
      try {
        if (u.device.is_cuda()) u.work->block_stream(cuda::current_stream(u.device.index));
        else u.work->wait();
      } catch (...) {
        // A failed reduction: its error is thrown by synchronize(), which waits for every unit's (the backward's
        // hooks would leave the round half done); the communicator is gone, nothing reads the buffer any more.
      }
      drop_flat_grad(u);
      --live;
    }
  }

  void drop_flat_grad(Unit& u) {
    reducing_bytes -= static_cast<int64_t>(u.flat_grad.nbytes());
    u.flat_grad = Tensor();
  }

  void on_grad(size_t i) {
    INGOT_CHECK(!units[unit_of[i]].vocab_parallel, "FullyShardedDataParallel: parameter '", names[i],
                "' got a gradient outside its vocabulary-parallel lookup (something read the table's weight "
                "directly); set distributed.vocab_parallel_embeddings false to gather it as any unit");
    INGOT_CHECK(!ready[i], "FullyShardedDataParallel: parameter '", names[i],
                "' received a second gradient before synchronize(); call synchronize() after each backward");
    ready[i] = true;
    round_active = true;
    Unit& u = units[unit_of[i]];
    if (--u.pending == 0) unit_done(u);
  }

  void reset_round() {
    std::fill(ready.begin(), ready.end(), false);
    for (Unit& u : units) {
      u.boundaries = 0;  // a graph dropped without its backward leaves none pending
      u.pending = static_cast<int>(u.plan.params.size());
      u.work.reset();
      if (u.flat_grad.defined()) drop_flat_grad(u);
      u.shard_grad = Tensor();
      u.vocab_grad = Tensor();
    }
    next_issue = 0;
    round_active = false;
    heads_awaiting_backward = 0;
    awaiting_update.clear();
  }
};

}  // namespace ingot::distributed
