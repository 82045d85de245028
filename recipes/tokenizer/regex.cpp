#include "recipes/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <mutex>

#include "runtime/error.h"

namespace ingot::recipes {

// Match data is scratch space; one per Regex guarded by a mutex keeps find_all const and thread-safe without
// allocating per call (the tokenizer calls it once per text section).
struct Regex::State {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  std::mutex mu;
  ~State() {
    if (match) pcre2_match_data_free(match);
    if (code) pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern) : pattern_(pattern), state_(std::make_unique<State>()) {
  int err = 0;
  PCRE2_SIZE off = 0;
  state_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                               &err, &off, nullptr);
  if (!state_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    INGOT_FAIL("tokenizer: regex does not compile: ", reinterpret_cast<const char*>(msg), " at offset ", off,
               " in pattern ", pattern);
  }
  uint32_t has_jit = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &has_jit);
  jit_ = has_jit && pcre2_jit_compile(state_->code, PCRE2_JIT_COMPLETE) == 0;
  state_->match = pcre2_match_data_create_from_pattern(state_->code, nullptr);
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  std::lock_guard<std::mutex> lock(state_->mu);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    // The text was validated once by the caller; NO_UTF_CHECK avoids re-checking it at every start offset.
    int rc = jit_ ? pcre2_jit_match(state_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, state_->match, nullptr)
                  : pcre2_match(state_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, state_->match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    INGOT_CHECK(rc >= 0, "tokenizer: regex match failed (PCRE2 error ", rc, ") for pattern ", pattern_);
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state_->match);
    size_t b = ov[0], e = ov[1];
    if (e == b) {
      // An empty match yields no piece; step over one character so the scan always advances.
      pos = b + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    out.emplace_back(b, e);
    pos = e;
  }
  return out;
}

}  // namespace ingot::recipes
