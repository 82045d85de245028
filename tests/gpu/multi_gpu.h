// What the multi-GPU suites share (test_ddp_multi_gpu.cpp, test_fsdp_multi_gpu.cpp, test_fsdp_compiled_gpu.cpp):
// the skip on machines without NCCL or without enough GPUs, and NCCL set-up options with test-sized timeouts.
#pragma once

#include <gtest/gtest.h>

#include <chrono>

#include "distributed/bootstrap.h"
#include "distributed/process_group.h"
#include "runtime/device.h"

// Skips unless NCCL is built and `n` GPUs are visible.
#define INGOT_REQUIRE_GPUS(n)                                                                                  \
  do {                                                                                                         \
    if (!::ingot::distributed::nccl_available())                                                               \
      GTEST_SKIP() << "built without NCCL (CPU-only build); runs on a multi-GPU machine";                     \
    if (::ingot::cuda_device_count() < (n))                                                                    \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << ::ingot::cuda_device_count()               \
                   << "; runs on the lent nvidia-h100-x2 / x4 or h200-x2 / x4 (scripts/device_dist.sh)";       \
  } while (0)

namespace ingot::distributed {

// NCCL with `timeout` for a collective and for the store (connecting: 60 s).
inline InitOptions nccl_init(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  InitOptions o;
  o.backend = "nccl";
  o.timeout = timeout;
  o.store_timeout = timeout;
  o.connect_timeout = std::chrono::seconds(60);
  return o;
}

}  // namespace ingot::distributed
