// DistributedDataParallel: bucket layout, the gradient hooks that issue bucket reductions during backward,
// and ZeRO-1/2 shards. See ddp.h for the protocol.
#include "distributed/ddp.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "autograd/nn/module.h"
#include "autograd/ops.h"
#include "autograd/primitive.h"
#include "distributed/buckets.h"
#include "distributed/collective_ops.h"

namespace ingot::distributed {

namespace {

struct Bucket {
  std::vector<size_t> params;    // parameter indices, in the order they were packed
  std::vector<int64_t> offsets;  // element offset of each in `flat`
  // Gradient buffer of the eager path (ZeRO-1: padded to a multiple of the world size), made at its first use:
  // a compiled step builds its buckets as graph values and never needs it (its bytes would sit beside the
  // step's peak: +0.5 GB for GPT-2 124M).
  Tensor flat;
  int64_t numel = 0;
  DType dtype = DType::f32;
  Device device;
  Tensor shard, shard_grad;      // ZeRO-1/2: this rank's chunk of the parameters and of the averaged gradient
  // ZeRO-1/2: the dtype of the shard's .grad: the reduction's when it is wider than the parameters' (f32 for bf16
  // weights), so f32 masters of the shard update from the f32 average itself, as ZeRO-3 keeps it (Note [Reduced
  // gradients keep their precision], fsdp.h); else the parameters' (a bf16 reduction of f32 weights is widened).
  DType grad_dtype = DType::f32;
  Tensor gathered;               // ZeRO-1/2, eager: all-gather output, same layout as `flat` (made at first use)
  int pending = 0;               // gradients still missing this round
  std::shared_ptr<Work> work;
};

// A view of `flat` holding `shape` at element `offset`.
Tensor slice(const Tensor& flat, int64_t offset, const Shape& shape) {
  return flat.as_strided(shape, contiguous_strides(shape), flat.offset() + offset);
}

}  // namespace

struct DistributedDataParallel::State {
  std::vector<Tensor> params;
  std::vector<std::string> names;
  std::vector<size_t> bucket_of, slot_of;  // per parameter: bucket index and position in it
  std::vector<bool> ready;                 // per parameter: gradient copied into its bucket this round
  std::vector<Bucket> buckets;
  size_t next_launch = 0;
  int no_sync_depth = 0;
  bool zero1 = false;  // sharded optimizer (stage 1 or 2)
  bool zero2 = false;
  ProcessGroup* group = nullptr;

  void launch_ready() {
    // Strictly in bucket order: the collective sequence must be identical on every rank.
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch++];
      b.work = reduce_bucket_async(*group, b.flat, zero1 ? &b.shard_grad : nullptr);
    }
    if (zero2) release_reduced();
  }

  // Note [ZeRO-2 frees gradients per bucket]: a bucket's whole buffer is needed only until its reduce-scatter
  // finished (this rank's chunk then sits in shard_grad), so it is dropped then: checked each time another
  // bucket is issued during backward, and for the rest in synchronize(). The parameters' .grad were dropped
  // when copied in (mark_ready), so at most the buckets still in flight hold whole gradients.
  void release_reduced() {
    for (size_t k = 0; k < next_launch; ++k)
      if (buckets[k].flat.defined() && buckets[k].work && buckets[k].work->is_completed()) buckets[k].flat = Tensor();
  }

  void mark_ready(size_t i, const Tensor* grad) {
    INGOT_CHECK(!ready[i], "DistributedDataParallel: parameter '", names[i],
                "' received a second gradient before synchronize(); call ddp.step()/synchronize() after each "
                "backward, or run the earlier micro-steps of gradient accumulation inside ddp.no_sync()");
    Bucket& b = buckets[bucket_of[i]];
    INGOT_INTERNAL_CHECK(next_launch <= bucket_of[i], "bucket issued before all its gradients arrived");
    if (!b.flat.defined()) b.flat = zeros({b.numel}, b.dtype, b.device);
    Tensor dst = slice(b.flat, b.offsets[slot_of[i]], params[i].shape());
    if (grad)
      dst.copy_(*grad);
    else
      dst.zero_();
    if (zero2) params[i].zero_grad();
    ready[i] = true;
    if (--b.pending == 0) launch_ready();
  }

  void reset_round() {
    std::fill(ready.begin(), ready.end(), false);
    for (Bucket& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.work.reset();
    }
    next_launch = 0;
  }
};

DistributedDataParallel::DistributedDataParallel(std::vector<Tensor> params, std::shared_ptr<ProcessGroup> group,
                                                 DdpOptions options)
    : group_(std::move(group)), options_(options) {
  std::vector<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    std::string name = "#";  // (not "#" + ...: GCC 12 warns falsely about that operator+ with -Wrestrict)
    name += std::to_string(i);
    names.push_back(std::move(name));
  }
  init(std::move(params), std::move(names));
}

DistributedDataParallel::DistributedDataParallel(const nn::Module& module, std::shared_ptr<ProcessGroup> group,
                                                 DdpOptions options)
    : group_(std::move(group)), options_(options) {
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (auto& [name, p] : module.named_parameters()) {
    params.push_back(p);
    names.push_back(name);
  }
  init(std::move(params), std::move(names));
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::init(std::vector<Tensor> params, std::vector<std::string> names) {
  INGOT_CHECK(group_ != nullptr, "DistributedDataParallel: a process group is required");
  INGOT_CHECK(options_.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be > 0, got ",
              options_.bucket_cap_mb);
  INGOT_CHECK(options_.root >= 0 && options_.root < group_->size(), "DistributedDataParallel: root must be in [0, ",
              group_->size(), "), got ", options_.root);
  INGOT_CHECK(options_.zero_stage >= 0 && options_.zero_stage <= 2,
              "DistributedDataParallel: zero_stage must be 0, 1 or 2 (stage 3 is FullyShardedDataParallel), got ",
              options_.zero_stage);
  INGOT_CHECK(!options_.reduce_dtype || is_floating(*options_.reduce_dtype),
              "DistributedDataParallel: reduce_dtype must be a floating dtype, got ", dtype_name(*options_.reduce_dtype));
  auto st = std::make_shared<State>();
  st->zero1 = options_.zero_stage >= 1;
  st->zero2 = options_.zero_stage == 2;
  st->group = group_.get();
  std::set<const TensorImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    INGOT_CHECK(p.defined() && p.requires_grad() && p.is_leaf(), "DistributedDataParallel: parameter '", names[i],
                "' must be a leaf tensor with requires_grad");
    INGOT_CHECK(p.is_contiguous(), "DistributedDataParallel: parameter '", names[i], "' must be contiguous");
    INGOT_CHECK(is_floating(p.dtype()), "DistributedDataParallel: parameter '", names[i],
                "' must be floating point, got ", dtype_name(p.dtype()));
    INGOT_CHECK(p.device() == params[0].device(), "DistributedDataParallel: parameter '", names[i], "' is on ",
                p.device().str(), " but '", names[0], "' is on ", params[0].device().str());
    INGOT_CHECK(seen.insert(p.impl()).second, "DistributedDataParallel: parameter '", names[i],
                "' is listed twice");
  }
  st->params = params;
  st->names = names;

  if (options_.broadcast_parameters && group_->size() > 1) {
    std::vector<std::shared_ptr<Work>> works;
    for (Tensor& p : st->params) works.push_back(group_->broadcast(p, options_.root));
    for (auto& w : works) w->wait();
  }

  const int world = group_->size(), rank = group_->rank();
  std::vector<BucketParam> infos;
  for (const Tensor& p : st->params) infos.push_back({p.numel(), p.dtype()});
  st->bucket_of.resize(params.size());
  st->slot_of.resize(params.size());
  for (const BucketPlan& plan : plan_buckets(infos, options_.bucket_cap_mb * 1024 * 1024, st->zero1 ? world : 1)) {
    Bucket& b = st->buckets.emplace_back();
    b.params = plan.params;
    b.offsets = plan.offsets;
    for (size_t s = 0; s < b.params.size(); ++s) {
      st->bucket_of[b.params[s]] = st->buckets.size() - 1;
      st->slot_of[b.params[s]] = s;
    }
    const Tensor& p0 = st->params[b.params[0]];
    const DType reduce = options_.reduce_dtype.value_or(p0.dtype());
    b.numel = plan.padded_numel;
    b.dtype = reduce;
    b.device = p0.device();
    if (st->zero1) {
      int64_t chunk = plan.padded_numel / world;
      b.gathered = zeros({plan.padded_numel}, p0.dtype(), p0.device());
      for (size_t s = 0; s < b.params.size(); ++s) {
        const Tensor& p = st->params[b.params[s]];
        slice(b.gathered, b.offsets[s], p.shape()).copy_(p);
      }
      b.shard = slice(b.gathered, rank * chunk, {chunk}).clone_raw();
      b.gathered = Tensor();  // a compiled step gathers into graph values: no whole copy kept beside it
      b.shard.set_requires_grad(true);  // the optimizer takes leaves; the shard's .grad is set by synchronize()
      b.shard_grad = zeros({chunk}, reduce, p0.device());
      b.grad_dtype = itemsize(reduce) > itemsize(p0.dtype()) ? reduce : p0.dtype();
    }
  }
  st->ready.assign(params.size(), false);
  st->reset_round();
  state_ = st;

  std::weak_ptr<State> weak = st;
  for (size_t i = 0; i < st->params.size(); ++i) {
    st->params[i].register_post_accumulate_grad_hook([weak, i](Tensor& param) {
      auto s = weak.lock();
      // The DDP object is gone, or accumulating locally, or a compiled step is being traced (its reduction is
      // recorded by synchronize() instead: Note [DDP in a traced step]).
      if (!s || s->no_sync_depth > 0 || trace_observer() != nullptr) return;
      Tensor g = param.grad();
      s->mark_ready(i, &g);
    });
  }
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel* d) : d_(d) { ++d_->state_->no_sync_depth; }
DistributedDataParallel::NoSync::~NoSync() { --d_->state_->no_sync_depth; }

// Note [DDP in a traced step]: while ingot::compile traces the step, the backward hooks stay quiet and
// synchronize() records each bucket's reduction as ops: the bucket's gradients flattened and concatenated (the
// same layout as eager's flat buffers), an all_reduce_start node and its collective_wait, and slices of the
// result copied back into the .grad tensors. The scheduler moves each start up to where its bucket's last
// gradient is made and each wait down to the optimizer, so the reductions overlap the rest of the backward. The compiled graph then holds the all-reduces between the backward and the optimizer
// update, and eager and compiled runs reduce the same buckets in the same order.
// ZeRO-1 records a reduce_scatter_avg node per bucket instead, whose chunk becomes the shard's gradient, and
// after_step() an all_gather node per bucket whose slices are copied into the parameters (write-backs).
void DistributedDataParallel::synchronize_traced() {
  State& s = *state_;
  TraceObserver* obs = trace_observer();
  // The optimizer reads `.grad`; under tracing its value is whatever was last assigned to that tensor.
  auto publish_grad = [obs](Tensor& leaf, const Tensor& value) {
    Tensor g = leaf.grad();
    if (g.defined()) {
      g.copy_(value);
      obs->on_assign(g, value);
    } else {
      leaf.set_grad(clone(value));  // a traced op: the optimizer's read of .grad maps to the graph value
    }
  };
  for (Bucket& b : s.buckets) {
    std::vector<Tensor> parts;
    int64_t used = 0;
    for (size_t k = 0; k < b.params.size(); ++k) {
      const Tensor& p = s.params[b.params[k]];
      Tensor g = p.grad();
      parts.push_back(reshape(g.defined() ? g : zeros(p.shape(), p.dtype(), p.device()), {p.numel()}));
      used += p.numel();
    }
    const DType grad_dtype = parts[0].dtype();
    if (b.numel > used) parts.push_back(zeros({b.numel - used}, grad_dtype, b.device));
    // reduce_dtype: the whole bucket rounded in one kernel after the concatenation (one cast per parameter
    // was launch-bound: +0.5 ms for GPT-2's 148 tensors, bench/RESULTS.md) and widened back in one.
    Tensor flat = parts.size() == 1 ? parts[0] : cat(parts, 0);
    flat = cast(flat, b.dtype);  // cast() of a tensor already in that dtype is the tensor itself
    if (s.zero1) {
      publish_grad(b.shard, cast(reduce_scatter_avg(flat, group_), b.grad_dtype));
      continue;
    }
    const Tensor avg = cast(collective_wait(all_reduce_start(flat, group_)), grad_dtype);
    for (size_t k = 0; k < b.params.size(); ++k) {
      Tensor& p = s.params[b.params[k]];
      publish_grad(p, cast(reshape(narrow(avg, 0, b.offsets[k], p.numel()), p.shape()), p.dtype()));
    }
  }
  s.reset_round();
}

void DistributedDataParallel::after_step_traced() {
  State& s = *state_;
  TraceObserver* obs = trace_observer();
  for (Bucket& b : s.buckets) {
    Tensor gathered = all_gather(b.shard, group_);
    for (size_t k = 0; k < b.params.size(); ++k) {
      Tensor& p = s.params[b.params[k]];
      Tensor v = reshape(narrow(gathered, 0, b.offsets[k], p.numel()), p.shape());
      p.copy_(v);
      obs->on_assign(p, v);
    }
  }
}

void DistributedDataParallel::synchronize() {
  State& s = *state_;
  INGOT_CHECK(s.no_sync_depth == 0, "DistributedDataParallel: synchronize() called inside no_sync()");
  if (trace_observer() != nullptr) {
    synchronize_traced();
    return;
  }
  // Parameters that got no gradient this round (unused in this rank's forward) contribute zeros.
  for (size_t i = 0; i < s.params.size(); ++i)
    if (!s.ready[i]) {
      Tensor g = s.params[i].grad();
      s.mark_ready(i, g.defined() ? &g : nullptr);
    }
  INGOT_INTERNAL_CHECK(s.next_launch == s.buckets.size(), "not every bucket was issued");
  std::exception_ptr first_error;
  for (Bucket& b : s.buckets) {
    try {
      b.work->wait();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) {
    s.reset_round();
    std::rethrow_exception(first_error);
  }
  for (Bucket& b : s.buckets) {
    if (s.zero1) {
      b.shard.set_grad(b.shard_grad.to(b.grad_dtype));  // to() of the same dtype is the tensor itself
      if (s.zero2) b.flat = Tensor();
      continue;
    }
    for (size_t k = 0; k < b.params.size(); ++k) {
      Tensor& p = s.params[b.params[k]];
      Tensor avg = slice(b.flat, b.offsets[k], p.shape());
      Tensor g = p.grad();
      if (g.defined())
        g.copy_(avg);
      else
        p.set_grad(avg.dtype() == p.dtype() ? avg.clone_raw() : avg.to(p.dtype()));
    }
  }
  s.reset_round();
}

std::vector<Tensor> DistributedDataParallel::optimizer_params() const {
  if (!state_->zero1) return state_->params;
  std::vector<Tensor> shards;
  for (const Bucket& b : state_->buckets) shards.push_back(b.shard);
  return shards;
}

void DistributedDataParallel::after_step() {
  State& s = *state_;
  if (!s.zero1) return;
  if (trace_observer() != nullptr) {
    after_step_traced();
    return;
  }
  std::vector<std::shared_ptr<Work>> works;
  for (Bucket& b : s.buckets) {
    if (!b.gathered.defined()) b.gathered = empty({b.numel}, b.shard.dtype(), b.device);
    works.push_back(group_->all_gather(b.gathered, b.shard));
  }
  for (auto& w : works) w->wait();
  for (Bucket& b : s.buckets) {
    for (size_t k = 0; k < b.params.size(); ++k) {
      Tensor& p = s.params[b.params[k]];
      p.copy_(slice(b.gathered, b.offsets[k], p.shape()));
    }
    if (s.zero2) b.gathered = Tensor();  // a second whole copy of the weights between steps is not stage 2
  }
}

void DistributedDataParallel::step(optim::Optimizer& opt) {
  synchronize();
  opt.step();
  after_step();
}

void DistributedDataParallel::zero_grad() {
  for (Tensor& p : state_->params) p.zero_grad();
  for (Bucket& b : state_->buckets)
    if (b.shard.defined()) b.shard.zero_grad();
}

void step_and_zero_grad(DistributedDataParallel* ddp, optim::Optimizer& opt) {
  if (ddp) {
    ddp->step(opt);
    ddp->zero_grad();
  } else {
    opt.step();
    opt.zero_grad();
  }
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : state_->buckets) out.push_back(b.params);
  return out;
}

}  // namespace ingot::distributed
