#include "recipes/datasets/loader.h"

#include <numeric>

#include "runtime/error.h"

namespace ingot::recipes::datasets {

namespace {
// SplitMix64: a small, portable generator, so the shuffle is the same with every standard library
// (std::shuffle and the std distributions are implementation-defined).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

DataLoader::DataLoader(const std::vector<Example>& examples, const LoaderOptions& opts) : opts_(opts) {
  INGOT_CHECK(opts.seq_len >= 1, "data loader: seq_len must be >= 1, got ", opts.seq_len);
  INGOT_CHECK(opts.global_batch_size >= 1, "data loader: global batch size must be >= 1, got ", opts.global_batch_size);
  INGOT_CHECK(opts.world_size >= 1 && opts.rank >= 0 && opts.rank < opts.world_size, "data loader: rank ", opts.rank,
              " is outside world size ", opts.world_size);
  INGOT_CHECK(opts.global_batch_size % opts.world_size == 0, "data loader: global batch size ",
              opts.global_batch_size, " is not divisible by world size ", opts.world_size);
  for (size_t i = 0; i < examples.size(); ++i)
    INGOT_CHECK(examples[i].ids.size() == examples[i].labels.size(), "data loader: example ", i, " has ",
                examples[i].ids.size(), " ids but ", examples[i].labels.size(), " labels");
  if (opts.pack) {
    for (size_t i = 0; i < examples.size(); ++i) {
      const Example& e = examples[i];
      stream_ids_.insert(stream_ids_.end(), e.ids.begin(), e.ids.end());
      stream_labels_.insert(stream_labels_.end(), e.labels.begin(), e.labels.end());
      stream_docs_.insert(stream_docs_.end(), e.ids.size(), static_cast<int64_t>(i));
    }
    packed_rows_ = stream_ids_.size() > size_t(opts.seq_len) ? (stream_ids_.size() - 1) / size_t(opts.seq_len) : 0;
  } else {
    for (const Example& e : examples)
      if (e.ids.size() >= 2) rows_.push_back(e);  // a single token has no next-token target
  }
  INGOT_CHECK(batches_per_epoch() >= 1, "data loader: ", num_rows(), " rows of ", opts.seq_len,
              " tokens, fewer than one global batch of ", opts.global_batch_size, " (",
              opts.pack ? std::to_string(stream_ids_.size()) + " tokens in all" : std::to_string(rows_.size()) + " examples",
              ")");
}

std::vector<int64_t> DataLoader::permutation(int64_t epoch) const {
  std::vector<int64_t> perm(static_cast<size_t>(num_rows()));
  std::iota(perm.begin(), perm.end(), int64_t(0));
  if (!opts_.shuffle) return perm;
  uint64_t state = opts_.seed * 0x100000001B3ull ^ uint64_t(epoch) * 0xD6E8FEB86659FD93ull;
  for (size_t i = perm.size(); i > 1; --i) {
    size_t j = size_t(splitmix64(state) % i);  // bias < i / 2^64: negligible
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

void DataLoader::fill_row(int64_t r, std::vector<int64_t>& ids, std::vector<int64_t>& labels,
                          std::vector<int64_t>& mask, std::vector<int64_t>& positions) const {
  const size_t T = size_t(opts_.seq_len);
  if (opts_.pack) {
    size_t start = size_t(r) * T;
    int64_t pos = 0;
    for (size_t t = 0; t < T; ++t) {
      const size_t s = start + t;
      // A row's first token starts a document too: what came before it is in another row.
      pos = t > 0 && stream_docs_[s] == stream_docs_[s - 1] ? pos + 1 : 0;
      ids.push_back(stream_ids_[s]);
      labels.push_back(stream_docs_[s + 1] == stream_docs_[s] ? stream_labels_[s + 1] : kIgnoreIndex);
      mask.push_back(1);
      positions.push_back(pos);
    }
    return;
  }
  const Example& e = rows_[size_t(r)];
  size_t n = std::min(e.ids.size(), T + 1);
  for (size_t t = 0; t < T; ++t) {
    bool real = t < n;
    ids.push_back(real ? e.ids[t] : opts_.pad_id);
    labels.push_back(t + 1 < n ? e.labels[t + 1] : kIgnoreIndex);
    mask.push_back(real ? 1 : 0);
  }
}

Batch DataLoader::batch_at(DataPosition pos) const {
  INGOT_CHECK(pos.epoch >= 0 && pos.index >= 0 && pos.index < batches_per_epoch(), "data loader: position (epoch ",
              pos.epoch, ", batch ", pos.index, ") is outside the ", batches_per_epoch(), " batches of an epoch");
  if (cached_epoch_ != pos.epoch) {
    cached_perm_ = permutation(pos.epoch);
    cached_epoch_ = pos.epoch;
  }
  const int64_t local = opts_.global_batch_size / opts_.world_size;
  const int64_t first = pos.index * opts_.global_batch_size + opts_.rank * local;
  std::vector<int64_t> ids, labels, mask, positions;
  ids.reserve(size_t(local * opts_.seq_len));
  labels.reserve(ids.capacity());
  mask.reserve(ids.capacity());
  for (int64_t b = 0; b < local; ++b) fill_row(cached_perm_[size_t(first + b)], ids, labels, mask, positions);
  Batch out;
  for (int64_t l : labels) out.num_loss_tokens += l != kIgnoreIndex;
  out.input_ids = from_vector_i64(ids, {local, opts_.seq_len});
  out.labels = from_vector_i64(labels, {local, opts_.seq_len});
  out.attention_mask = from_vector_i64(mask, {local, opts_.seq_len});
  if (opts_.pack) out.positions = from_vector_i64(positions, {local, opts_.seq_len});
  return out;
}

Batch DataLoader::next() {
  Batch b = batch_at(pos_);
  if (++pos_.index == batches_per_epoch()) {
    pos_.index = 0;
    ++pos_.epoch;
  }
  return b;
}

void DataLoader::set_position(DataPosition pos) {
  INGOT_CHECK(pos.epoch >= 0 && pos.index >= 0 && pos.index < batches_per_epoch(), "data loader: cannot resume at (epoch ",
              pos.epoch, ", batch ", pos.index, "): an epoch has ", batches_per_epoch(), " batches");
  pos_ = pos;
}

}  // namespace ingot::recipes::datasets
