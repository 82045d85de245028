// Small file helpers shared by safetensors, checkpoints and the compile cache. Every failure throws
// ingot::Error naming the path and the system's reason (strerror).
#pragma once

#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>

namespace ingot {

// Replaces `path` with what `write` puts into the stream, all or nothing: the bytes go to "<path>.tmp.<pid>"
// in the same directory, are flushed and fsynced, the temp file is renamed over `path`, and the directory is
// fsynced so the rename survives a crash. If anything fails (including `write` throwing) the temp file is
// removed, an existing `path` is left untouched, and the exception propagates (ingot::Error messages gain
// the target path).
void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write);
// Writes exactly n bytes or throws (for use inside write_file_atomic callbacks).
void write_bytes(std::FILE* f, const void* data, size_t n);

// The whole file as bytes.
std::string read_file(const std::string& path);

// An exclusive advisory lock (flock) on `path` (created, with its directory, if missing), held for the object's
// lifetime and released by the kernel if the process dies. Where locking fails the lock is simply not taken:
// callers use it to avoid duplicate work or lost merges between processes, never for correctness alone.
class FileLock {
 public:
  explicit FileLock(const std::string& path);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool locked() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// A fresh, private directory "<TMPDIR or /tmp>/<prefix>XXXXXX", removed with its contents on destruction
// (scratch space for tests and for compiler builds).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // path() + "/" + name
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace ingot
