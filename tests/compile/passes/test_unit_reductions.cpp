// unit_reductions (compile/passes/unit_reductions.h) and schedule on a hand-built graph of a backward over four
// units, as the ZeRO-3 trace records it: each unit's gradient computed, flattened and its reduce-scatter started,
// and every wait (with the cast into the shard's gradient) after the whole backward. Afterwards each wait reads
// the start `lag` units later as a token and is scheduled right after it, so at most lag + 1 reduce-scatter inputs
// are alive at any point; lag 0 leaves the waits at the end. The traced ZeRO-3 steps are tested in
// tests/distributed/test_fsdp_compiled.cpp and test_fsdp_memory.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/ops/attrs.h"
#include "autograd/primitive_collective.h"
#include "autograd/primitive_multi_tensor.h"
#include "compile/ir/graph.h"
#include "compile/passes/schedule.h"
#include "compile/passes/unit_reductions.h"
#include "tests/compile/passes/collective_stand_ins.h"

namespace ingot::compiler {
namespace {

// Stand-ins for distributed/collective_ops.cpp's primitives: the pass knows them only by what they declare.
using stand_ins::PrimBase;
using stand_ins::Wait;

// ZeRO-1's bucket reduce_scatter_start (no unit), and reduce_scatter_unit_start (its unit in typed attributes).
class ReduceStart : public PrimBase, public CollectiveStep {
 public:
  std::string_view name() const override { return "reduce_scatter_start"; }
  CollectivePhase phase() const override { return CollectivePhase::Start; }
  CollectiveOp op() const override { return CollectiveOp::ReduceScatter; }
};

class UnitReduceStart final : public ReduceStart, public WithAttrs<UnitCollectiveAttrs> {
 public:
  explicit UnitReduceStart(UnitCollectiveAttrs a) : WithAttrs<UnitCollectiveAttrs>(std::move(a)) {}
};

// A unit's backward (reading the previous unit's output gradient) or the flatten of its gradients.
class Compute final : public PrimBase {
 public:
  explicit Compute(std::string_view name = "compute") : name_(name) {}
  std::string_view name() const override { return name_; }

 private:
  std::string_view name_;
};

// Units 3, 2, 1, 0 in backward order:
//   d_k = compute(d_{k+1}); flat_k = flatten(d_k); p_k = reduce_scatter_start(flat_k)
// then per unit, last first: r_k = collective_wait(p_k); grad_k = cast(r_k).
Graph backward_of_units(int units, bool unit_attrs = true) {
  Graph g;
  const TensorMeta m{Shape{8}, DType::f32, Device::cpu()};
  int32_t d = g.add_input(InputRole::Arg, DType::f32, Device::cpu(), {Dim{8}}, "arg0");
  auto out = [&](int32_t node) { return g.nodes[static_cast<size_t>(node)].outputs[0]; };
  std::vector<int32_t> pending;
  for (int k = units; k-- > 0;) {
    d = out(g.add_node(std::make_shared<Compute>(), {d}, {m}));
    const int32_t flat = out(g.add_node(std::make_shared<Compute>("flatten"), {d}, {m}));
    const UnitCollectiveAttrs a{k, "blocks." + std::to_string(k), false};
    std::shared_ptr<Primitive> start = unit_attrs ? std::make_shared<UnitReduceStart>(a) : std::make_shared<ReduceStart>();
    pending.push_back(out(g.add_node(start, {flat}, {m})));
  }
  g.outputs = {d};
  for (int32_t p : pending) {
    const int32_t r = out(g.add_node(std::make_shared<Wait>(), {p}, {m}));
    g.outputs.push_back(out(g.add_node(std::make_shared<Compute>("cast"), {r}, {m})));
  }
  g.verify();
  return g;
}

// The most reduce-scatter inputs alive at once in node order: each from its start until its own wait (the one
// whose first input is the start's result), as the collective holds it.
int most_inputs_alive(const Graph& g) {
  int alive = 0, most = 0;
  for (const Node& n : g.nodes) {
    if (n.prim->name() == "reduce_scatter_start") most = std::max(most, ++alive);
    if (is_collective_wait(*n.prim)) --alive;
  }
  return most;
}

int32_t start_of_wait(const Graph& g, const Node& wait) { return g.producer(wait.inputs[0]).id; }

TEST(UnitReductions, EachWaitReadsTheStartLagUnitsLaterAsItsToken) {
  for (int lag : {1, 2}) {
    Graph g = backward_of_units(4);
    ASSERT_TRUE(passes::unit_reductions(g, {.lag = lag}));
    g.verify();
    std::vector<int32_t> starts;
    for (const Node& n : g.nodes)
      if (n.prim->name() == "reduce_scatter_start") starts.push_back(n.id);
    ASSERT_EQ(starts.size(), 4u);
    int tokens = 0;
    for (const Node& n : g.nodes) {
      if (!is_collective_wait(*n.prim)) continue;
      const size_t i = static_cast<size_t>(std::find(starts.begin(), starts.end(), start_of_wait(g, n)) - starts.begin());
      if (i + static_cast<size_t>(lag) < starts.size()) {
        ASSERT_EQ(n.inputs.size(), 2u) << "lag " << lag << "\n" << g.str();
        EXPECT_EQ(g.producer(n.inputs[1]).id, starts[i + static_cast<size_t>(lag)]) << g.str();
        ++tokens;
      } else {
        EXPECT_EQ(n.inputs.size(), 1u) << "the last units' waits have no later start\n" << g.str();
      }
    }
    EXPECT_EQ(tokens, 4 - lag);
  }
}

TEST(UnitReductions, AfterScheduleAtMostLagPlusOneInputsAreAliveAndEachWaitFollowsItsToken) {
  Graph before = backward_of_units(4);
  passes::schedule(before, {});
  EXPECT_EQ(most_inputs_alive(before), 4) << "without the pass every input lives to the backward's end\n"
                                          << before.str();
  for (int lag : {1, 2}) {
    Graph g = backward_of_units(4);
    ASSERT_TRUE(passes::unit_reductions(g, {.lag = lag}));
    passes::schedule(g, {});
    g.verify();
    EXPECT_EQ(most_inputs_alive(g), lag + 1) << g.str();
    for (const Node& n : g.nodes) {
      if (!is_collective_wait(*n.prim) || n.inputs.size() < 2) continue;
      EXPECT_EQ(g.producer(n.inputs[1]).id + 1, n.id) << "a wait runs right after its token's start\n" << g.str();
      EXPECT_LT(start_of_wait(g, n) + 1, n.id) << "never right after its own start\n" << g.str();
    }
  }
}

// An optimizer update's part (a SplittableUpdate, as AdamW's and AdamW8bit's are): the scheduler runs it as soon as
// its unit's gradient is reduced, so the gradient shards die one by one inside the backward.
class UpdatePart final : public PrimBase, public SplittableUpdate {
 public:
  std::string_view name() const override { return "update"; }
  size_t tensors() const override { return 1; }
  size_t input_slots() const override { return 1; }
  size_t output_slots() const override { return 1; }
  std::shared_ptr<Primitive> for_tensors(size_t) const override { return std::make_shared<UpdatePart>(); }
};

TEST(UnitReductions, AfterScheduleEachUnitsUpdateRunsOnceItsGradientIsReducedNotAtTheBackwardsEnd) {
  Graph g = backward_of_units(4);
  // Each reduced gradient (its wait's result: bf16 shards updated without masters read it as it is) is read by
  // its unit's update; nothing is returned but the input's gradient and the updates' results.
  const TensorMeta m{Shape{8}, DType::f32, Device::cpu()};
  std::vector<int32_t> grads;
  for (size_t i = 1; i < g.outputs.size(); ++i) grads.push_back(g.producer(g.outputs[i]).inputs[0]);
  g.outputs.resize(1);
  for (int32_t grad : grads)
    g.outputs.push_back(g.nodes[static_cast<size_t>(g.add_node(std::make_shared<UpdatePart>(), {grad}, {m}))].outputs[0]);
  g.verify();
  ASSERT_TRUE(passes::unit_reductions(g, {.lag = 1}));
  passes::schedule(g, {});
  g.verify();
  // Reduced gradients alive at once: from their wait to their update. In trace order every update waits for the
  // last unit's backward, and all four are alive there.
  int alive = 0, most = 0;
  for (const Node& n : g.nodes) {
    if (is_collective_wait(*n.prim)) most = std::max(most, ++alive);
    if (n.prim->name() == "update") --alive;
  }
  EXPECT_EQ(most, 1) << g.str();
  int computes_after_first_update = 0;
  bool updated = false;
  for (const Node& n : g.nodes) {
    updated = updated || n.prim->name() == "update";
    if (updated && n.prim->name() == "compute") ++computes_after_first_update;
  }
  EXPECT_GT(computes_after_first_update, 0) << "the first update runs inside the backward\n" << g.str();
}

TEST(UnitReductions, LagZeroAndGraphsWithoutUnitReductionsAreUnchanged) {
  Graph g = backward_of_units(4);
  const std::string before = g.str();
  EXPECT_FALSE(passes::unit_reductions(g, {.lag = 0}));
  EXPECT_EQ(g.str(), before);
  Graph buckets = backward_of_units(4, false);  // ZeRO-1's bucket reduce-scatters: no unit attributes
  const std::string b = buckets.str();
  EXPECT_FALSE(passes::unit_reductions(buckets, {.lag = 1}));
  EXPECT_EQ(buckets.str(), b);
}

}  // namespace
}  // namespace ingot::compiler
