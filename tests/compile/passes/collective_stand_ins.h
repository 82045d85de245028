// Stand-ins for distributed/collective_ops.cpp's primitives in the compiler's pass tests (test_unit_gathers.cpp,
// test_unit_reductions.cpp): the passes know collectives only by what they declare, so an identity primitive that
// declares a phase and an op is enough to build the graphs a ZeRO-3 trace records.
#pragma once

#include <string_view>
#include <vector>

#include "autograd/primitive.h"
#include "autograd/primitive_collective.h"

namespace ingot::compiler::stand_ins {

// The identity on its first input: what a pass test needs to build and run a graph.
class PrimBase : public Primitive {
 public:
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[0]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return {in[0]}; }
};

// collective_wait.
class Wait final : public PrimBase, public CollectiveStep {
 public:
  std::string_view name() const override { return "collective_wait"; }
  CollectivePhase phase() const override { return CollectivePhase::Wait; }
};

}  // namespace ingot::compiler::stand_ins
