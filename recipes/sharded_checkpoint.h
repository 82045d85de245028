// Sharded training checkpoints (ZeRO-2/3): every rank writes the slices it owns, one index says where each
// tensor's slices are, so a checkpoint written by N ranks loads under any number of ranks.
//
//   <output_dir>/checkpoints/step_00000120/
//     model.shard-00002-of-00004.safetensors      rank 2's slices of the trained weights (parameters' dtype)
//     optimizer.shard-00002-of-00004.safetensors  rank 2's slices of the optimizer state and f32 masters
//     index.json     {"format": "ingot-sharded-checkpoint", "version": 1, "world_size": 4, "zero_stage": 3,
//                     "tensors": {"model/h.0.attn.weight": {"dtype": "f32", "shape": [48, 16],
//                                 "pieces": [["model.shard-00000-of-00004.safetensors", 0, 312], ...]}, ...},
//                     "aliases": {"model/lm_head.weight": "model/wte.weight"}}
//     state.json, manifest.json                   as in a whole checkpoint (recipes/train_state.h)
//
// Tensors are named as in a whole checkpoint with the file as prefix: "model/<state_dict name>" and
// "optimizer/step", "optimizer/<param index>.<state>", "optimizer/master.<param index>" (Note [ZeRO-1
// checkpoints hold the full optimizer state]: what a plain optimizer over the parameters holds). Each rank owns
// chunk r of every flat buffer (a DDP bucket or an FSDP unit, padded to a multiple of the world size); a
// parameter's elements in that chunk are one contiguous piece of its flattened values, stored as a 1-D tensor
// under the tensor's name in that rank's file. Counters and entries that are not trained parameters (buffers,
// frozen weights) are stored whole by rank 0.
//
// AdamW8bit's moments are stored as the shards hold them (Note [Moments in their blocks], .cpp): each rank's
// codes and block scales of buffer b as "blocks/<b>.exp_avg_q" etc. (version 2 of the index), and every
// "optimizer/<p>.exp_avg" of those buffers is listed with "blocks" (where in them it lies) instead of "pieces":
// reading it decodes its elements. About 2 bytes a parameter instead of 8; a run with the writers' layout loads
// the codes themselves (block_source).
//
// Writing follows recipes/checkpoint.h's multi-writer commit: rank 0 opens the shared temp directory, every
// rank writes and fsyncs its files, the ranks exchange sizes and checksums, then rank 0 writes index.json,
// state.json and manifest.json and renames the directory. Every rank writes into that one directory, so a job
// spanning several hosts needs output_dir on a filesystem they share. Reading checks every listed file's size at open and a
// file's SHA-256 before its first use, so a missing or changed shard file is an error naming it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "recipes/checkpoint.h"
#include "runtime/tensor.h"

namespace ingot::recipes {

// One flat buffer over the trained parameters (indices), each at its element offset; padded_numel divides by
// the world size and rank r owns elements [r * padded_numel / world, (r + 1) * padded_numel / world).
struct FlatLayout {
  std::vector<size_t> params;
  std::vector<int64_t> offsets;
  int64_t padded_numel = 0;
};

// What one rank saves.
struct ShardedState {
  int rank = 0, world = 1, zero_stage = 2;
  std::vector<FlatLayout> layout;
  std::vector<std::string> names;                     // each trained parameter's model state_dict name
  std::vector<Shape> shapes;                          // each trained parameter's shape
  std::vector<Tensor> weights;                        // this rank's chunk of every flat buffer
  std::map<std::string, Tensor> optimizer;            // the shards' optimizer state: "step", "<buffer>.<state>"
                                                      // (AdamW8bit: its codes and absmax as state_dict() has them)
  std::vector<Tensor> masters;                        // f32 master chunks per buffer, or none
  std::map<std::string, std::string> aliases;         // state_dict names of tied parameters -> their name
  std::vector<std::pair<std::string, Tensor>> whole;  // rank 0: state_dict entries that are not trained
};

bool is_sharded_checkpoint(const std::string& dir);

// This rank's files (model and optimizer slices) and, for rank 0, index.json.
std::vector<CheckpointFile> shard_files(const ShardedState& s);
CheckpointFile shard_index_file(const ShardedState& s);

class ShardedCheckpoint {
 public:
  // Reads index.json and manifest.json, checks every listed file's size and the index's and state.json's
  // checksums. Throws ingot::Error naming the checkpoint and the file.
  static ShardedCheckpoint open(const std::string& dir);

  const std::string& dir() const;
  int world_size() const;
  // Tensor names (aliases included) starting with `prefix`, sorted.
  std::vector<std::string> names(const std::string& prefix) const;
  bool has(const std::string& name) const;
  DType dtype(const std::string& name) const;
  const Shape& shape(const std::string& name) const;
  // The whole tensor, assembled from its pieces.
  Tensor read(const std::string& name) const;
  // Elements [begin, end) of the flattened tensor, reading only the pieces that overlap them.
  Tensor read_flat(const std::string& name, int64_t begin, int64_t end) const;
  // Rank `rank` of `world`'s chunk of a flat buffer: the elements of param `p`'s tensor `key(p)` where the
  // layout puts them, zeros in the padding.
  Tensor read_chunk(const FlatLayout& layout, int rank, int world, DType dtype,
                    const std::function<std::string(size_t)>& key) const;
  // Bytes of tensor data read so far (every piece counted once per read).
  uint64_t bytes_read() const;

  // Where a tensor stored in 8-bit blocks lies: the writers' codes and absmax of its buffer ("blocks/..."), its
  // element offset in that buffer, the writers' chunk (elements a rank), and whether the signed map decodes it;
  // nullopt for a tensor stored as its elements.
  struct BlockSource {
    std::string codes, absmax;
    int64_t offset = 0, chunk = 0;
    bool signed_map = true;
  };
  std::optional<BlockSource> block_source(const std::string& name) const;

  struct Impl;

 private:
  Tensor read_blocks(const BlockSource& b, int64_t begin, int64_t end) const;

  std::shared_ptr<Impl> impl_;
};

}  // namespace ingot::recipes
