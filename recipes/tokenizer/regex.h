// A compiled PCRE2 pattern for the pre-tokenizer Split regexes of tokenizer.json (the GPT-2, Llama 3 and Qwen
// patterns use \p{L}, \p{N}, (?i:...) and look-ahead). Compiled with UTF and UCP so \s, \w and classes follow
// Unicode as the Oniguruma engine of HF tokenizers does; JIT-compiled when the library supports it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ingot::recipes {

class Regex {
 public:
  // Throws ingot::Error quoting the pattern and PCRE2's message and offset when it does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // [begin, end) byte ranges of the successive non-overlapping, non-empty matches in `text` (valid UTF-8).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

 private:
  struct State;
  std::string pattern_;
  std::unique_ptr<State> state_;
  bool jit_ = false;
};

}  // namespace ingot::recipes
