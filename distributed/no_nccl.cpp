// Stub for CPU-only builds: NCCL comes with the CUDA build (-DINGOT_CUDA=ON).
#include "distributed/process_group.h"

namespace ingot::distributed {

bool nccl_available() { return false; }
std::shared_ptr<ProcessGroup> new_nccl_group(std::shared_ptr<Store>, int, int, ProcessGroupOptions) {
  INGOT_FAIL("nccl process group: ingot was built without CUDA/NCCL (rebuild with -DINGOT_CUDA=ON)");
}

}  // namespace ingot::distributed
