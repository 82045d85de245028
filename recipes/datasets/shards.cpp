#include "recipes/datasets/shards.h"

#include <bit>
#include <cstring>

#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::recipes::datasets {

namespace {
constexpr char kMagic[8] = {'I', 'N', 'G', 'O', 'T', 'T', 'O', 'K'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;

template <typename T>
void put(std::string& out, T v) {
  static_assert(std::endian::native == std::endian::little, "shards are little-endian; add byte swaps for this host");
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T get(const std::string& in, size_t off) {
  T v;
  std::memcpy(&v, in.data() + off, sizeof(T));
  return v;
}
}  // namespace

void write_token_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size) {
  INGOT_CHECK(vocab_size > 0 && vocab_size <= (int64_t(1) << 32), "token shard ", path, ": vocab size ", vocab_size,
              " out of range (1 .. 2^32)");
  const uint32_t width = vocab_size <= 65536 ? 2 : 4;
  std::string buf;
  buf.reserve(kHeaderBytes + tokens.size() * width);
  buf.append(kMagic, sizeof(kMagic));
  put<uint32_t>(buf, kVersion);
  put<uint32_t>(buf, width);
  put<uint64_t>(buf, tokens.size());
  put<uint64_t>(buf, uint64_t(vocab_size));
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t t = tokens[i];
    INGOT_CHECK(t >= 0 && t < vocab_size, "token shard ", path, ": token ", i, " = ", t, " is outside the vocabulary [0, ",
                vocab_size, ")");
    if (width == 2) put<uint16_t>(buf, uint16_t(t));
    else put<uint32_t>(buf, uint32_t(t));
  }
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, buf.data(), buf.size()); });
}

TokenShard read_token_shard(const std::string& path) {
  std::string in = read_file(path);
  INGOT_CHECK(in.size() >= kHeaderBytes, "token shard ", path, ": ", in.size(), " bytes, shorter than the ",
              kHeaderBytes, "-byte header");
  INGOT_CHECK(std::memcmp(in.data(), kMagic, sizeof(kMagic)) == 0, "token shard ", path,
              ": bad magic (expected \"INGOTTOK\"); not a token shard");
  uint32_t version = get<uint32_t>(in, 8), width = get<uint32_t>(in, 12);
  uint64_t count = get<uint64_t>(in, 16), vocab = get<uint64_t>(in, 24);
  INGOT_CHECK(version == kVersion, "token shard ", path, ": version ", version, ", expected ", kVersion);
  INGOT_CHECK(width == 2 || width == 4, "token shard ", path, ": ", width, " bytes per token, expected 2 or 4");
  INGOT_CHECK(vocab > 0 && vocab <= (uint64_t(1) << 32), "token shard ", path, ": vocab size ", vocab, " out of range");
  INGOT_CHECK(count <= (in.size() - kHeaderBytes) / width && kHeaderBytes + count * width == in.size(), "token shard ",
              path, ": header says ", count, " tokens of ", width, " bytes but the file holds ", in.size() - kHeaderBytes,
              " bytes after the header (truncated or corrupted)");
  TokenShard s;
  s.vocab_size = int64_t(vocab);
  s.tokens.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t t = width == 2 ? get<uint16_t>(in, kHeaderBytes + i * 2) : get<uint32_t>(in, kHeaderBytes + i * 4);
    INGOT_CHECK(t < vocab, "token shard ", path, ": token ", i, " = ", t, " is outside the vocabulary (size ", vocab, ")");
    s.tokens[i] = int32_t(t);
  }
  return s;
}

}  // namespace ingot::recipes::datasets
