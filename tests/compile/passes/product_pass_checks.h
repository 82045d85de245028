// Helpers shared by the tests of the product passes (accumulate_products, scale_into_products): run a graph as the
// executor does, random arguments, and the comparison with what eager computes, within what each dtype can tell apart.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "autograd/ops.h"
#include "compile/exec/executor.h"
#include "runtime/rng.h"
#include "compile/graph_checks.h"

namespace ingot::compiler::product_pass_checks {

inline std::vector<Tensor> run_graph(const Graph& g, const std::vector<Tensor>& args) {
  Executable exe;
  exe.graph = g;
  exe.steps = plan_steps(g);
  return execute(exe, args);
}

inline std::vector<Tensor> random_args(const std::vector<Shape>& shapes, DType dtype) {
  std::vector<Tensor> args;
  for (const Shape& s : shapes) args.push_back(randn(s, dtype));
  return args;
}

// Within what the dtype can tell apart. bf16 eager rounds an intermediate (the product before the sum, the scaled
// operand) that the fused product does not, so bf16 results are held to the function computed in f64.
template <class Fn>
void expect_close(const std::vector<Tensor>& got, const Fn& fn, const std::vector<Tensor>& args, DType dtype) {
  std::vector<Tensor> wide;
  for (const Tensor& a : args) wide.push_back(cast(a, DType::f64));
  const std::vector<Tensor> want = dtype == DType::bf16 ? fn(wide) : fn(args);
  const double tol = dtype == DType::f64 ? 1e-12 : dtype == DType::f32 ? 1e-5 : 1e-2;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(max_rel_error(cast(got[i], DType::f64), cast(want[i], DType::f64), tol, tol), 1.0)
        << dtype_name(dtype) << " output " << i;
}

}  // namespace ingot::compiler::product_pass_checks
