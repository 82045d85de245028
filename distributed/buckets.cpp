// Bucket layout and the reduction of one bucket (see buckets.h).
#include "distributed/buckets.h"

#include "runtime/error.h"

namespace ingot::distributed {

std::vector<BucketPlan> plan_buckets(const std::vector<BucketParam>& params, double cap_bytes, int pad_multiple) {
  INGOT_CHECK(cap_bytes > 0, "plan_buckets: the bucket cap must be > 0 bytes, got ", cap_bytes);
  INGOT_CHECK(pad_multiple >= 1, "plan_buckets: pad_multiple must be >= 1, got ", pad_multiple);
  std::vector<BucketPlan> plans;
  double bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const BucketParam& p = params[k];
    if (plans.empty() || bytes >= cap_bytes || plans.back().dtype != p.dtype) {
      plans.emplace_back();
      plans.back().dtype = p.dtype;
      bytes = 0;
    }
    BucketPlan& b = plans.back();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel;
    bytes += static_cast<double>(p.numel) * static_cast<double>(itemsize(p.dtype));
  }
  for (BucketPlan& b : plans) b.padded_numel = (b.numel + pad_multiple - 1) / pad_multiple * pad_multiple;
  return plans;
}

std::shared_ptr<Work> reduce_bucket_async(ProcessGroup& group, Tensor& flat, Tensor* shard_out) {
  if (!shard_out) return group.all_reduce(flat, ReduceOp::Avg);
  INGOT_CHECK(shard_out->defined(), "reduce_bucket_async: the ZeRO-1 shard output is undefined");
  // A wider shard sums the narrow bucket in its own dtype (Note [Narrow wire, wide sum], process_group.h).
  if (shard_out->dtype() != flat.dtype()) return group.reduce_scatter_widen(*shard_out, flat, ReduceOp::Avg);
  return group.reduce_scatter(*shard_out, flat, ReduceOp::Avg);
}

}  // namespace ingot::distributed
