// Moving the next training batch to the GPU while the current step runs.
//
// Note [Prefetching the next batch]
//   The training loop draws batch k+1 on the host and starts its host-to-device copy on a copy stream right
//   after step k is queued, so the host work and the copy overlap step k instead of sitting between steps
//   (where the GPU waits). The copy reads page-locked staging memory (only such copies are asynchronous).
//   Two slots alternate, each with its own device buffers and staging: take() makes the compute stream wait
//   for the slot's copy, and marks (an event on the compute stream) where the step before it, which read the
//   other slot, ends; the next put() into that other slot makes the copy stream wait for that mark, so a copy
//   never overwrites a batch a queued step still reads. On a CPU device put/take hand the tensors through.
#pragma once

#include <memory>
#include <vector>

#include "runtime/cuda_runtime.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace ingot::recipes {

class BatchPrefetcher {
 public:
  explicit BatchPrefetcher(Device device);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Starts moving `host` (CPU tensors, any layout) to the device. At most one batch is pending.
  void put(const std::vector<Tensor>& host);
  // The pending batch on the device, in put order; work queued on the device's current stream after this
  // call sees the copied values. The tensors are reused by the put() after next.
  std::vector<Tensor> take();
  bool pending() const { return pending_ >= 0; }

 private:
  struct Slot;
  Device device_;
  cuda::Stream copy_stream_;
  std::vector<std::unique_ptr<Slot>> slots_;
  int next_ = 0, pending_ = -1;
  std::vector<Tensor> cpu_pending_;
};

}  // namespace ingot::recipes
