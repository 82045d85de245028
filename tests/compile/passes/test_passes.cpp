// Each graph pass on small graphs: what it guarantees, and that the graph still computes the same values.
#include <gtest/gtest.h>

#include <sstream>

#include "autograd/ops.h"
#include "autograd/ops/sum_pieces.h"
#include "compile/api.h"
#include "compile/exec/executor.h"
#include "compile/explain.h"
#include "compile/passes/passes.h"
#include "compile/trace/trace.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "runtime/file_util.h"
#include "runtime/rng.h"
#include "tests/testing.h"

namespace ingot::compiler {
namespace {

Graph graph_of(const StepFn& fn, const std::vector<Tensor>& args) { return std::move(trace(fn, args).graph); }

std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& args) {
  Executable exe;
  exe.graph = g;
  exe.steps = plan_steps(g);
  return execute(exe, args);
}

size_t count_ops(const Graph& g, std::string_view name) {
  size_t n = 0;
  for (const Node& node : g.nodes) n += node.prim->name() == name;
  return n;
}

void expect_same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(allclose(a[i], b[i], 1e-6, 1e-7)) << "output " << i;
}

TEST(Dce, RemovesNodesThatReachNoRoot) {
  Tensor x = randn({3, 5});
  Graph g = graph_of([](const std::vector<Tensor>& a) {
    Tensor unused = exp(a[0]) * 2.0;
    return std::vector<Tensor>{relu(a[0])};
  }, {x});
  ASSERT_EQ(g.nodes.size(), 3u);
  EXPECT_TRUE(passes::dce(g, {}));
  g.verify();
  EXPECT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(count_ops(g, "relu"), 1u);
  expect_same(run(g, {x}), {relu(x)});
  EXPECT_FALSE(passes::dce(g, {}));
}

TEST(Cse, MergesEquivalentOpsOnTheSameInputs) {
  Tensor x = randn({4, 4});
  Graph g = graph_of([](const std::vector<Tensor>& a) { return std::vector<Tensor>{exp(a[0]) + exp(a[0])}; }, {x});
  ASSERT_EQ(count_ops(g, "exp"), 2u);
  EXPECT_TRUE(passes::cse(g, {}));
  g.verify();
  EXPECT_EQ(count_ops(g, "exp"), 1u);
  expect_same(run(g, {x}), {exp(x) * 2.0});
}

TEST(Cse, KeepsOpsThatDifferInAttributes) {
  Tensor x = randn({4});
  Graph g = graph_of([](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * 2.0 + a[0] * 3.0}; }, {x});
  EXPECT_FALSE(passes::cse(g, {}));
  EXPECT_EQ(count_ops(g, "mul_scalar"), 2u);
}

TEST(Simplify, BypassesIdentityOps) {
  Tensor x = randn({2, 6});
  Graph g = graph_of([](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{tanh(clone(a[0] * 1.0) + 0.0)};
  }, {x});
  ASSERT_EQ(g.nodes.size(), 4u);
  EXPECT_TRUE(passes::simplify(g, {}));
  passes::dce(g, {});
  g.verify();
  EXPECT_EQ(g.nodes.size(), 1u) << g.str();
  expect_same(run(g, {x}), {tanh(x)});
}

TEST(Simplify, FoldsOpsOnConstantsCreatedWhileTracing) {
  Tensor x = randn({3});
  Graph g = graph_of([](const std::vector<Tensor>& a) {
    Tensor c = exp(from_vector({0.5, 1.0, 2.0}, {3}));  // a constant made inside the function
    return std::vector<Tensor>{a[0] * c};
  }, {x});
  ASSERT_EQ(count_ops(g, "exp"), 1u);
  EXPECT_TRUE(passes::simplify(g, {}));
  g.verify();
  EXPECT_EQ(count_ops(g, "exp"), 0u) << g.str();
  expect_same(run(g, {x}), {x * exp(from_vector({0.5, 1.0, 2.0}, {3}))});
}

TEST(Simplify, NeverFoldsCapturedTensorsThatMayChange) {
  Tensor w = randn({3});
  Tensor x = randn({3});
  Graph g = graph_of([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * exp(w)}; }, {x});
  EXPECT_FALSE(passes::simplify(g, {}));
  w.fill_(0.25);  // captured by handle: the graph reads the new value
  expect_same(run(g, {x}), {x * exp(full({3}, 0.25))});
}

TEST(Functionalize, OptimizerUpdateBecomesAPureNodePlusWriteBacks) {
  Tensor w = randn({5}).set_requires_grad(true);
  Tensor x = randn({5});
  Graph g = graph_of([&](const std::vector<Tensor>& a) {
    Tensor loss = sum(a[0] * w);
    loss.backward();
    {
      NoGradGuard ng;
      Tensor next = w - w.grad() * 0.1;
      w.copy_(next);
      trace_observer()->on_assign(w, next);
    }
    w.zero_grad();
    return std::vector<Tensor>{loss};
  }, {x});
  ASSERT_EQ(g.writebacks.size(), 1u);
  EXPECT_FALSE(passes::functionalize(g, {}));  // nothing to drop: the one write-back is a real update
  g.writebacks.push_back(WriteBack{g.writebacks[0].input, g.inputs[static_cast<size_t>(g.writebacks[0].input)].value});
  g.writebacks.erase(g.writebacks.begin());
  EXPECT_TRUE(passes::functionalize(g, {}));  // a write-back of the input's own value is a no-op
  EXPECT_TRUE(g.writebacks.empty());
}

TEST(Remat, RecomputesCheapSavedValuesUnderABudget) {
  Tensor w = randn({16, 16}).set_requires_grad(true);
  Tensor x = randn({8, 16});
  auto fn = [&](const std::vector<Tensor>& a) {
    Tensor h = gelu(matmul(a[0], w));
    Tensor y = tanh(h * 1.5);
    Tensor loss = sum(y * y);
    loss.backward();
    return std::vector<Tensor>{loss};
  };
  Graph g = graph_of(fn, {x});
  const Tensor eager_grad = w.grad().clone_raw();
  w.zero_grad();
  int64_t saved = 0;
  EXPECT_FALSE(passes::remat(g, {.budget = 1.0}, &saved));
  EXPECT_TRUE(passes::remat(g, {.budget = 0.3}, &saved));
  passes::dce(g, {});
  g.verify();
  EXPECT_GT(saved, 0);
  size_t recomputed = 0;
  for (const Node& n : g.nodes) recomputed += !n.forward && n.prim->name() == "tanh";
  EXPECT_EQ(recomputed, 1u) << "tanh(gelu(mm) * 1.5) is recomputed from the saved matmul output\n" << g.str();
  run(g, {x});
  EXPECT_TRUE(allclose(w.grad(), eager_grad, 1e-5, 1e-6));
}

// A row norm is cheap to recompute (Primitive::cheap_to_recompute): its output, read in the backward only by the
// linear's weight gradient, is remade from the input its own backward keeps anyway. One copy of the norm serves
// both of its saved outputs (the normalized rows and the statistics its backward reads), and the gradients match.
TEST(Remat, RecomputesARowNormOnceForItsOutputAndStatistics) {
  Tensor w = randn({16, 8}).set_requires_grad(true), g = randn({16}).set_requires_grad(true);
  Tensor x = randn({4, 16}).set_requires_grad(true);
  auto fn = [&](const std::vector<Tensor>& a) {
    Tensor loss = sum(tanh(matmul(rms_norm(a[0], g, 1e-5), w)));
    loss.backward();
    return std::vector<Tensor>{loss};
  };
  Graph gr = graph_of(fn, {x});
  const Tensor want_w = w.grad().clone_raw(), want_g = g.grad().clone_raw();
  w.zero_grad();
  g.zero_grad();
  int64_t recomputed = 0, saved = 0;
  ASSERT_TRUE(passes::remat(gr, {.budget = 0.1}, &recomputed, &saved));
  passes::dce(gr, {});
  gr.verify();
  EXPECT_GT(recomputed, 0);
  EXPECT_GT(saved, recomputed);
  size_t norms = 0;
  for (const Node& n : gr.nodes) norms += !n.forward && n.prim->name() == "rms_norm";
  EXPECT_EQ(norms, 1u) << "one recomputed norm for its output and its statistics\n" << gr.str();
  run(gr, {x});
  EXPECT_TRUE(allclose(w.grad(), want_w, 1e-5, 1e-6));
  EXPECT_TRUE(allclose(g.grad(), want_g, 1e-5, 1e-6));
}

// Note [Saved values remade for free]: a SwiGLU's silu(g) is read in the backward only by the product's gradient
// (pointwise) and made from g, which silu's own gradient keeps anyway: with generated kernels it is remade there at
// the default budget (the forward's copy is no longer kept), and the gradients stay the same. With eager kernels
// (generated = false) the default budget changes nothing.
TEST(Remat, RemakesAPointwiseValueOfKeptInputsForItsPointwiseReadersAtAnyBudget) {
  Tensor w1 = randn({16, 32}).set_requires_grad(true), w2 = randn({16, 32}).set_requires_grad(true);
  Tensor x = randn({8, 16});
  auto fn = [&](const std::vector<Tensor>& a) {
    Tensor loss = sum(tanh(silu(matmul(a[0], w1)) * matmul(a[0], w2)));
    loss.backward();
    return std::vector<Tensor>{loss};
  };
  Graph g = graph_of(fn, {x});
  const Tensor want1 = w1.grad().clone_raw(), want2 = w2.grad().clone_raw();
  w1.zero_grad();
  w2.zero_grad();
  auto backward_silus = [](const Graph& gr) {
    size_t n = 0;
    for (const Node& node : gr.nodes) n += !node.forward && node.prim->name() == "silu";
    return n;
  };
  EXPECT_FALSE(passes::remat(g, {.budget = 1.0, .generated = false}));
  int64_t recomputed = 0, saved = 0;
  ASSERT_TRUE(passes::remat(g, {.budget = 1.0, .generated = true}, &recomputed, &saved)) << g.str();
  passes::dce(g, {});
  g.verify();
  EXPECT_EQ(backward_silus(g), 1u) << g.str();
  EXPECT_EQ(recomputed, 8 * 32 * 4) << "silu(g), 8 x 32 f32, and nothing else";
  EXPECT_GT(saved, recomputed);
  const std::vector<std::vector<int32_t>> readers = g.readers();
  for (const Node& node : g.nodes) {  // the forward's silu is read by the forward only
    if (!node.forward || node.prim->name() != "silu") continue;
    for (int32_t r : readers[static_cast<size_t>(node.outputs[0])]) {
      EXPECT_TRUE(g.nodes[static_cast<size_t>(r)].forward) << g.str();
    }
  }
  run(g, {x});
  EXPECT_TRUE(allclose(w1.grad(), want1, 1e-5, 1e-6));
  EXPECT_TRUE(allclose(w2.grad(), want2, 1e-5, 1e-6));
}

// The same silu(g) read in the backward by a product (the weight gradient of a linear that follows it) is not free:
// remade, it would be a kernel of its own writing what was kept. At the default budget it stays kept.
TEST(Remat, KeepsAPointwiseValueAProductReadsInTheBackward) {
  Tensor w1 = randn({16, 32}).set_requires_grad(true), w3 = randn({32, 8}).set_requires_grad(true);
  Tensor x = randn({8, 16});
  Graph g = graph_of([&](const std::vector<Tensor>& a) {
    Tensor loss = sum(tanh(matmul(silu(matmul(a[0], w1)), w3)));
    loss.backward();
    return std::vector<Tensor>{loss};
  }, {x});
  EXPECT_FALSE(passes::remat(g, {.budget = 1.0, .generated = true})) << g.str();
}

// explain says what memory_budget recomputed (compile/explain.h): the bytes the backward reads of forward values and
// how many of them it remakes; at the default budget the line is not there.
TEST(Remat, ExplainSaysHowMuchIsRecomputed) {
  Tensor w = randn({256, 256}).set_requires_grad(true);
  Tensor x = randn({512, 256});
  auto fn = [&](const std::vector<Tensor>& a) {
    Tensor loss = sum(tanh(gelu(matmul(a[0], w)) * 1.5));
    loss.backward();
    Tensor g = w.grad();  // an output, so the backward is not dead code
    w.zero_grad();
    return std::vector<Tensor>{loss, g};
  };
  CompileOptions o;
  o.memory_budget = 0.3;
  const std::string report = explain(fn, {x}, o);
  const size_t at = report.find("recomputed in the backward (memory_budget 0.3): ");
  ASSERT_NE(at, std::string::npos) << report;
  // gelu(mm) * 1.5 (512 x 256 f32 = 0.5 MiB) at least is remade from the matmul's output.
  EXPECT_EQ(report.substr(at, 80).find(": 0.00 MiB of"), std::string::npos) << report.substr(at, 120);
  EXPECT_EQ(explain(fn, {x}, {}).find("recomputed in the backward"), std::string::npos);
}

TEST(SplitUpdate, OneUpdatePerParameterAfterEveryReaderOfIt) {
  Tensor w1 = randn({4, 4}).set_requires_grad(true), w2 = randn({4, 3}).set_requires_grad(true);
  Tensor r1 = w1.clone_raw().set_requires_grad(true), r2 = w2.clone_raw().set_requires_grad(true);
  auto step_fn = [](Tensor& a, Tensor& b, optim::AdamW& opt) {
    return [&](const std::vector<Tensor>& in) {
      Tensor loss = sum(matmul(tanh(matmul(in[0], a)), b));
      loss.backward();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{loss};
    };
  };
  optim::AdamW opt({w1, w2}), ref_opt({r1, r2});
  Tensor x = randn({2, 4});
  Graph g = graph_of(step_fn(w1, w2, opt), {x});  // step 1 (eager, traced)
  ASSERT_EQ(count_ops(g, "adamw_update"), 1u);
  EXPECT_FALSE(passes::split_update(g, {.budget = 1.0}));
  EXPECT_TRUE(passes::split_update(g, {.budget = 0.5}));
  g.verify();
  ASSERT_EQ(count_ops(g, "adamw_update"), 2u);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].prim->name() != "adamw_update") continue;
    for (size_t k = 1; k < g.nodes[i].inputs.size(); ++k)
      for (size_t r = i + 1; r < g.nodes.size(); ++r)
        for (int32_t v : g.nodes[r].inputs) EXPECT_NE(v, g.nodes[i].inputs[k]) << "node " << r << " reads an input of update " << i;
  }
  run(g, {x});  // step 2 through the split graph
  auto ref = step_fn(r1, r2, ref_opt);
  ref({x});
  ref({x});
  EXPECT_TRUE(allclose(w1, r1, 1e-6, 1e-7));
  EXPECT_TRUE(allclose(w2, r2, 1e-6, 1e-7));
}

TEST(Fuse, PointwiseChainIsOneGroup) {
  Tensor x = randn({4, 8}), b = randn({8});
  Graph g = graph_of([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{exp(relu(a[0] + b)) * 0.5}; }, {x});
  EXPECT_TRUE(passes::fuse(g, {}));
  g.verify();
  ASSERT_EQ(g.groups.size(), 1u);
  EXPECT_EQ(g.groups[0].kind, GroupKind::Pointwise);
  EXPECT_EQ(g.groups[0].nodes.size(), 4u);
  EXPECT_EQ(g.groups[0].outputs.size(), 1u);
  EXPECT_EQ(g.groups[0].inputs.size(), 2u);  // x and the broadcast bias
}

TEST(Fuse, SoftmaxWithPrologueAndEpilogueIsOneRowReductionGroup) {
  Tensor x = randn({4, 8});
  Graph g = graph_of([](const std::vector<Tensor>& a) { return std::vector<Tensor>{softmax(a[0] * 2.0) * 3.0}; }, {x});
  passes::fuse(g, {});
  g.verify();
  ASSERT_EQ(g.groups.size(), 1u) << g.str();
  EXPECT_EQ(g.groups[0].kind, GroupKind::RowReduction);
  EXPECT_EQ(g.groups[0].nodes.size(), 3u);
}

// Note [Column sums]: on CUDA, the row sum of a tall bf16 matrix that a matmul produced stays an eager node (the
// reduce kernel's 16-byte column path); a small one, an f32 one, one with a pointwise producer, or any on the CPU
// is generated as before.
TEST(Fuse, TallHalfColumnSumsOfAMatmulStayEagerOnCuda) {
  auto sum_grouped = [](int64_t n, int64_t c, DType dt, bool cuda, bool pointwise_producer) {
    Tensor x = randn({n, 16}, dt), w = randn({16, c}, dt);
    Graph g = graph_of([&](const std::vector<Tensor>& a) {
      Tensor y = matmul(a[0], w);
      return std::vector<Tensor>{sum(pointwise_producer ? y * 2.0 : y, {0})};
    }, {x});
    if (cuda)
      for (Value& v : g.values) v.device = Device::cuda(0);  // the pass reads devices only as metadata
    passes::fuse(g, {passes::pass_target(g)});
    for (const Node& node : g.nodes)
      if (node.prim->name() == "sum") return node.group >= 0;
    ADD_FAILURE() << "no sum";
    return false;
  };
  EXPECT_FALSE(sum_grouped(2048, 256, DType::bf16, true, false));
  EXPECT_FALSE(sum_grouped(4096, 768, DType::f16, true, false));
  EXPECT_TRUE(sum_grouped(2048, 256, DType::bf16, false, false));
  EXPECT_TRUE(sum_grouped(1024, 256, DType::bf16, true, false));
  EXPECT_TRUE(sum_grouped(2048, 260, DType::bf16, true, false));
  EXPECT_TRUE(sum_grouped(2048, 256, DType::f32, true, false));
  EXPECT_TRUE(sum_grouped(2048, 256, DType::bf16, true, true));
}

// Note [Parameter casts]: on CUDA, the bf16 casts of f32 weights that only matmuls read are one multi-tensor
// group; a cast with a pointwise reader, or any on the CPU, is not in it.
TEST(Fuse, ParameterCastsForMatmulsAreOneMultiTensorGroupOnCuda) {
  Tensor x = randn({8, 16}), w1 = randn({16, 16}), w2 = randn({16, 16}), w3 = randn({8, 16});
  auto fn = [&](const std::vector<Tensor>& a) {
    Tensor h = matmul(cast(a[0], DType::bf16), cast(w1, DType::bf16));
    h = matmul(h, cast(w2, DType::bf16));
    return std::vector<Tensor>{h + cast(w3, DType::bf16)};  // w3's cast feeds an add: it joins that group instead
  };
  for (bool cuda : {true, false}) {
    Graph g = graph_of(fn, {x});
    if (cuda)
      for (Value& v : g.values) v.device = Device::cuda(0);
    passes::fuse(g, {passes::pass_target(g)});
    g.verify();
    int multi = 0;
    size_t members = 0;
    for (const FusionGroup& fg : g.groups)
      if (fg.kind == GroupKind::MultiTensor) ++multi, members = fg.nodes.size();
    EXPECT_EQ(multi, cuda ? 1 : 0) << g.str();
    if (cuda) {
      EXPECT_EQ(members, 3u) << "x, w1 and w2 (graph inputs all); w3's cast joined the add";
    }
  }
}

// Note [Parameter casts] for LoRA adapters kept in f32: the bf16 casts of adapter weights whose readers are matmuls,
// the concatenation of attention's A weights (Note [Adapters of one input]) and the transposes the backward takes of
// them are one multi-tensor group too. (The 8B LoRA step's 256 small casts were not these but the copies of updated
// masters into bf16 adapters: Note [Update copies], the next test.)
TEST(Fuse, AdapterWeightCastsReadThroughViewsAndACatAreOneMultiTensorGroupOnCuda) {
  Tensor x = randn({8, 16}, DType::bf16), w = randn({24, 16}, DType::bf16);
  Tensor a1 = randn({2, 16}).set_requires_grad(true), a2 = randn({2, 16}).set_requires_grad(true);
  Tensor b1 = randn({24, 2}).set_requires_grad(true), b2 = randn({24, 2}).set_requires_grad(true);
  Tensor c = randn({8, 24}).set_requires_grad(true);
  Graph g = graph_of([&](const std::vector<Tensor>& a) {
    const Tensor h = linear(a[0], cat({cast(a1, DType::bf16), cast(a2, DType::bf16)}, 0));
    const std::vector<Tensor> hs = split_sizes(h, {2, 2}, -1);
    Tensor y = linear(a[0], w) + linear(hs[0], cast(b1, DType::bf16)) + linear(hs[1], cast(b2, DType::bf16));
    y = y + exp(cast(c, DType::bf16));  // a pointwise reader: c's cast joins that group instead
    Tensor loss = sum(cast(y, DType::f32));
    loss.backward();
    return std::vector<Tensor>{loss, a1.grad(), a2.grad(), b1.grad(), b2.grad()};
  }, {x});
  for (Value& v : g.values) v.device = Device::cuda(0);
  passes::fuse(g, {passes::pass_target(g)});
  g.verify();
  size_t members = 0;
  for (const FusionGroup& fg : g.groups)
    if (fg.kind == GroupKind::MultiTensor) members += fg.nodes.size();
  EXPECT_EQ(members, 4u) << "a1, a2, b1 and b2's casts; not c's\n" << g.str();
}

// Note [Update copies]: with f32 masters of bf16 parameters, the casts of the updated masters back into the
// parameters are one multi-tensor group on CUDA (the 8B LoRA step ran 256 of them as kernels of their own); on the
// CPU, none.
TEST(Fuse, CopiesOfUpdatedMastersIntoBf16ParametersAreOneMultiTensorGroupOnCuda) {
  Tensor x = randn({8, 16}, DType::bf16);
  Tensor w1 = randn({16, 16}, DType::bf16).set_requires_grad(true), w2 = randn({16, 4}, DType::bf16).set_requires_grad(true);
  for (bool cuda : {true, false}) {
    optim::MasterWeights mw({w1, w2});
    optim::AdamW opt(mw.master(), optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
    Graph g = graph_of([&](const std::vector<Tensor>& a) {
      Tensor loss = sum(cast(matmul(matmul(a[0], w1), w2), DType::f32));
      loss.backward();
      mw.copy_grads_to_master();
      opt.step();
      mw.copy_to_model();
      opt.zero_grad();
      w1.zero_grad();
      w2.zero_grad();
      return std::vector<Tensor>{loss};
    }, {x});
    if (cuda)
      for (Value& v : g.values) v.device = Device::cuda(0);
    passes::functionalize(g, {passes::pass_target(g)});
    passes::dce(g, {passes::pass_target(g)});
    passes::fuse(g, {passes::pass_target(g)});
    g.verify();
    size_t copy_groups = 0, members = 0;
    for (const FusionGroup& fg : g.groups) {
      if (fg.kind != GroupKind::MultiTensor || g.nodes[static_cast<size_t>(fg.nodes[0])].prim->name() != "cast") continue;
      ++copy_groups;
      members = fg.nodes.size();
      for (int32_t n : fg.nodes) {
        const Value& in = g.values[static_cast<size_t>(g.nodes[static_cast<size_t>(n)].inputs[0])];
        ASSERT_GE(in.producer, 0);
        EXPECT_EQ(g.nodes[static_cast<size_t>(in.producer)].prim->name(), "adamw_update") << g.str();
      }
    }
    EXPECT_EQ(copy_groups, cuda ? 1u : 0u) << g.str();
    if (cuda) {
      EXPECT_EQ(members, 2u) << g.str();
    }
  }
}

// Note [Column sums]: the f32 cast of such a sum (a bf16 bias gradient on its way to AdamW) folds into it on CUDA.
TEST(Fuse, TheF32CastOfAnEagerColumnSumFoldsIntoIt) {
  Tensor x = randn({2048, 16}, DType::bf16), w = randn({16, 256}, DType::bf16);
  Graph g = graph_of([&](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{cast(sum(matmul(a[0], w), {0}), DType::f32)};
  }, {x});
  for (Value& v : g.values) v.device = Device::cuda(0);
  ASSERT_TRUE(passes::fuse_matmul_epilogues(g, {passes::pass_target(g)}));
  passes::dce(g, {passes::pass_target(g)});
  g.verify();
  int casts = 0, wide = 0;
  for (const Node& n : g.nodes) {
    casts += n.prim->name() == "cast";
    wide += n.prim->name() == "sum" && exact_attrs(*n.prim) == "dims=[0], keepdim=false, out=f32";
  }
  EXPECT_EQ(casts, 0) << g.str();
  EXPECT_EQ(wide, 1) << g.str();
  passes::fuse(g, {passes::pass_target(g)});
  for (const Node& n : g.nodes)
    if (n.prim->name() == "sum") {
      EXPECT_LT(n.group, 0) << "the widened sum stays on the eager column path";
    }
}

TEST(Fuse, NeverGroupsAcrossAnOpaqueOpThatDependsOnTheGroup) {
  Tensor x = randn({4, 4}), w = randn({4, 4});
  Graph g = graph_of([&](const std::vector<Tensor>& a) {
    Tensor e = exp(a[0]);
    return std::vector<Tensor>{e + matmul(e, w)};  // joining 'add' to exp's group would form a cycle
  }, {x});
  passes::fuse(g, {});
  g.verify();
  ASSERT_EQ(g.groups.size(), 2u) << g.str();
  EXPECT_TRUE(passes::schedule(g, {}) || true);
  expect_same(run(g, {x}), {exp(x) + matmul(exp(x), w)});
}

TEST(Schedule, MakesEveryFusionGroupContiguous) {
  Tensor x = randn({4, 4}), y = randn({2, 3});
  Graph g = graph_of([](const std::vector<Tensor>& a) {
    Tensor e = exp(a[0]);
    Tensor other = sin(a[1]);  // different shape: its own group, traced between e and relu(e)
    return std::vector<Tensor>{relu(e), other};
  }, {x, y});
  passes::fuse(g, {});
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_TRUE(passes::schedule(g, {}));
  g.verify();
  for (const FusionGroup& fg : g.groups)
    EXPECT_EQ(fg.nodes.back() - fg.nodes.front() + 1, static_cast<int32_t>(fg.nodes.size())) << g.str();
  expect_same(run(g, {x, y}), {relu(exp(x)), sin(y)});
}

TEST(MemoryPlan, ReusesBuffersOfDeadValuesWithoutOverlappingLiveOnes) {
  Tensor x = randn({64, 64});
  Graph g = graph_of([](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{cos(sin(relu(exp(tanh(a[0])))))};
  }, {x});
  passes::MemoryPlan p = passes::memory_plan(g);
  const int64_t buf = 64 * 64 * 4;
  // Consecutive chain values are live together, so never overlap (two buffers), and the dead ones are reused
  // (no more than two): the four intermediates of the chain fit in two blocks.
  EXPECT_EQ(p.arena_bytes, 2 * buf);
  EXPECT_EQ(p.unplanned_peak, 2 * buf);
}


// Note [Pieces read by the update] (compile/passes/pieces_into_update.h): an update whose gradient is a sum of pieces
// reads the pieces; a sum read elsewhere too stays for that reader; both graphs update as the eager step does.
// A step whose gradients are sums of bf16 pieces (a narrow wire's, compiled ZeRO-3), updated by AdamW; with
// `also_read` the step returns one sum too, so the update is not its only reader.
StepFn pieces_step(std::vector<Tensor>& params, optim::AdamW& opt, bool also_read) {
  return [&params, &opt, also_read](const std::vector<Tensor>& in) {
    std::vector<Tensor> out;
    for (size_t k = 0; k < params.size(); ++k) {
      const std::vector<Tensor> pieces(in.begin() + static_cast<std::ptrdiff_t>(4 * k),
                                       in.begin() + static_cast<std::ptrdiff_t>(4 * k + 4));
      Tensor g = sum_pieces(pieces, 0.25, DType::f32);
      params[k].set_grad(g);
      if (also_read && k == 0) out.push_back(g * 2.0);
    }
    opt.step();
    opt.zero_grad();
    out.push_back(params[0] * 1.0);
    return out;
  };
}

// Two parameters (37 and 1029 elements, from `seed`) and their copies, each set with an AdamW (weight decay 0.1).
struct PiecesParams {
  std::vector<Tensor> w, ref;
  optim::AdamW opt, ref_opt;
  static std::vector<Tensor> leaves(std::vector<Tensor> ts) {
    for (Tensor& t : ts) t.set_requires_grad(true);
    return ts;
  }
  static optim::AdamWOptions options() {
    optim::AdamWOptions o;
    o.weight_decay = 0.1;
    return o;
  }
  explicit PiecesParams(uint64_t seed)
      : w(leaves([seed] {
          manual_seed(seed);
          return std::vector<Tensor>{randn({37}), randn({1029})};
        }())),
        ref(leaves({w[0].clone_raw(), w[1].clone_raw()})),
        opt(w, options()),
        ref_opt(ref, options()) {}
};

// A step over given parameters and their optimizer (pieces_step, widened_bucket_step with their flag bound).
using MakeStep = std::function<StepFn(std::vector<Tensor>&, optim::AdamW&)>;

// Step 2 through the rewritten graph `g` (traced from step 1 of ps.w on in1) against two eager steps of ps.ref: the
// same bits.
void expect_second_step_as_eager(const Graph& g, PiecesParams& ps, const MakeStep& make,
                                 const std::vector<Tensor>& in1, const std::vector<Tensor>& in2) {
  run(g, in2);
  StepFn ref_step = make(ps.ref, ps.ref_opt);
  ref_step(in1);
  ref_step(in2);
  for (size_t k = 0; k < ps.w.size(); ++k)
    EXPECT_EQ(amax(abs(sub(ps.w[k], ps.ref[k]))).item(), 0.0) << "parameter " << k;
}

// Three steps compiled through the whole pipeline (generated CPU kernels) against eager steps of ps.ref on the same
// fresh inputs, within the f32 rounding of the generated update. Returns the last compiled graph.
std::string expect_compiled_steps_follow_eager(PiecesParams& ps, const MakeStep& make, CompileOptions o,
                                               const std::function<std::vector<Tensor>()>& inputs) {
  TempDir dir("ingot-update-");
  o.cache_dir = dir.path();
  CompiledFunction f = compile(make(ps.w, ps.opt), o);
  StepFn ref_step = make(ps.ref, ps.ref_opt);
  for (int step = 0; step < 3; ++step) {
    const std::vector<Tensor> in = inputs();
    f(in);
    ref_step(in);
  }
  for (size_t k = 0; k < ps.w.size(); ++k) EXPECT_TRUE(allclose(ps.w[k], ps.ref[k], 1e-6, 1e-7)) << "parameter " << k;
  return f.stats().last_graph;
}

std::vector<Tensor> pieces_inputs(const std::vector<int64_t>& sizes) {
  std::vector<Tensor> in;
  for (int64_t n : sizes)
    for (int r = 0; r < 4; ++r) in.push_back(randn({n}).to(DType::bf16));
  return in;
}

TEST(PiecesIntoUpdate, AnUpdateReadsASumsPiecesAndUpdatesAsTheSum) {
  for (const bool also_read : {false, true}) {
    SCOPED_TRACE(also_read ? "a sum read by the step too" : "sums read by the update alone");
    PiecesParams ps(31);
    std::vector<Tensor>& w = ps.w;
    optim::AdamW& opt = ps.opt;
    const std::vector<Tensor> in1 = pieces_inputs({37, 1029}), in2 = pieces_inputs({37, 1029});
    Graph g = graph_of(pieces_step(w, opt, also_read), in1);  // step 1 (eager, traced)
    ASSERT_EQ(count_ops(g, "sum_pieces"), 2u);
    EXPECT_TRUE(passes::pieces_into_update(g, {}));
    g.verify();
    EXPECT_EQ(count_ops(g, "sum_pieces"), also_read ? 1u : 0u) << "a sum with another reader stays for it";
    size_t with_pieces = 0;
    for (const Node& n : g.nodes) {
      std::ostringstream attrs;
      n.prim->print_attrs(attrs);
      with_pieces += n.prim->name() == "adamw_update" && attrs.str().find("gradient pieces=4") != std::string::npos;
    }
    EXPECT_EQ(with_pieces, 1u) << "the update reads the pieces either way";
    expect_second_step_as_eager(
        g, ps, [also_read](std::vector<Tensor>& p, optim::AdamW& o) { return pieces_step(p, o, also_read); }, in1,
        in2);
  }
}

// sum_pieces refuses pieces it cannot sum, by name: different lengths or dtypes, no pieces, a narrow sum dtype.
TEST(PiecesIntoUpdate, SumPiecesRefusesPiecesOfDifferentLengthsOrDtypesAndANarrowSum) {
  const Tensor a = randn({8}).to(DType::bf16), b = randn({9}).to(DType::bf16), c = randn({8});
  EXPECT_NE(ingot::testing::error_of([&] { sum_pieces({a, b}, 0.5, DType::f32); }).find("sum_pieces: pieces must be"),
            std::string::npos);
  EXPECT_NE(ingot::testing::error_of([&] { sum_pieces({a, c}, 0.5, DType::f32); }).find("sum_pieces: pieces must be"),
            std::string::npos);
  EXPECT_NE(ingot::testing::error_of([&] { sum_pieces({}, 0.5, DType::f32); }).find("sum_pieces: no pieces"),
            std::string::npos);
  EXPECT_NE(ingot::testing::error_of([&] { sum_pieces({a, a}, 0.5, DType::bf16); }).find("sums in f32 or f64"),
            std::string::npos);
  EXPECT_EQ(sum_pieces({a, a}, 0.5, DType::f32).to_vector(), a.to(DType::f32).to_vector());
}

// Through the whole pipeline (generated CPU kernels): the update's kernel adds the pieces itself, and three steps
// follow the eager steps within the f32 rounding of the generated update.
TEST(PiecesIntoUpdate, TheGeneratedUpdateAddsThePiecesAndFollowsEager) {
  PiecesParams ps(32);
  CompileOptions o;
  o.split_update = true;  // one update per parameter, as bucket_updates makes one per unit
  const std::string graph = expect_compiled_steps_follow_eager(
      ps, [](std::vector<Tensor>& p, optim::AdamW& opt) { return pieces_step(p, opt, false); }, o,
      [] { return pieces_inputs({37, 1029}); });
  EXPECT_EQ(graph.find("sum_pieces("), std::string::npos) << graph;
  EXPECT_NE(graph.find("gradient pieces=4"), std::string::npos) << graph;
}

// Note [Narrow gradients read by the update] (compile/passes/widen_in_update.h): a bf16 "bucket" widened to f32 and
// sliced into the parameters' gradients, as DDP with reduce_dtype bf16 leaves it; with `also_read` the step returns
// the widened bucket too, so the cast has a reader besides the update.
StepFn widened_bucket_step(std::vector<Tensor>& params, optim::AdamW& opt, bool also_read) {
  return [&params, &opt, also_read](const std::vector<Tensor>& in) {
    const Tensor wide = cast(in[0], DType::f32);
    int64_t at = 0;
    for (Tensor& p : params) {
      p.set_grad(reshape(narrow(wide, 0, at, p.numel()), p.shape()));
      at += p.numel();
    }
    opt.step();
    opt.zero_grad();
    std::vector<Tensor> out{params[0] * 1.0};
    if (also_read) out.push_back(wide * 2.0);
    return out;
  };
}

TEST(WidenInUpdate, AnUpdateReadsTheNarrowSlicesAndUpdatesAsAfterTheCast) {
  for (const bool also_read : {false, true}) {
    SCOPED_TRACE(also_read ? "the widened bucket read by the step too" : "the widened bucket read by the update alone");
    PiecesParams ps(33);
    std::vector<Tensor>& w = ps.w;
    optim::AdamW& opt = ps.opt;
    const Tensor in1 = randn({37 + 1029 + 6}).to(DType::bf16), in2 = randn({37 + 1029 + 6}).to(DType::bf16);
    Graph g = graph_of(widened_bucket_step(w, opt, also_read), {in1});  // step 1 (eager, traced)
    ASSERT_EQ(count_ops(g, "cast"), 1u) << g.str();
    EXPECT_EQ(passes::widen_in_update(g, {}), !also_read);
    g.verify();
    EXPECT_EQ(count_ops(g, "cast"), also_read ? 1u : 0u) << g.str();
    for (const Node& n : g.nodes) {
      if (n.prim->name() != "adamw_update") continue;
      for (size_t t = 0; t < w.size(); ++t) {
        EXPECT_EQ(g.values[static_cast<size_t>(n.inputs[1 + w.size() + t])].dtype,
                  also_read ? DType::f32 : DType::bf16) << "gradient " << t;
      }
    }
    expect_second_step_as_eager(
        g, ps, [also_read](std::vector<Tensor>& p, optim::AdamW& o) { return widened_bucket_step(p, o, also_read); },
        {in1}, {in2});
  }
}

// Through the whole pipeline (generated CPU kernels): the update's kernel loads the bf16 gradients itself, and
// three steps follow the eager steps within the f32 rounding of the generated update.
TEST(WidenInUpdate, TheGeneratedUpdateLoadsBf16GradientsAndFollowsEager) {
  PiecesParams ps(34);
  const std::string graph = expect_compiled_steps_follow_eager(
      ps, [](std::vector<Tensor>& p, optim::AdamW& opt) { return widened_bucket_step(p, opt, false); }, CompileOptions{},
      [] { return std::vector<Tensor>{randn({37 + 1029 + 6}).to(DType::bf16)}; });
  EXPECT_EQ(graph.find("cast("), std::string::npos) << graph;
}
}  // namespace
}  // namespace ingot::compiler
