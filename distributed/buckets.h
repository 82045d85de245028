// Gradient buckets: the layout and the reduction of one bucket, shared by eager DDP (ddp.cpp) and the
// compiled step (compile/'s bucketize pass issues reduce_bucket_async as a graph node on the comm stream).
//
// The compiled path's contract:
//   plan_buckets(...)            the same layout eager DDP uses, so eager and compiled runs reduce identically
//   group.set_input_stream(s)    CUDA: collectives wait for the work queued on `s` (the executable's stream)
//   reduce_bucket_async(...)     issues one bucket's average across ranks, returns at once
//   work->block_stream(s)        the optimizer kernels of that bucket wait on the device, the host does not
//   group.comm_stream()          the stream the collectives run on (for events and CUDA-graph capture)
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "distributed/process_group.h"
#include "runtime/dtype.h"

namespace ingot::distributed {

struct BucketParam {
  int64_t numel = 0;
  DType dtype = DType::f32;
};

struct BucketPlan {
  std::vector<size_t> params;    // parameter indices (registration order), in packing order
  std::vector<int64_t> offsets;  // element offset of each parameter in the flat buffer
  int64_t numel = 0;             // elements used
  int64_t padded_numel = 0;      // flat buffer length: numel rounded up to a multiple of pad_multiple
  DType dtype = DType::f32;
};

// Packs parameters in reverse registration order (roughly the order backward produces their gradients) into
// buckets of about `cap_bytes`: a bucket is closed once it holds cap_bytes or more, or when the dtype changes
// (a bucket is one flat buffer of one dtype). `pad_multiple` is the world size for ZeRO-1 (equal chunks per
// rank), 1 otherwise.
std::vector<BucketPlan> plan_buckets(const std::vector<BucketParam>& params, double cap_bytes, int pad_multiple = 1);

// Averages `flat` across the group, in place (all_reduce); with `shard_out` (ZeRO-1), reduce-scatters instead so
// shard_out (padded_numel / world elements) receives this rank's averaged chunk, summed in shard_out's dtype when
// it is wider than flat's (reduce_scatter_widen: ZeRO-3's narrow wire). Returns at once.
std::shared_ptr<Work> reduce_bucket_async(ProcessGroup& group, Tensor& flat, Tensor* shard_out = nullptr);

}  // namespace ingot::distributed
