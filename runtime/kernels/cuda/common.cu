// Host-side helpers of common.cuh.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

#include "runtime/kernels/cuda/common.cuh"

namespace ingot::kernels::cuda {

namespace {

// A device attribute worked out once per device: `compute(device)` runs on the first call for that device.
template <typename T, typename F>
T per_device(const char* what, int device, F compute) {
  static std::mutex mu;
  static std::vector<T> known;
  std::lock_guard<std::mutex> g(mu);
  if (known.empty()) known.assign(static_cast<size_t>(cuda_device_count()), T{});
  INGOT_INTERNAL_CHECK(device >= 0 && device < static_cast<int>(known.size()), what, ": bad device ", device);
  T& v = known[static_cast<size_t>(device)];
  if (v == T{}) v = compute(device);
  return v;
}

int attribute(cudaDeviceAttr a, int device) {
  int v = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&v, a, device));
  return v;
}

}  // namespace

int sm_count(int device) {
  return per_device<int>("sm_count", device, [](int d) { return attribute(cudaDevAttrMultiProcessorCount, d); });
}

int compute_major(int device) {
  return per_device<int>("compute_major", device,
                         [](int d) { return attribute(cudaDevAttrComputeCapabilityMajor, d); });
}

bool hopper_paths(int device) {
  static const bool off = [] {
    const char* v = std::getenv("INGOT_HOPPER");
    return v != nullptr && std::string_view(v) == "0";
  }();
  return !off && compute_major(device) >= 9;
}

int shared_bytes_optin(int device) {
  return per_device<int>("shared_bytes_optin", device,
                         [](int d) { return attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, d); });
}

double dram_gbps_per_sm(int device) {
  return per_device<double>("dram_gbps_per_sm", device, [](int d) {
    const double hz = attribute(cudaDevAttrMemoryClockRate, d) * 1e3;
    const double bytes = attribute(cudaDevAttrGlobalMemoryBusWidth, d) / 8.0;
    // Double data rate: two transfers per memory clock.
    return 2.0 * hz * bytes / 1e9 / std::max(sm_count(d), 1);
  });
}

unsigned grid_for(int64_t n, int block, int device) {
  int64_t want = ceil_div(n, block);
  int64_t cap = static_cast<int64_t>(usable_sms(device)) * 8;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap)));
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      INGOT_CHECK(t->device().is_cuda(), op, ": expected CUDA tensors, got one on ", t->device().str());
      continue;
    }
    INGOT_CHECK(t->device() == first->device(), op, ": tensors on different devices (", first->device().str(),
                " and ", t->device().str(), ")");
  }
}

}  // namespace ingot::kernels::cuda
