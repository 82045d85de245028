// The CPU allocator's alignment and statistics (measured as deltas: other tests may hold tensors).
#include <gtest/gtest.h>

#include <cstdint>

#include "runtime/allocator.h"
#include "runtime/tensor.h"

namespace ingot {
namespace {

TEST(Allocator, CpuBlocksAre64ByteAlignedAndCountedInMultiplesOf64) {
  Allocator& a = cpu_allocator();
  AllocatorStats before = a.stats();
  {
    std::shared_ptr<void> p = a.allocate(100);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u);
    AllocatorStats during = a.stats();
    EXPECT_EQ(during.allocated_bytes - before.allocated_bytes, 128);
    EXPECT_EQ(during.reserved_bytes, during.allocated_bytes);
    EXPECT_EQ(during.num_allocs - before.num_allocs, 1);
  }
  EXPECT_EQ(a.stats().allocated_bytes, before.allocated_bytes);
}

TEST(Allocator, ZeroBytesGiveNullWithoutCounting) {
  Allocator& a = cpu_allocator();
  AllocatorStats before = a.stats();
  EXPECT_EQ(a.allocate(0), nullptr);
  EXPECT_EQ(a.stats().allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(a.stats().num_allocs, before.num_allocs);
  Tensor t = empty({0, 4});
  EXPECT_EQ(t.data_ptr(), nullptr);
  EXPECT_EQ(a.stats().allocated_bytes, before.allocated_bytes);
}

TEST(Allocator, PeakTracksTheHighWaterMarkUntilReset) {
  Allocator& a = cpu_allocator();
  a.reset_peak();
  const int64_t base = a.stats().allocated_bytes;
  EXPECT_EQ(a.stats().peak_allocated_bytes, base);
  {
    Tensor big = empty({1024}, DType::f64);  // 8 KiB
    {
      Tensor small = empty({16}, DType::f32);  // 64 bytes
      EXPECT_EQ(a.stats().allocated_bytes - base, 8192 + 64);
    }
    EXPECT_EQ(a.stats().allocated_bytes - base, 8192);
    EXPECT_EQ(a.stats().peak_allocated_bytes - base, 8192 + 64);
  }
  EXPECT_EQ(a.stats().allocated_bytes, base);
  EXPECT_EQ(a.stats().peak_allocated_bytes - base, 8192 + 64);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, base);
}

TEST(Allocator, TensorStorageIsReturnedWhenTheLastViewDies) {
  Allocator& a = cpu_allocator();
  const int64_t base = a.stats().allocated_bytes;
  Tensor view;
  {
    Tensor t = empty({256}, DType::f32);
    view = t.as_strided({16}, {16}, 0);
  }
  EXPECT_EQ(a.stats().allocated_bytes - base, 1024);
  view = Tensor();
  EXPECT_EQ(a.stats().allocated_bytes, base);
}

TEST(Allocator, DevicesMapToTheirAllocators) {
  EXPECT_EQ(&allocator_for(Device::cpu()), &cpu_allocator());
#ifndef INGOT_WITH_CUDA
  EXPECT_THROW(allocator_for(Device::cuda(0)), Error);
#endif
}

}  // namespace
}  // namespace ingot
