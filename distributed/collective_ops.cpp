#include "distributed/collective_ops.h"

#include "autograd/primitive.h"
#include "distributed/buckets.h"

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

}  // namespace

Tensor all_reduce_avg(const Tensor& flat, std::shared_ptr<ProcessGroup> group) {
  INGOT_CHECK(group != nullptr, "all_reduce_avg: no process group");
  return ingot::apply(std::make_shared<AllReduceAvgPrim>(std::move(group)), {flat})[0];
}

}  // namespace ingot::distributed
