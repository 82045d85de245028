// The TCP store's wire format (internal to store.cpp and store_server.cpp).
// Every message is a frame: u32 body length (little endian), then the body.
//   request body:  u8 op, then op arguments (strings are u32 length + bytes, integers are i64)
//   reply body:    u8 status (Status), then the payload
// Ops and their arguments / OK payloads:
//   kSet     key value                 -> -
//   kGet     key timeout_ms            -> value            (kTimeout if the key never appears)
//   kAdd     key delta                 -> new value (i64)
//   kCas     key expected desired      -> value after
//   kDelete  key                       -> u8 existed
//   kCheck   n keys...                 -> u8 all present
//   kWait    n keys... timeout_ms      -> -                (kTimeout + u32 n + the missing keys)
//   kNumKeys                           -> i64
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace ingot::distributed::wire {

enum Op : uint8_t { kSet = 1, kGet, kAdd, kCas, kDelete, kCheck, kWait, kNumKeys };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kFailed = 2 };

// Frames larger than this are refused: the store carries ids and addresses, not tensors.
constexpr uint32_t kMaxFrame = 64u << 20;

struct Writer {
  std::string buf;
  Writer() { buf.resize(4); }  // room for the frame length
  Writer& u8(uint8_t v) {
    buf.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(uint32_t v) {
    char b[4];
    std::memcpy(b, &v, 4);
    buf.append(b, 4);
    return *this;
  }
  Writer& i64(int64_t v) {
    char b[8];
    std::memcpy(b, &v, 8);
    buf.append(b, 8);
    return *this;
  }
  Writer& str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    buf.append(s);
    return *this;
  }
  // Fills in the frame length and returns the frame.
  std::string finish() {
    uint32_t n = static_cast<uint32_t>(buf.size() - 4);
    std::memcpy(buf.data(), &n, 4);
    return std::move(buf);
  }
};

// Reads a frame body; any overrun is an Error (a malformed frame), never an out-of-bounds read.
struct Reader {
  const std::string& b;
  size_t pos = 0;
  explicit Reader(const std::string& body) : b(body) {}
  void need(size_t n) const {
    INGOT_CHECK(pos + n <= b.size(), "tcp store: malformed message: needs ", n, " more bytes at offset ", pos,
                " of ", b.size());
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(b[pos++]);
  }
  uint32_t u32() {
    need(4);
    uint32_t v;
    std::memcpy(&v, b.data() + pos, 4);
    pos += 4;
    return v;
  }
  int64_t i64() {
    need(8);
    int64_t v;
    std::memcpy(&v, b.data() + pos, 8);
    pos += 8;
    return v;
  }
  std::string str() {
    uint32_t n = u32();
    need(n);
    std::string s = b.substr(pos, n);
    pos += n;
    return s;
  }
  std::vector<std::string> strs() {
    uint32_t n = u32();
    std::vector<std::string> v;
    for (uint32_t i = 0; i < n; ++i) v.push_back(str());
    return v;
  }
};

}  // namespace ingot::distributed::wire
