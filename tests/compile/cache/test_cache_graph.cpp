// The compiled step across processes: a second process with a warm compile cache runs no C++ compiler, and a
// corrupted cache entry is survived (warned about, rebuilt) with correct results.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "autograd/ops.h"
#include "compile/api.h"
#include "runtime/file_util.h"

namespace ingot {
namespace {

// The function both processes compile: pointwise chains and a softmax (three distinct kernels).
std::vector<Tensor> small_fn(const std::vector<Tensor>& a) {
  Tensor h = softmax(a[0] * 1.7 + 0.25, -1);
  return {tanh(h * a[0]) - 0.5};
}

// Child half (run by CacheAcrossProcesses with --gtest_also_run_disabled_tests): compiles small_fn against
// $INGOT_TEST_CACHE and writes "<generated> <disk hits> <max error>" to $INGOT_TEST_OUT.
TEST(CacheAcrossProcesses, DISABLED_ChildCompilesAgainstTheSharedCache) {
  const char* dir = std::getenv("INGOT_TEST_CACHE");
  const char* out = std::getenv("INGOT_TEST_OUT");
  ASSERT_TRUE(dir && out);
  CompileOptions o;
  o.cache_dir = dir;
  CompiledFunction f = compile(small_fn, o);
  Tensor x = from_vector({0.1, -0.4, 2.0, 0.3, 1.1, -1.5, 0.7, 0.2}, {2, 4});
  f({x});
  Tensor y = f({x})[0];  // the compiled executable
  const double err = max_rel_error(y, small_fn({x})[0], 1e-5, 1e-6);
  std::ofstream(out) << f.stats().kernels_generated << " " << f.stats().kernels_disk_hits << " " << err << "\n";
}

struct ChildResult {
  long long generated = -1, disk_hits = -1;
  double err = 1e9;
};

// Runs this test binary (resolved before the shell starts, or /proc/self/exe would name the shell) as the child.
ChildResult run_child(const std::string& cache, const std::string& out) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "INGOT_TEST_CACHE='" + cache + "' INGOT_TEST_OUT='" + out + "' '" + self +
                          "' --gtest_also_run_disabled_tests "
                          "--gtest_filter=CacheAcrossProcesses.DISABLED_ChildCompilesAgainstTheSharedCache > '" +
                          out + ".log' 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_file(out + ".log");
  ChildResult r;
  std::ifstream in(out);
  in >> r.generated >> r.disk_hits >> r.err;
  return r;
}

TEST(CacheAcrossProcesses, ASecondProcessWithAWarmCacheCompilesNothing) {
  TempDir tmp("ingot_compile_cache_test");
  const std::string cache = tmp.path() + "/cache";
  ChildResult cold = run_child(cache, tmp.path() + "/cold.txt");
  EXPECT_GT(cold.generated, 0);
  EXPECT_LE(cold.err, 1.0);
  ChildResult warm = run_child(cache, tmp.path() + "/warm.txt");
  EXPECT_EQ(warm.generated, 0);
  EXPECT_EQ(warm.disk_hits, cold.generated);
  EXPECT_LE(warm.err, 1.0);
}

TEST(CacheAcrossProcesses, CorruptedEntriesAreRebuiltAndResultsStayCorrect) {
  TempDir tmp("ingot_compile_cache_test");
  const std::string cache = tmp.path() + "/cache";
  ChildResult cold = run_child(cache, tmp.path() + "/cold.txt");
  ASSERT_GT(cold.generated, 0);
  int corrupted = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(cache + "/entries")) {
    if (!e.is_regular_file()) continue;
    std::filesystem::resize_file(e.path(), std::filesystem::file_size(e.path()) / 2);  // truncate
    ++corrupted;
  }
  ASSERT_GT(corrupted, 0);
  ChildResult again = run_child(cache, tmp.path() + "/again.txt");
  EXPECT_EQ(again.generated, cold.generated) << "every truncated entry is a miss and is rebuilt";
  EXPECT_LE(again.err, 1.0);
  ChildResult warm = run_child(cache, tmp.path() + "/warm.txt");
  EXPECT_EQ(warm.generated, 0) << "the rebuilt entries are valid";
}

}  // namespace
}  // namespace ingot
