#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "runtime/error.h"
#include "runtime/file_util.h"
#include "tests/testing.h"

namespace ingot {
namespace {

int64_t entries_in(const std::string& dir) {
  return std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator());
}

using ingot::testing::error_of;

// The lock the compile caches and the autotune database take: it makes its directory, and while it is held
// another open file description cannot take it (flock conflicts between descriptions, even in one process).
TEST(FileUtil, FileLockCreatesItsDirectoryAndExcludesOtherHoldersUntilDestroyed) {
  TempDir d("ingot-lock-");
  const std::string p = d.path() + "/a/b/x.lock";
  auto try_lock = [&] {
    const int fd = ::open(p.c_str(), O_RDWR);
    EXPECT_GE(fd, 0);
    const bool got = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    ::close(fd);
    return got;
  };
  {
    FileLock lock(p);
    EXPECT_TRUE(lock.locked());
    EXPECT_FALSE(try_lock()) << "held by `lock`";
  }
  EXPECT_TRUE(try_lock()) << "released by the destructor";
}

TEST(FileUtil, WriteFileAtomicCreatesTheFileAndLeavesNoTempFile) {
  TempDir dir("ingot_fu_");
  std::string path = dir.file("a.bin");
  std::string payload("hello\0world", 11);
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, payload.data(), payload.size()); });
  EXPECT_EQ(read_file(path), payload);
  EXPECT_EQ(entries_in(dir.path()), 1);
}

TEST(FileUtil, WriteFileAtomicReplacesAnExistingFile) {
  TempDir dir("ingot_fu_");
  std::string path = dir.file("a.txt");
  write_file_atomic(path, [](std::FILE* f) { write_bytes(f, "a much longer first version", 27); });
  write_file_atomic(path, [](std::FILE* f) { write_bytes(f, "v2", 2); });
  EXPECT_EQ(read_file(path), "v2");
  EXPECT_EQ(entries_in(dir.path()), 1);
}

TEST(FileUtil, AThrowingWriterLeavesTheOldFileAndRemovesTheTempFile) {
  TempDir dir("ingot_fu_");
  std::string path = dir.file("keep.txt");
  write_file_atomic(path, [](std::FILE* f) { write_bytes(f, "old", 3); });
  std::string msg = error_of([&] {
    write_file_atomic(path, [](std::FILE* f) {
      write_bytes(f, "partial new cont", 16);
      INGOT_FAIL("serializer: tensor 'w' is broken");
    });
  });
  EXPECT_NE(msg.find("cannot write '" + path + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'w' is broken"), std::string::npos) << msg;
  EXPECT_EQ(read_file(path), "old");
  EXPECT_EQ(entries_in(dir.path()), 1);
  // Exceptions that are not ingot errors pass through unchanged.
  EXPECT_THROW(write_file_atomic(path, [](std::FILE*) { throw std::out_of_range("x"); }), std::out_of_range);
  EXPECT_EQ(read_file(path), "old");
  EXPECT_EQ(entries_in(dir.path()), 1);
}

TEST(FileUtil, WritingIntoAMissingDirectoryNamesThePathAndTheReason) {
  TempDir dir("ingot_fu_");
  std::string path = dir.file("missing/x.bin");
  std::string msg = error_of([&] { write_file_atomic(path, [](std::FILE*) {}); });
  EXPECT_NE(msg.find("cannot write '" + path + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

TEST(FileUtil, WritingOverADirectoryFailsAndKeepsIt) {
  TempDir dir("ingot_fu_");
  std::string target = dir.file("sub");
  std::filesystem::create_directory(target);
  std::string msg = error_of([&] { write_file_atomic(target, [](std::FILE* f) { write_bytes(f, "x", 1); }); });
  EXPECT_NE(msg.find("cannot rename"), std::string::npos) << msg;
  EXPECT_TRUE(std::filesystem::is_directory(target));
  EXPECT_EQ(entries_in(dir.path()), 1);
}

TEST(FileUtil, ReadFileReportsMissingFilesAndDirectories) {
  TempDir dir("ingot_fu_");
  std::string missing = dir.file("nope");
  EXPECT_EQ(error_of([&] { read_file(missing); }), "cannot read '" + missing + "': No such file or directory");
  EXPECT_EQ(error_of([&] { read_file(dir.path()); }), "cannot read '" + dir.path() + "': Is a directory");
}

TEST(FileUtil, ReadFileReadsEmptyFiles) {
  TempDir dir("ingot_fu_");
  write_file_atomic(dir.file("empty"), [](std::FILE*) {});
  EXPECT_EQ(read_file(dir.file("empty")), "");
}

TEST(FileUtil, TempDirIsRemovedWithItsContents) {
  std::string path;
  {
    TempDir dir("ingot_fu_");
    path = dir.path();
    EXPECT_TRUE(std::filesystem::is_directory(path));
    std::filesystem::create_directories(dir.file("a/b"));
    write_file_atomic(dir.file("a/b/c"), [](std::FILE* f) { write_bytes(f, "c", 1); });
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace ingot
