// The CUDA caching allocator (one per device), in the manner of PyTorch's: cudaMalloc and cudaFree are slow and
// synchronize the device, so freed memory is kept and handed out again.
//
// Note [Caching allocator layout]
//   Requests are rounded up to 512 bytes. Requests of at most 1 MiB come from the small pool, whose segments
//   (cudaMalloc'd ranges) are 2 MiB; larger ones from the large pool, whose segments are 20 MiB for requests
//   under 10 MiB and the request rounded up to 2 MiB otherwise. A free block bigger than asked for is split
//   (the remainder stays free in the same segment); a freed block merges with free neighbours of its segment.
//   Lookup is best fit: the smallest free block of the same stream that is large enough.
//
// Note [Streams]
//   Every block belongs to the stream that was current on its device when its segment was made. Work on one
//   stream runs in order, so a block freed by the host while kernels using it are still queued can be handed to
//   the next allocation on that stream: its kernels are queued after the pending ones. Blocks are never handed
//   to another stream; a request on a stream with nothing cached makes a new segment.
//
// Note [Pools held for CUDA graphs] (runtime/pool_accounting.h): the pool of a stream that CUDA graphs were captured
// on counts whole in the stats while held, and keeps its segments.
//
// Out of memory: the allocator releases every fully free segment not held for CUDA graphs (empty_cache) and tries
// once more, then throws an ingot::Error naming the request and the memory held.
//
// INGOT_CUDA_MEMORY_LIMIT_GIB=X caps what the allocator reserves on each device at X GiB (PyTorch's
// set_per_process_memory_fraction, as a size): a run on an 80 or 141 GB GPU then fails where one on a smaller card
// would, so "fits a 24 GB card" can be checked without one (the CUDA context, ~0.5 GiB, comes on top on a real card).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/allocator_census.h"
#include "runtime/cuda/check.h"
#include "runtime/pool_accounting.h"

namespace ingot {
namespace {

constexpr size_t kRound = 512;
constexpr size_t kSmallRequest = size_t{1} << 20;
constexpr size_t kSmallSegment = size_t{2} << 20;
constexpr size_t kMediumRequest = size_t{10} << 20;
constexpr size_t kMediumSegment = size_t{20} << 20;
constexpr size_t kLargeRound = size_t{2} << 20;

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

struct Block {
  char* ptr = nullptr;
  size_t size = 0;
  cudaStream_t stream = nullptr;
  bool small = false;      // which pool its segment belongs to
  bool allocated = false;
  Block* prev = nullptr;   // neighbours within the same segment (address order)
  Block* next = nullptr;
};

// Free blocks ordered by (stream, size, address): lower_bound finds the best fit on a stream.
struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    auto sa = reinterpret_cast<uintptr_t>(a->stream), sb = reinterpret_cast<uintptr_t>(b->stream);
    if (sa != sb) return sa < sb;
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};
using FreeSet = std::set<Block*, BlockLess>;

std::string mib(int64_t bytes) { return detail::str_cat(static_cast<double>(bytes) / (1 << 20), " MiB"); }

// INGOT_CUDA_MEMORY_LIMIT_GIB in bytes; 0 when unset (no limit).
int64_t memory_limit() {
  const char* v = std::getenv("INGOT_CUDA_MEMORY_LIMIT_GIB");
  if (v == nullptr || *v == '\0') return 0;
  double gib = 0;
  const char* end = v + std::strlen(v);
  auto [p, ec] = std::from_chars(v, end, gib);
  INGOT_CHECK(ec == std::errc() && p == end && std::isfinite(gib) && gib > 0,
              "INGOT_CUDA_MEMORY_LIMIT_GIB must be a size in GiB > 0 (e.g. 23.5), got '", v, "'");
  return static_cast<int64_t>(gib * static_cast<double>(int64_t{1} << 30));
}

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device) : device_(device), limit_(memory_limit()) {}

  std::shared_ptr<void> allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = round_up(nbytes, kRound);
    cudaStream_t stream = cuda::raw_stream(device_);
    std::lock_guard<std::mutex> g(mu_);
    const bool small = size <= kSmallRequest;
    FreeSet& pool = small ? free_small_ : free_large_;
    Block key;
    key.stream = stream;
    key.size = size;
    Block* b = nullptr;
    auto it = pool.lower_bound(&key);
    if (it != pool.end() && (*it)->stream == stream) {
      b = *it;
      pool.erase(it);
    } else {
      b = new_segment(size, small, stream, nbytes);
    }
    split(b, size, pool);
    b->allocated = true;
    census::on_allocate(Device::cuda(device_), b->ptr, static_cast<int64_t>(b->size), acct_.stats().allocated_bytes);
    acct_.allocate(stream, static_cast<int64_t>(b->size));
    return std::shared_ptr<void>(b->ptr, [this, b](void*) { release(b); });
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> g(mu_);
    return acct_.stats();
  }

  void reset_peak() override {
    std::lock_guard<std::mutex> g(mu_);
    acct_.reset_peak();
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> g(mu_);
    free_cached_segments();
  }

  void hold_pool(cuda::Stream s) override {
    std::lock_guard<std::mutex> g(mu_);
    acct_.hold(s.handle);
  }

  void release_pool(cuda::Stream s) override {
    std::lock_guard<std::mutex> g(mu_);
    acct_.release(s.handle);
  }

 private:
  Block* new_segment(size_t size, bool small, cudaStream_t stream, size_t requested) {
    const size_t seg = small ? kSmallSegment : size < kMediumRequest ? kMediumSegment : round_up(size, kLargeRound);
    cuda::DeviceGuard guard(device_);
    void* p = nullptr;
    // Past INGOT_CUDA_MEMORY_LIMIT_GIB as if the device were full.
    auto try_malloc = [&] {
      if (limit_ > 0 && acct_.stats().reserved_bytes + static_cast<int64_t>(seg) > limit_)
        return cudaErrorMemoryAllocation;
      return cudaMalloc(&p, seg);
    };
    cudaError_t err = try_malloc();
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the failure before retrying
      free_cached_segments();
      err = try_malloc();
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      const AllocatorStats& st = acct_.stats();
      throw OutOfMemoryError(detail::str_cat(
          "CUDA out of memory on cuda:", device_, " allocating ", requested, " bytes (", mib(requested), ", a ",
          mib(static_cast<int64_t>(seg)), " segment); ingot holds ", mib(st.reserved_bytes), " of which ",
          mib(st.in_use_bytes()), " in use",
          st.graph_pool_bytes > 0 ? " (" + mib(st.graph_pool_bytes) + " of it held for CUDA graphs)" : "",
          "; the device has ", mib(static_cast<int64_t>(free_b)), " free of ", mib(static_cast<int64_t>(total_b)),
          limit_ > 0 ? "; INGOT_CUDA_MEMORY_LIMIT_GIB allows " + mib(limit_) : ""));
    }
    CUDA_CHECK(err);
    acct_.reserve(stream, static_cast<int64_t>(seg));
    auto* b = new Block;
    b->ptr = static_cast<char*>(p);
    b->size = seg;
    b->stream = stream;
    b->small = small;
    return b;
  }

  // Leaves `b` with `size` bytes when the rest is worth keeping as a separate free block.
  void split(Block* b, size_t size, FreeSet& pool) {
    const size_t rest = b->size - size;
    if (b->small ? rest < kRound : rest <= kSmallRequest) return;
    auto* r = new Block;
    r->ptr = b->ptr + size;
    r->size = rest;
    r->stream = b->stream;
    r->small = b->small;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool.insert(r);
  }

  void release(Block* b) {
    std::lock_guard<std::mutex> g(mu_);
    census::on_free(Device::cuda(device_), b->ptr, static_cast<int64_t>(b->size));
    acct_.allocate(b->stream, -static_cast<int64_t>(b->size));
    b->allocated = false;
    FreeSet& pool = b->small ? free_small_ : free_large_;
    if (b->prev && !b->prev->allocated) {
      Block* p = b->prev;
      pool.erase(p);
      p->size += b->size;
      p->next = b->next;
      if (b->next) b->next->prev = p;
      delete b;
      b = p;
    }
    if (b->next && !b->next->allocated) {
      Block* n = b->next;
      pool.erase(n);
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      delete n;
    }
    pool.insert(b);
  }

  // Returns every segment with no block in use to the driver, except those of pools held for CUDA graphs (their
  // replays write them). Called with mu_ held.
  void free_cached_segments() {
    cuda::DeviceGuard guard(device_);
    for (FreeSet* pool : {&free_small_, &free_large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev || b->next || acct_.held(b->stream)) {
          ++it;
          continue;
        }
        CUDA_CHECK(cudaFree(b->ptr));
        acct_.reserve(b->stream, -static_cast<int64_t>(b->size));
        it = pool->erase(it);
        delete b;
      }
    }
  }

  const int device_;
  const int64_t limit_;  // INGOT_CUDA_MEMORY_LIMIT_GIB in bytes, 0: none
  mutable std::mutex mu_;
  FreeSet free_small_, free_large_;
  PoolAccounting acct_;
};

}  // namespace

Allocator& cuda_allocator(int index) {
  // Never destroyed: tensors held in statics may be freed after static destruction has begun.
  static std::vector<CudaCachingAllocator*>* allocators = [] {
    auto* v = new std::vector<CudaCachingAllocator*>();
    for (int i = 0; i < cuda_device_count(); ++i) v->push_back(new CudaCachingAllocator(i));
    return v;
  }();
  INGOT_CHECK(index >= 0 && index < static_cast<int>(allocators->size()), "cuda_allocator: CUDA device ", index,
              " does not exist (", allocators->size(), " device(s) visible)");
  return *(*allocators)[static_cast<size_t>(index)];
}

}  // namespace ingot
