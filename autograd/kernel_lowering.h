// Note [Ops lower themselves]: an op that a generated kernel can compute says how, in its family file, by also
// deriving from KernelLowering: lower() appends its scalar expression to the kernel being built
// (compile/codegen/common/kernel_spec.h) and returns the node ids of its outputs. compile/lower/lower_kernel.cpp decides
// only the iteration space (which axes are rows and which are reduced, from reduced_axes()) and the
// buffers; it knows no op. An op that is not a KernelLowering runs its eager kernel inside compiled steps
// (matmuls, attention, indexing, collectives). A multi-tensor update lowers itself through its own
// interface (Note [Multi-tensor updates], autograd/primitive_multi_tensor.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autograd/primitive.h"
#include "compile/codegen/common/kernel_spec.h"

namespace ingot {

// What lower() sees of the kernel being built: the spec, the op's inputs as node ids, its outputs' dtypes and
// the iteration space. Implemented by compile/lower/lower_kernel.cpp (fusion groups) and by the eager interpreter
// of pointwise formulas (autograd/ops/pointwise.cpp).
class LowerContext {
 public:
  virtual ~LowerContext() = default;
  virtual codegen::KernelSpec& spec() = 0;
  // Node id of input i (a load of a new buffer when its value comes from outside the kernel).
  virtual int input(size_t i) = 0;
  // Whether optional input i was given (a norm's weight or bias).
  virtual bool has_input(size_t i) const = 0;
  // Input i as a per-row value (a norm's mean or rstd: the iteration space without its reduced axis).
  virtual int row_input(size_t i) = 0;
  virtual DType output_dtype(size_t i) const = 0;
  // RowReduction kernels only: reductions (reduce(), column_sum()) are allowed, over reduced_size() columns.
  virtual bool row_reduction() const = 0;
  virtual int64_t reduced_size() const = 0;
  // Gives up on this kernel (the group runs eagerly, `why` in the compile log).
  [[noreturn]] virtual void unsupported(const std::string& why) = 0;

  // Helpers for the common cases.
  DType node_dtype(int x) { return spec().nodes[static_cast<size_t>(x)].dtype; }
  // x in a floating type (integers and bools as f32, as the eager kernels compute them).
  int floating(int x) { return is_floating(node_dtype(x)) ? x : spec().cast(x, DType::f32); }
  // The constant v in the dtype of node `like`.
  int constant_like(double v, int like) { return spec().constant(v, node_dtype(like)); }
  // Gives up unless this kernel may reduce.
  void require_row_reduction() {
    if (!row_reduction()) unsupported("a reduction in a pointwise kernel");
  }
};

class KernelLowering {
 public:
  virtual ~KernelLowering() = default;
  // Appends the op's expression; returns one node per output (the caller casts each to its output's dtype).
  virtual std::vector<int> lower(LowerContext& cx) const = 0;
  // A reduction: the axes of input 0 (of shape `in0`) that the kernel reduces (adjacent; they become the last
  // iteration dim and input 0's shape the kernel's), or nullopt for a pointwise op. An empty list: this call
  // cannot be a kernel, for the reason in `why`.
  virtual std::optional<std::vector<int64_t>> reduced_axes(const Shape& in0, std::string* why) const {
    (void)in0;
    (void)why;
    return std::nullopt;
  }
};

inline const KernelLowering* as_kernel_lowering(const Primitive& p) { return dynamic_cast<const KernelLowering*>(&p); }

}  // namespace ingot
