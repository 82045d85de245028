#include "runtime/file_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "runtime/error.h"

namespace ingot {
namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// Makes the rename of a file in `path`'s directory durable. Filesystems that cannot fsync a directory
// (EINVAL) give no stronger guarantee anyway, so that case is not an error.
void sync_parent_dir(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  INGOT_CHECK(fd >= 0, "wrote '", path, "' but cannot open its directory '", dir, "' to sync it: ",
              errno_text(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  INGOT_CHECK(rc == 0 || err == EINVAL, "wrote '", path, "' but cannot fsync its directory '", dir,
              "': ", errno_text(err));
}

}  // namespace

void write_bytes(std::FILE* f, const void* data, size_t n) {
  if (n == 0) return;
  size_t done = std::fwrite(data, 1, n, f);
  INGOT_CHECK(done == n, "write failed after ", done, " of ", n, " bytes: ", errno_text(errno));
}

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write) {
  INGOT_CHECK(!path.empty(), "write_file_atomic: empty path");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  INGOT_CHECK(f != nullptr, "cannot write '", path, "': cannot create temporary file '", tmp,
              "': ", errno_text(errno));
  auto discard = [&] {
    if (f) std::fclose(f);
    f = nullptr;
    ::unlink(tmp.c_str());
  };
  try {
    write(f);
    INGOT_CHECK(std::fflush(f) == 0, "flush failed: ", errno_text(errno));
    INGOT_CHECK(::fsync(::fileno(f)) == 0, "fsync failed: ", errno_text(errno));
    int rc = std::fclose(f);
    f = nullptr;
    INGOT_CHECK(rc == 0, "close failed: ", errno_text(errno));
    INGOT_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' over it: ",
                errno_text(errno));
  } catch (const Error& e) {
    discard();
    throw Error(detail::str_cat("cannot write '", path, "': ", e.what(), " (any existing file is unchanged)"));
  } catch (...) {
    discard();
    throw;
  }
  sync_parent_dir(path);
}

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  INGOT_CHECK(fd >= 0, "cannot read '", path, "': ", errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    int err = S_ISDIR(st.st_mode) ? EISDIR : errno;
    ::close(fd);
    INGOT_FAIL("cannot read '", path, "': ", errno_text(err));
  }
  std::string out;
  out.reserve(S_ISREG(st.st_mode) ? static_cast<size_t>(st.st_size) : 0);
  std::vector<char> buf(1 << 16);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      INGOT_FAIL("cannot read '", path, "': ", errno_text(err));
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

TempDir::TempDir(const std::string& prefix) {
  const char* env = std::getenv("TMPDIR");
  std::string base = env && *env ? env : "/tmp";
  std::string templ = base + "/" + prefix + "XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  INGOT_CHECK(::mkdtemp(buf.data()) != nullptr, "cannot create a temporary directory '", templ, "': ",
              errno_text(errno));
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;  // best effort: a destructor must not throw
  std::filesystem::remove_all(path_, ec);
}

FileLock::FileLock(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) return;
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    ::close(fd_);
    fd_ = -1;
    return;
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the lock
}

}  // namespace ingot
