// On-disk compile cache (see compile_cache.h for the layout and the guarantees).
#include "compile/cache/compile_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <tuple>

#include "compile/cache/cache_entry.pb.h"
#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/sha256.h"

#ifndef INGOT_VERSION
#error "INGOT_VERSION must be defined by the build (compile/cache/cache.cmake)"
#endif

namespace ingot::cache {

namespace {

// Checksum of everything an entry says, in a fixed order with lengths, so no two different entries
// serialize to the same checksummed bytes.
uint64_t entry_checksum(const proto::CacheEntry& e) {
  std::string s;
  auto add = [&](std::string_view part) {
    s += std::to_string(part.size());
    s += ':';
    s.append(part.data(), part.size());
  };
  add(e.key());
  add(e.ingot_version());
  add(e.kind());
  add(e.payload());
  for (const proto::FileRef& f : e.files()) {
    add(f.name());
    add(std::to_string(f.size()));
    add(std::to_string(f.checksum()));
  }
  return hash_bytes(s, 0x1a2b3c4d);
}

// Files already checked in this process, by identity (device, inode, size, mtime): a kernel library shared
// by hundreds of entries is hashed once, and a file replaced since has another identity.
using FileIdentity = std::tuple<dev_t, ino_t, off_t, int64_t>;
std::mutex g_verified_mu;
std::map<FileIdentity, uint64_t> g_verified;

// The checksum of `path` (and its size through `size`), memoized by file identity. Throws when unreadable.
uint64_t file_checksum(const std::string& path, uint64_t* size) {
  struct stat st {};
  INGOT_CHECK(::stat(path.c_str(), &st) == 0, "the file '", path, "' is missing");
  *size = static_cast<uint64_t>(st.st_size);
  const FileIdentity id{st.st_dev, st.st_ino, st.st_size,
                        static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  {
    std::lock_guard<std::mutex> lock(g_verified_mu);
    auto it = g_verified.find(id);
    if (it != g_verified.end()) return it->second;
  }
  const std::string bytes = read_file(path);
  *size = bytes.size();
  const uint64_t sum = hash_bytes(bytes);
  std::lock_guard<std::mutex> lock(g_verified_mu);
  g_verified[id] = sum;
  return sum;
}

// Why `path` does not match (size, checksum), or "" when it does.
std::string check_file(const std::string& path, uint64_t size, uint64_t checksum) {
  uint64_t actual_size = 0, actual = 0;
  try {
    actual = file_checksum(path, &actual_size);
  } catch (const Error&) {
    return "the file it refers to, '" + path + "', is missing or unreadable";
  }
  if (actual_size != size)
    return "the file it refers to, '" + path + "', has " + std::to_string(actual_size) + " bytes, expected " +
           std::to_string(size);
  if (actual != checksum) return "the file it refers to, '" + path + "', has the wrong checksum";
  return "";
}

std::mutex g_warned_mu;
std::set<std::string> g_warned;  // one warning per entry file per process

}  // namespace

uint64_t hash_bytes(std::string_view bytes, uint64_t seed) { return Key64().add(seed).add_bytes(bytes).value(); }

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

CompileCache::CompileCache(std::string dir) : dir_(dir.empty() ? default_dir() : std::move(dir)) {}

std::string CompileCache::default_dir() {
  if (const char* env = std::getenv("INGOT_CACHE_DIR"); env && *env) return env;
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/ingot";
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/ingot-cache-" + std::to_string(::getuid());
}

std::string_view CompileCache::ingot_version() { return INGOT_VERSION; }

std::string CompileCache::entry_path(const std::string& key) const {
  // Two independent 64-bit hashes: a collision of both would still read as a key mismatch, not a hit.
  return dir_ + "/entries/" + hex64(hash_bytes(key, 1)) + hex64(hash_bytes(key, 2)) + ".pb";
}

void CompileCache::warn_invalid(const std::string& path, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.invalid;
  }
  std::lock_guard<std::mutex> lock(g_warned_mu);
  if (!g_warned.insert(path).second) return;
  std::fprintf(stderr, "ingot: warning: ignoring compile cache entry '%s': %s; it will be rewritten\n", path.c_str(),
               why.c_str());
}

std::optional<CacheEntry> CompileCache::get(const std::string& key, std::string_view kind) {
  const std::string path = entry_path(key);
  std::string bytes;
  try {
    if (!std::filesystem::exists(path)) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.misses;
      return std::nullopt;
    }
    bytes = read_file(path);
  } catch (const std::exception& e) {  // unreadable (permissions, a directory in the way...)
    warn_invalid(path, e.what());
    return std::nullopt;
  }
  proto::CacheEntry e;
  if (!e.ParseFromString(bytes)) {
    warn_invalid(path, "it is not a valid CacheEntry message (corrupt or truncated, " + std::to_string(bytes.size()) +
                           " bytes)");
    return std::nullopt;
  }
  if (e.checksum() != entry_checksum(e)) {
    warn_invalid(path, "its checksum does not match its contents (corrupt or truncated)");
    return std::nullopt;
  }
  if (e.key() != key) {
    warn_invalid(path, "it holds another key (a hash collision or a foreign file)");
    return std::nullopt;
  }
  if (e.ingot_version() != ingot_version()) {
    warn_invalid(path, "it was written by ingot " + e.ingot_version() + ", this is " + std::string(ingot_version()));
    return std::nullopt;
  }
  if (e.kind() != kind) {
    warn_invalid(path, "it is a '" + e.kind() + "' entry, expected '" + std::string(kind) + "'");
    return std::nullopt;
  }
  CacheEntry out;
  out.kind = e.kind();
  out.payload = e.payload();
  for (const proto::FileRef& f : e.files()) {
    if (f.name().empty() || f.name().find('/') != std::string::npos) {
      warn_invalid(path, "it refers to a file with an invalid name '" + f.name() + "'");
      return std::nullopt;
    }
    const std::string why = check_file(file_path(f.name()), f.size(), f.checksum());
    if (!why.empty()) {
      warn_invalid(path, why);
      return std::nullopt;
    }
    out.files.push_back(f.name());
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.hits;
  return out;
}

void CompileCache::put(const std::string& key, const CacheEntry& entry) {
  proto::CacheEntry e;
  e.set_key(key);
  e.set_ingot_version(std::string(ingot_version()));
  e.set_kind(entry.kind);
  e.set_payload(entry.payload);
  for (const std::string& name : entry.files) {
    const std::string p = file_path(name);
    INGOT_CHECK(std::filesystem::exists(p), "compile cache: entry '", entry.kind, "' refers to '", p,
                "', which does not exist; store it with put_file first");
    uint64_t size = 0;
    const uint64_t sum = file_checksum(p, &size);
    proto::FileRef* f = e.add_files();
    f->set_name(name);
    f->set_size(size);
    f->set_checksum(sum);
  }
  e.set_checksum(entry_checksum(e));
  std::string bytes;
  INGOT_INTERNAL_CHECK(e.SerializeToString(&bytes), "cannot serialize a cache entry");
  const std::string path = entry_path(key);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, bytes.data(), bytes.size()); });
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.writes;
}

std::string CompileCache::put_file(const std::string& name, std::string_view bytes) {
  INGOT_CHECK(!name.empty() && name.find('/') == std::string::npos, "compile cache: invalid file name '", name,
              "': expected a plain name");
  const std::string path = file_path(name);
  std::filesystem::create_directories(dir_ + "/files");
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, bytes.data(), bytes.size()); });
  return path;
}

CacheStats CompileCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace ingot::cache
