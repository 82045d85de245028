#include "distributed/collective_ops.h"

#include <map>
#include <mutex>
#include <optional>

#include "autograd/primitive.h"
#include "autograd/primitive_collective.h"
#include "distributed/buckets.h"
#include "runtime/cuda_runtime.h"

namespace ingot::distributed {
namespace {

// What every collective node shares: not differentiable, saves nothing, and never equivalent to another (CSE
// must keep each collective: every rank issues the same ones in the same order). Attributes print nothing
// rank- or world-size-specific, so every rank of a job traces the same graph text and shares one
// compile-cache entry. infer() maps one input to one output of numel * out_num / out_den elements (the input's
// shape when the ratio is 1; ZeRO-1's collectives take flat 1-d buffers). Every one is a start but
// collective_wait (CollectiveStep, autograd/primitive_collective.h: what the scheduler reads).
class CollectivePrim : public Primitive, public CollectiveStep {
 public:
  CollectivePrim(std::shared_ptr<ProcessGroup> group, int64_t out_num = 1, int64_t out_den = 1)
      : group_(std::move(group)), num_(out_num), den_(out_den) {}
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 1, name(), ": expected one input, got ", in.size());
    if (num_ == den_) return {in[0]};
    INGOT_CHECK(in[0].shape.size() == 1, name(), ": expected one flat (1-d) input");
    const int64_t n = in[0].shape[0];
    INGOT_CHECK(n * num_ % den_ == 0, name(), ": ", n, " elements do not split over ", group_->size(), " ranks");
    TensorMeta m = in[0];
    m.shape = Shape{n * num_ / den_};
    return {m};
  }
  bool differentiable() const override { return false; }
  bool saves_input(size_t) const override { return false; }
  bool equivalent(const Primitive&) const override { return false; }
  CollectivePhase phase() const override { return CollectivePhase::Start; }

 protected:
  std::shared_ptr<ProcessGroup> group_;
  int64_t num_, den_;
};

// Collectives in flight, by the storage of the buffer they write: what collective_wait waits for.
std::mutex g_pending_mu;
std::map<const Storage*, std::shared_ptr<Work>> g_pending;

// A collective with nothing to do (Note [Averages over one rank]): finished before its wait.
std::shared_ptr<Work> done_work(const char* op) {
  auto work = std::make_shared<Work>(op, -1);
  work->finish();
  return work;
}

// Registers the work that writes `out` for its collective_wait.
void register_pending(const Tensor& out, std::shared_ptr<Work> work) {
  std::lock_guard<std::mutex> lock(g_pending_mu);
  g_pending[out.storage().get()] = std::move(work);
}

// Note [In-place bucket reductions]: the all-reduce runs in the buffer of its input when the executor knows
// nothing else holds it (the bucket's concatenation, read by the start alone: Note [Outputs over dead inputs]),
// so a compiled DDP step does not copy the bucket again before reducing it. Eagerly (or when the input is
// still read afterwards) it reduces a copy.
//
// Note [Averages over one rank]: in a world of one the average of a bucket is the bucket itself, so the start
// issues nothing and its wait finds the work already done. NCCL would not skip it: ncclAvg over f32 is a
// pre-multiplied sum, and on one rank NCCL still runs it as a kernel that reads and writes the whole bucket (2x
// the gradient bytes per step, ~1 GB for GPT-2 124M, on the comm stream beside the backward: the 0.98 ms of
// "communication" a world of one showed, bench/RESULTS.md 2026-11-26). The graph keeps its starts and waits, so a
// world of one still runs a data-parallel step's schedule and per-bucket updates (`bench_gpt2_step --ddp`).
class AllReduceStartPrim final : public CollectivePrim {
 public:
  using CollectivePrim::CollectivePrim;
  std::string_view name() const override { return "all_reduce_start"; }
  CollectiveOp op() const override { return CollectiveOp::AllReduce; }
  std::optional<size_t> reusable_input() const override { return 0; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return start(in[0].clone_raw()); }
  std::vector<Tensor> eval_into(const std::vector<Tensor>&, const Tensor& into) const override { return start(into); }
  void print_attrs(std::ostream& os) const override { os << "op=avg"; }

 private:
  std::vector<Tensor> start(Tensor out) const {
    register_pending(out, group_->size() == 1 ? done_work("all_reduce") : reduce_bucket_async(*group_, out));
    return {out};
  }
};

// Waits for the collective that writes its first input (any of the starts above and below). Inputs after the
// first are ordering tokens (compile/passes/unit_reductions.h adds them): infer and eval look at the first only.
class CollectiveWaitPrim final : public CollectivePrim {
 public:
  CollectiveWaitPrim() : CollectivePrim(nullptr) {}
  std::string_view name() const override { return "collective_wait"; }
  CollectivePhase phase() const override { return CollectivePhase::Wait; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(!in.empty(), name(), ": expected the buffer of a collective in flight");
    return {in[0]};
  }
  // The result is the collective's buffer itself: the memory plan (compile/passes/memory_plan.cpp) continues that
  // buffer instead of placing a second one where the wait runs.
  std::optional<size_t> reusable_input() const override { return 0; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    std::shared_ptr<Work> work;
    {
      std::lock_guard<std::mutex> lock(g_pending_mu);
      auto it = g_pending.find(in[0].storage().get());
      INGOT_CHECK(it != g_pending.end(), "collective_wait: no collective in flight writes this tensor");
      work = std::move(it->second);
      g_pending.erase(it);
    }
    if (in[0].device().is_cuda())
      work->block_stream(cuda::current_stream(in[0].device().index));
    else
      work->wait();
    return {in[0]};
  }
};

// ZeRO-1's collectives, split like the all-reduce so that they overlap the compute around them: the
// reduce-scatter of a bucket starts when its gradients exist, the all-gather of a shard when its update ran.
// Neither backend writes the input of a reduce-scatter, so it is not copied first.
// `into`: a dtype wider than the input's the average is summed in (Note [Narrow wire, wide sum],
// process_group.h); the result has that dtype.
class ReduceScatterStartPrim : public CollectivePrim {
 public:
  explicit ReduceScatterStartPrim(std::shared_ptr<ProcessGroup> g, std::optional<DType> into = std::nullopt)
      : CollectivePrim(g, 1, g->size()), into_(into) {}
  std::string_view name() const override { return "reduce_scatter_start"; }
  CollectiveOp op() const override { return CollectiveOp::ReduceScatter; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    std::vector<TensorMeta> out = CollectivePrim::infer(in);
    if (into_) out[0].dtype = *into_;
    return out;
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor flat = in[0].contiguous_raw();
    Tensor out = empty({flat.numel() / group_->size()}, into_.value_or(flat.dtype()), flat.device());
    register_pending(out, reduce_bucket_async(*group_, flat, &out));
    return {out};
  }
  void print_attrs(std::ostream& os) const override {
    os << "op=avg";
    if (into_) os << ", summed in " << dtype_name(*into_);
  }

 protected:
  std::optional<DType> into_;
};

// The sum instead of the average (vocabulary-parallel lookups: each token's row comes from the one rank that
// holds it, the others add zeros; Note [Vocabulary-parallel embeddings], distributed/fsdp.h).
class ReduceScatterSumStartPrim final : public CollectivePrim, public WithAttrs<CollectivePurposeAttrs> {
 public:
  ReduceScatterSumStartPrim(std::shared_ptr<ProcessGroup> g, std::string purpose)
      : CollectivePrim(g, 1, g->size()), WithAttrs<CollectivePurposeAttrs>({std::move(purpose)}) {}
  std::string_view name() const override { return "reduce_scatter_start"; }
  CollectiveOp op() const override { return CollectiveOp::ReduceScatter; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor flat = in[0].contiguous_raw();
    Tensor out = empty({flat.numel() / group_->size()}, flat.dtype(), flat.device());
    register_pending(out, group_->reduce_scatter(out, flat, ReduceOp::Sum));
    return {out};
  }
  void print_attrs(std::ostream& os) const override {
    os << "op=sum";
    if (!attrs_.what.empty()) os << ", for " << attrs_.what;
  }
};

class AllGatherStartPrim : public CollectivePrim {
 public:
  explicit AllGatherStartPrim(std::shared_ptr<ProcessGroup> g) : CollectivePrim(g, g->size(), 1) {}
  std::string_view name() const override { return "all_gather_start"; }
  CollectiveOp op() const override { return CollectiveOp::AllGather; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor chunk = in[0].contiguous_raw();
    Tensor out = empty({chunk.numel() * group_->size()}, chunk.dtype(), chunk.device());
    register_pending(out, group_->all_gather(out, chunk));
    return {out};
  }
};

// An all-gather saying what it is for (CollectivePurposeAttrs).
class AllGatherForStartPrim final : public AllGatherStartPrim, public WithAttrs<CollectivePurposeAttrs> {
 public:
  AllGatherForStartPrim(std::shared_ptr<ProcessGroup> g, std::string purpose)
      : AllGatherStartPrim(std::move(g)), WithAttrs<CollectivePurposeAttrs>({std::move(purpose)}) {}
  void print_attrs(std::ostream& os) const override { os << "for " << attrs_.what; }
};

// Compiled ZeRO-3: ZeRO-1's starts, naming the unit (UnitCollectiveAttrs). A gather takes ordering tokens
// after its shard (compile/passes/unit_gathers.cpp adds them): infer and eval look at the shard only.
void print_unit(std::ostream& os, const UnitCollectiveAttrs& a) {
  os << "unit=" << a.name;
  if (a.regather) os << ", regather";
}

class AllGatherUnitStartPrim final : public AllGatherStartPrim, public WithAttrs<UnitCollectiveAttrs> {
 public:
  AllGatherUnitStartPrim(std::shared_ptr<ProcessGroup> g, UnitCollectiveAttrs a, std::optional<DType> as)
      : AllGatherStartPrim(std::move(g)), WithAttrs<UnitCollectiveAttrs>(std::move(a)), as_(as) {}
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(!in.empty(), name(), ": expected a shard");
    std::vector<TensorMeta> out = AllGatherStartPrim::infer({in[0]});
    if (as_) out[0].dtype = *as_;
    return out;
  }
  // The cast copy lives until the collective read it (the process group keeps it): one shard's bytes. NCCL casts on
  // its comm stream (Note [Gathers cast on the comm stream], nccl_process_group.cpp).
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    if (!as_ || in[0].dtype() == *as_) return AllGatherStartPrim::eval({in[0]});
    Tensor master = in[0].contiguous_raw();
    Tensor out = empty({master.numel() * group_->size()}, *as_, master.device());
    register_pending(out, group_->all_gather_cast(out, master));
    return {out};
  }
  void print_attrs(std::ostream& os) const override {
    os << "unit=" << attrs_.name;
    if (as_) os << ", as " << dtype_name(*as_);
    if (attrs_.regather) os << ", regather";
  }

 private:
  std::optional<DType> as_;
};

class ReduceScatterUnitStartPrim final : public ReduceScatterStartPrim, public WithAttrs<UnitCollectiveAttrs> {
 public:
  ReduceScatterUnitStartPrim(std::shared_ptr<ProcessGroup> g, UnitCollectiveAttrs a, std::optional<DType> into)
      : ReduceScatterStartPrim(std::move(g), into), WithAttrs<UnitCollectiveAttrs>(std::move(a)) {}
  void print_attrs(std::ostream& os) const override {
    ReduceScatterStartPrim::print_attrs(os);
    os << ", ";
    print_unit(os, attrs_);
  }
};

// The exchange of a unit's narrow-wire reduce-scatter (exchange_unit_start). A reduce-scatter to the compiler
// (CollectiveOp::ReduceScatter): its gradients are made in its input's bucket and its wait comes a unit later,
// like the whole reduce-scatter's.
class ExchangeUnitStartPrim final : public CollectivePrim, public WithAttrs<UnitCollectiveAttrs> {
 public:
  ExchangeUnitStartPrim(std::shared_ptr<ProcessGroup> g, UnitCollectiveAttrs a)
      : CollectivePrim(g, g->size() - 1, g->size()), WithAttrs<UnitCollectiveAttrs>(std::move(a)) {}
  std::string_view name() const override { return "exchange_start"; }
  CollectiveOp op() const override { return CollectiveOp::ReduceScatter; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor flat = in[0].contiguous_raw();
    Tensor out = empty({flat.numel() / group_->size() * (group_->size() - 1)}, flat.dtype(), flat.device());
    register_pending(out, group_->exchange_chunks(out, flat));
    return {out};
  }
  void print_attrs(std::ostream& os) const override {
    os << "the others' pieces, ";
    print_unit(os, attrs_);
  }
};

template <class Prim>
Tensor apply_collective(const char* op, const Tensor& in, std::shared_ptr<ProcessGroup> group) {
  INGOT_CHECK(group != nullptr, op, ": no process group");
  return ingot::apply(std::make_shared<Prim>(std::move(group)), {in})[0];
}

}  // namespace

Tensor reduce_scatter_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group) {
  return apply_collective<ReduceScatterStartPrim>("reduce_scatter_start", flat, std::move(group));
}

Tensor reduce_scatter_sum_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group, std::string purpose) {
  INGOT_CHECK(group != nullptr, "reduce_scatter_sum_start: no process group");
  return ingot::apply(std::make_shared<ReduceScatterSumStartPrim>(std::move(group), std::move(purpose)), {flat})[0];
}

Tensor all_gather_start(const Tensor& chunk, std::shared_ptr<ProcessGroup> group, std::string purpose) {
  INGOT_CHECK(group != nullptr, "all_gather_start: no process group");
  return ingot::apply(std::make_shared<AllGatherForStartPrim>(std::move(group), std::move(purpose)), {chunk})[0];
}

Tensor all_gather_start(const Tensor& chunk, std::shared_ptr<ProcessGroup> group) {
  return apply_collective<AllGatherStartPrim>("all_gather_start", chunk, std::move(group));
}

Tensor all_gather_unit_start(const Tensor& shard, std::shared_ptr<ProcessGroup> group, UnitCollectiveAttrs unit,
                             std::optional<DType> as) {
  INGOT_CHECK(group != nullptr, "all_gather_unit_start: no process group");
  return ingot::apply(std::make_shared<AllGatherUnitStartPrim>(std::move(group), std::move(unit), as), {shard})[0];
}

Tensor reduce_scatter_unit_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group, UnitCollectiveAttrs unit,
                                 std::optional<DType> into) {
  INGOT_CHECK(group != nullptr, "reduce_scatter_unit_start: no process group");
  return ingot::apply(std::make_shared<ReduceScatterUnitStartPrim>(std::move(group), std::move(unit), into), {flat})[0];
}

Tensor exchange_unit_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group, UnitCollectiveAttrs unit) {
  INGOT_CHECK(group != nullptr && group->size() > 1, "exchange_unit_start: needs a process group of two or more ranks");
  return ingot::apply(std::make_shared<ExchangeUnitStartPrim>(std::move(group), std::move(unit)), {flat})[0];
}

Tensor reduce_scatter_avg(const Tensor& flat, std::shared_ptr<ProcessGroup> group) {
  return collective_wait(reduce_scatter_start(flat, std::move(group)));
}

Tensor all_gather(const Tensor& chunk, std::shared_ptr<ProcessGroup> group) {
  return collective_wait(all_gather_start(chunk, std::move(group)));
}

Tensor all_reduce_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group) {
  return apply_collective<AllReduceStartPrim>("all_reduce_start", flat, std::move(group));
}

Tensor collective_wait(const Tensor& pending) {
  return ingot::apply(std::make_shared<CollectiveWaitPrim>(), {pending})[0];
}

Tensor all_reduce_avg(const Tensor& flat, std::shared_ptr<ProcessGroup> group) {
  INGOT_CHECK(group != nullptr, "all_reduce_avg: no process group");
  return collective_wait(all_reduce_start(flat, std::move(group)));
}

}  // namespace ingot::distributed
