// Memory for tensors. Every Storage owns its bytes through a shared_ptr whose deleter returns them to the
// allocator that made them (or unmaps a file, for mmapped safetensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/cuda_runtime.h"
#include "runtime/device.h"

namespace ingot {

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // bytes handed out and not yet returned
  int64_t reserved_bytes = 0;        // bytes held from the system (>= allocated for caching allocators)
  int64_t graph_pool_bytes = 0;      // free bytes of pools held for CUDA graphs, which their replays write (Note
                                     // [Pools held for CUDA graphs], runtime/pool_accounting.h); 0 without graphs
  int64_t peak_allocated_bytes = 0;  // high-water mark of in_use_bytes() since the last reset
  int64_t num_allocs = 0;
  int64_t num_system_allocs = 0;     // cudaMalloc / aligned_alloc calls (cache misses)

  int64_t in_use_bytes() const { return allocated_bytes + graph_pool_bytes; }
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns at least `nbytes` bytes (64-byte aligned on CPU, 256 on CUDA); nbytes == 0 gives a null pointer.
  virtual std::shared_ptr<void> allocate(size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Gives cached, unused blocks back to the system (no-op for the CPU allocator).
  virtual void empty_cache() {}
  // CUDA graphs captured on stream `s` replay into its pool: from hold_pool until release_pool the pool counts whole
  // in the stats and keeps its segments (Note [Pools held for CUDA graphs], runtime/pool_accounting.h). No-op on
  // the CPU.
  virtual void hold_pool(cuda::Stream /*s*/) {}
  virtual void release_pool(cuda::Stream /*s*/) {}
};

Allocator& cpu_allocator();
// The caching allocator of CUDA device `index`; throws when built without CUDA.
Allocator& cuda_allocator(int index);
Allocator& allocator_for(Device d);

struct Storage {
  std::shared_ptr<void> data;
  size_t nbytes = 0;
  Device device;
  uint64_t version = 0;  // in-place writes so far (see Tensor::version)
};

}  // namespace ingot
