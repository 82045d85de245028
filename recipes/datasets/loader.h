// Fixed-shape training batches from examples (sources.h), for static shapes under the compiler:
//   packing  all examples concatenated into one token stream, cut into rows of seq_len + 1 tokens that
//            overlap by one (row r covers stream[r*seq_len, r*seq_len + seq_len]); no padding at all. The
//            examples stay apart: `positions` restarts at 0 where an example starts (and at a row's first
//            token), the model attends only within an example, and the last token of an example has no
//            target (the next example's first token is not predicted from it)
//   padding  one example per row, truncated to seq_len + 1 tokens, padded with pad_id; attention_mask marks
//            real tokens
// A row's inputs are its first seq_len tokens and its labels the last seq_len (the next-token targets), with
// kIgnoreIndex for prompt tokens and padding.
//
// Order and sharding: rows are shuffled per epoch by a permutation seeded by (seed, epoch), identical on
// every machine. Global batch g of an epoch is rows perm[g*B, (g+1)*B) for the global batch size B; rank r
// of world_size W takes the contiguous slice [r*B/W, (r+1)*B/W) of it, so the global batch, and the
// training it drives, does not depend on W. A trailing partial batch is dropped.
//
// Position: (epoch, index of the next global batch within it); a checkpoint saves it and set_position()
// resumes exactly where the run stopped.
#pragma once

#include <cstdint>
#include <vector>

#include "recipes/datasets/sources.h"
#include "runtime/tensor.h"

namespace ingot::recipes::datasets {

struct LoaderOptions {
  int64_t seq_len = 0;            // T
  int64_t global_batch_size = 0;  // B, rows per step over all ranks
  bool pack = true;
  int32_t pad_id = 0;  // padding mode: the token filling rows (masked from loss and attention)
  bool shuffle = true;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
};

// Tensors are CPU i64 of shape [global_batch_size / world_size, seq_len].
struct Batch {
  Tensor input_ids;
  Tensor labels;          // kIgnoreIndex where no loss
  Tensor attention_mask;  // 1 for real tokens, 0 for padding (all ones when packing)
  Tensor positions;       // packing: each token's position within its example's part of the row; else undefined
  int64_t num_loss_tokens = 0;  // labels that count, in this rank's part
};

struct DataPosition {
  int64_t epoch = 0;
  int64_t index = 0;  // next global batch within the epoch
  bool operator==(const DataPosition&) const = default;
};

class DataLoader {
 public:
  // Throws when the options are inconsistent (seq_len or batch size < 1, batch not divisible by world_size,
  // rank out of range) or when there are fewer rows than one global batch.
  DataLoader(const std::vector<Example>& examples, const LoaderOptions& opts);

  // The batch at the current position; then advances (to the next epoch after the last full batch).
  Batch next();
  // Batch `index` of `epoch`, without moving.
  Batch batch_at(DataPosition pos) const;

  DataPosition position() const { return pos_; }
  // Throws when index is outside [0, batches_per_epoch()).
  void set_position(DataPosition pos);
  int64_t batches_per_epoch() const { return num_rows() / opts_.global_batch_size; }
  int64_t num_rows() const { return opts_.pack ? int64_t(packed_rows_) : int64_t(rows_.size()); }
  const LoaderOptions& options() const { return opts_; }

 private:
  // Row r as seq_len + 1 (id, label) pairs, padded.
  void fill_row(int64_t r, std::vector<int64_t>& ids, std::vector<int64_t>& labels, std::vector<int64_t>& mask,
                std::vector<int64_t>& positions) const;
  std::vector<int64_t> permutation(int64_t epoch) const;

  LoaderOptions opts_;
  // packing: the concatenated stream
  std::vector<int32_t> stream_ids_, stream_labels_;
  std::vector<int64_t> stream_docs_;  // the example each stream token comes from
  size_t packed_rows_ = 0;
  // padding: one example per row
  std::vector<Example> rows_;
  DataPosition pos_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_perm_;
};

}  // namespace ingot::recipes::datasets
