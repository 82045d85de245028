#include "runtime/allocator.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "runtime/allocator_census.h"
#include "runtime/error.h"

namespace ingot {
namespace {

class CpuAllocator final : public Allocator {
 public:
  std::shared_ptr<void> allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) INGOT_FAIL("out of CPU memory allocating ", nbytes, " bytes");
    const int64_t before = allocated_.fetch_add(static_cast<int64_t>(rounded));
    const int64_t now = before + static_cast<int64_t>(rounded);
    census::on_allocate(Device::cpu(), p, static_cast<int64_t>(rounded), before);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {}
    ++num_allocs_;
    return std::shared_ptr<void>(p, [this, rounded](void* q) {
      census::on_free(Device::cpu(), q, static_cast<int64_t>(rounded));
      std::free(q);
      allocated_.fetch_sub(static_cast<int64_t>(rounded));
    });
  }
  AllocatorStats stats() const override {
    AllocatorStats s;
    s.allocated_bytes = s.reserved_bytes = allocated_.load();
    s.peak_allocated_bytes = peak_.load();
    s.num_allocs = s.num_system_allocs = num_allocs_.load();
    return s;
  }
  void reset_peak() override { peak_ = allocated_.load(); }

 private:
  std::atomic<int64_t> allocated_{0}, peak_{0}, num_allocs_{0};
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator* a = new CpuAllocator();  // never destroyed: storages may outlive static destruction
  return *a;
}

Allocator& allocator_for(Device d) { return d.is_cpu() ? cpu_allocator() : cuda_allocator(d.index); }

}  // namespace ingot
