#include "runtime/error.h"

namespace ingot::detail {

// User errors carry only the message (it already names the op, tensor or key); internal errors add our
// file:line because they are bug reports.
void throw_error(const char* file, int line, const std::string& msg, bool internal) {
  if (internal) throw Error(str_cat(msg, " (at ", file, ":", line, "; please report this ingot bug)"));
  throw Error(msg);
}

}  // namespace ingot::detail
