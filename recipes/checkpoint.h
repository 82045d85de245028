// Training-state checkpoints: a directory of files plus manifest.json, written all-or-nothing.
//
//   <output_dir>/checkpoints/step_00000120/
//     model.safetensors      the model's parameters and buffers, in the model's dtype
//     optimizer.safetensors  optimizer state ("step", "<param>.<state>") and, in bf16 runs, f32 masters
//     state.json             step, LR schedule, RNG states, data position, config hash, loss history
//     manifest.json          {"format": "ingot-checkpoint", "version": 1, "step": 120,
//                             "files": {"model.safetensors": {"bytes": N, "sha256": "..."}, ...}}
//
// Writing: every file goes into a hidden temp directory beside the final one, each file is fsynced, the
// manifest last; the temp directory is fsynced, renamed to its final name, and the parent fsynced. A crash
// at any point leaves either no checkpoint or a complete one (never a half-written directory under a final
// name). Reading verifies the manifest first: a missing, resized or changed file is refused, naming it.
//
// Several writers (the ranks of a sharded checkpoint, recipes/sharded_checkpoint.h) share one temp directory:
// one process opens it (begin_checkpoint), each writes its files into it (write_checkpoint_file) and hands
// the resulting manifest entries to the one that commits (commit_checkpoint), once every writer is done.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ingot::recipes {

// A file in a checkpoint: its name and a writer that puts its bytes into the stream.
struct CheckpointFile {
  std::string name;  // a plain file name, no directories
  std::function<void(const std::string& path)> write;  // writes the complete file at `path`
};

// "<output_dir>/checkpoints"
std::string checkpoints_dir(const std::string& output_dir);
// "<output_dir>/checkpoints/step_00000120"
std::string checkpoint_path(const std::string& output_dir, int64_t step);

struct ManifestEntry {
  uint64_t bytes = 0;
  std::string sha256;
};

// Writes the files and manifest.json to checkpoint_path(output_dir, step) atomically and returns that path.
// An existing checkpoint of the same step is replaced only once the new one is complete.
std::string write_checkpoint(const std::string& output_dir, int64_t step, const std::vector<CheckpointFile>& files);

// The pieces of write_checkpoint for several writers. begin_checkpoint creates a fresh, empty temp directory
// for `step` and returns it; `writer` names it ("pid" gives one per process, a fixed name one that other
// processes can compute). write_checkpoint_file writes one file into it (fsynced) and returns its size and
// SHA-256. commit_checkpoint writes manifest.json listing `files` (in that order, each already in `tmp`),
// fsyncs and renames `tmp` to checkpoint_path(output_dir, step) as write_checkpoint does (an existing
// checkpoint of that step replaced only then) and returns the path; on failure it removes `tmp`.
std::string begin_checkpoint(const std::string& output_dir, int64_t step, const std::string& writer);
std::string checkpoint_temp_path(const std::string& output_dir, int64_t step, const std::string& writer);
ManifestEntry write_checkpoint_file(const std::string& tmp, const CheckpointFile& file);
std::string commit_checkpoint(const std::string& output_dir, int64_t step, const std::string& tmp,
                              const std::vector<std::pair<std::string, ManifestEntry>>& files);

struct Manifest {
  int64_t step = 0;
  std::map<std::string, ManifestEntry> files;
};

// Reads <dir>/manifest.json and checks every listed file's size and SHA-256, and that each name in
// `required` is listed. Throws ingot::Error naming the checkpoint and the offending file.
Manifest verify_checkpoint(const std::string& dir, const std::vector<std::string>& required = {});
// The same checks where only some files are read: every listed file must exist with its size, and the files
// named in `checksummed` (each listed) must match their SHA-256; verify_checkpoint_file checks one later.
Manifest verify_checkpoint_sizes(const std::string& dir, const std::vector<std::string>& required,
                                 const std::vector<std::string>& checksummed);
void verify_checkpoint_file(const std::string& dir, const std::string& name, const ManifestEntry& entry);

// Complete checkpoints (those with a manifest.json) under <output_dir>/checkpoints, by increasing step.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& output_dir);
std::optional<std::string> latest_checkpoint(const std::string& output_dir);
// Removes all but the newest `keep_last` complete checkpoints (keep_last <= 0 keeps everything) and any
// temp directory left by a crashed save. Returns the removed paths.
std::vector<std::string> prune_checkpoints(const std::string& output_dir, int64_t keep_last);

}  // namespace ingot::recipes
