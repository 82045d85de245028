// Sharded sampling. The permutation is a Fisher-Yates shuffle driven by Philox(seed, epoch counter), so every
// rank computes the same order without communicating.
#include "distributed/sampler.h"

#include <algorithm>
#include <numeric>

#include "runtime/error.h"
#include "runtime/rng.h"

namespace ingot::distributed {

RowRange batch_shard(int64_t global_batch, int rank, int world) {
  INGOT_CHECK(world >= 1 && rank >= 0 && rank < world, "batch_shard: rank must be in [0, world), got rank ", rank,
              " of ", world);
  INGOT_CHECK(global_batch > 0 && global_batch % world == 0, "batch_shard: the global batch (", global_batch,
              ") must be a positive multiple of the world size (", world,
              ") so every rank gets the same number of rows");
  int64_t per = global_batch / world;
  return {rank * per, (rank + 1) * per};
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t global_batch, int rank, int world, bool shuffle,
                                       uint64_t seed)
    : size_(dataset_size), global_(global_batch), rank_(rank), world_(world), shuffle_(shuffle), seed_(seed) {
  batch_shard(global_batch, rank, world);  // validates
  INGOT_CHECK(dataset_size >= global_batch, "DistributedSampler: the dataset (", dataset_size,
              " samples) is smaller than one global batch (", global_batch, ")");
}

std::vector<int64_t> DistributedSampler::global_indices(int64_t step) const {
  INGOT_CHECK(step >= 0 && step < steps_per_epoch(), "DistributedSampler: step must be in [0, ", steps_per_epoch(),
              "), got ", step);
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), 0);
  if (shuffle_) {
    uint64_t base = static_cast<uint64_t>(epoch_) * static_cast<uint64_t>(size_);
    for (int64_t i = size_ - 1; i > 0; --i) {
      Philox4 r = philox4x32_10(seed_, base + static_cast<uint64_t>(i));
      uint64_t x = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
      auto j = static_cast<int64_t>(x % static_cast<uint64_t>(i + 1));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
  }
  return {order.begin() + step * global_, order.begin() + (step + 1) * global_};
}

std::vector<int64_t> DistributedSampler::indices(int64_t step) const {
  std::vector<int64_t> all = global_indices(step);
  RowRange r = batch_shard(global_, rank_, world_);
  return {all.begin() + r.begin, all.begin() + r.end};
}

}  // namespace ingot::distributed
