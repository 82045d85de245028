// The on-disk compile cache: what a later process (or another rank of the same job) needs to skip work it
// has done before — compiled kernel libraries, and whatever else the compiler stores under a key.
//
// Layout of a cache directory (default $INGOT_CACHE_DIR, else ~/.cache/ingot):
//   entries/<32 hex digits>.pb   one serialized ingot.cache.proto.CacheEntry (cache_entry.proto) per key
//   files/<name>                 files entries refer to (e.g. kernel .so libraries), shared between entries
//
// Guarantees:
//   - Writes are atomic: bytes go to a temp file in the same directory, are fsynced, then renamed over the
//     target (write_file_atomic). Concurrent writers (several processes or ranks) may race on one key; the
//     last rename wins and every reader sees one complete entry, never a mix.
//   - A corrupt, truncated or mismatched entry (bad protobuf, bad checksum, other key or ingot version,
//     another kind, or a referenced file missing / of the wrong size or checksum) is a miss: get() warns once
//     per file, naming it and the reason, and the caller's next put() rewrites it. Never a crash.
//   - Keys must not depend on rank, world size or paths, so every rank of a job shares one entry.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace ingot::cache {

struct CacheEntry {
  std::string kind;                // what the payload is, e.g. "cpu_kernel"
  std::string payload;             // opaque bytes for the owner of `kind`
  std::vector<std::string> files;  // names of files stored with put_file(); verified by get()
};

struct CacheStats {
  int64_t hits = 0;
  int64_t misses = 0;   // no entry at all
  int64_t invalid = 0;  // an entry existed but was corrupt, truncated or mismatched
  int64_t writes = 0;
};

// 64-bit content hash used for checksums and file names: the first 8 bytes of OpenSSL's SHA-256 of the seed (8 bytes,
// little-endian) and the bytes. `seed` selects an independent hash of the same bytes.
uint64_t hash_bytes(std::string_view bytes, uint64_t seed = 0);
// 16 lower-case hex digits.
std::string hex64(uint64_t v);

class CompileCache {
 public:
  // `dir` is created on first write; an empty dir means default_dir().
  explicit CompileCache(std::string dir = {});

  // $INGOT_CACHE_DIR if set, else $HOME/.cache/ingot, else <TMPDIR or /tmp>/ingot-cache-<uid>.
  static std::string default_dir();
  // The ingot version written into and required of every entry.
  static std::string_view ingot_version();

  const std::string& dir() const { return dir_; }

  // The entry under `key` if it is intact, of this ingot version and of `kind` (see the guarantees above).
  std::optional<CacheEntry> get(const std::string& key, std::string_view kind);
  // Stores `entry` under `key`, replacing what was there. Its files must have been stored with put_file.
  void put(const std::string& key, const CacheEntry& entry);

  // Stores `bytes` as files/<name> (atomically; an existing file of that name is replaced) and returns the
  // path. Name files by a hash of their content, so that equal names mean equal bytes.
  std::string put_file(const std::string& name, std::string_view bytes);
  std::string file_path(const std::string& name) const { return dir_ + "/files/" + name; }
  // The entry file a key lives in (for tests and for messages).
  std::string entry_path(const std::string& key) const;

  CacheStats stats() const;

 private:
  void warn_invalid(const std::string& path, const std::string& why);

  std::string dir_;
  mutable std::mutex mu_;
  CacheStats stats_;
};

}  // namespace ingot::cache
