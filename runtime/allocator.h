// Memory for tensors. Every Storage owns its bytes through a shared_ptr whose deleter returns them to the
// allocator that made them (or unmaps a file, for mmapped safetensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/device.h"

namespace ingot {

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // bytes handed out and not yet returned
  int64_t reserved_bytes = 0;        // bytes held from the system (>= allocated for caching allocators)
  int64_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes since the last reset
  int64_t num_allocs = 0;
  int64_t num_system_allocs = 0;     // cudaMalloc / aligned_alloc calls (cache misses)
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
