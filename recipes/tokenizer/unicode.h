// UTF-8 helpers shared by the tokenizer stages: walking code points, the GPT-2 byte <-> printable-character
// map of byte-level BPE, lossy repair of invalid UTF-8 (what decode returns for a cut multi-byte character)
// and Unicode NFC normalization (ICU).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ingot::recipes::unicode {

// Length in bytes of the UTF-8 sequence starting with byte `lead` (1 for a stray continuation byte, so a walk
// over invalid text always advances).
inline size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// Appends code point `cp` encoded as UTF-8.
void append_utf8(std::string& out, uint32_t cp);

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view s);

// `s` with every ill-formed sequence replaced by U+FFFD (one per maximal invalid subpart, as Python's
// bytes.decode(errors="replace") and Rust's from_utf8_lossy do).
std::string to_valid_utf8(std::string_view s);

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 bytes to U+0100.. in order, so
// every byte has a visible one-character token. byte_to_char()[b] is that character as UTF-8.
const std::array<std::string, 256>& byte_to_char();
// The inverse for code points < 0x180 (all the map uses); -1 for a character outside the map.
int char_to_byte(uint32_t cp);

// Unicode normalization form C. Text that is already NFC (the common case) is returned without copying work
// beyond ICU's quick check.
std::string nfc(std::string_view s);

}  // namespace ingot::recipes::unicode
