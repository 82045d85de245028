// The autotune database: what `mode: max-autotune` measured on a GPU, so that a later compile (this process
// or another) reads the winners and times nothing.
//
// One file per GPU, <dir>/<gpu>-<16 hex digits>.tsv, where the hex digits hash the device id (GPU name,
// compute capability, CUDA runtime and cuBLASLt versions: a new driver stack or another GPU model starts a new
// file). dir is <cache dir>/autotune ($INGOT_CACHE_DIR, else ~/.cache/ingot). The file is text:
//     ingot-autotune 1
//     device <device id>
//     <key>\t<time in ms>\t<config>          one line per entry
// Keys name what was tuned and its shapes ("kernel <structural hash> ...", "matmul <m n k ...>"); configs are
// the winner in the tuner's own words. Neither may contain a tab or a line break.
//
// Robustness: a file that cannot be read or parsed (or belongs to another device id) is ignored with one
// warning naming it, never an exception; the next flush replaces it. flush() is atomic (temp file, fsync,
// rename, see write_file_atomic) and merges under an advisory file lock: it re-reads the file, adds this
// object's new entries (they win over older ones for the same key) and writes the union, so processes
// tuning side by side do not lose each other's entries.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace ingot::autotune {

struct TuneEntry {
  std::string config;
  double ms = 0;  // the winner's measured time
};

class AutotuneDb {
 public:
  // `dir` "" = default_dir(). Nothing is read until the first get/put/flush.
  AutotuneDb(std::string dir, std::string device_id);

  std::optional<TuneEntry> get(const std::string& key);
  // Recorded in memory at once; written by the next flush(). Throws ingot::Error (internal) for a key or
  // config with a tab or line break.
  void put(const std::string& key, TuneEntry entry);
  // Writes the entries put since the last flush, merged with the file as it is now. A failure (read-only or
  // full disk) is one warning; the entries stay in memory and are retried by the next flush.
  void flush();
  size_t size();

  const std::string& path() const { return path_; }
  const std::string& device_id() const { return device_id_; }

  // <INGOT_CACHE_DIR or ~/.cache/ingot>/autotune; dir_for("") is that, dir_for(d) is d + "/autotune" (the
  // CompileOptions::cache_dir a compile was given).
  static std::string default_dir();
  static std::string dir_for(const std::string& cache_dir);
  // The file name for a device id: readable prefix plus a hash of the whole id.
  static std::string file_name(const std::string& device_id);
  // One object per (dir, device id) in the process, shared by every compile that tunes there.
  static std::shared_ptr<AutotuneDb> shared(const std::string& dir, const std::string& device_id);

 private:
  using Entries = std::map<std::string, TuneEntry>;
  void load_locked();
  // The file's entries; nullopt when it is missing; warns (once per file and reason) and returns an empty
  // map when it is unreadable or corrupt.
  std::optional<Entries> read_disk();

  std::string dir_, device_id_, path_;
  std::mutex mu_;
  bool loaded_ = false;
  Entries entries_;
  std::set<std::string> dirty_;  // put since the last successful flush
  std::string warned_;           // the last warning printed (printed once)
};

}  // namespace ingot::autotune
