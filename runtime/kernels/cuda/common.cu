// Host-side helpers of common.cuh.
#include <algorithm>
#include <mutex>
#include <vector>

#include "runtime/kernels/cuda/common.cuh"

namespace ingot::kernels::cuda {

int sm_count(int device) {
  static std::mutex mu;
  static std::vector<int> counts;
  std::lock_guard<std::mutex> g(mu);
  if (counts.empty()) counts.assign(static_cast<size_t>(cuda_device_count()), 0);
  INGOT_INTERNAL_CHECK(device >= 0 && device < static_cast<int>(counts.size()), "sm_count: bad device ", device);
  int& c = counts[static_cast<size_t>(device)];
  if (c == 0) CUDA_CHECK(cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, device));
  return c;
}

double dram_gbps_per_sm(int device) {
  static std::mutex mu;
  static std::vector<double> known;
  std::lock_guard<std::mutex> g(mu);
  if (known.empty()) known.assign(static_cast<size_t>(cuda_device_count()), 0.0);
  INGOT_INTERNAL_CHECK(device >= 0 && device < static_cast<int>(known.size()), "dram_gbps_per_sm: bad device ", device);
  double& v = known[static_cast<size_t>(device)];
  if (v == 0.0) {
    int khz = 0, bits = 0, sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    // Double data rate: two transfers per memory clock.
    v = 2.0 * khz * 1e3 * (bits / 8.0) / 1e9 / std::max(sms, 1);
  }
  return v;
}

unsigned grid_for(int64_t n, int block, int device) {
  int64_t want = ceil_div(n, block);
  int64_t cap = static_cast<int64_t>(sm_count(device)) * 8;
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
