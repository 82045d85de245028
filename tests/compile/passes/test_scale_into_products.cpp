// compile/passes/scale_into_products.cpp (Note [Scales folded into products]): a scalar multiply that only products
// read, directly or through views (LoRA's split of the shared A-product), becomes their alpha, and the graph still
// computes what eager does; a multiply read by anything else, or that is a graph output, stays. The pass is for CUDA
// targets; cpu_too runs it on the CPU graphs here. Also the alpha attribute itself: printed only when it is not 1,
// exactly, and told apart by equivalent().
#include <gtest/gtest.h>

#include <functional>

#include "autograd/ops.h"
#include "autograd/ops/attrs.h"
#include "autograd/ops/matmul_fused.h"
#include "compile/exec/executor.h"
#include "compile/graph_checks.h"
#include "compile/passes/passes.h"
#include "compile/trace/trace.h"
#include "runtime/rng.h"
#include "tests/compile/passes/product_pass_checks.h"

namespace ingot::compiler {
namespace {

using product_pass_checks::expect_close;
using product_pass_checks::random_args;
using product_pass_checks::run_graph;

int scalar_muls(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes)
    if (const UnaryAttrs* u = match<UnaryAttrs>(*node.prim)) n += u->op == kernels::UnaryOp::MulScalar;
  return n;
}

// The alphas of the graph's products, in node order.
std::vector<double> alphas(const Graph& g) {
  std::vector<double> r;
  for (const Node& n : g.nodes)
    if (std::optional<double> a = product_alpha(*n.prim)) r.push_back(*a);
  return r;
}

constexpr DType kDtypes[] = {DType::f32, DType::f64, DType::bf16};

TEST(ScaleIntoProducts, AScaledOperandBecomesTheAlphaOfEveryProductReadingIt) {
  for (DType dt : kDtypes) {
    manual_seed(8);
    const std::vector<Tensor> args = random_args({{6, 5}, {5, 4}, {3, 5}}, dt);
    auto fn = [](const std::vector<Tensor>& a) {
      const Tensor h = mul(a[0], 0.3);
      return std::vector<Tensor>{matmul(h, a[1]), linear(h, a[2], Tensor()), matmul(transpose(h, 0, 1), h)};
    };
    Graph g = trace(fn, args).graph;
    ASSERT_EQ(scalar_muls(g), 1);
    EXPECT_FALSE(passes::scale_into_products(g, {})) << "a CPU target keeps its generated multiply";
    ASSERT_TRUE(passes::scale_into_products(g, {.cpu_too = true}));
    passes::dce(g, {});
    g.verify();
    EXPECT_EQ(scalar_muls(g), 0);
    // h^T h reads the scaled value twice.
    EXPECT_EQ(alphas(g), (std::vector<double>{0.3, 0.3, 0.3 * 0.3}));
    expect_close(run_graph(g, args), fn, args, dt);
  }
}

// Note [Adapters of one input] (autograd/nn/lora.h): the scaled [B, T, 3r] activation is split into each
// projection's [B, T, r] and each piece reshaped to [B * T, r] for its B-product.
TEST(ScaleIntoProducts, ThroughTheSplitAndReshapesOfASharedAProduct) {
  for (DType dt : kDtypes) {
    manual_seed(9);
    const std::vector<Tensor> args = random_args({{2, 3, 5}, {6, 5}, {4, 2}, {4, 2}, {3, 2}}, dt);
    auto fn = [](const std::vector<Tensor>& a) {
      const Tensor h = mul(linear(a[0], a[1], Tensor()), 2.5);
      const std::vector<Tensor> hs = split_sizes(h, {2, 2, 2}, -1);
      return std::vector<Tensor>{linear(hs[0], a[2], Tensor()), linear(hs[1], a[3], Tensor()),
                                 linear(hs[2], a[4], Tensor())};
    };
    Graph g = trace(fn, args).graph;
    ASSERT_EQ(count_nodes(g, "split"), 1);
    ASSERT_TRUE(passes::scale_into_products(g, {.cpu_too = true}));
    passes::dce(g, {});
    g.verify();
    EXPECT_EQ(scalar_muls(g), 0);
    EXPECT_EQ(alphas(g), (std::vector<double>{1.0, 2.5, 2.5, 2.5})) << "the A-product itself is not scaled";
    expect_close(run_graph(g, args), fn, args, dt);
  }
}

TEST(ScaleIntoProducts, AMultiplyReadByAnythingButAProductOperandStays) {
  manual_seed(10);
  const std::vector<Tensor> args = random_args({{6, 5}, {5, 4}, {3, 5}, {3}}, DType::f32);
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  const std::pair<const char*, Fn> cases[] = {
      {"a pointwise op reads it too",
       [](const std::vector<Tensor>& a) {
         const Tensor h = mul(a[0], 0.3);
         return std::vector<Tensor>{matmul(h, a[1]), relu(h)};
       }},
      {"it is a graph output",
       [](const std::vector<Tensor>& a) {
         const Tensor h = mul(a[0], 0.3);
         return std::vector<Tensor>{matmul(h, a[1]), h};
       }},
      {"a view of it is a graph output",
       [](const std::vector<Tensor>& a) {
         const Tensor h = mul(a[0], 0.3);
         return std::vector<Tensor>{matmul(h, a[1]), reshape(h, {30})};
       }},
      {"a linear with a bias reads it (the bias kernel has no alpha)",
       [](const std::vector<Tensor>& a) { return std::vector<Tensor>{linear(mul(a[0], 0.3), a[2], a[3])}; }},
  };
  for (const auto& [what, fn] : cases) {
    Graph g = trace(fn, args).graph;
    EXPECT_FALSE(passes::scale_into_products(g, {.cpu_too = true})) << what;
  }
}

// Note [Exact attributes] (autograd/primitive.h): graphs without folded scales print, compare and hash as before;
// a folded scale is printed to the last bit and told apart from a nearby one.
TEST(ScaleIntoProducts, AlphaIsPrintedOnlyWhenNotOneAndExactly) {
  const Tensor x = randn({4, 3}), w = randn({5, 3}), b = randn({5});
  auto fn = [](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{matmul(a[0], transpose(a[1], 0, 1)), linear(a[0], a[1], Tensor())};
  };
  Graph g = trace(fn, {x, w}).graph;
  std::shared_ptr<Primitive> mm, lin;
  for (const Node& n : g.nodes) {
    if (n.prim->name() == "matmul") mm = n.prim;
    if (n.prim->name() == "linear") lin = n.prim;
  }
  ASSERT_TRUE(mm && lin);
  EXPECT_EQ(exact_attrs(*mm), "trans_a=0, trans_b=0");
  EXPECT_EQ(exact_attrs(*lin), "");
  EXPECT_TRUE(scaled_product(*mm, 1.0)->equivalent(*mm));
  EXPECT_TRUE(scaled_product(*mm, 1.0)->differentiable());
  EXPECT_EQ(exact_attrs(*scaled_product(*mm, 1.0000001)), "trans_a=0, trans_b=0, alpha=1.0000001000000001");
  EXPECT_EQ(exact_attrs(*scaled_product(*lin, 1.0000001)), "alpha=1.0000001000000001");
  EXPECT_FALSE(scaled_product(*mm, 0.5000001)->equivalent(*scaled_product(*mm, 0.5000002)));
  EXPECT_FALSE(scaled_product(*lin, 0.5)->equivalent(*lin));
  EXPECT_FALSE(scaled_product(*lin, 0.5)->differentiable()) << "compiler-only";
  EXPECT_TRUE(scaled_product(*scaled_product(*mm, 0.5), 0.25)->equivalent(*scaled_product(*mm, 0.125)));
  for (const Node& n : g.nodes)
    if (n.prim != mm && n.prim != lin) {
      EXPECT_EQ(scaled_product(*n.prim, 2.0), nullptr) << n.prim->name();
    }
  // A scaled linear with a bias is refused rather than scaling the bias or leaving it unscaled.
  EXPECT_ANY_THROW(scaled_product(*lin, 0.5)->eval({x, w, b}));
  const Tensor got = scaled_product(*lin, 0.5)->eval({x, w, Tensor()})[0];
  EXPECT_LE(max_rel_error(got, mul(linear(x, w, Tensor()), 0.5), 1e-6, 1e-6), 1.0);
}

}  // namespace
}  // namespace ingot::compiler
