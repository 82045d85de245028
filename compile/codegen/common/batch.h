// What the CPU and CUDA code generators share when they compile a batch of kernels (cpu/cpu_codegen.cpp,
// cuda/cuda_codegen.cpp): the batch's keys, and how its rendered kernels are spread over the compiler runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compile/codegen/common/kernel_spec.h"

namespace ingot::codegen {

// The specs' structural keys, in order; each spec is validated first (throws naming an invalid one).
inline std::vector<std::string> validated_keys(const std::vector<KernelSpec>& specs) {
  std::vector<std::string> keys(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].validate();
    keys[i] = specs[i].structural_key();
  }
  return keys;
}

inline int64_t distinct_keys(const std::vector<std::string>& keys) {
  return static_cast<int64_t>(std::set<std::string>(keys.begin(), keys.end()).size());
}

// Spreads the kernels `order` over `units` translation units so that the compilers run about equally long: largest
// first (by size_of(kernel), the rendered source's length), each into the unit with the least source so far.
// Returns (kernel, unit) in that order, which is the order the sources are appended to their units.
template <class SizeOf>
std::vector<std::pair<size_t, int>> balance_units(std::vector<size_t> order, int units, SizeOf size_of) {
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return size_of(a) > size_of(b); });
  std::vector<size_t> unit_size(static_cast<size_t>(units), 0);
  std::vector<std::pair<size_t, int>> placed;
  placed.reserve(order.size());
  for (size_t k : order) {
    const int u = static_cast<int>(std::min_element(unit_size.begin(), unit_size.end()) - unit_size.begin());
    unit_size[static_cast<size_t>(u)] += size_of(k);
    placed.emplace_back(k, u);
  }
  return placed;
}

}  // namespace ingot::codegen
