// The on-disk compile cache: round trips, corrupt / truncated / mismatched entries survived and rewritten,
// concurrent writers, and compiled kernels found by a second process without running the compiler.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "compile/cache/compile_cache.h"
#include "runtime/error.h"
#include "runtime/sha256.h"
#include "runtime/file_util.h"
#include "tests/compile/codegen/test_codegen_util.h"

namespace ingot::cache {
namespace {

void overwrite(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// hash_bytes is OpenSSL's SHA-256 of the little-endian seed and the bytes, its first 8 bytes little-endian: the values
// Python's hashlib gives for b"abc" under seeds 0 and 1.
TEST(CompileCacheHash, HashBytesIsTheSeededSha256Prefix) {
  EXPECT_EQ(hash_bytes("abc"), 0x99bb38e94c2e65f3ull);
  EXPECT_EQ(hash_bytes("abc", 1), 0x326ac35b04c7a522ull);
  EXPECT_EQ(hex64(hash_bytes("abc")), "99bb38e94c2e65f3");
}

// The compiler's in-memory keys (runtime/sha256.h): SHA-256 of 8-byte little-endian integers and length-prefixed
// strings, first 8 bytes; values from Python's hashlib. "a" then "bc" is not "ab" then "c".
TEST(CompileCacheHash, Key64IsTheSha256PrefixOfLengthPrefixedAdditions) {
  EXPECT_EQ(Key64().add(std::string_view("abc")).value(), 0xad3901ec5edc91ceull);
  EXPECT_EQ(Key64().add(uint64_t{7}).add(std::string_view("xy")).value(), 0xa76f6d6e3c23c714ull);
  EXPECT_EQ(Key64().add(std::string_view("a")).add(std::string_view("bc")).value(), 0xbec0c6b6a1cc8a9aull);
  EXPECT_EQ(Key64().add(std::string_view("ab")).add(std::string_view("c")).value(), 0xca01de795565ee43ull);
}

TEST(CompileCache, PutThenGetRoundTripsAndUnknownKeysMiss) {
  TempDir dir("ingot-cache-");
  CompileCache c(dir.path());
  EXPECT_FALSE(c.get("graph:abc", "graph").has_value());
  const std::string payload("\x00\x01 binary \xff", 12);
  c.put("graph:abc", CacheEntry{"graph", payload, {}});
  auto e = c.get("graph:abc", "graph");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->payload, payload);
  EXPECT_EQ(e->kind, "graph");
  EXPECT_FALSE(c.get("graph:abd", "graph").has_value());
  EXPECT_EQ(c.stats().hits, 1);
  EXPECT_EQ(c.stats().misses, 2);
  // A new object (as another process would) reads the same entry.
  EXPECT_EQ(CompileCache(dir.path()).get("graph:abc", "graph")->payload, payload);
}

TEST(CompileCache, DefaultDirFollowsTheEnvironment) {
  const char* old = std::getenv("INGOT_CACHE_DIR");
  const std::string saved = old ? old : "";
  ::setenv("INGOT_CACHE_DIR", "/tmp/some-ingot-cache", 1);
  EXPECT_EQ(CompileCache::default_dir(), "/tmp/some-ingot-cache");
  ::unsetenv("INGOT_CACHE_DIR");
  if (const char* home = std::getenv("HOME"); home && *home)
    EXPECT_EQ(CompileCache::default_dir(), std::string(home) + "/.cache/ingot");
  if (old) ::setenv("INGOT_CACHE_DIR", saved.c_str(), 1);
}

TEST(CompileCache, ACorruptEntryIsIgnoredWarnedAboutOnceAndRewritten) {
  TempDir dir("ingot-cache-");
  CompileCache c(dir.path());
  c.put("k1", CacheEntry{"graph", std::string(300, 'p'), {}});
  const std::string path = c.entry_path("k1");
  std::string bytes = read_file(path);
  bytes[bytes.size() / 2] ^= 0x5a;  // one flipped byte inside the payload: still parses, checksum catches it
  overwrite(path, bytes);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(c.get("k1", "graph").has_value());
  EXPECT_FALSE(c.get("k1", "graph").has_value());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("ignoring compile cache entry '" + path + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
  EXPECT_EQ(err.find("ignoring", err.find("ignoring") + 1), std::string::npos) << "warned twice:\n" << err;
  EXPECT_EQ(c.stats().invalid, 2);
  c.put("k1", CacheEntry{"graph", "fresh", {}});
  EXPECT_EQ(c.get("k1", "graph")->payload, "fresh");
}

TEST(CompileCache, TruncatedGarbageAndEmptyEntriesAreMisses) {
  TempDir dir("ingot-cache-");
  CompileCache c(dir.path());
  c.put("k", CacheEntry{"graph", std::string(1000, 'x'), {}});
  const std::string path = c.entry_path("k"), full = read_file(path);
  for (const std::string& bad : {full.substr(0, full.size() / 2), full.substr(0, 3), std::string(),
                                 std::string("\xff\xff\xff\xff garbage", 13)}) {
    overwrite(path, bad);
    ::testing::internal::CaptureStderr();
    EXPECT_FALSE(c.get("k", "graph").has_value()) << bad.size() << " bytes";
    ::testing::internal::GetCapturedStderr();
  }
  overwrite(path, full);
  EXPECT_TRUE(c.get("k", "graph").has_value());
}

TEST(CompileCache, AnEntryOfAnotherKeyOrKindIsAMismatch) {
  TempDir dir("ingot-cache-");
  CompileCache c(dir.path());
  c.put("a", CacheEntry{"graph", "A", {}});
  std::filesystem::create_directories(std::filesystem::path(c.entry_path("b")).parent_path());
  std::filesystem::copy_file(c.entry_path("a"), c.entry_path("b"));  // as if the hashes of "a" and "b" collided
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(c.get("b", "graph").has_value());
  EXPECT_FALSE(c.get("a", "cpu_kernel").has_value());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("it holds another key"), std::string::npos) << err;
  EXPECT_NE(err.find("it is a 'graph' entry, expected 'cpu_kernel'"), std::string::npos) << err;
  EXPECT_EQ(c.get("a", "graph")->payload, "A");
}

TEST(CompileCache, ReferencedFilesAreVerified) {
  TempDir dir("ingot-cache-");
  CompileCache c(dir.path());
  c.put_file("lib-1.so", std::string(4096, 'L'));
  c.put("k", CacheEntry{"cpu_kernel", "sym", {"lib-1.so"}});
  ASSERT_TRUE(c.get("k", "cpu_kernel").has_value());
  EXPECT_EQ(c.get("k", "cpu_kernel")->files, std::vector<std::string>{"lib-1.so"});
  overwrite(c.file_path("lib-1.so"), std::string(100, 'L'));  // truncated library
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(c.get("k", "cpu_kernel").has_value());
  std::filesystem::remove(c.file_path("lib-1.so"));
  c.put_file("other.so", "x");
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("has 100 bytes, expected 4096"), std::string::npos) << err;
  EXPECT_THROW(c.put("k2", CacheEntry{"cpu_kernel", "sym", {"lib-1.so"}}), Error);
  EXPECT_THROW(c.put_file("../escape.so", "x"), Error);
}

TEST(CompileCache, ConcurrentWritersLeaveAValidEntry) {
  TempDir dir("ingot-cache-");
  const std::string key = "shared-by-all-ranks";
  constexpr int kWriters = 4, kRounds = 60;
  std::vector<pid_t> pids;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // child: many puts of the same key with writer-specific, large payloads
      int rc = 0;
      try {
        CompileCache c(dir.path());
        for (int r = 0; r < kRounds; ++r)
          c.put(key, CacheEntry{"graph", std::string(20000 + w * 1000 + r, static_cast<char>('a' + w)), {}});
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  CompileCache reader(dir.path());
  int valid_reads = 0;
  for (int i = 0; i < 200; ++i) valid_reads += reader.get(key, "graph").has_value();  // while they write
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(reader.stats().invalid, 0) << "a reader saw a half-written entry";
  auto e = reader.get(key, "graph");
  ASSERT_TRUE(e.has_value());
  const char ch = e->payload[0];
  EXPECT_EQ(e->payload, std::string(e->payload.size(), ch));
  EXPECT_EQ(e->payload.size(), 20000u + (ch - 'a') * 1000u + kRounds - 1);  // some writer's last, complete put
  for (const auto& f : std::filesystem::directory_iterator(dir.path() + "/entries"))
    EXPECT_EQ(f.path().extension(), ".pb") << "temporary file left behind: " << f.path();
  (void)valid_reads;
}

// ----- compiled kernels through the cache -----------------------------------------------------------------

codegen::KernelSpec axpy_spec(double a) {
  codegen::KernelSpec k;
  k.name = "axpy";
  k.dims = {codegen::SymInt::slot(0)};
  k.num_syms = 1;
  const int x = k.input(DType::f32, {codegen::SymInt::constant(1)}, "x");
  const int y = k.input(DType::f32, {codegen::SymInt::constant(1)}, "y");
  const int o = k.output(DType::f32, {codegen::SymInt::constant(1)}, "out");
  k.store(o, k.binary(codegen::Op::Add, k.binary(codegen::Op::Mul, k.load(x), k.constant(a, DType::f32)), k.load(y)));
  return k;
}

void expect_axpy_works(const codegen::cpu::CpuKernel& k, double a) {
  Tensor x = randn({100}), y = randn({100}), out = empty({100});
  codegen::testing::run(k, {x, y, out}, {100});
  EXPECT_LE(max_rel_error(out, add(mul(x, a), y), 1e-6, 1e-6), 1.0);
}

TEST(CompileCache, ASecondProcessLoadsCompiledKernelsWithoutTheCompiler) {
  TempDir dir("ingot-cache-");
  const codegen::cpu::CpuCodegenOptions opts{dir.path(), true, 2};
  {
    codegen::cpu::CpuCodegen cold(opts);
    codegen::CodegenStats st;
    expect_axpy_works(cold.compile(axpy_spec(2.5), &st), 2.5);
    EXPECT_EQ(st.compiled, 1);
    EXPECT_EQ(st.disk_hits, 0);
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // a new process: nothing in memory, the cache on disk is warm
    int rc = 10;
    try {
      codegen::cpu::CpuCodegen warm(opts);
      codegen::CodegenStats st;
      const codegen::cpu::CpuKernel k = warm.compile(axpy_spec(2.5), &st);
      rc = (st.disk_hits == 1 && st.compiled == 0 && st.compiler_processes == 0 && st.compiler_s == 0.0 && k.fn)
               ? 0
               : 11;
    } catch (...) {
      rc = 12;
    }
    ::_exit(rc);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10/12: exception, 11: the warm process did not take the kernel from disk";
  // And here too, with a fresh in-memory table: the loaded kernel computes the right thing.
  codegen::cpu::CpuCodegen warm(opts);
  codegen::CodegenStats st;
  expect_axpy_works(warm.compile(axpy_spec(2.5), &st), 2.5);
  EXPECT_EQ(st.disk_hits, 1);
  EXPECT_EQ(st.compiled, 0);
}

TEST(CompileCache, RanksStartingColdTogetherCompileOnce) {
  TempDir dir("ingot-cache-");
  const codegen::cpu::CpuCodegenOptions opts{dir.path(), true, 1};
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 3; ++rank) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // exit code: how many kernels this rank compiled (100 on an exception)
      int rc = 100;
      try {
        codegen::CodegenStats st;
        codegen::cpu::CpuCodegen(opts).compile({axpy_spec(0.125), axpy_spec(8.0)}, &st);
        rc = static_cast<int>(st.compiled);
      } catch (...) {
      }
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  int compiled = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_LT(WEXITSTATUS(status), 100);
    compiled += WEXITSTATUS(status);
  }
  EXPECT_EQ(compiled, 2) << "each of the two kernels compiled by exactly one rank";
}

TEST(CompileCache, ACorruptKernelLibraryIsRecompiledNotLoaded) {
  TempDir dir("ingot-cache-");
  const codegen::cpu::CpuCodegenOptions opts{dir.path(), true, 2};
  codegen::cpu::CpuCodegen(opts).compile(axpy_spec(-1.5));
  for (const auto& f : std::filesystem::directory_iterator(dir.path() + "/files")) {
    std::string bytes = read_file(f.path());
    bytes.resize(bytes.size() / 3);  // a truncated .so: dlopen would fail or worse
    overwrite(f.path(), bytes);
  }
  ::testing::internal::CaptureStderr();
  codegen::cpu::CpuCodegen again(opts);
  codegen::CodegenStats st;
  const codegen::cpu::CpuKernel k = again.compile(axpy_spec(-1.5), &st);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("ignoring compile cache entry"), std::string::npos) << err;
  EXPECT_EQ(st.compiled, 1);
  expect_axpy_works(k, -1.5);
  codegen::CodegenStats third;
  codegen::cpu::CpuCodegen(opts).compile(axpy_spec(-1.5), &third);
  EXPECT_EQ(third.disk_hits, 1) << "the rewritten entry is used";
}

}  // namespace
}  // namespace ingot::cache
