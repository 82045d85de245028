// rank_zero_first: see the header.
#include "distributed/rank_zero_first.h"

#include "runtime/error.h"

namespace ingot::distributed {

namespace {
constexpr const char* kFailed = "failed: ";
}

void rank_zero_first(Store& store, int rank, const std::string& name, const std::function<void()>& fn,
                     Millis timeout) {
  std::string key = "rank_zero_first/" + name;
  if (rank == 0) {
    try {
      fn();
    } catch (const std::exception& e) {
      store.set(key, std::string(kFailed) + e.what());
      throw;
    }
    store.set(key, "done");
    return;
  }
  std::string status;
  try {
    status = store.get(key, timeout);
  } catch (const Error& e) {
    INGOT_FAIL("rank ", rank, " waited ", timeout.count(), " ms for rank 0 to finish '", name,
               "' first, in vain: ", e.what());
  }
  INGOT_CHECK(status.rfind(kFailed, 0) != 0, "rank ", rank, ": rank 0 failed while running '", name,
              "' first: ", status.substr(std::string(kFailed).size()));
  fn();
}

}  // namespace ingot::distributed
