// Data sharding for data parallelism: each rank reads only its part, and what the job computes does not
// depend on how many ranks share it.
//   batch_shard          rank r's contiguous rows of a global batch (global batch fixed, per-rank = global/world)
//   DistributedSampler   an epoch's (optionally shuffled) order of dataset indices, split into per-rank batches
//                        so that step k's global batch holds the same samples whatever the world size
#pragma once

#include <cstdint>
#include <vector>

namespace ingot::distributed {

struct RowRange {
  int64_t begin = 0, end = 0;  // [begin, end)
  int64_t size() const { return end - begin; }
};

// Rows [rank * g/world, (rank+1) * g/world) of a global batch of g rows. Throws unless world divides g.
RowRange batch_shard(int64_t global_batch, int rank, int world);

class DistributedSampler {
 public:
  // `dataset_size` samples, global batches of `global_batch`; a trailing partial batch is dropped.
  DistributedSampler(int64_t dataset_size, int64_t global_batch, int rank, int world, bool shuffle = true,
                     uint64_t seed = 0);
  // Reshuffles (the permutation is a pure function of seed and epoch).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t steps_per_epoch() const { return size_ / global_; }
  // The dataset indices this rank reads at `step` of the current epoch: its shard of the global batch.
  std::vector<int64_t> indices(int64_t step) const;
  // The whole global batch at `step` (what every rank together reads).
  std::vector<int64_t> global_indices(int64_t step) const;

 private:
  int64_t size_, global_;
  int rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  int64_t epoch_ = 0;
};

}  // namespace ingot::distributed
