// The CUDA caching allocator's byte counts (runtime/pool_accounting.h), driven as the allocator drives them: segments
// reserved for a stream's pool, blocks handed out and returned, and a pool held for CUDA graphs
// (Note [Pools held for CUDA graphs]).
#include "runtime/pool_accounting.h"

#include <gtest/gtest.h>

#include "runtime/error.h"

namespace ingot {
namespace {

int caller_stream, graph_stream;  // their addresses stand for two streams' handles
const void* const kCaller = &caller_stream;
const void* const kGraphs = &graph_stream;

TEST(PoolAccounting, WithoutHeldPoolsThePeakIsOfTheBytesHandedOut) {
  PoolAccounting a;
  a.reserve(kCaller, 20 << 20);
  a.allocate(kCaller, 8 << 20);
  a.allocate(kCaller, 4 << 20);
  a.allocate(kCaller, -(8 << 20));
  const AllocatorStats& s = a.stats();
  EXPECT_EQ(s.allocated_bytes, 4 << 20);
  EXPECT_EQ(s.reserved_bytes, 20 << 20);
  EXPECT_EQ(s.graph_pool_bytes, 0);
  EXPECT_EQ(s.in_use_bytes(), 4 << 20);
  EXPECT_EQ(s.peak_allocated_bytes, 12 << 20);
  EXPECT_EQ(s.num_allocs, 2);
  EXPECT_EQ(s.num_system_allocs, 1);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, 4 << 20);
  a.reserve(kCaller, -(16 << 20));  // a free segment given back
  EXPECT_EQ(a.stats().reserved_bytes, 4 << 20);
  EXPECT_EQ(a.stats().num_system_allocs, 1);
}

// The issue-24 shape: weights on the caller's stream, a step captured on the graphs' stream whose intermediates are
// freed during the capture. A later call (a replay) hands nothing out, yet its peak is what the capture held.
TEST(PoolAccounting, AHeldPoolCountsWholeSoAReplayedStepKeepsItsCapturedPeak) {
  PoolAccounting a;
  a.reserve(kCaller, 64 << 20);
  a.allocate(kCaller, 40 << 20);  // weights and optimizer state
  a.reset_peak();
  // The capture: a 30 MiB intermediate and a 1 MiB kept result, the intermediate freed before the capture ends.
  a.hold(kGraphs);
  EXPECT_TRUE(a.held(kGraphs));
  EXPECT_FALSE(a.held(kCaller));
  a.reserve(kGraphs, 32 << 20);
  a.allocate(kGraphs, 30 << 20);
  a.allocate(kGraphs, 1 << 20);
  a.allocate(kGraphs, -(30 << 20));
  EXPECT_EQ(a.stats().allocated_bytes, 41 << 20);
  EXPECT_EQ(a.stats().graph_pool_bytes, 31 << 20);  // the pool's 32 MiB less the kept result
  EXPECT_EQ(a.stats().in_use_bytes(), 72 << 20);
  const int64_t captured_peak = a.stats().peak_allocated_bytes;
  EXPECT_EQ(captured_peak, 72 << 20);

  // A replay: the graphs write the pool; the allocator hands nothing out.
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, captured_peak);
  // A step run between the graphs allocates from the held pool's free bytes: they change hands, still in use.
  a.allocate(kGraphs, 8 << 20);
  EXPECT_EQ(a.stats().graph_pool_bytes, 23 << 20);
  EXPECT_EQ(a.stats().in_use_bytes(), 72 << 20);
  a.allocate(kGraphs, -(8 << 20));
  // The caller's own allocations add to it.
  a.allocate(kCaller, 2 << 20);
  EXPECT_EQ(a.stats().peak_allocated_bytes, 74 << 20);
  a.allocate(kCaller, -(2 << 20));

  // The graphs dropped: their kept result returned, the pool no longer held. Its segment stays cached, not in use.
  a.allocate(kGraphs, -(1 << 20));
  a.release(kGraphs);
  EXPECT_FALSE(a.held(kGraphs));
  EXPECT_EQ(a.stats().graph_pool_bytes, 0);
  EXPECT_EQ(a.stats().in_use_bytes(), 40 << 20);
  EXPECT_EQ(a.stats().reserved_bytes, 96 << 20);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, 40 << 20);
}

TEST(PoolAccounting, SegmentsMadeOrGivenBackWhileHeldCountInThePool) {
  PoolAccounting a;
  a.hold(kGraphs);
  a.reserve(kGraphs, 2 << 20);  // a segment made for a block of 512 bytes: the rest is the pool's
  a.allocate(kGraphs, 512);
  EXPECT_EQ(a.stats().graph_pool_bytes, (2 << 20) - 512);
  EXPECT_EQ(a.stats().in_use_bytes(), 2 << 20);
  a.reserve(kGraphs, 20 << 20);
  EXPECT_EQ(a.stats().in_use_bytes(), 22 << 20);
  a.reserve(kGraphs, -(20 << 20));
  EXPECT_EQ(a.stats().in_use_bytes(), 2 << 20);
  EXPECT_EQ(a.stats().peak_allocated_bytes, 22 << 20);
}

TEST(PoolAccounting, HoldsNestAndAPoolNotHeldCannotBeReleased) {
  PoolAccounting a;
  a.reserve(kGraphs, 4 << 20);
  a.hold(kGraphs);
  a.hold(kGraphs);
  EXPECT_EQ(a.stats().graph_pool_bytes, 4 << 20);  // counted once
  a.release(kGraphs);
  EXPECT_TRUE(a.held(kGraphs));
  EXPECT_EQ(a.stats().graph_pool_bytes, 4 << 20);
  a.release(kGraphs);
  EXPECT_EQ(a.stats().graph_pool_bytes, 0);
  EXPECT_THROW(a.release(kGraphs), Error);
  EXPECT_THROW(a.release(kCaller), Error);
}

}  // namespace
}  // namespace ingot
