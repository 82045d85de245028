#include "recipes/data.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/rng.h"

namespace ingot::recipes {

namespace {

// Offset of the first byte that is not part of a well-formed UTF-8 sequence, or npos.
size_t find_invalid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || (len == 2 && c < 0xc2) || i + len > n) return i;
    for (size_t k = 1; k < len; ++k)
      if ((p[i + k] & 0xc0) != 0x80) return i;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3f);
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
      return i;
    i += len;
  }
  return std::string::npos;
}

// The problem with `text` as UTF-8 ("" when there is none).
std::string utf8_problem(const std::string& text) {
  if (text.empty()) return "is empty";
  size_t bad = find_invalid_utf8(text);
  if (bad == std::string::npos) return "";
  int64_t line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n');
  char hex[8];
  std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned>(static_cast<unsigned char>(text[bad])));
  return "is not UTF-8 text (invalid byte 0x" + std::string(hex) + " at byte offset " + std::to_string(bad) +
         ", line " + std::to_string(line) + ")";
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  INGOT_CHECK(in.good(), path, ": cannot open text file: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  INGOT_CHECK(!in.bad(), path, ": cannot read text file");
  return ss.str();
}

// Keeps the train and validation streams of one seed apart.
constexpr uint64_t kValSeedSalt = 0x9e3779b97f4a7c15ull;

}  // namespace

std::string text_file_problem(const std::string& path) {
  try {
    return utf8_problem(read_text_file(path));
  } catch (const Error& e) {
    return std::string("cannot be read: ") + e.what();
  }
}

std::pair<int64_t, int64_t> split_sizes(int64_t bytes, double val_fraction) {
  const int64_t n_val = std::llround(static_cast<double>(bytes) * val_fraction);
  return {bytes - n_val, n_val};
}

TextDataset TextDataset::from_file(const std::string& path, double val_fraction) {
  return from_text(read_text_file(path), val_fraction, path);
}

TextDataset TextDataset::from_text(const std::string& text, double val_fraction, const std::string& name) {
  INGOT_CHECK(val_fraction >= 0 && val_fraction < 1, name, ": val_fraction must be in [0, 1), got ", val_fraction);
  const std::string problem = utf8_problem(text);
  INGOT_CHECK(problem.empty(), name, ": ", problem);
  TextDataset d;
  d.name_ = name;
  const auto [train_tokens, val_tokens] = split_sizes(static_cast<int64_t>(text.size()), val_fraction);
  const size_t n_train = static_cast<size_t>(train_tokens), n_val = static_cast<size_t>(val_tokens);
  d.train_.reserve(n_train);
  d.val_.reserve(n_val);
  for (size_t i = 0; i < text.size(); ++i)
    (i < n_train ? d.train_ : d.val_).push_back(static_cast<unsigned char>(text[i]));
  return d;
}

BatchSampler::BatchSampler(const TextDataset& data, Split split, int64_t batch, int64_t block, uint64_t seed, int rank,
                           int world)
    : tokens_(&data.tokens(split)),
      batch_(batch),
      block_(block),
      seed_(split == Split::Val ? seed ^ kValSeedSalt : seed) {
  INGOT_CHECK(batch >= 1 && block >= 1, "BatchSampler: batch and block must be >= 1, got ", batch, " and ", block);
  INGOT_CHECK(world >= 1 && rank >= 0 && rank < world && batch % world == 0, "BatchSampler: rank ", rank, " of ",
              world, " cannot take an equal share of a global batch of ", batch);
  row_begin_ = rank * (batch / world);
  row_end_ = row_begin_ + batch / world;
  const char* which = split == Split::Train ? "train" : "validation";
  INGOT_CHECK(static_cast<int64_t>(tokens_->size()) >= block + 1, data.name(), ": the ", which, " split has ",
              tokens_->size(), " tokens, fewer than block_size + 1 = ", block + 1,
              " (use a longer text, a smaller block_size, or a different val_fraction)");
}

Tensor BatchSampler::batch(int64_t index) const {
  INGOT_CHECK(index >= 0, "BatchSampler: negative batch index ", index);
  const uint64_t n_windows = tokens_->size() - static_cast<uint64_t>(block_);
  const int64_t rows = row_end_ - row_begin_;
  std::vector<int64_t> out(static_cast<size_t>(rows * (block_ + 1)));
  for (int64_t b = row_begin_; b < row_end_; ++b) {
    Philox4 r = philox4x32_10(seed_, static_cast<uint64_t>(index * batch_ + b));
    uint64_t start = ((static_cast<uint64_t>(r.v[0]) << 32) | r.v[1]) % n_windows;
    for (int64_t t = 0; t <= block_; ++t) out[(b - row_begin_) * (block_ + 1) + t] = (*tokens_)[start + t];
  }
  return from_vector_i64(out, {rows, block_ + 1});
}

}  // namespace ingot::recipes
