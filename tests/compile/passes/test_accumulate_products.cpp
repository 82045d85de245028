// compile/passes/accumulate_products.cpp (Note [Products accumulated in place]): a sum of two products that only
// opaque ops read becomes one matmul_accumulate computing the later product into the other's output, and the graph
// still computes what eager does; sums that a kernel would fuse, that broadcast, or whose summands are read elsewhere
// stay. The pass is for CUDA targets; cpu_too runs it on the CPU graphs here.
#include <gtest/gtest.h>

#include <functional>

#include "autograd/ops.h"
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

// The caller's argument position a graph value comes from, or -1.
int arg_of(const Graph& g, int32_t v) {
  const Value& val = g.values[static_cast<size_t>(v)];
  return val.producer < 0 ? g.inputs[static_cast<size_t>(val.input_index)].arg : -1;
}

const Node* first_node(const Graph& g, std::string_view name) {
  for (const Node& n : g.nodes)
    if (n.prim->name() == name) return &n;
  return nullptr;
}

constexpr DType kDtypes[] = {DType::f32, DType::f64, DType::bf16};

TEST(AccumulateProducts, ASumOfTwoProductsReadByAProductBecomesTheLaterProductAccumulatingIntoTheOther) {
  for (DType dt : kDtypes)
    for (bool swapped : {false, true}) {
      manual_seed(3);
      const std::vector<Tensor> args = random_args({{6, 5}, {5, 4}, {6, 3}, {3, 4}, {4, 7}}, dt);
      auto fn = [swapped](const std::vector<Tensor>& a) {
        Tensor p = matmul(a[0], a[1]), q = matmul(a[2], a[3]);
        return std::vector<Tensor>{matmul(swapped ? add(q, p) : add(p, q), a[4])};
      };
      Graph g = trace(fn, args).graph;
      ASSERT_EQ(count_nodes(g, "matmul"), 3);
      EXPECT_FALSE(passes::accumulate_products(g, {})) << "a CPU target keeps its generated add";
      ASSERT_TRUE(passes::accumulate_products(g, {.cpu_too = true}));
      passes::dce(g, {});
      g.verify();
      EXPECT_EQ(count_nodes(g, "add"), 0);
      EXPECT_EQ(count_nodes(g, "matmul"), 2);
      const Node* acc = first_node(g, "matmul_accumulate");
      ASSERT_NE(acc, nullptr);
      // q = a[2] @ a[3] runs later, whichever side of the add it is on; p's output is the accumulated buffer.
      EXPECT_EQ(arg_of(g, acc->inputs[0]), 2);
      EXPECT_EQ(arg_of(g, acc->inputs[1]), 3);
      EXPECT_EQ(g.producer(acc->inputs[2]).prim->name(), "matmul");
      expect_close(run_graph(g, args), fn, args, dt);
    }
}

// v_proj's forward in the 8B profile: two linears over [B, T, in] inputs, each seen through its reshape to
// [B, T, out], summed and handed on through views (to attention there; here to a product and the graph's outputs).
TEST(AccumulateProducts, LinearsSeenThroughReshapesAccumulateAndTheirReshapesGo) {
  for (DType dt : kDtypes) {
    manual_seed(4);
    const std::vector<Tensor> args = random_args({{2, 3, 5}, {4, 5}, {2, 3, 2}, {4, 2}, {3, 6}}, dt);
    auto fn = [](const std::vector<Tensor>& a) {
      Tensor v = add(linear(a[0], a[1], Tensor()), linear(a[2], a[3], Tensor()));
      return std::vector<Tensor>{matmul(transpose(v, 1, 2), a[4]), v};
    };
    Graph g = trace(fn, args).graph;
    ASSERT_EQ(count_nodes(g, "linear"), 2);
    const int reshapes = count_nodes(g, "reshape");
    ASSERT_TRUE(passes::accumulate_products(g, {.cpu_too = true}));
    passes::dce(g, {});
    g.verify();
    EXPECT_EQ(count_nodes(g, "add"), 0);
    EXPECT_EQ(count_nodes(g, "linear"), 1);
    EXPECT_EQ(count_nodes(g, "matmul_accumulate"), 1);
    EXPECT_EQ(count_nodes(g, "reshape"), reshapes - 1) << "the accumulated linear's reshape is gone";
    const Node* acc = first_node(g, "matmul_accumulate");
    ASSERT_NE(acc, nullptr);
    EXPECT_EQ(exact_attrs(*acc->prim), "trans_a=0, trans_b=1") << "x @ w^T";
    expect_close(run_graph(g, args), fn, args, dt);
  }
}

TEST(AccumulateProducts, SumsThatAKernelWouldFuseBroadcastOrShareASummandStay) {
  manual_seed(5);
  const std::vector<Tensor> args = random_args({{6, 5}, {5, 4}, {6, 3}, {3, 4}, {4, 7}, {1, 3}, {6, 4}}, DType::f32);
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  const std::pair<const char*, Fn> cases[] = {
      {"the accumulated buffer is read elsewhere",
       [](const std::vector<Tensor>& a) {
         Tensor p = matmul(a[0], a[1]), q = matmul(a[2], a[3]);
         return std::vector<Tensor>{matmul(add(p, q), a[4]), p};
       }},
      {"a pointwise op reads the sum",
       [](const std::vector<Tensor>& a) {
         return std::vector<Tensor>{relu(add(matmul(a[0], a[1]), matmul(a[2], a[3])))};
       }},
      {"a reduction reads the sum through a view",
       [](const std::vector<Tensor>& a) {
         return std::vector<Tensor>{sum(reshape(add(matmul(a[0], a[1]), matmul(a[2], a[3])), {24}), {0})};
       }},
      {"the add broadcasts",
       [](const std::vector<Tensor>& a) {
         return std::vector<Tensor>{matmul(add(matmul(a[0], a[1]), matmul(a[5], a[3])), a[4])};
       }},
      {"one summand is no product",
       [](const std::vector<Tensor>& a) { return std::vector<Tensor>{matmul(add(matmul(a[0], a[1]), a[6]), a[4])}; }},
  };
  for (const auto& [what, fn] : cases) {
    Graph g = trace(fn, args).graph;
    EXPECT_FALSE(passes::accumulate_products(g, {.cpu_too = true})) << what;
  }
}

// The primitive itself: a fresh buffer holding c (eval), c's own buffer (eval_into, what the executor calls when c
// dies there) and a given slice of a larger buffer (eval_to, a gradient bucket's slice).
TEST(AccumulateProducts, MatmulAccumulateComputesIntoAFreshBufferItsBaseOrAGivenSlice) {
  for (DType dt : kDtypes) {
    manual_seed(6);
    const Tensor a = randn({4, 5}, dt), b = randn({3, 5}, dt), c = randn({2, 2, 3}, dt);
    const double alpha = 0.375;
    const std::shared_ptr<Primitive> p = make_matmul_accumulate(false, true, alpha);
    EXPECT_EQ(exact_attrs(*p), "trans_a=0, trans_b=1, alpha=0.375");
    EXPECT_FALSE(p->differentiable());
    const Tensor want = add(mul(reshape(linear(cast(a, DType::f64), cast(b, DType::f64), Tensor()), {2, 2, 3}), alpha),
                            cast(c, DType::f64));
    const double tol = dt == DType::bf16 ? 1e-2 : dt == DType::f32 ? 1e-5 : 1e-12;
    const Tensor fresh = p->eval({a, b, c})[0];
    EXPECT_EQ(fresh.shape(), c.shape());
    EXPECT_LE(max_rel_error(cast(fresh, DType::f64), want, tol, tol), 1.0) << dtype_name(dt);
    const Tensor base = c.clone_raw();
    const Tensor into = p->eval_into({a, b, base}, base)[0];
    EXPECT_TRUE(into.storage() == base.storage()) << "computed over c's buffer";
    EXPECT_LE(max_rel_error(cast(into, DType::f64), want, tol, tol), 1.0) << dtype_name(dt);
    const Tensor bucket = full({20}, 7.0, dt);
    const Tensor slot = bucket.as_strided({2, 2, 3}, {6, 3, 1}, 4);
    p->eval_to({a, b, c}, {slot});
    EXPECT_LE(max_rel_error(cast(slot, DType::f64), want, tol, tol), 1.0) << dtype_name(dt);
    const std::vector<double> all = cast(bucket, DType::f64).to_vector();
    for (size_t i : {0u, 1u, 2u, 3u, 16u, 17u, 18u, 19u}) EXPECT_EQ(all[i], 7.0) << "outside the slice";
  }
}

}  // namespace
}  // namespace ingot::compiler
