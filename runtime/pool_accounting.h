// The byte counts behind the CUDA caching allocator's AllocatorStats, kept by pool (the stream a block belongs to,
// Note [Streams] in runtime/cuda/allocator.cpp) so that the pools CUDA graphs replay into count whole. It lives apart
// from the allocator (whose lock guards it) so that tests/runtime/test_pool_accounting.cpp checks the counting
// without a GPU.
//
// Note [Pools held for CUDA graphs]
//   A CUDA graph writes the addresses it was captured with, those of the blocks freed during its capture included:
//   the allocator has those blocks back as free, yet every replay writes them (compile/exec/graph_replay.h). While a
//   pool is held (by the runner of the graphs captured on its stream, from its capture until the graphs are
//   dropped), its free bytes therefore count as in use: graph_pool_bytes sums them over the held pools, and the peak
//   is that of allocated + graph_pool bytes. Nothing else draws from a pool (a block is never handed to another
//   stream), so a held pool counts whole, as what the device holds for its graphs: the bytes of its segments that
//   no capture handed out included, as reserved_bytes counts them. Without held pools the counts are the plain
//   ones (allocated, reserved, and the peak of allocated). The allocator gives no segment of a held pool back.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "runtime/allocator.h"

namespace ingot {

class PoolAccounting {
 public:
  using Pool = const void*;  // a stream handle

  // A segment of `bytes` made for pool `p` by a system allocation, or given back (negative).
  void reserve(Pool p, int64_t bytes);
  // A block of `bytes` of pool `p` handed out, or returned (negative).
  void allocate(Pool p, int64_t bytes);
  // `p` counts whole from now on (Note [Pools held for CUDA graphs]); holds nest, each ended by its release.
  void hold(Pool p);
  void release(Pool p);
  bool held(Pool p) const;
  void reset_peak();
  const AllocatorStats& stats() const { return s_; }

 private:
  struct Bytes {
    int64_t reserved = 0, allocated = 0;
    int holds = 0;
  };
  void raise_peak();

  std::unordered_map<Pool, Bytes> pools_;
  AllocatorStats s_;
};

}  // namespace ingot
