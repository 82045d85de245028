// Checksums used by checkpoints and event files:
//   SHA-256 (FIPS 180-4, computed by OpenSSL's EVP interface) for checkpoint manifests and config hashes,
//   CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) with TensorFlow's mask for tfevents records.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/sha256.h"

namespace ingot::recipes {

// SHA-256 itself: ingot::Sha256 (runtime/sha256.h).
std::string sha256_hex(std::string_view data);
// Streams the file through SHA-256; throws ingot::Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TensorFlow's record checksum: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace ingot::recipes
