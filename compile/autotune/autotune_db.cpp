// The autotune database file: load, merge and atomic write (see autotune_db.h).
#include "compile/autotune/autotune_db.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <system_error>

#include "compile/cache/compile_cache.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::autotune {
namespace {

constexpr const char* kMagic = "ingot-autotune 1";

bool single_line(const std::string& s) { return s.find_first_of("\t\r\n") == std::string::npos; }

}  // namespace

AutotuneDb::AutotuneDb(std::string dir, std::string device_id)
    : dir_(dir.empty() ? default_dir() : std::move(dir)), device_id_(std::move(device_id)) {
  INGOT_INTERNAL_CHECK(single_line(device_id_) && !device_id_.empty(), "autotune: bad device id '", device_id_, "'");
  path_ = dir_ + "/" + file_name(device_id_);
}

std::string AutotuneDb::default_dir() { return cache::CompileCache::default_dir() + "/autotune"; }

std::string AutotuneDb::dir_for(const std::string& cache_dir) {
  return cache_dir.empty() ? default_dir() : cache_dir + "/autotune";
}

std::string AutotuneDb::file_name(const std::string& device_id) {
  std::string slug;
  for (char c : device_id) {
    if (slug.size() >= 40) break;
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (alnum) slug += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    else if (!slug.empty() && slug.back() != '_') slug += '_';
  }
  while (!slug.empty() && slug.back() == '_') slug.pop_back();
  if (slug.empty()) slug = "gpu";
  return slug + "-" + cache::hex64(cache::hash_bytes(device_id)) + ".tsv";
}

std::shared_ptr<AutotuneDb> AutotuneDb::shared(const std::string& dir, const std::string& device_id) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::shared_ptr<AutotuneDb>> all;
  std::lock_guard<std::mutex> lock(mu);
  const std::string d = dir.empty() ? default_dir() : dir;
  auto& db = all[{d, device_id}];
  if (!db) db = std::make_shared<AutotuneDb>(d, device_id);
  return db;
}

std::optional<AutotuneDb::Entries> AutotuneDb::read_disk() {
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return std::nullopt;
  auto bad = [&](const std::string& why) {
    const std::string msg = "ingot: warning: ignoring the autotune database '" + path_ + "': " + why;
    if (msg != warned_) std::fprintf(stderr, "%s\n", msg.c_str());
    warned_ = msg;
    return Entries{};
  };
  std::string text;
  try {
    text = read_file(path_);
  } catch (const Error& e) {
    return bad(e.what());
  }
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kMagic) return bad("not an ingot autotune file (bad header)");
  if (!std::getline(in, line) || line != "device " + device_id_)
    return bad("it belongs to another device ('" + line + "')");
  Entries out;
  int64_t number = 2;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const size_t t1 = line.find('\t'), t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    if (t2 == std::string::npos || line.find('\t', t2 + 1) != std::string::npos)
      return bad("line " + std::to_string(number) + " is not <key>\\t<ms>\\t<config>");
    const std::string ms_text = line.substr(t1 + 1, t2 - t1 - 1);
    char* end = nullptr;
    const double ms = std::strtod(ms_text.c_str(), &end);
    if (ms_text.empty() || *end != '\0' || !std::isfinite(ms) || ms < 0)
      return bad("line " + std::to_string(number) + " has a bad time '" + ms_text + "'");
    out[line.substr(0, t1)] = TuneEntry{line.substr(t2 + 1), ms};
  }
  if (!text.empty() && text.back() != '\n') return bad("truncated (no final line break)");
  return out;
}

void AutotuneDb::load_locked() {
  if (loaded_) return;
  loaded_ = true;
  if (std::optional<Entries> disk = read_disk())
    for (auto& [k, e] : *disk) entries_.emplace(k, e);
}

std::optional<TuneEntry> AutotuneDb::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  load_locked();
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void AutotuneDb::put(const std::string& key, TuneEntry entry) {
  INGOT_INTERNAL_CHECK(!key.empty() && single_line(key) && single_line(entry.config),
                       "autotune: keys and configs are single lines without tabs: '", key, "' -> '", entry.config, "'");
  INGOT_INTERNAL_CHECK(std::isfinite(entry.ms) && entry.ms >= 0, "autotune: bad time ", entry.ms, " for '", key, "'");
  std::lock_guard<std::mutex> lock(mu_);
  load_locked();
  entries_[key] = std::move(entry);
  dirty_.insert(key);
}

size_t AutotuneDb::size() {
  std::lock_guard<std::mutex> lock(mu_);
  load_locked();
  return entries_.size();
}

void AutotuneDb::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  load_locked();
  if (dirty_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  FileLock file_lock(path_ + ".lock");
  // Another process may have written since we loaded: its entries join ours, ours win for the same key.
  Entries merged = read_disk().value_or(Entries{});
  for (const std::string& k : dirty_) merged[k] = entries_.at(k);
  for (const auto& [k, e] : entries_) merged.emplace(k, e);
  try {
    write_file_atomic(path_, [&](std::FILE* f) {
      std::ostringstream o;
      o.precision(6);
      o << kMagic << "\ndevice " << device_id_ << "\n";
      for (const auto& [k, e] : merged) o << k << '\t' << e.ms << '\t' << e.config << '\n';
      const std::string s = o.str();
      write_bytes(f, s.data(), s.size());
    });
  } catch (const Error& e) {
    std::fprintf(stderr, "ingot: warning: cannot write the autotune database: %s\n", e.what());
    return;
  }
  entries_ = std::move(merged);
  dirty_.clear();
}

}  // namespace ingot::autotune
