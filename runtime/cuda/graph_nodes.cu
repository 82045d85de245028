#include "runtime/cuda/graph_nodes.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/cuda/check.h"

namespace ingot::cuda::detail {

// Note [Small memsets in CUDA graphs]
// cuBLASLt clears a 4-byte word of its workspace before each of its persistent (nvjet) kernels, so a captured
// GPT-2 step holds ~120 such memset nodes between its ~415 kernels. A memset node costs the graph a few
// microseconds of dependency latency, several times what a tiny kernel node costs (TransformerEngine measured
// 3.2 vs 0.8 us for the same 4-byte clear outside graphs), so the small ones become a one-block kernel that
// writes the same bytes. Same destination, value and edges: the graph's meaning does not change.
namespace {

__global__ void set_small(uint8_t* dst, size_t pitch, uint32_t value, uint32_t elem, uint32_t width, uint32_t height) {
  const uint32_t n = width * height;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    uint8_t* p = dst + static_cast<size_t>(i / width) * pitch + static_cast<size_t>(i % width) * elem;
    if (elem == 4) *reinterpret_cast<uint32_t*>(p) = value;
    else if (elem == 2) *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(value);
    else *p = static_cast<uint8_t>(value);
  }
}

}  // namespace

int small_memsets_to_kernels(cudaGraph_t graph) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  // The kernel runs on the current (capturing) device, so only its own device memory is rewritten; a memset
  // of managed, host or peer memory stays a memset.
  int device = -1;
  CUDA_CHECK(cudaGetDevice(&device));
  int replaced = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams mp{};
    CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &mp));
    const size_t bytes = static_cast<size_t>(mp.elementSize) * mp.width * std::max<size_t>(mp.height, 1);
    if (bytes > kSmallMemsetBytes || mp.dst == nullptr) continue;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, mp.dst) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    if (attr.type != cudaMemoryTypeDevice || attr.device != device) continue;
    size_t nd = 0, nk = 0;
    CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &nd));
    CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &nk));
    std::vector<cudaGraphNode_t> deps(nd), kids(nk);
    CUDA_CHECK(cudaGraphNodeGetDependencies(node, deps.data(), nullptr, &nd));
    CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, kids.data(), nullptr, &nk));
    uint8_t* dst = static_cast<uint8_t*>(mp.dst);
    size_t pitch = mp.pitch;
    uint32_t value = mp.value, elem = mp.elementSize, width = static_cast<uint32_t>(mp.width),
             height = static_cast<uint32_t>(std::max<size_t>(mp.height, 1));
    void* args[] = {&dst, &pitch, &value, &elem, &width, &height};
    cudaKernelNodeParams kp{};
    kp.func = reinterpret_cast<void*>(&set_small);
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(64);
    kp.kernelParams = args;
    cudaGraphNode_t k = nullptr;
    CUDA_CHECK(cudaGraphAddKernelNode(&k, graph, deps.data(), nd, &kp));
    for (cudaGraphNode_t kid : kids) CUDA_CHECK(cudaGraphAddDependencies(graph, &k, &kid, nullptr, 1));
    CUDA_CHECK(cudaGraphDestroyNode(node));
    ++replaced;
  }
  return replaced;
}

}  // namespace ingot::cuda::detail
