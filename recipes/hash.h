// Checksums used by checkpoints and event files:
//   SHA-256 (FIPS 180-4, computed by OpenSSL's EVP interface) for checkpoint manifests and config hashes,
//   CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) with TensorFlow's mask for tfevents records.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace ingot::recipes {

// Incremental SHA-256: update() any number of times, then hex() (or digest()) once.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();  // finishes the hash; the object must not be updated afterwards
  std::string hex();                 // digest() as 64 lowercase hex digits

 private:
  evp_md_ctx_st* ctx_;
};

std::string sha256_hex(std::string_view data);
// Streams the file through SHA-256; throws ingot::Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TensorFlow's record checksum: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace ingot::recipes
