// The allocation census: who holds the allocator's bytes at its peak.
//
// Note [Allocation census]
// With the census on (INGOT_LOGS naming memory or all, read at the first allocation, or census::start()), every
// allocator records each live block's bytes (as it counts them: CPU requests rounded to 64 bytes, CUDA blocks as
// handed out) and its owner, keeps the bytes per owner, and copies those sums whenever its allocated bytes reach a
// new high since census::reset_peak(). So the census at the peak sums to the allocator's peak exactly (while no
// pool is held for CUDA graphs: their free bytes, AllocatorStats::graph_pool_bytes, count in the allocator's peak
// and not in the census); what it tells is how the owners were named:
//   - a block belongs, when allocated, to the innermost census::Owner scope of the allocating thread ("other"
//     outside any);
//   - a holder that takes a block over names it again (census::attribute): the compiled step's executor names its
//     graph inputs (parameters, shards, masters, optimizer state, .grad, arguments) when it binds them and its
//     graph values after the step that made them (compile/exec/executor.cpp, MemoryWatch);
//   - blocks allocated before the census started, and freed since, count as "before the census".
// Off, an allocation costs one check of a flag.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/device.h"

namespace ingot {
struct Storage;
}

namespace ingot::census {

bool on();
// Turns the census on from now on (tests); a no-op when it is on already.
void start();

// Allocations on this thread while the scope lives belong to `owner` (a short phrase: "ZeRO-3: gathered units").
class Owner {
 public:
  explicit Owner(std::string_view owner);
  ~Owner();
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;

 private:
  int previous_;
};

// `s`'s block belongs to `owner` from now on (nothing when the census is off, `s` has no bytes, or its block was
// allocated before the census started).
void attribute(const Storage& s, std::string_view owner);
// The owner `s`'s block has now ("" when unknown).
std::string owner_of(const Storage& s);

struct Share {
  std::string owner;
  int64_t bytes = 0;
  int64_t blocks = 0;
};
struct Snapshot {
  int64_t peak_bytes = 0;     // the allocator's allocated bytes at the peak (== the sum of the shares)
  int64_t current_bytes = 0;  // its allocated bytes now
  std::vector<Share> owners;  // at the peak, largest first, owners holding nothing left out
};
// The census of device `d`'s allocator at its highest allocated bytes since the last reset_peak(d).
Snapshot at_peak(Device d);
void reset_peak(Device d);
// Multi-line text: the peak and each owner's bytes, blocks and share of the peak.
std::string format(const Snapshot& s, Device d);

// For the allocators: a block of `bytes` was handed out at `p` (`allocated_before`: the allocator's allocated
// bytes without it), and returned.
void on_allocate(Device d, const void* p, int64_t bytes, int64_t allocated_before);
void on_free(Device d, const void* p, int64_t bytes);

}  // namespace ingot::census
