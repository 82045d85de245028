// Shapes and strides are plain vectors of int64 (in elements). Symbolic dims live in compile/ir; by the
// time a kernel runs every dim is concrete.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ingot {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t numel(const Shape& s);
Strides contiguous_strides(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3, 4]"
// Numpy broadcasting; throws naming `op` when the shapes do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

}  // namespace ingot
