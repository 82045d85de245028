// Typed attributes (Note [Typed attributes], autograd/primitive.h): the compiler reads an op's attributes
// through match<A>, never through printed text. The structs hold what the op was built with (dims wrapped and
// sorted, the exact scalar), match is null for other ops, and the passes that used to compare printed text
// still find their patterns (tests/compile/test_matmul_epilogue.cpp, test_pack_attention_grads.cpp).
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "autograd/ops/attrs.h"
#include "autograd/primitive_collective.h"
#include "compile/lower/lowering.h"
#include "compile/trace/trace.h"
#include "optim/fused_update.h"
#include "tests/testing.h"

namespace ingot::compiler {
namespace {

const Node& only(const Graph& g, std::string_view name) {
  const Node* found = nullptr;
  for (const Node& n : g.nodes)
    if (n.prim->name() == name) {
      EXPECT_EQ(found, nullptr) << "more than one " << name;
      found = &n;
    }
  if (!found) throw std::runtime_error("no " + std::string(name) + " node");
  return *found;
}

TEST(TypedAttrs, OpsExposeTheAttributesTheyWereBuiltWith) {
  auto fn = [](const std::vector<Tensor>& a) {
    const Tensor& x = a[0];  // [2, 3, 4, 5]
    Tensor s = sum(cast(x, DType::f32), {-1, 1});
    Tensor p = permute(x, {0, 2, -3, 3});
    Tensor c = cat({x, x}, -2);
    Tensor n = layer_norm(x, Tensor(), Tensor(), 1e-7 + 1e-23);
    return std::vector<Tensor>{s, p, c, n, mul(x, 0.1 + 1e-17), add(x, x)};
  };
  Graph g = trace(fn, {randn({2, 3, 4, 5}, DType::f64)}).graph;

  const CastAttrs* c = match<CastAttrs>(*only(g, "cast").prim);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->to, DType::f32);

  const ReduceAttrs* r = match<ReduceAttrs>(*only(g, "sum").prim);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->op, kernels::ReduceOp::Sum);
  EXPECT_EQ(r->dims, (std::vector<int64_t>{1, 3}));  // wrapped and sorted
  EXPECT_FALSE(r->keepdim);
  EXPECT_FALSE(r->widened);

  const PermuteAttrs* p = match<PermuteAttrs>(*only(g, "permute").prim);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->dims, (std::vector<int64_t>{0, 2, 1, 3}));

  const CatAttrs* k = match<CatAttrs>(*only(g, "cat").prim);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->dim, 2);

  const NormAttrs* n = match<NormAttrs>(*only(g, "layer_norm").prim);
  ASSERT_NE(n, nullptr);
  EXPECT_TRUE(n->centered);
  EXPECT_EQ(n->eps, 1e-7 + 1e-23);  // the exact double, not a printed one
  EXPECT_FALSE(n->weight);
  EXPECT_FALSE(n->bias);

  const Primitive& m = *only(g, "mul_scalar").prim;
  ASSERT_NE(match<UnaryAttrs>(m), nullptr);
  EXPECT_EQ(match<UnaryAttrs>(m)->alpha, 0.1 + 1e-17);
  EXPECT_EQ(scalar_alpha(m), 0.1 + 1e-17);

  // Other ops do not match; an op without a scalar has no scalar_alpha.
  const Primitive& add_prim = *only(g, "add").prim;
  EXPECT_EQ(match<CastAttrs>(add_prim), nullptr);
  EXPECT_EQ(match<UnaryAttrs>(add_prim), nullptr);
  ASSERT_NE(match<BinaryAttrs>(add_prim), nullptr);
  EXPECT_EQ(match<BinaryAttrs>(add_prim)->op, kernels::BinaryOp::Add);
  EXPECT_EQ(match<ReduceAttrs>(*only(g, "cast").prim), nullptr);
  EXPECT_EQ(scalar_alpha(add_prim), std::nullopt);
}

TEST(TypedAttrs, EqualityStillSeesEveryDigit) {
  // match reads fields; equivalent() (CSE, kernel dedup) still compares the exact printed attributes.
  auto fn = [](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{mul(a[0], 0.5000001), mul(a[0], 0.5000002), mul(a[0], 0.5000001)};
  };
  Graph g = trace(fn, {randn({3}, DType::f64)}).graph;
  std::vector<const Primitive*> muls;
  for (const Node& n : g.nodes)
    if (n.prim->name() == "mul_scalar") muls.push_back(n.prim.get());
  ASSERT_EQ(muls.size(), 3u);
  EXPECT_FALSE(muls[0]->equivalent(*muls[1]));
  EXPECT_TRUE(muls[0]->equivalent(*muls[2]));
}

// A collective half under a name the compiler has never seen: it declares its phase (autograd/
// primitive_collective.h), which is all the scheduler reads.
class NewCollective final : public Primitive, public CollectiveStep {
 public:
  explicit NewCollective(CollectivePhase phase) : phase_(phase) {}
  std::string_view name() const override { return "some_new_collective"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return in; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return in; }
  CollectivePhase phase() const override { return phase_; }

 private:
  CollectivePhase phase_;
};

TEST(TypedAttrs, TheLoweringReadsWhatOpsDeclareNotTheirNames) {
  EXPECT_EQ(schedule_class(NewCollective(CollectivePhase::Start)), -1) << "starts go as early as they can";
  EXPECT_EQ(schedule_class(NewCollective(CollectivePhase::Wait)), 1) << "waits as late";
  auto fn = [](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{mul(a[0], 1.0), mul(a[0], 1.0 + 0x1p-52), add(a[0], 0.0), cast(a[0], DType::f32)};
  };
  Graph g = trace(fn, {randn({3}, DType::f64)}).graph;
  const TensorMeta meta{Shape{3}, DType::f64, Device::cpu()};
  std::vector<const Node*> muls;
  for (const Node& n : g.nodes)
    if (n.prim->name() == "mul_scalar") muls.push_back(&n);
  ASSERT_EQ(muls.size(), 2u);
  EXPECT_EQ(identity_input(*muls[0]->prim, {meta}, {meta}), 0u) << "x * 1";
  EXPECT_EQ(identity_input(*muls[1]->prim, {meta}, {meta}), std::nullopt) << "x * (1 + 2^-52)";
  EXPECT_EQ(identity_input(*only(g, "add_scalar").prim, {meta}, {meta}), 0u) << "x + 0";
  EXPECT_EQ(schedule_class(*only(g, "add_scalar").prim), 0);
  EXPECT_TRUE(is_layout_glue(*only(g, "cast").prim));
  EXPECT_FALSE(is_layout_glue(*only(g, "add_scalar").prim));
  // The optimizers' updates declare they fuse horizontally (HorizontalUpdate, autograd/primitive_multi_tensor.h).
  EXPECT_TRUE(is_multi_tensor_update(*optim::make_adamw_update(2, 0, {})));
  EXPECT_TRUE(is_multi_tensor_update(*optim::make_sgd_update(2, 0, {})));
  EXPECT_FALSE(is_multi_tensor_update(*only(g, "cast").prim));
}

}  // namespace
}  // namespace ingot::compiler
