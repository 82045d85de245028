// unit_gathers (compile/passes/unit_gathers.h) on a hand-built graph of two resharded units: the backward reads
// gathers of its own placed before its first reader, each unit gather waits for the previous unit's gathered value
// (the backward's first one for the backward's first op), the traced run's unit boundary goes, and after schedule
// unit k+1's gather is issued once unit k's weights arrived, before unit k computes. The traced ZeRO-3 steps these
// graphs come from are tested in tests/distributed/test_fsdp_compiled.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/ops/attrs.h"
#include "autograd/primitive_collective.h"
#include "compile/ir/graph.h"
#include "compile/passes/schedule.h"
#include "compile/passes/unit_gathers.h"
#include "tests/compile/passes/collective_stand_ins.h"

namespace ingot::compiler {
namespace {

// Stand-ins for distributed/collective_ops.cpp's primitives: the pass knows them only by what they declare.
using stand_ins::PrimBase;
using stand_ins::Wait;

// all_gather_unit_start (one rank: the gathered value is the shard); ordering tokens follow the shard.
class GatherStart final : public PrimBase, public CollectiveStep, public WithAttrs<UnitCollectiveAttrs> {
 public:
  explicit GatherStart(UnitCollectiveAttrs a) : WithAttrs<UnitCollectiveAttrs>(std::move(a)) {}
  std::string_view name() const override { return "all_gather_start"; }
  CollectivePhase phase() const override { return CollectivePhase::Start; }
  CollectiveOp op() const override { return CollectiveOp::AllGather; }
};

// A parameter's view of the gathered value (narrow + reshape in the traced step).
class ParamView final : public PrimBase {
 public:
  std::string_view name() const override { return "param_view"; }
  FusionKind fusion_kind() const override { return FusionKind::View; }
};

// A forward or backward product reading activations and a unit's weights.
class Compute final : public PrimBase {
 public:
  std::string_view name() const override { return "compute"; }
};

// fsdp_unit_boundary: the traced run's identity on a resharded unit's output (no collective).
class Boundary final : public PrimBase, public WithAttrs<UnitCollectiveAttrs> {
 public:
  explicit Boundary(UnitCollectiveAttrs a) : WithAttrs<UnitCollectiveAttrs>(std::move(a)) {}
  std::string_view name() const override { return "fsdp_unit_boundary"; }
  bool equivalent(const Primitive&) const override { return false; }
};

// Two resharded units as the trace records them:
//   forward:  unit k: start_k(shard_k) -> wait_k -> view_k;  y0 = compute(x, view_0); b = boundary(y0);
//             y1 = compute(b, view_1)
//   backward: dy = compute(y1) (the loss's gradient: no weights); d1 = compute(dy, view_1); d0 = compute(d1, view_0)
struct TwoUnits {
  Graph g;
  int32_t x = -1, view0 = -1, view1 = -1;  // the input and the forward's parameter views
};

TwoUnits two_units() {
  TwoUnits t;
  Graph& g = t.g;
  const SymShape s = {Dim{4}, Dim{4}};
  const TensorMeta m{Shape{4, 4}, DType::f32, Device::cpu()};
  t.x = g.add_input(InputRole::Arg, DType::f32, Device::cpu(), s, "arg0");
  int32_t view[2];
  for (int k = 0; k < 2; ++k) {
    const int32_t shard = g.add_input(InputRole::Captured, DType::f32, Device::cpu(), s, "shard" + std::to_string(k));
    const UnitCollectiveAttrs a{k, "blocks." + std::to_string(k), true};
    const int32_t start = g.add_node(std::make_shared<GatherStart>(a), {shard}, {m});
    const int32_t wait = g.add_node(std::make_shared<Wait>(), {g.nodes[static_cast<size_t>(start)].outputs[0]}, {m});
    const int32_t v = g.add_node(std::make_shared<ParamView>(), {g.nodes[static_cast<size_t>(wait)].outputs[0]}, {m});
    view[k] = g.nodes[static_cast<size_t>(v)].outputs[0];
  }
  t.view0 = view[0];
  t.view1 = view[1];
  auto out = [&](int32_t node) { return g.nodes[static_cast<size_t>(node)].outputs[0]; };
  const int32_t y0 = g.add_node(std::make_shared<Compute>(), {t.x, view[0]}, {m});
  const int32_t b = g.add_node(std::make_shared<Boundary>(UnitCollectiveAttrs{0, "blocks.0", true}), {out(y0)}, {m});
  const int32_t y1 = g.add_node(std::make_shared<Compute>(), {out(b), view[1]}, {m});
  for (Node& n : g.nodes) n.forward = true;
  const int32_t dy = g.add_node(std::make_shared<Compute>(), {out(y1)}, {m});
  const int32_t d1 = g.add_node(std::make_shared<Compute>(), {out(dy), view[1]}, {m});
  const int32_t d0 = g.add_node(std::make_shared<Compute>(), {out(d1), view[0]}, {m});
  g.outputs = {out(y1), out(d0)};
  g.verify();
  return t;
}

int unit_of(const Node& n) {
  const UnitCollectiveAttrs* a = match<UnitCollectiveAttrs>(*n.prim);
  return a ? a->unit : -1;
}
std::vector<int32_t> starts(const Graph& g) {
  std::vector<int32_t> r;
  for (const Node& n : g.nodes)
    if (is_all_gather_start(*n.prim)) r.push_back(n.id);
  return r;
}
// The gather start a value derives from through views and waits.
const Node& gather_of(const Graph& g, int32_t v) {
  const Node* n = &g.producer(v);
  while (!is_all_gather_start(*n->prim)) n = &g.producer(n->inputs[0]);
  return *n;
}
// The product whose first input is `from`.
const Node& reader_of(const Graph& g, int32_t from) {
  for (const Node& n : g.nodes)
    if (!n.inputs.empty() && n.inputs[0] == from && n.prim->name() == "compute") return n;
  ADD_FAILURE() << "no compute reads value " << from << "\n" << g.str();
  return g.nodes.front();
}

TEST(UnitGathers, TheBackwardReadsGathersOfItsOwnPlacedBeforeItsFirstReader) {
  TwoUnits t = two_units();
  ASSERT_TRUE(passes::unit_gathers(t.g, {}));
  t.g.verify();
  const Graph& g = t.g;
  ASSERT_EQ(starts(g).size(), 4u) << "one forward and one backward gather per unit\n" << g.str();
  // The forward reads the forward's gathers; the backward's products read backward copies of them.
  const Node& y0 = reader_of(g, t.x);
  EXPECT_EQ(y0.inputs[1], t.view0);
  const Node& y1 = reader_of(g, y0.outputs[0]);
  EXPECT_EQ(y1.inputs[1], t.view1);
  const Node& dy = reader_of(g, y1.outputs[0]);
  const Node& d1 = reader_of(g, dy.outputs[0]);
  const Node& d0 = reader_of(g, d1.outputs[0]);
  for (const Node* n : {&d1, &d0}) {
    EXPECT_FALSE(n->forward);
    const Node& gather = gather_of(g, n->inputs[1]);
    EXPECT_FALSE(gather.forward) << "the backward's gather is a backward node";
    EXPECT_NE(n->inputs[1], n == &d1 ? t.view1 : t.view0) << "no backward node reads the forward's gathered weights";
    EXPECT_EQ(unit_of(gather), n == &d1 ? 1 : 0);
    // Placed before its first reader and after the reader before it: each copy's start, wait and view sit right
    // in front of the backward product that needs them.
    EXPECT_EQ(gather.id + 3, n->id) << g.str();
  }
  // The forward's gathered values now die in the forward: their only readers are forward nodes.
  for (const Node& n : g.nodes)
    for (int32_t v : n.inputs) {
      if (v == t.view0 || v == t.view1) {
        EXPECT_TRUE(n.forward) << n.prim->name() << " reads a forward gather";
      }
    }
  // (c) the boundary went; the second block reads the first one's output.
  for (const Node& n : g.nodes) EXPECT_NE(n.prim->name(), "fsdp_unit_boundary");
  EXPECT_EQ(y1.inputs[0], y0.outputs[0]);
}

TEST(UnitGathers, EachGatherWaitsForThePreviousUnitsGatheredValue) {
  TwoUnits t = two_units();
  ASSERT_TRUE(passes::unit_gathers(t.g, {}));
  const Graph& g = t.g;
  const std::vector<int32_t> s = starts(g);
  ASSERT_EQ(s.size(), 4u) << g.str();
  // In the order of their first readers: forward unit 0, forward unit 1, backward unit 1, backward unit 0.
  const Node &f0 = g.nodes[static_cast<size_t>(s[0])], &f1 = g.nodes[static_cast<size_t>(s[1])];
  const Node &b1 = g.nodes[static_cast<size_t>(s[2])], &b0 = g.nodes[static_cast<size_t>(s[3])];
  ASSERT_TRUE(f0.forward && f1.forward && !b1.forward && !b0.forward) << g.str();
  EXPECT_EQ(unit_of(b1), 1);
  EXPECT_EQ(unit_of(b0), 0);
  EXPECT_EQ(f0.inputs.size(), 1u) << "the first gather waits for nothing";
  auto wait_out = [&](const Node& start) {
    for (const Node& n : g.nodes)
      if (is_collective_wait(*n.prim) && n.inputs[0] == start.outputs[0]) return n.outputs[0];
    return -1;
  };
  ASSERT_EQ(f1.inputs.size(), 2u) << g.str();
  EXPECT_EQ(f1.inputs[1], wait_out(f0)) << "forward unit 1 is gathered once unit 0's weights arrived";
  // The backward's first gather waits for the backward's first op (the loss gradient), not for the forward's last
  // gather, which arrived while the forward's last unit still computes.
  ASSERT_EQ(b1.inputs.size(), 2u) << g.str();
  const Node& dy = g.producer(b1.inputs[1]);
  EXPECT_FALSE(dy.forward);
  EXPECT_EQ(dy.prim->name(), "compute");
  EXPECT_EQ(dy.inputs.size(), 1u) << "the loss gradient reads no weights";
  ASSERT_EQ(b0.inputs.size(), 2u) << g.str();
  EXPECT_EQ(b0.inputs[1], wait_out(b1)) << "backward unit 0 is gathered once unit 1's backward weights arrived";
}

TEST(UnitGathers, AfterScheduleUnitKPlusOneIsIssuedWhileUnitKComputesAndNotEarlier) {
  TwoUnits t = two_units();
  ASSERT_TRUE(passes::unit_gathers(t.g, {}));
  passes::schedule(t.g, {});
  t.g.verify();
  const Graph& g = t.g;
  auto first_reader = [&](int32_t start) {  // the first product reading the weights gathered by `start`
    for (const Node& n : g.nodes)
      if (n.prim->name() == "compute" && n.inputs.size() == 2 && gather_of(g, n.inputs[1]).id == start) return n.id;
    return -1;
  };
  auto wait_of = [&](int32_t start) {
    for (const Node& n : g.nodes)
      if (is_collective_wait(*n.prim) && n.inputs[0] == g.nodes[static_cast<size_t>(start)].outputs[0]) return n.id;
    return -1;
  };
  std::vector<int32_t> s = starts(g);
  ASSERT_EQ(s.size(), 4u) << g.str();
  std::sort(s.begin(), s.end(), [&](int32_t a, int32_t b) { return first_reader(a) < first_reader(b); });
  // Forward unit 0 -> 1 and backward unit 1 -> 0: issued once the previous unit's weights arrived, before the
  // previous unit's product runs.
  for (size_t k : {1u, 3u}) {
    EXPECT_GT(s[k], wait_of(s[k - 1])) << "gather " << k << " is issued before the previous unit arrived\n" << g.str();
    EXPECT_LT(s[k], first_reader(s[k - 1])) << "gather " << k << " waits for the previous unit's compute\n"
                                            << g.str();
  }
  // The backward's first gather: once the backward began (after the loss gradient), so not while the forward's
  // last unit still computes.
  const Node& dy = reader_of(g, g.nodes[static_cast<size_t>(first_reader(s[1]))].outputs[0]);
  EXPECT_FALSE(dy.forward);
  EXPECT_GT(s[2], dy.id) << g.str();
  EXPECT_LT(s[2], first_reader(s[2])) << g.str();
}

TEST(UnitGathers, AGraphWithoutUnitGathersIsUnchanged) {
  Graph g;
  const TensorMeta m{Shape{4}, DType::f32, Device::cpu()};
  const int32_t x = g.add_input(InputRole::Arg, DType::f32, Device::cpu(), {Dim{4}}, "arg0");
  const int32_t y = g.add_node(std::make_shared<Compute>(), {x}, {m});
  g.outputs = {g.nodes[static_cast<size_t>(y)].outputs[0]};
  const std::string before = g.str();
  EXPECT_FALSE(passes::unit_gathers(g, {}));
  EXPECT_EQ(g.str(), before);
}

}  // namespace
}  // namespace ingot::compiler
