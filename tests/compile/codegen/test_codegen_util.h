// Helpers for the codegen tests: index maps from tensors, running a compiled kernel on tensors, and
// dtype-aware comparison against the eager ops.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/codegen/cpu/cpu_codegen.h"
#include "compile/codegen/common/kernel_spec.h"

namespace ingot::codegen::testing {

// The tensor's strides as constant index-map strides (0 where it is broadcast).
inline std::vector<SymInt> strides_of(const Tensor& t) {
  std::vector<SymInt> s;
  for (int64_t v : t.strides()) s.push_back(SymInt::constant(v));
  return s;
}

inline std::vector<SymInt> dims_of(const Shape& shape) {
  std::vector<SymInt> d;
  for (int64_t v : shape) d.push_back(SymInt::constant(v));
  return d;
}

// One code generator for the whole test binary, without a disk cache: kernels used by several tests are
// compiled once, which is itself part of what is tested.
inline cpu::CpuCodegen& test_codegen() {
  static cpu::CpuCodegen cg(cpu::CpuCodegenOptions{"", false, 2});
  return cg;
}

inline void run(const cpu::CpuKernel& k, const std::vector<Tensor>& bufs, const std::vector<int64_t>& syms = {},
                const std::vector<double>& scalars = {}) {
  std::vector<void*> ptrs;
  for (const Tensor& t : bufs) ptrs.push_back(t.data_ptr());
  k(ptrs.data(), syms.data(), scalars.data());
}

// Tolerances for comparing a fused kernel (no intermediate rounding) with eager ops (rounding after each op).
struct Tol {
  double rtol, atol;
};
inline Tol tol_for(DType t) {
  switch (t) {
    case DType::f64: return {1e-10, 1e-12};
    case DType::bf16: return {3e-2, 3e-2};
    case DType::f16: return {4e-3, 4e-3};
    default: return {2e-5, 2e-6};
  }
}

// Random values on a non-contiguous layout: the transpose of a contiguous [.., C, R] tensor.
inline Tensor randn_transposed(const Shape& shape, DType dtype) {
  Shape t = shape;
  std::swap(t[t.size() - 1], t[t.size() - 2]);
  return transpose(randn(t, DType::f64).to(dtype), -1, -2).detach();
}

#define EXPECT_TENSOR_CLOSE(got, want, dtype)                                                             \
  do {                                                                                                    \
    const ::ingot::codegen::testing::Tol _tol = ::ingot::codegen::testing::tol_for(dtype);               \
    ASSERT_EQ((got).shape(), (want).shape());                                                             \
    EXPECT_LE(::ingot::max_rel_error((got).to(DType::f64), (want).to(DType::f64), _tol.rtol, _tol.atol), 1.0) \
        << #got << " vs " << #want << " in " << ::ingot::dtype_name(dtype) << "\n got " << (got).str(6)   \
        << "\nwant " << (want).str(6);                                                                    \
  } while (0)

}  // namespace ingot::codegen::testing
