#include "runtime/sha256.h"

#include <openssl/evp.h>

#include "runtime/error.h"

namespace ingot {

// OpenSSL picks the fastest SHA-256 the CPU has (SHA-NI, AVX2): a checkpoint of several GB is hashed at
// memory speed when it is written and again when it is loaded.
Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  INGOT_CHECK(ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1,
              "SHA-256: OpenSSL could not set up a digest context");
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::update(const void* data, size_t n) {
  INGOT_CHECK(EVP_DigestUpdate(ctx_, data, n) == 1, "SHA-256: OpenSSL digest update failed");
}

std::array<uint8_t, 32> Sha256::digest() {
  std::array<uint8_t, 32> out;
  unsigned int n = 0;
  INGOT_CHECK(EVP_DigestFinal_ex(ctx_, out.data(), &n) == 1 && n == out.size(), "SHA-256: OpenSSL digest failed");
  return out;
}

std::string Sha256::hex() {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : digest()) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 15]);
  }
  return s;
}

Key64& Key64::add(uint64_t x) {
  unsigned char le[8];
  for (int k = 0; k < 8; ++k) le[k] = static_cast<unsigned char>(x >> (8 * k));
  sha_.update(le, sizeof le);
  return *this;
}

Key64& Key64::add(std::string_view s) { return add(static_cast<uint64_t>(s.size())).add_bytes(s); }

Key64& Key64::add_bytes(std::string_view s) {
  sha_.update(s);
  return *this;
}

uint64_t Key64::value() {
  const std::array<uint8_t, 32> md = sha_.digest();
  uint64_t h = 0;
  for (int k = 0; k < 8; ++k) h |= static_cast<uint64_t>(md[k]) << (8 * k);
  return h;
}

}  // namespace ingot
