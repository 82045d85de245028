#include "recipes/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "recipes/hash.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kFormat = "ingot-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kStepPrefix = "step_";
constexpr const char* kTempPrefix = ".tmp-";

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  INGOT_CHECK(fd >= 0, "cannot open directory '", dir.string(), "' to sync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Filesystems that cannot sync a directory (EINVAL) offer no stronger guarantee anyway.
  INGOT_CHECK(rc == 0 || err == EINVAL, "cannot fsync directory '", dir.string(), "': ", std::strerror(err));
}

// The step of a directory named "step_00000120", or -1 for anything else.
int64_t step_of(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0 || name.size() == std::strlen(kStepPrefix)) return -1;
  int64_t v = 0;
  for (size_t i = std::strlen(kStepPrefix); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace

std::string checkpoints_dir(const std::string& output_dir) { return (fs::path(output_dir) / "checkpoints").string(); }

std::string checkpoint_path(const std::string& output_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return (fs::path(checkpoints_dir(output_dir)) / name).string();
}

std::string checkpoint_temp_path(const std::string& output_dir, int64_t step, const std::string& writer) {
  const fs::path final_dir = checkpoint_path(output_dir, step);
  return (final_dir.parent_path() / (kTempPrefix + final_dir.filename().string() + "-" + writer)).string();
}

std::string begin_checkpoint(const std::string& output_dir, int64_t step, const std::string& writer) {
  INGOT_CHECK(step >= 0, "write_checkpoint: negative step ", step);
  const fs::path root = checkpoints_dir(output_dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  INGOT_CHECK(!ec, "cannot create checkpoint directory '", root.string(), "': ", ec.message());
  const fs::path tmp = checkpoint_temp_path(output_dir, step, writer);
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  INGOT_CHECK(!ec, "cannot create temporary checkpoint directory '", tmp.string(), "': ", ec.message());
  return tmp.string();
}

ManifestEntry write_checkpoint_file(const std::string& tmp, const CheckpointFile& f) {
  INGOT_CHECK(!f.name.empty() && f.name.find('/') == std::string::npos && f.name != kManifest,
              "write_checkpoint: bad file name '", f.name, "'");
  const fs::path p = fs::path(tmp) / f.name;
  f.write(p.string());  // writers are atomic and fsync the file (write_file_atomic / save_safetensors)
  return {fs::file_size(p), sha256_file(p.string())};
}

std::string commit_checkpoint(const std::string& output_dir, int64_t step, const std::string& tmp_dir,
                              const std::vector<std::pair<std::string, ManifestEntry>>& files) {
  const fs::path final_dir = checkpoint_path(output_dir, step);
  const fs::path root = final_dir.parent_path();
  const fs::path tmp = tmp_dir;
  std::error_code ec;
  try {
    nlohmann::ordered_json manifest;
    manifest["format"] = kFormat;
    manifest["version"] = kVersion;
    manifest["step"] = step;
    nlohmann::ordered_json listed = nlohmann::ordered_json::object();
    for (const auto& [name, entry] : files) {
      INGOT_CHECK(!name.empty() && name.find('/') == std::string::npos && name != kManifest && !listed.contains(name),
                  "write_checkpoint: bad or duplicate file name '", name, "'");
      INGOT_INTERNAL_CHECK(fs::is_regular_file(tmp / name, ec), "commit_checkpoint: '", name, "' is not in ",
                           tmp.string());
      listed[name] = {{"bytes", entry.bytes}, {"sha256", entry.sha256}};
    }
    manifest["files"] = std::move(listed);
    std::string text = manifest.dump(2) + "\n";
    write_file_atomic((tmp / kManifest).string(),
                      [&](std::FILE* out) { write_bytes(out, text.data(), text.size()); });
    fsync_dir(tmp);
    // Replace an older checkpoint of the same step only after the new one is complete.
    fs::path old;
    if (fs::exists(final_dir, ec)) {
      old = root / (".old-" + tmp.filename().string());
      fs::remove_all(old, ec);
      fs::rename(final_dir, old, ec);
      INGOT_CHECK(!ec, "cannot move the previous checkpoint '", final_dir.string(), "' aside: ", ec.message());
    }
    fs::rename(tmp, final_dir, ec);
    INGOT_CHECK(!ec, "cannot rename '", tmp.string(), "' to '", final_dir.string(), "': ", ec.message());
    fsync_dir(root);
    if (!old.empty()) fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return final_dir.string();
}

std::string write_checkpoint(const std::string& output_dir, int64_t step, const std::vector<CheckpointFile>& files) {
  const std::string tmp = begin_checkpoint(output_dir, step, std::to_string(::getpid()));
  std::vector<std::pair<std::string, ManifestEntry>> listed;
  try {
    for (const CheckpointFile& f : files) {
      for (const auto& l : listed)
        INGOT_CHECK(l.first != f.name, "write_checkpoint: bad or duplicate file name '", f.name, "'");
      listed.emplace_back(f.name, write_checkpoint_file(tmp, f));
    }
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  return commit_checkpoint(output_dir, step, tmp, listed);
}

namespace {

Manifest read_manifest(const std::string& dir, const std::vector<std::string>& required, bool checksum_all,
                       const std::vector<std::string>& checksummed) {
  const fs::path mpath = fs::path(dir) / kManifest;
  std::error_code ec;
  INGOT_CHECK(fs::is_directory(dir, ec), "checkpoint '", dir, "' does not exist or is not a directory");
  INGOT_CHECK(fs::is_regular_file(mpath, ec), "checkpoint '", dir,
              "' has no manifest.json (an incomplete or foreign directory); refusing to load it");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_file(mpath.string()));
  } catch (const nlohmann::json::exception& e) {
    INGOT_FAIL("checkpoint manifest '", mpath.string(), "' is not valid JSON: ", e.what());
  }
  auto bad = [&](const std::string& what) { INGOT_FAIL("checkpoint manifest '", mpath.string(), "': ", what); };
  if (!m.is_object() || m.value("format", "") != kFormat) bad("not an ingot checkpoint manifest (format)");
  if (!m.contains("version") || !m["version"].is_number_integer() || m["version"].get<int>() != kVersion)
    bad("unsupported version (expected " + std::to_string(kVersion) + ")");
  if (!m.contains("step") || !m["step"].is_number_integer()) bad("missing integer 'step'");
  if (!m.contains("files") || !m["files"].is_object()) bad("missing object 'files'");
  Manifest out;
  out.step = m["step"].get<int64_t>();
  for (const auto& [name, e] : m["files"].items()) {
    if (name.empty() || name.find('/') != std::string::npos || name == kManifest)
      bad("bad file name '" + name + "'");
    if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_number_unsigned() || !e.contains("sha256") ||
        !e["sha256"].is_string())
      bad("entry '" + name + "' needs 'bytes' and 'sha256'");
    ManifestEntry entry{e["bytes"].get<uint64_t>(), e["sha256"].get<std::string>()};
    const fs::path p = fs::path(dir) / name;
    INGOT_CHECK(fs::is_regular_file(p, ec), "checkpoint '", dir, "': file '", name,
                "' is listed in manifest.json but missing");
    uint64_t size = fs::file_size(p, ec);
    INGOT_CHECK(!ec && size == entry.bytes, "checkpoint '", dir, "': file '", name, "' has ", size,
                " bytes but manifest.json says ", entry.bytes, " (truncated or replaced)");
    out.files.emplace(name, std::move(entry));
  }
  for (const std::string& r : required)
    INGOT_CHECK(out.files.count(r), "checkpoint '", dir, "': manifest.json does not list the required file '", r,
                "'");
  if (checksum_all) {
    for (const auto& [name, entry] : out.files) verify_checkpoint_file(dir, name, entry);
  } else {
    for (const std::string& name : checksummed) {
      auto it = out.files.find(name);
      INGOT_CHECK(it != out.files.end(), "checkpoint '", dir, "': manifest.json does not list the file '", name, "'");
      verify_checkpoint_file(dir, name, it->second);
    }
  }
  return out;
}

}  // namespace

void verify_checkpoint_file(const std::string& dir, const std::string& name, const ManifestEntry& entry) {
  std::string sum = sha256_file((fs::path(dir) / name).string());
  INGOT_CHECK(sum == entry.sha256, "checkpoint '", dir, "': file '", name,
              "' does not match its checksum in manifest.json (sha256 ", sum, ", expected ", entry.sha256,
              "): the file is corrupted or was changed");
}

Manifest verify_checkpoint(const std::string& dir, const std::vector<std::string>& required) {
  return read_manifest(dir, required, true, {});
}

Manifest verify_checkpoint_sizes(const std::string& dir, const std::vector<std::string>& required,
                                 const std::vector<std::string>& checksummed) {
  return read_manifest(dir, required, false, checksummed);
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  fs::path root = checkpoints_dir(output_dir);
  if (!fs::is_directory(root, ec)) return out;
  for (const fs::directory_entry& d : fs::directory_iterator(root, ec)) {
    int64_t step = step_of(d.path().filename().string());
    if (step < 0 || !d.is_directory(ec) || !fs::is_regular_file(d.path() / kManifest, ec)) continue;
    out.emplace_back(step, d.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& output_dir) {
  auto all = list_checkpoints(output_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

std::vector<std::string> prune_checkpoints(const std::string& output_dir, int64_t keep_last) {
  std::vector<std::string> removed;
  std::error_code ec;
  fs::path root = checkpoints_dir(output_dir);
  if (!fs::is_directory(root, ec)) return removed;
  // Leftovers of a crashed save from an earlier process (this process's own are already gone).
  for (const fs::directory_entry& d : fs::directory_iterator(root, ec)) {
    std::string name = d.path().filename().string();
    if (name.rfind(kTempPrefix, 0) == 0 || name.rfind(".old-", 0) == 0) {
      fs::remove_all(d.path(), ec);
      removed.push_back(d.path().string());
    }
  }
  if (keep_last <= 0) return removed;
  auto all = list_checkpoints(output_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) {
    fs::remove_all(all[i].second, ec);
    INGOT_CHECK(!ec, "cannot remove old checkpoint '", all[i].second, "': ", ec.message());
    removed.push_back(all[i].second);
  }
  return removed;
}

}  // namespace ingot::recipes
