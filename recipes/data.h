// Text data for pretraining: a UTF-8 text file tokenized to bytes (vocabulary 256; the BPE tokenizer of the
// recipes issue replaces this), split into a leading train part and a trailing validation part, and sampled
// as random windows of T+1 tokens (inputs are the first T, targets the last T).
//
// Sampling is a pure function of (seed, split, batch index): batch i is the same whatever came before, on
// any machine, so a resumed run continues with exactly the batches it would have drawn.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace ingot::recipes {

enum class Split { Train, Val };

// What keeps `path` from being read as text: "" when it is a non-empty UTF-8 file, else the problem
// ("is empty", "is not UTF-8 text (invalid byte 0xe9 at byte offset 3, line 1)", "cannot be read: ...").
// Config checks call it so that `ingot validate` finds what TextDataset and the dataset readers would.
std::string text_file_problem(const std::string& path);

// The token counts of the train and validation splits a TextDataset makes of `bytes` bytes of text (one token a
// byte): the last round(bytes * val_fraction) are the validation split. Config checks use it to find a split
// shorter than one block before the run.
std::pair<int64_t, int64_t> split_sizes(int64_t bytes, double val_fraction);

class TextDataset {
 public:
  // Reads `path` (must be valid UTF-8, non-empty). The last `val_fraction` of the bytes is the validation
  // split. Throws ingot::Error naming the file.
  static TextDataset from_file(const std::string& path, double val_fraction);
  // `name` is what error messages call the text.
  static TextDataset from_text(const std::string& text, double val_fraction, const std::string& name = "text");

  static constexpr int64_t kVocabSize = 256;
  int64_t vocab_size() const { return kVocabSize; }
  const std::vector<int32_t>& tokens(Split s) const { return s == Split::Train ? train_ : val_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::vector<int32_t> train_, val_;
};

// Draws batches of windows [batch, block + 1] (i64, CPU) from one split of a dataset. Data parallel: rank r of
// `world` reads only rows [r*batch/world, (r+1)*batch/world) of each global batch, so the global batch (and the
// training it drives) does not depend on the world size.
class BatchSampler {
 public:
  // Throws when the split is shorter than block + 1 tokens or world does not divide batch. The dataset must
  // outlive the sampler.
  BatchSampler(const TextDataset& data, Split split, int64_t batch, int64_t block, uint64_t seed, int rank = 0,
               int world = 1);
  // This rank's rows of global batch number `index` ([batch / world, block + 1]): row b of the global batch
  // starts at a uniform random offset drawn from Philox(seed, index * batch + b).
  Tensor batch(int64_t index) const;
  // batch(position()), then advances the position.
  Tensor next() { return batch(position_++); }
  int64_t position() const { return position_; }
  void set_position(int64_t p) { position_ = p; }

 private:
  const std::vector<int32_t>* tokens_;
  int64_t batch_, block_;
  uint64_t seed_;
  int64_t row_begin_ = 0, row_end_ = 0;
  int64_t position_ = 0;
};

}  // namespace ingot::recipes
