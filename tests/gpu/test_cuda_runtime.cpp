// The CUDA runtime pieces: device count, copies, streams and events, and the caching allocator (reuse, stream
// separation, splitting and merging, statistics, pools held for CUDA graphs, empty_cache, out-of-memory errors).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "runtime/allocator.h"
#include "runtime/cuda_runtime.h"
#include "runtime/kernels/kernels.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/shell.h"
#include "tests/testing.h"
#ifdef INGOT_WITH_CUDA
#include <cstring>
#include <vector>

#include "runtime/cuda/check.h"
#include "runtime/cuda/graph_nodes.h"
#endif

namespace ingot::testing {
namespace {

const Device kGpu = Device::cuda(0);

TEST(CudaRuntime, DeviceCountIsZeroWithoutAGpuAndNeverThrows) {
  // Runs everywhere: on a machine without a driver or GPU the count is 0 and "auto" picks the CPU.
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(cuda_available(), n > 0);
  EXPECT_EQ(parse_device("auto"), n > 0 ? Device::cuda(0) : Device::cpu());
}

TEST(CudaRuntime, TensorsRoundTripBetweenHostAndDevice) {
  INGOT_REQUIRE_CUDA();
  manual_seed(1);
  for (DType dt : kAllDTypes) {
    Tensor h = random_values({3, 5, 7}, [](double x) { return 10 * x; }).to(dt);
    Tensor d = h.to(kGpu);
    EXPECT_EQ(d.device(), kGpu);
    Tensor d2 = d.clone_raw();  // device-to-device
    EXPECT_EQ(count_unequal(d2.to(Device::cpu()), h), 0) << dtype_name(dt);
  }
  Tensor one = full({1}, 2.5, DType::f32, kGpu);
  EXPECT_EQ(one.item(), 2.5);
  EXPECT_THROW(cuda::set_device(cuda_device_count()), Error);
}

TEST(CudaRuntime, EventsTimeWorkOnAStreamAndOrderAnotherStream) {
  INGOT_REQUIRE_CUDA();
  cuda::Stream s1 = cuda::create_stream(0), s2 = cuda::create_stream(0);
  const cuda::Stream saved = cuda::current_stream(0);
  EXPECT_EQ(saved.handle, nullptr);  // the legacy default stream until someone sets one
  Tensor big, copy;
  {
    cuda::set_current_stream(s1);
    cuda::Event start, stop;
    start.record(s1);
    big = empty({1 << 24}, DType::f32, kGpu);  // allocated on s1
    for (int i = 0; i < 20; ++i) kernels::cuda::fill(big, 1.0 + i);
    stop.record(s1);
    stop.synchronize();
    const float ms = start.elapsed_ms(stop);
    EXPECT_GT(ms, 0.0f);
    EXPECT_LT(ms, 10000.0f);
    // s2 waits for the fills queued on s1, then copies: it must see the last value.
    for (int i = 0; i < 20; ++i) kernels::cuda::fill(big, 100.0 + i);
    cuda::Event done;
    done.record(s1);
    cuda::set_current_stream(s2);
    done.wait(s2);
    copy = empty({1 << 24}, DType::f32, kGpu);
    kernels::cuda::copy(copy, big);
    cuda::synchronize_stream(s2);
  }
  cuda::set_current_stream(saved);
  std::vector<double> v = copy.to_vector();
  EXPECT_EQ(v.front(), 119.0);
  EXPECT_EQ(v.back(), 119.0);
  big = Tensor();
  copy = Tensor();
  cuda::synchronize_device(0);
  cuda::destroy_stream(s1);
  cuda::destroy_stream(s2);
}

TEST(CudaRuntime, FailedCallsThrowWithTheCallSiteAndTheCudaError) {
  INGOT_REQUIRE_CUDA();
#ifdef INGOT_WITH_CUDA
  try {
    CUDA_CHECK(cudaSetDevice(-1));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test_cuda_runtime.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaSetDevice(-1)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaError"), std::string::npos) << msg;
  }
  // The failure was cleared: later work still runs.
  EXPECT_EQ(full({4}, 3.0, DType::f32, kGpu).to_vector()[3], 3.0);
#endif
}

#ifdef INGOT_WITH_CUDA
std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t g, cudaGraphNodeType type) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> all(n), out;
  CUDA_CHECK(cudaGraphGetNodes(g, all.data(), &n));
  for (cudaGraphNode_t x : all) {
    cudaGraphNodeType t;
    CUDA_CHECK(cudaGraphNodeGetType(x, &t));
    if (t == type) out.push_back(x);
  }
  return out;
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
#endif

// Note [Small memsets in CUDA graphs]: small memset nodes become kernel nodes with the same bytes and edges;
// large ones stay. A chain big memset -> small memsets (4-byte words, a 2-D byte block, 2-byte halves) -> copy
// out: the values must land and the copy must still come after every set.
TEST(CudaGraphs, SmallMemsetsBecomeKernelNodesWithTheSameBytesAndEdges) {
  INGOT_REQUIRE_CUDA();
#ifdef INGOT_WITH_CUDA
  Tensor a = empty({1024}, DType::f32, kGpu), out = empty({1024 + 64}, DType::f32, kGpu);
  cudaGraph_t g = nullptr;
  CUDA_CHECK(cudaGraphCreate(&g, 0));
  auto memset_node = [&](const std::vector<cudaGraphNode_t>& deps, void* dst, size_t pitch, uint32_t value,
                         uint32_t elem, size_t width, size_t height) {
    cudaMemsetParams p{};
    p.dst = dst;
    p.pitch = pitch;
    p.value = value;
    p.elementSize = elem;
    p.width = width;
    p.height = height;
    cudaGraphNode_t n = nullptr;
    CUDA_CHECK(cudaGraphAddMemsetNode(&n, g, deps.data(), deps.size(), &p));
    return n;
  };
  float* af = a.data<float>();
  auto* bytes = reinterpret_cast<uint8_t*>(out.data<float>() + 1024);  // 256 bytes after the copy's target
  cudaGraphNode_t fill = memset_node({}, af, 0, float_bits(1.5f), 4, 1024, 1);  // 4 KB: kept
  cudaGraphNode_t word = memset_node({fill}, af + 5, 0, float_bits(-2.25f), 4, 1, 1);
  cudaGraphNode_t block = memset_node({}, bytes, 64, 7, 1, 16, 3);  // 16 bytes in each of 3 rows 64 apart
  // 0x3f80 (the high half of 1.0f's bits) into element 9's low half.
  cudaGraphNode_t half = memset_node({word}, af + 9, 0, 0x3f80, 2, 1, 1);
  cudaGraphNode_t copy = nullptr;
  const std::vector<cudaGraphNode_t> before_copy{half, block};
  CUDA_CHECK(cudaGraphAddMemcpyNode1D(&copy, g, before_copy.data(), before_copy.size(), out.data_ptr(), af,
                                      1024 * sizeof(float), cudaMemcpyDeviceToDevice));
  EXPECT_EQ(cuda::detail::small_memsets_to_kernels(g), 3);
  EXPECT_EQ(nodes_of(g, cudaGraphNodeTypeMemset).size(), 1u);
  const std::vector<cudaGraphNode_t> kernels = nodes_of(g, cudaGraphNodeTypeKernel);
  EXPECT_EQ(kernels.size(), 3u);
  size_t copy_deps = 0;
  CUDA_CHECK(cudaGraphNodeGetDependencies(copy, nullptr, nullptr, &copy_deps));
  EXPECT_EQ(copy_deps, 2u);  // the replacements of `half` and `block`
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  // Garbage first, so that every checked value was written by the graph.
  kernels::cuda::fill(out, 99.0);
  cuda::synchronize_device(0);
  CUDA_CHECK(cudaGraphLaunch(exec, nullptr));
  CUDA_CHECK(cudaStreamSynchronize(nullptr));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  const std::vector<double> v = out.to_vector();
  for (int i = 0; i < 1024; ++i)
    if (i != 9) ASSERT_EQ(v[static_cast<size_t>(i)], i == 5 ? -2.25 : 1.5) << "element " << i;
  // Element 9: 1.5f is 0x3fc00000; its low half (little endian, the first two bytes) set to 0x3f80.
  uint32_t bits9 = 0x3fc03f80u;
  float f9;
  std::memcpy(&f9, &bits9, 4);
  EXPECT_EQ(v[9], static_cast<double>(f9));
  std::vector<uint8_t> host(256);
  CUDA_CHECK(cudaMemcpy(host.data(), bytes, 256, cudaMemcpyDeviceToHost));
  uint8_t garbage[4];  // the bytes of the 99.0f fill
  const float ninety_nine = 99.0f;
  std::memcpy(garbage, &ninety_nine, 4);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 64; ++c) {
      const bool set = r < 3 && c < 16;
      ASSERT_EQ(host[static_cast<size_t>(r * 64 + c)], set ? 7 : garbage[c % 4]) << "row " << r << " byte " << c;
    }
#endif
}

TEST(CudaAllocator, ReusesFreedBlocksOfTheSameStreamWithoutCudaMalloc) {
  INGOT_REQUIRE_CUDA();
  Allocator& a = cuda_allocator(0);
  a.empty_cache();  // no stray free fragments: best fit must land on the block just freed
  void* first = nullptr;
  {
    auto p = a.allocate(1000);
    first = p.get();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 256, 0u);
  }
  const AllocatorStats before = a.stats();
  {
    auto p = a.allocate(900);  // same 1024-byte class: the block just freed
    EXPECT_EQ(p.get(), first);
  }
  EXPECT_EQ(a.stats().num_system_allocs, before.num_system_allocs);
  EXPECT_EQ(a.stats().num_allocs, before.num_allocs + 1);
}

TEST(CudaAllocator, StatsTrackAllocatedReservedAndPeak) {
  INGOT_REQUIRE_CUDA();
  Allocator& a = cuda_allocator(0);
  a.empty_cache();
  a.reset_peak();
  const AllocatorStats s0 = a.stats();
  {
    auto x = a.allocate(5 << 20), y = a.allocate(3000);
    const AllocatorStats s1 = a.stats();
    EXPECT_EQ(s1.allocated_bytes - s0.allocated_bytes, (5 << 20) + 3072);
    EXPECT_GE(s1.reserved_bytes, s1.allocated_bytes);
    EXPECT_EQ(s1.peak_allocated_bytes, s1.allocated_bytes);
  }
  const AllocatorStats s2 = a.stats();
  EXPECT_EQ(s2.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s2.peak_allocated_bytes, s0.allocated_bytes + (5 << 20) + 3072);
  EXPECT_GT(s2.reserved_bytes, s0.reserved_bytes);  // cached, not given back
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, s0.reserved_bytes);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, a.stats().allocated_bytes);
}

TEST(CudaAllocator, SplitsSegmentsAndMergesFreedNeighbours) {
  INGOT_REQUIRE_CUDA();
  Allocator& a = cuda_allocator(0);
  a.empty_cache();
  const int64_t sys0 = a.stats().num_system_allocs;
  void* base = nullptr;
  {
    auto x = a.allocate(3 << 20);  // a 20 MiB segment
    auto y = a.allocate(4 << 20);  // carved from its remainder
    EXPECT_EQ(a.stats().num_system_allocs, sys0 + 1);
    EXPECT_EQ(static_cast<char*>(y.get()), static_cast<char*>(x.get()) + (3 << 20));
    base = x.get();
  }
  // Both freed and merged: the whole segment serves one larger request.
  auto z = a.allocate(18 << 20);
  EXPECT_EQ(z.get(), base);
  EXPECT_EQ(a.stats().num_system_allocs, sys0 + 1);
}

TEST(CudaAllocator, BlocksFreedOnOneStreamAreNotHandedToAnother) {
  INGOT_REQUIRE_CUDA();
  Allocator& a = cuda_allocator(0);
  a.empty_cache();
  cuda::Stream s = cuda::create_stream(0);
  const cuda::Stream saved = cuda::current_stream(0);
  void* on_default = nullptr;
  { on_default = a.allocate(4096).get(); }
  cuda::set_current_stream(s);
  {
    auto p = a.allocate(4096);
    EXPECT_NE(p.get(), on_default);
  }
  cuda::set_current_stream(saved);
  { EXPECT_EQ(a.allocate(4096).get(), on_default); }
  cuda::destroy_stream(s);
}

// Note [Pools held for CUDA graphs]: while held, a stream's pool counts whole in the stats (CUDA graphs captured on it
// write its free blocks) and keeps its segments through empty_cache.
TEST(CudaAllocator, AHeldPoolCountsWholeAndKeepsItsSegments) {
  INGOT_REQUIRE_CUDA();
  Allocator& a = cuda_allocator(0);
  a.empty_cache();
  cuda::Stream s = cuda::create_stream(0);
  const cuda::Stream saved = cuda::current_stream(0);
  const AllocatorStats s0 = a.stats();
  a.hold_pool(s);
  EXPECT_EQ(a.stats().graph_pool_bytes, s0.graph_pool_bytes) << "nothing in the new stream's pool yet";
  cuda::set_current_stream(s);
  { auto x = a.allocate(5 << 20); }  // a 20 MiB segment of s's pool, free again
  const AllocatorStats s1 = a.stats();
  EXPECT_EQ(s1.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s1.reserved_bytes - s0.reserved_bytes, 20 << 20);
  EXPECT_EQ(s1.graph_pool_bytes - s0.graph_pool_bytes, 20 << 20);
  EXPECT_GE(s1.peak_allocated_bytes, s1.in_use_bytes());
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, s1.in_use_bytes());
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, s1.reserved_bytes) << "a held pool keeps its segments";
  {
    auto y = a.allocate(3 << 20);  // from the held pool's free bytes: in use either way
    EXPECT_EQ(a.stats().allocated_bytes - s1.allocated_bytes, 3 << 20);
    EXPECT_EQ(a.stats().in_use_bytes(), s1.in_use_bytes());
  }
  cuda::set_current_stream(saved);
  a.release_pool(s);
  EXPECT_EQ(a.stats().graph_pool_bytes, s0.graph_pool_bytes);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, s0.reserved_bytes) << "released, its free segment is given back";
  cuda::destroy_stream(s);
}

TEST(CudaAllocator, OutOfMemoryIsAClearErrorAndTheAllocatorStillWorks) {
  INGOT_REQUIRE_CUDA();
  Allocator& a = cuda_allocator(0);
  try {
    a.allocate(size_t{1} << 50);  // 1 PiB
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(size_t{1} << 50)), std::string::npos) << msg;
  }
  EXPECT_EQ(full({8}, 1.5, DType::f32, kGpu).to_vector()[7], 1.5);
  EXPECT_THROW(cuda_allocator(cuda_device_count()), Error);
}

// INGOT_CUDA_MEMORY_LIMIT_GIB is read when the allocator is made, once per process: the DISABLED_ cases below run in
// a child process of this binary with the variable set (the parent checks what they printed), not on their own.
TEST(CudaAllocatorLimit, DISABLED_ReservesUpToTheLimitThenFailsNamingIt) {
  Allocator& a = cuda_allocator(0);  // the first use in this process: INGOT_CUDA_MEMORY_LIMIT_GIB=0.5
  auto p1 = a.allocate(size_t{256} << 20);
  auto p2 = a.allocate(size_t{256} << 20);  // 512 MiB reserved: at the limit, not past it
  EXPECT_EQ(a.stats().reserved_bytes, int64_t{512} << 20);
  try {
    a.allocate(size_t{4} << 20);
    FAIL() << "expected the limit to refuse a segment past 512 MiB";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("INGOT_CUDA_MEMORY_LIMIT_GIB allows 512 MiB"), std::string::npos) << msg;
  }
  p2.reset();
  a.empty_cache();  // back under the limit once a segment is given back
  EXPECT_NE(a.allocate(size_t{4} << 20), nullptr);
}

TEST(CudaAllocatorLimit, DISABLED_RefusesALimitThatIsNotASize) {
  try {
    cuda_allocator(0);
    FAIL() << "expected INGOT_CUDA_MEMORY_LIMIT_GIB=24GB to be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("INGOT_CUDA_MEMORY_LIMIT_GIB must be a size in GiB > 0 (e.g. 23.5), got "
                                         "'24GB'"),
              std::string::npos)
        << e.what();
  }
}

ShellResult run_limited_child(const std::string& limit, const std::string& test) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return run_shell("INGOT_CUDA_MEMORY_LIMIT_GIB='" + limit + "' '" + self +
                   "' --gtest_also_run_disabled_tests --gtest_filter='CudaAllocatorLimit." + test + "' 2>&1");
}

TEST(CudaAllocator, ALimitFromTheEnvironmentCapsWhatItReserves) {
  INGOT_REQUIRE_CUDA();
  ShellResult r = run_limited_child("0.5", "DISABLED_ReservesUpToTheLimitThenFailsNamingIt");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[  PASSED  ] 1 test"), std::string::npos) << r.output;
  r = run_limited_child("24GB", "DISABLED_RefusesALimitThatIsNotASize");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[  PASSED  ] 1 test"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ingot::testing
