#include "recipes/export_streamed.h"

#include <cstdlib>
#include <exception>

#include "runtime/error.h"

namespace ingot::recipes {
namespace {

constexpr size_t kMaxMessage = 4000;  // characters of the writer's error passed on

using Sum = std::function<std::vector<double>(const std::vector<double>&)>;

// One status exchange: every rank learns the writer's error ("" on the writer while it is fine; the others
// always pass ""). Two collectives when it failed (the length, then the characters), one otherwise.
std::string exchange_status(const Sum& sum, const std::string& error) {
  const std::string mine = error.substr(0, kMaxMessage);
  const size_t n = static_cast<size_t>(sum({static_cast<double>(mine.size())})[0]);
  if (n == 0) return {};
  std::vector<double> chars(n, 0.0);
  for (size_t i = 0; i < mine.size() && i < n; ++i) chars[i] = static_cast<unsigned char>(mine[i]);
  chars = sum(chars);
  std::string out(n, ' ');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(static_cast<unsigned char>(chars[i]));
  return out;
}

int64_t fail_after() {
  const char* v = std::getenv("INGOT_TEST_FAIL_EXPORT_AFTER");
  return v && *v ? std::atoll(v) : -1;
}

}  // namespace

std::vector<std::string> save_streamed_with_status(
    const ShardedWeights& w, const Sum& sum_over_ranks, const std::string& destination,
    const std::function<std::vector<std::string>(const ShardedWeights&)>& save) {
  const int64_t hook = w.writer ? fail_after() : -1;
  int64_t fetched = 0;
  ShardedWeights checked = w;
  checked.fetch = [&](size_t i) {
    // Before the exchange: the writer's failure must meet the others in an exchange, never in a gather.
    INGOT_CHECK(fetched != hook, "INGOT_TEST_FAIL_EXPORT_AFTER: the writer fails before tensor ", fetched + 1,
                " of the final weights into '", destination, "' (test hook)");
    const std::string failed = exchange_status(sum_over_ranks, "");
    INGOT_CHECK(failed.empty(), "rank 0 failed to write the final weights into '", destination, "': ", failed);
    ++fetched;
    return w.fetch(i);
  };
  std::vector<std::string> out;
  std::exception_ptr error;
  std::string message;
  try {
    out = save(checked);
  } catch (const std::exception& e) {
    if (!w.writer) throw;  // the writer's failure, passed on; or this rank's own, which the launcher reports
    error = std::current_exception();
    message = e.what();
    if (message.empty()) message = "unknown error";
  }
  const std::string failed = exchange_status(sum_over_ranks, message);
  if (error) std::rethrow_exception(error);
  INGOT_CHECK(failed.empty(), "rank 0 failed to write the final weights into '", destination, "': ", failed);
  return out;
}

}  // namespace ingot::recipes
