// SHA-256 (FIPS 180-4) through OpenSSL's EVP interface, for every layer that hashes bytes: checkpoint manifests and
// config hashes (recipes/hash.h), the compile cache's content keys (compile/cache/compile_cache.h: hash_bytes), and
// the compiler's in-memory structural keys (Key64: graphs, segments, kernel specs, options, renderer fingerprints).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace ingot {

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

// A 64-bit key from the SHA-256 of what was added: integers as 8 little-endian bytes, strings as their length (8
// bytes) and then their bytes, so no two sequences of additions feed the same bytes; value() is the digest's first 8
// bytes, little-endian. For keys that must not collide by accident (a kernel reused for another spec, a compiled
// graph for another graph), where a hand-mixed 64-bit hash gave no such assurance.
class Key64 {
 public:
  Key64& add(uint64_t x);
  Key64& add(std::string_view s);
  // The bytes alone, without their length: for a hash whose definition is one run of bytes (compile/cache's
  // hash_bytes: the seed, then the content).
  Key64& add_bytes(std::string_view s);
  uint64_t value();  // finishes; the object must not be added to afterwards

 private:
  Sha256 sha_;
};

}  // namespace ingot
