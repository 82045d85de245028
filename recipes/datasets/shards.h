// Pre-tokenized binary shards: a fixed 32-byte header then the tokens, little-endian.
//   bytes 0-7   magic "INGOTTOK"
//   bytes 8-11  u32 version (1)
//   bytes 12-15 u32 bytes per token: 2 (uint16, vocabularies up to 65,536) or 4 (uint32)
//   bytes 16-23 u64 number of tokens
//   bytes 24-31 u64 vocabulary size (every token is below it)
// Writes are atomic (write_file_atomic); reads check the magic, version, width, length and every token
// against the vocabulary size, naming the file on any mismatch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ingot::recipes::datasets {

// Picks uint16 when vocab_size <= 65536. Throws on a token outside [0, vocab_size).
void write_token_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size);

struct TokenShard {
  std::vector<int32_t> tokens;
  int64_t vocab_size = 0;
};
TokenShard read_token_shard(const std::string& path);

}  // namespace ingot::recipes::datasets
