// The autotune database (compile/autotune/autotune_db.h): round trip through the file, corrupt and
// unreadable files (a warning naming the file, never an exception), one file per GPU, atomic writes that
// leave no temp files, and writers side by side that keep each other's entries.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "compile/autotune/autotune_db.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::autotune {
namespace {

const std::string kGpu = "NVIDIA H100 80GB HBM3 sm_90 cudart 13000 cublasLt 130000";
const std::string kOtherGpu = "NVIDIA A100-SXM4-80GB sm_80 cudart 13000 cublasLt 130000";

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(AutotuneDb, EntriesSurviveARoundTripThroughTheFile) {
  TempDir dir("ingot-autotune-");
  {
    AutotuneDb db(dir.path(), kGpu);
    EXPECT_FALSE(db.get("kernel 0123").has_value());
    db.put("kernel 0123 ln_fwd", {"block=256 rows=warp vec=1", 0.0125});
    db.put("matmul m=64 n=768 k=768 f32", {"00ff00ff", 0.5});
    db.flush();
  }
  AutotuneDb again(dir.path(), kGpu);
  std::optional<TuneEntry> k = again.get("kernel 0123 ln_fwd");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->config, "block=256 rows=warp vec=1");
  EXPECT_DOUBLE_EQ(k->ms, 0.0125);
  ASSERT_TRUE(again.get("matmul m=64 n=768 k=768 f32").has_value());
  EXPECT_EQ(again.get("matmul m=64 n=768 k=768 f32")->config, "00ff00ff");
  EXPECT_EQ(again.size(), 2u);
}

TEST(AutotuneDb, NothingIsWrittenBeforeFlushAndAnEmptyFlushWritesNothing) {
  TempDir dir("ingot-autotune-");
  AutotuneDb db(dir.path() + "/sub", kGpu);
  db.flush();
  EXPECT_FALSE(std::filesystem::exists(db.path()));
  db.put("k", {"c", 1});
  EXPECT_FALSE(std::filesystem::exists(db.path()));
  db.flush();
  EXPECT_TRUE(std::filesystem::exists(db.path()));
}

TEST(AutotuneDb, ACorruptFileWarnsNamingItAndIsIgnored) {
  const std::vector<std::string> corrupt = {
      "garbage\x01\x02 not a database",
      "ingot-autotune 1\ndevice " + kGpu + "\nkernel 1\tnot-a-number\tblock=256\n",
      "ingot-autotune 1\ndevice " + kGpu + "\nkernel 1 missing tabs\n",
      "ingot-autotune 1\ndevice " + kGpu + "\nkernel 1\t0.5\tblock=256",  // truncated: no final line break
      "ingot-autotune 1\ndevice " + kGpu + "\nkernel 1\t-3\tblock=256\n",
      "",
  };
  for (const std::string& text : corrupt) {
    TempDir dir("ingot-autotune-");
    AutotuneDb db(dir.path(), kGpu);
    write_text(db.path(), text);
    ::testing::internal::CaptureStderr();
    EXPECT_NO_THROW(EXPECT_FALSE(db.get("kernel 1").has_value()));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("warning: ignoring the autotune database '" + db.path() + "'"), std::string::npos)
        << "for file text '" << text << "', stderr: " << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << "one line: " << err;
    // The next flush replaces the corrupt file with a good one.
    db.put("kernel 2", {"block=128", 0.25});
    ::testing::internal::CaptureStderr();
    db.flush();
    ::testing::internal::GetCapturedStderr();
    AutotuneDb fresh(dir.path(), kGpu);
    ASSERT_TRUE(fresh.get("kernel 2").has_value()) << "for file text '" << text << "'";
    EXPECT_EQ(fresh.get("kernel 2")->config, "block=128");
  }
}

TEST(AutotuneDb, AnUnreadableOrUnwritableFileIsAWarningNotAnError) {
  TempDir dir("ingot-autotune-");
  AutotuneDb db(dir.path(), kGpu);
  std::filesystem::create_directories(db.path());  // a directory where the file should be
  ::testing::internal::CaptureStderr();
  EXPECT_NO_THROW(EXPECT_FALSE(db.get("k").has_value()));
  db.put("k", {"c", 1});
  EXPECT_NO_THROW(db.flush());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(db.path()), std::string::npos) << err;
  EXPECT_EQ(db.get("k")->config, "c") << "the entry stays in memory";
}

TEST(AutotuneDb, EachGpuHasItsOwnFileAndEntries) {
  TempDir dir("ingot-autotune-");
  AutotuneDb h100(dir.path(), kGpu), a100(dir.path(), kOtherGpu);
  EXPECT_NE(h100.path(), a100.path());
  EXPECT_EQ(AutotuneDb::file_name(kGpu).rfind("nvidia_h100_80gb_hbm3", 0), 0u) << AutotuneDb::file_name(kGpu);
  h100.put("kernel 7", {"block=1024", 1});
  a100.put("kernel 7", {"block=128", 2});
  h100.flush();
  a100.flush();
  EXPECT_EQ(AutotuneDb(dir.path(), kGpu).get("kernel 7")->config, "block=1024");
  EXPECT_EQ(AutotuneDb(dir.path(), kOtherGpu).get("kernel 7")->config, "block=128");
  // A file renamed to another GPU's name is rejected by its device line.
  AutotuneDb other(dir.path(), "Some Other GPU sm_75");
  std::filesystem::copy_file(h100.path(), other.path());
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(other.get("kernel 7").has_value());
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("another device"), std::string::npos);
}

TEST(AutotuneDb, AtomicWritesLeaveNoTempFiles) {
  TempDir dir("ingot-autotune-");
  AutotuneDb db(dir.path(), kGpu);
  for (int i = 0; i < 5; ++i) {
    db.put("kernel " + std::to_string(i), {"block=256", 0.5 * i});
    db.flush();
  }
  for (const std::string& f : files_in(dir.path())) {
    EXPECT_EQ(f.find(".tmp"), std::string::npos) << "left behind: " << f;
    EXPECT_TRUE(f == AutotuneDb::file_name(kGpu) || f == AutotuneDb::file_name(kGpu) + ".lock") << f;
  }
  EXPECT_EQ(AutotuneDb(dir.path(), kGpu).size(), 5u);
}

TEST(AutotuneDb, WritersSideBySideKeepEachOthersEntries) {
  TempDir dir("ingot-autotune-");
  // Two processes' views: both loaded before either wrote.
  AutotuneDb a(dir.path(), kGpu), b(dir.path(), kGpu);
  a.put("shared", {"from-a", 1});
  b.put("shared", {"from-b", 2});
  EXPECT_FALSE(a.get("only b").has_value());
  a.put("only a", {"x", 1});
  b.put("only b", {"y", 1});
  a.flush();
  b.flush();
  AutotuneDb c(dir.path(), kGpu);
  EXPECT_TRUE(c.get("only a").has_value());
  EXPECT_TRUE(c.get("only b").has_value());
  EXPECT_EQ(c.get("shared")->config, "from-b") << "the last writer's measurement wins for one key";
  EXPECT_TRUE(b.get("only a").has_value()) << "a flush also learns the other writers' entries";

  // Many writers at once, each with its own object (as separate processes would be).
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      AutotuneDb w(dir.path(), kGpu);
      for (int i = 0; i < 4; ++i) {
        w.put(detail::str_cat("t", t, " ", i), {"c", 1});
        w.flush();
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(AutotuneDb(dir.path(), kGpu).size(), 3u + 8 * 4);
}

TEST(AutotuneDb, SharedGivesOneObjectPerDirectoryAndDevice) {
  TempDir dir("ingot-autotune-");
  EXPECT_EQ(AutotuneDb::shared(dir.path(), kGpu), AutotuneDb::shared(dir.path(), kGpu));
  EXPECT_NE(AutotuneDb::shared(dir.path(), kGpu), AutotuneDb::shared(dir.path(), kOtherGpu));
  EXPECT_EQ(AutotuneDb::dir_for("/x/cache"), "/x/cache/autotune");
  EXPECT_EQ(AutotuneDb::dir_for(""), AutotuneDb::default_dir());
}

TEST(AutotuneDb, KeysAndConfigsMustBeSingleLinesWithoutTabs) {
  TempDir dir("ingot-autotune-");
  AutotuneDb db(dir.path(), kGpu);
  EXPECT_THROW(db.put("a\tb", {"c", 1}), Error);
  EXPECT_THROW(db.put("a", {"c\nd", 1}), Error);
  EXPECT_THROW(db.put("", {"c", 1}), Error);
}

}  // namespace
}  // namespace ingot::autotune
