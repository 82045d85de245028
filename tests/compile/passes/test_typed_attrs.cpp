// Typed attributes (Note [Typed attributes], autograd/primitive.h): the compiler reads an op's attributes
// through match<A>, never through printed text. The structs hold what the op was built with (dims wrapped and
// sorted, the exact scalar), match is null for other ops, and the passes that used to compare printed text
// still find their patterns (tests/compile/passes/test_matmul_epilogue.cpp, test_pack_attention_grads.cpp).
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "autograd/ops/attrs.h"
#include "autograd/ops/loss_fused.h"
#include "autograd/primitive_collective.h"
#include "compile/graph_checks.h"
#include "compile/lower/lower_kernel.h"
#include "compile/lower/lowering.h"
#include "compile/passes/passes.h"
#include "compile/step_fixture.h"
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
  explicit NewCollective(CollectivePhase phase, CollectiveOp op = CollectiveOp::None) : phase_(phase), op_(op) {}
  std::string_view name() const override { return "some_new_collective"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return in; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return in; }
  CollectivePhase phase() const override { return phase_; }
  CollectiveOp op() const override { return op_; }

 private:
  CollectivePhase phase_;
  CollectiveOp op_;
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

// An op under a name no pass knows that declares `of`'s attributes and otherwise behaves as `of`: a pass that
// reads what ops declare treats it as `of`; one that compares names passes it by.
template <class A>
class Renamed final : public Primitive, public WithAttrs<A> {
 public:
  Renamed(std::shared_ptr<Primitive> of, A a) : WithAttrs<A>(std::move(a)), of_(std::move(of)) {}
  std::string_view name() const override { return "renamed"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return of_->infer(in); }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return of_->eval(in); }
  bool differentiable() const override { return of_->differentiable(); }
  bool saves_input(size_t i) const override { return of_->saves_input(i); }
  FusionKind fusion_kind() const override { return of_->fusion_kind(); }

 private:
  std::shared_ptr<Primitive> of_;
};

template <class A>
bool rename_if(Node& n) {
  const A* a = match<A>(*n.prim);
  if (!a) return false;
  n.prim = std::make_shared<Renamed<A>>(n.prim, *a);
  return true;
}

// Every add, GELU, GELU gradient, reshape, expand, clone, contiguous, attention backward and cross-entropy (forward
// and backward) of a GPT-2 step renamed: the passes that matched those names (accumulate_index_add,
// matmul_epilogue, pack_attention_grads, fuse_cross_entropy) rewrite as many nodes as on the step as traced, and
// the lowering still takes copies and same-shape views for identities.
TEST(TypedAttrs, ThePassesReadWhatOpsDeclareNotTheirNames) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  manual_seed(13);
  auto fn = testing::loss_and_grads(testing::tiny_gpt2());
  Graph g = trace(fn, {ids, tgt}).graph;
  int renamed = 0;
  for (Node& n : g.nodes) {
    const BinaryAttrs* b = match<BinaryAttrs>(*n.prim);
    const UnaryAttrs* u = match<UnaryAttrs>(*n.prim);
    if (b && (b->op == kernels::BinaryOp::Add || b->op == kernels::BinaryOp::GeluTanhGrad))
      renamed += rename_if<BinaryAttrs>(n);
    else if (u && u->op == kernels::UnaryOp::GeluTanh)
      renamed += rename_if<UnaryAttrs>(n);
    else
      renamed += rename_if<ReshapeAttrs>(n) || rename_if<ExpandAttrs>(n) || rename_if<CopyAttrs>(n) ||
                 rename_if<AttentionBwdAttrs>(n) || rename_if<CrossEntropyAttrs>(n);
  }
  ASSERT_GT(renamed, 0);
  const int layers = 2;
  ASSERT_EQ(count_nodes(g, "gelu_tanh_grad") + count_nodes(g, "gelu_tanh") + count_nodes(g, "add") +
                count_nodes(g, "reshape") + count_nodes(g, "attention_bwd") + count_nodes(g, "cross_entropy") +
                count_nodes(g, "cross_entropy_bwd"),
            0);
  ASSERT_TRUE(passes::accumulate_index_add(g, {})) << "add";
  EXPECT_EQ(count_nodes(g, "index_add_accumulate"), 1);
  ASSERT_TRUE(passes::pack_attention_grads(g, {})) << "reshape, attention_bwd";
  EXPECT_EQ(count_nodes(g, "attention_bwd_packed"), layers);
  ASSERT_TRUE(passes::fuse_matmul_epilogues(g, {.cpu_too = true, .with_dbias = true}));
  EXPECT_EQ(count_nodes(g, "matmul_dgelu"), layers) << "gelu_tanh_grad, reshape";
  EXPECT_EQ(count_nodes(g, "linear_gelu"), layers) << "gelu_tanh, reshape, linear";
  ASSERT_TRUE(passes::fuse_cross_entropy(g, {})) << "cross_entropy, cross_entropy_bwd";
  EXPECT_EQ(count_nodes(g, "cross_entropy_fused"), 1);
  passes::dce(g, {});
  g.verify();

  const TensorMeta meta{Shape{2, 3}, DType::f32, Device::cpu()};
  const Renamed<CopyAttrs> copy(nullptr, {});
  const Renamed<ReshapeAttrs> view(nullptr, {{2, 3}});
  const Renamed<ExpandAttrs> expanded(nullptr, {{2, 3}});
  for (const Primitive* p : std::initializer_list<const Primitive*>{&copy, &view, &expanded})
    EXPECT_EQ(identity_input(*p, {meta}, {meta}), 0u) << "a copy, a view to the same shape";
  // A unit's gather is found by what it starts (explain.cpp, unit_gathers.cpp).
  EXPECT_TRUE(is_all_gather_start(NewCollective(CollectivePhase::Start, CollectiveOp::AllGather)));
  EXPECT_FALSE(is_all_gather_start(NewCollective(CollectivePhase::Start, CollectiveOp::ReduceScatter)));
  EXPECT_FALSE(is_all_gather_start(NewCollective(CollectivePhase::Wait)));
  EXPECT_TRUE(is_collective_wait(NewCollective(CollectivePhase::Wait)));
}

// Note [Parameter casts] with the casts renamed: fuse still makes them one multi-tensor group on CUDA and the
// lowering still takes that group for parameter casts (compile/passes/fuse.cpp, compile/lower/lower_kernel.cpp).
TEST(TypedAttrs, ParameterCastsAreFoundByTheirAttributesNotTheirName) {
  Tensor x = randn({8, 16}), w1 = randn({16, 16}), w2 = randn({16, 16});
  auto fn = [&](const std::vector<Tensor>& a) {
    Tensor h = matmul(cast(a[0], DType::bf16), cast(w1, DType::bf16));
    return std::vector<Tensor>{matmul(h, cast(w2, DType::bf16))};
  };
  Graph g = trace(fn, {x}).graph;
  for (Node& n : g.nodes) rename_if<CastAttrs>(n);
  ASSERT_EQ(count_nodes(g, "cast"), 0);
  for (Value& v : g.values) v.device = Device::cuda(0);
  passes::fuse(g, {passes::pass_target(g)});
  g.verify();
  const FusionGroup* multi = nullptr;
  for (const FusionGroup& fg : g.groups)
    if (fg.kind == GroupKind::MultiTensor) multi = &fg;
  ASSERT_NE(multi, nullptr) << g.str();
  EXPECT_EQ(multi->nodes.size(), 3u);
  std::string why;
  const std::optional<LoweredGroup> lg = lower_group(g, *multi, &why);
  ASSERT_TRUE(lg.has_value()) << why;
  EXPECT_EQ(lg->spec.name, "cast_params");
  EXPECT_EQ(lg->tensors, 3u);
}

}  // namespace
}  // namespace ingot::compiler
