// Errors: one exception type carrying context, and two check macros.
//   INGOT_CHECK(cond, msg...)          user-facing errors (bad shapes, bad files, bad config)
//   INGOT_INTERNAL_CHECK(cond, msg...) our own invariants; a failure is a bug in ingot
// Messages are built by streaming every argument, so callers write
//   INGOT_CHECK(a == b, "matmul: inner dims differ: ", a, " vs ", b);
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ingot {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A device allocator could not get the memory asked for (runtime/cuda/allocator.cpp): the training loop adds what
// the run could set to need less (recipes/memory_advice.h).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg, bool internal);
}  // namespace detail

}  // namespace ingot

#define INGOT_CHECK(cond, ...)                                                              \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::ingot::detail::throw_error(__FILE__, __LINE__, ::ingot::detail::str_cat(__VA_ARGS__), false); \
  } while (0)

#define INGOT_INTERNAL_CHECK(cond, ...)                                                     \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::ingot::detail::throw_error(__FILE__, __LINE__,                                      \
                                   ::ingot::detail::str_cat("internal check failed: " #cond " ", \
                                                            ##__VA_ARGS__),                 \
                                   true);                                                   \
  } while (0)

#define INGOT_FAIL(...) ::ingot::detail::throw_error(__FILE__, __LINE__, ::ingot::detail::str_cat(__VA_ARGS__), false)
