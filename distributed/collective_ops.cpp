#include "distributed/collective_ops.h"

#include <map>
#include <mutex>

#include "autograd/primitive.h"
#include "distributed/buckets.h"
#include "runtime/cuda_runtime.h"

namespace ingot::distributed {
namespace {

class AllReduceAvgPrim final : public Primitive {
 public:
  explicit AllReduceAvgPrim(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}
  std::string_view name() const override { return "all_reduce_avg"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 1, "all_reduce_avg: expected one input, got ", in.size());
    return {in[0]};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor out = in[0].clone_raw();
    reduce_bucket_async(*group_, out)->wait();
    return {out};
  }
  bool differentiable() const override { return false; }
  bool saves_input(size_t) const override { return false; }
  // Nothing rank- or world-size-specific: every rank of a job traces the same graph text, so they share one
  // compile-cache entry. Two all-reduces are never equivalent: CSE must keep each collective.
  void print_attrs(std::ostream& os) const override { os << "op=avg"; }
  bool equivalent(const Primitive&) const override { return false; }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

// Collectives in flight, by the storage of the buffer they write: what collective_wait waits for.
std::mutex g_pending_mu;
std::map<const Storage*, std::shared_ptr<Work>> g_pending;

class AllReduceStartPrim final : public Primitive {
 public:
  explicit AllReduceStartPrim(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}
  std::string_view name() const override { return "all_reduce_start"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 1, "all_reduce_start: expected one input, got ", in.size());
    return {in[0]};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor out = in[0].clone_raw();
    std::shared_ptr<Work> work = reduce_bucket_async(*group_, out);
    std::lock_guard<std::mutex> lock(g_pending_mu);
    g_pending[out.storage().get()] = std::move(work);
    return {out};
  }
  bool differentiable() const override { return false; }
  bool saves_input(size_t) const override { return false; }
  void print_attrs(std::ostream& os) const override { os << "op=avg"; }  // rank-independent (cache key)
  bool equivalent(const Primitive&) const override { return false; }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

class CollectiveWaitPrim final : public Primitive {
 public:
  std::string_view name() const override { return "collective_wait"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 1, "collective_wait: expected one input, got ", in.size());
    return {in[0]};
  }
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
  bool differentiable() const override { return false; }
  bool saves_input(size_t) const override { return false; }
  bool equivalent(const Primitive&) const override { return false; }
};

// The base of the ZeRO-1 collectives: one flat input, one flat output of numel * out_num / out_den.
class FlatCollectivePrim : public Primitive {
 public:
  FlatCollectivePrim(std::shared_ptr<ProcessGroup> group, int64_t out_num, int64_t out_den)
      : group_(std::move(group)), num_(out_num), den_(out_den) {}
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 1 && in[0].shape.size() == 1, name(), ": expected one flat (1-d) input");
    const int64_t n = in[0].shape[0];
    INGOT_CHECK(n * num_ % den_ == 0, name(), ": ", n, " elements do not split over ", group_->size(), " ranks");
    TensorMeta m = in[0];
    m.shape = Shape{n * num_ / den_};
    return {m};
  }
  bool differentiable() const override { return false; }
  bool saves_input(size_t) const override { return false; }
  void print_attrs(std::ostream&) const override {}  // nothing rank- or world-specific: ranks share the cache
  bool equivalent(const Primitive&) const override { return false; }

 protected:
  std::shared_ptr<ProcessGroup> group_;
  int64_t num_, den_;
};

class ReduceScatterAvgPrim final : public FlatCollectivePrim {
 public:
  explicit ReduceScatterAvgPrim(std::shared_ptr<ProcessGroup> g) : FlatCollectivePrim(g, 1, g->size()) {}
  std::string_view name() const override { return "reduce_scatter_avg"; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor flat = in[0].clone_raw();  // reduce_scatter may use its input as scratch
    Tensor out = empty({flat.numel() / group_->size()}, flat.dtype(), flat.device());
    reduce_bucket_async(*group_, flat, &out)->wait();
    return {out};
  }
};

class AllGatherPrim final : public FlatCollectivePrim {
 public:
  explicit AllGatherPrim(std::shared_ptr<ProcessGroup> g) : FlatCollectivePrim(g, g->size(), 1) {}
  std::string_view name() const override { return "all_gather"; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor chunk = in[0].contiguous_raw();
    Tensor out = empty({chunk.numel() * group_->size()}, chunk.dtype(), chunk.device());
    group_->all_gather(out, chunk)->wait();
    return {out};
  }
};

}  // namespace

Tensor reduce_scatter_avg(const Tensor& flat, std::shared_ptr<ProcessGroup> group) {
  INGOT_CHECK(group != nullptr, "reduce_scatter_avg: no process group");
  return ingot::apply(std::make_shared<ReduceScatterAvgPrim>(std::move(group)), {flat})[0];
}

Tensor all_gather(const Tensor& chunk, std::shared_ptr<ProcessGroup> group) {
  INGOT_CHECK(group != nullptr, "all_gather: no process group");
  return ingot::apply(std::make_shared<AllGatherPrim>(std::move(group)), {chunk})[0];
}

Tensor all_reduce_start(const Tensor& flat, std::shared_ptr<ProcessGroup> group) {
  INGOT_CHECK(group != nullptr, "all_reduce_start: no process group");
  return ingot::apply(std::make_shared<AllReduceStartPrim>(std::move(group)), {flat})[0];
}

Tensor collective_wait(const Tensor& pending) {
  return ingot::apply(std::make_shared<CollectiveWaitPrim>(), {pending})[0];
}

Tensor all_reduce_avg(const Tensor& flat, std::shared_ptr<ProcessGroup> group) {
  INGOT_CHECK(group != nullptr, "all_reduce_avg: no process group");
  return ingot::apply(std::make_shared<AllReduceAvgPrim>(std::move(group)), {flat})[0];
}

}  // namespace ingot::distributed
