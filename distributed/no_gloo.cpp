// Stub for builds without Gloo (-DINGOT_GLOO=OFF).
#include "distributed/process_group.h"

namespace ingot::distributed {

bool gloo_available() { return false; }
std::shared_ptr<ProcessGroup> new_gloo_group(std::shared_ptr<Store>, int, int, ProcessGroupOptions) {
  INGOT_FAIL("gloo process group: ingot was built without Gloo (install libgloo-dev and rebuild with -DINGOT_GLOO=ON)");
}

}  // namespace ingot::distributed
