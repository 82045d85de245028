// The norm backward split (compile/passes/decompose_norm_bwd.cpp) and the lowering of its two halves
// (compile/lower/lower_kernel.cpp): the graph the pass leaves, generated CPU kernels against eager autograd, and
// the kernels of a GPT-2 step (Note [Norm backward decomposition]).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "autograd/ops.h"
#include "autograd/ops/norm.h"
#include "compile/exec/executor.h"
#include "compile/lower/lower_kernel.h"
#include "compile/passes/passes.h"
#include "compile/pipeline.h"
#include "compile/step_fixture.h"
#include "compile/trace/trace.h"

namespace ingot::compiler {
namespace {

struct Case {
  bool centered = true;  // layer_norm, else rms_norm
  bool weight = true, bias = true;
  bool bf16_dy = false;  // the linear after the norm runs in bf16 (autocast): dy is a cast of its gradient
  Shape shape{2, 5, 48};
  DType dtype = DType::f32;  // of x, the parameters and the residual
  std::string str() const {
    return detail::str_cat(centered ? "layer_norm" : "rms_norm", " weight=", weight, " bias=", bias,
                           " bf16_dy=", bf16_dy, " ", dtype_name(dtype), shape_str(shape));
  }
};

// A norm between a residual stream and a linear layer, as in a transformer block:
//   h = x0 * 1.5;  out = h + cast(cast(norm(h), lin) @ W, f32);  loss = sum(out * r)
// so h's gradient is the norm's dx added to the residual's gradient r. The step returns the loss and the
// gradients of x0 and of the defined norm parameters.
struct NormBlock {
  Case c;
  Tensor x0, w, b, W;

  explicit NormBlock(const Case& cs) : c(cs) {
    manual_seed(21);
    const int64_t C = c.shape.back();
    x0 = (randn(c.shape, c.dtype) * 2.0 + 0.5).detach().set_requires_grad(true);
    if (c.weight) w = (randn({C}, c.dtype) * 0.5 + 1.0).detach().set_requires_grad(true);
    if (c.bias) b = randn({C}, c.dtype).detach().set_requires_grad(true);
    W = cast(randn({C, C}, c.dtype) * (1.0 / std::sqrt(static_cast<double>(C))), c.bf16_dy ? DType::bf16 : c.dtype);
  }
  std::vector<Tensor> leaves() const {
    std::vector<Tensor> ls{x0};
    if (c.weight) ls.push_back(w);
    if (c.bias) ls.push_back(b);
    return ls;
  }
  std::vector<Tensor> operator()(const std::vector<Tensor>& a) {
    for (Tensor& t : leaves()) t.zero_grad();
    Tensor h = x0 * 1.5;
    Tensor y = c.centered ? layer_norm(h, w, b) : rms_norm(h, w);
    Tensor out = h + cast(matmul(cast(y, W.dtype()), W), c.dtype);
    Tensor loss = sum(out * a[0]);
    loss.backward();
    std::vector<Tensor> r{loss};
    for (const Tensor& t : leaves()) r.push_back(t.grad());
    return r;
  }
};

size_t count_ops(const Graph& g, std::string_view name) {
  size_t n = 0;
  for (const Node& node : g.nodes) n += node.prim->name() == name;
  return n;
}

std::vector<int32_t> norm_bwd_nodes(const Graph& g) {
  std::vector<int32_t> r;
  for (const Node& n : g.nodes)
    if (norm_bwd_flags(*n.prim)) r.push_back(n.id);
  return r;
}

std::vector<Tensor> run_node_by_node(const Graph& g, const std::vector<Tensor>& args) {
  Executable exe;
  exe.graph = g;
  exe.steps = plan_steps(g);
  return execute(exe, args);
}

// Gradients of one step, in f32 or f64 (dy of the bf16 case is exactly the bf16 gradient widened), so the
// fused kernels differ from eager only by the order of their sums.
void expect_same_grads(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].shape(), want[i].shape()) << what << ", output " << i;
    ASSERT_EQ(got[i].dtype(), want[i].dtype()) << what << ", output " << i;
    const bool f64 = want[i].dtype() == DType::f64;
    EXPECT_LE(max_rel_error(got[i], want[i], f64 ? 1e-10 : 1e-4, f64 ? 1e-12 : 1e-5), 1.0)
        << what << ", output " << i << "\n got " << got[i].str(6) << "\nwant " << want[i].str(6);
  }
}

TEST(DecomposeNormBwd, SplitsIntoDxThenDwDbKeepingTheOutputValues) {
  for (const Case& c :
       {Case{true, true, true, true}, Case{false, true, false, false}, Case{true, false, true, false}}) {
    SCOPED_TRACE(c.str());
    NormBlock blk(c);
    Tensor r = randn(c.shape);
    Graph g = std::move(trace(std::ref(blk), {r}).graph);
    const std::vector<int32_t> before = norm_bwd_nodes(g);
    ASSERT_EQ(before.size(), 1u) << g.str();
    const Node orig = g.nodes[static_cast<size_t>(before[0])];
    const NormBwdFlags of = *norm_bwd_flags(*orig.prim);
    ASSERT_TRUE(of.dx && (of.dw || of.db));
    EXPECT_EQ(orig.prim->fusion_kind(), FusionKind::Opaque) << "eager's fused kernel stays one op";
    const size_t casts = count_ops(g, "cast");

    ASSERT_TRUE(passes::decompose_norm_bwd(g, {}));
    g.verify();
    const std::vector<int32_t> after = norm_bwd_nodes(g);
    ASSERT_EQ(after.size(), 2u) << g.str();
    const Node& dx = g.nodes[static_cast<size_t>(after[0])];
    const Node& par = g.nodes[static_cast<size_t>(after[1])];
    const NormBwdFlags fx = *norm_bwd_flags(*dx.prim), fp = *norm_bwd_flags(*par.prim);
    EXPECT_TRUE(fx.dx && !fx.dw && !fx.db);
    EXPECT_TRUE(!fp.dx && fp.dw == of.dw && fp.db == of.db);
    EXPECT_EQ(fx.centered, c.centered);
    EXPECT_EQ(fp.centered, c.centered);
    EXPECT_EQ(dx.prim->fusion_kind(), FusionKind::Reduction);
    EXPECT_EQ(par.prim->fusion_kind(), FusionKind::Reduction);
    EXPECT_EQ(dx.outputs, std::vector<int32_t>{orig.outputs[0]});
    EXPECT_EQ(par.outputs, std::vector<int32_t>(orig.outputs.begin() + 1, orig.outputs.end()));
    EXPECT_EQ(dx.inputs, orig.inputs);
    for (size_t i = 1; i < orig.inputs.size(); ++i) EXPECT_EQ(par.inputs[i], orig.inputs[i]) << "input " << i;
    if (c.bf16_dy) {
      // dy is the cast of the bf16 matmul gradient: the dw/db half reads its own copy of that cast.
      EXPECT_EQ(count_ops(g, "cast"), casts + 1);
      ASSERT_NE(par.inputs[0], orig.inputs[0]);
      const Node& copy = g.producer(par.inputs[0]);
      const Node& cast_dy = g.producer(orig.inputs[0]);
      EXPECT_EQ(copy.prim->name(), "cast");
      EXPECT_EQ(copy.inputs, cast_dy.inputs);
      EXPECT_NE(copy.id, cast_dy.id);
      EXPECT_LT(copy.id, par.id);
    } else {
      EXPECT_EQ(par.inputs[0], orig.inputs[0]) << "a dy from a matmul is read as it is";
      EXPECT_EQ(count_ops(g, "cast"), casts);
    }
    EXPECT_FALSE(passes::decompose_norm_bwd(g, {})) << "nothing left to split";
    // Node by node, each half runs the eager kernel with its flags (what an unlowered group does).
    expect_same_grads(run_node_by_node(g, {r}), blk({r}), "node by node");
  }
}

TEST(DecomposeNormBwd, LeavesABackwardWithoutParameterGradientsAlone) {
  NormBlock blk(Case{true, false, false, false});
  Tensor r = randn(blk.c.shape);
  Graph g = std::move(trace(std::ref(blk), {r}).graph);
  ASSERT_EQ(norm_bwd_nodes(g).size(), 1u);
  const Node& n = g.nodes[static_cast<size_t>(norm_bwd_nodes(g)[0])];
  EXPECT_EQ(n.prim->fusion_kind(), FusionKind::Reduction) << "dx alone is a row reduction";
  EXPECT_FALSE(passes::decompose_norm_bwd(g, {}));
}

TEST(DecomposeNormBwd, NodeByNodeBackendKeepsTheFusedEagerKernel) {
  NormBlock blk(Case{});
  Tensor r = randn(blk.c.shape);
  CompileOptions opts;
  opts.backend = CompileBackend::Eager;
  CompileStats stats;
  std::shared_ptr<Executable> exe = build_executable(std::move(trace(std::ref(blk), {r}).graph), opts, stats);
  EXPECT_EQ(norm_bwd_nodes(exe->graph).size(), 1u) << "no kernels to fuse the halves into";
  opts.backend = CompileBackend::Auto;
  exe = build_executable(std::move(trace(std::ref(blk), {r}).graph), opts, stats);
  EXPECT_EQ(norm_bwd_nodes(exe->graph).size(), 2u);
}

// Note [Column sums in row reductions]: on CUDA the backward stays one node, and fuse makes it one row
// reduction with the cast of dy as prologue and the residual add as epilogue, lowered with dw and db as column
// sums. Rows too wide for four warps' shared rows in a block (layer norm, dw and db: 1280 columns; rms_norm, dw
// only: 4096) are split as on the CPU. Only the values' devices are changed: no GPU is needed to check the graph
// and the spec.
TEST(DecomposeNormBwd, OnCudaTheBackwardStaysWholeAndLowersWithColumnSums) {
  struct Width {
    bool layer_norm;
    int64_t cols;
    bool whole;
  };
  for (const Width& wd : {Width{true, 48, true}, Width{true, 768, true}, Width{true, 1280, false},
                          Width{false, 2048, true}, Width{false, 4096, false}}) {
    const int64_t C = wd.cols;
    SCOPED_TRACE(detail::str_cat(wd.layer_norm ? "layer_norm" : "rms_norm", " C=", C));
    Case c{wd.layer_norm, true, wd.layer_norm, true};
    c.shape = {2, 3, C};
    NormBlock blk(c);
    Tensor r = randn(c.shape);
    Graph g = std::move(trace(std::ref(blk), {r}).graph);
    for (Value& v : g.values) v.device = Device::cuda(0);
    const int32_t id = norm_bwd_nodes(g).at(0);
    if (!wd.whole) {
      EXPECT_FALSE(passes::column_sum_norm_bwd(g, g.nodes[static_cast<size_t>(id)]));
      EXPECT_TRUE(passes::decompose_norm_bwd(g, {passes::pass_target(g)}));
      EXPECT_EQ(norm_bwd_nodes(g).size(), 2u);
      continue;
    }
    ASSERT_TRUE(passes::column_sum_norm_bwd(g, g.nodes[static_cast<size_t>(id)]));
    EXPECT_FALSE(passes::decompose_norm_bwd(g, {passes::pass_target(g)}));
    ASSERT_EQ(norm_bwd_nodes(g).size(), 1u);
    passes::fuse(g, {passes::pass_target(g)});
    const Node& n = g.nodes[static_cast<size_t>(norm_bwd_nodes(g)[0])];
    ASSERT_GE(n.group, 0) << "a whole norm backward joins a group on CUDA";
    const FusionGroup& fg = g.groups[static_cast<size_t>(n.group)];
    EXPECT_EQ(fg.kind, GroupKind::RowReduction);
    bool cast_in = false, add = false;
    for (int32_t m : fg.nodes) {
      const std::string_view name = g.nodes[static_cast<size_t>(m)].prim->name();
      cast_in = cast_in || (name == "cast" && m < n.id);
      add = add || (name == "add" && m > n.id);
    }
    EXPECT_TRUE(cast_in && add) << fg.name;
    std::string why;
    const std::optional<LoweredGroup> lg = lower_group(g, fg, &why);
    ASSERT_TRUE(lg) << why;
    int sums = 0;
    for (const codegen::Node& kn : lg->spec.nodes) sums += kn.op == codegen::Op::ColumnSum;
    EXPECT_EQ(sums, wd.layer_norm ? 2 : 1) << "dw and db, or dw";
    for (size_t o = 1; o < n.outputs.size(); ++o)
      EXPECT_NE(std::find(lg->outputs.begin(), lg->outputs.end(), n.outputs[o]), lg->outputs.end());
  }
}

// Every norm backward half runs in a generated kernel (not the eager fallback), with the cast of dy as its
// prologue and, for dx, the residual add as its epilogue; the gradients match eager autograd.
TEST(NormBwdLowering, GeneratedKernelsMatchEagerGradients) {
  const std::vector<Case> cases = {{true, true, true, false},
                                   {true, true, true, true},
                                   {true, false, true, true},
                                   {true, true, false, false},
                                   {true, false, false, false},
                                   {false, true, false, false},
                                   {false, true, false, true},
                                   {false, false, false, true},
                                   {true, true, true, true, Shape{7, 40}},
                                   {false, true, false, false, Shape{3, 1, 4, 24}},
                                   {true, true, true, false, Shape{6, 33}, DType::f64},
                                   {false, true, false, false, Shape{2, 3, 16}, DType::f64}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.str());
    NormBlock blk(c);
    Tensor r = randn(c.shape, c.dtype);
    CompileStats stats;
    std::shared_ptr<Executable> exe = build_executable(std::move(trace(std::ref(blk), {r}).graph), {}, stats);
    const Graph& g = exe->graph;
    std::vector<bool> has_kernel(g.groups.size(), false);
    for (const ExecStep& s : exe->steps)
      if (s.kernel && s.group >= 0) has_kernel[static_cast<size_t>(s.group)] = true;
    const std::vector<int32_t> halves = norm_bwd_nodes(g);
    ASSERT_EQ(halves.size(), c.weight || c.bias ? 2u : 1u) << g.str();
    for (int32_t id : halves) {
      const Node& n = g.nodes[static_cast<size_t>(id)];
      ASSERT_GE(n.group, 0) << g.str();
      const FusionGroup& fg = g.groups[static_cast<size_t>(n.group)];
      EXPECT_EQ(fg.kind, GroupKind::RowReduction);
      EXPECT_TRUE(has_kernel[static_cast<size_t>(fg.id)]) << fg.name << " runs as a generated kernel";
      std::vector<std::string_view> ops;
      for (int32_t m : fg.nodes) ops.push_back(g.nodes[static_cast<size_t>(m)].prim->name());
      auto has = [&](std::string_view op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };
      EXPECT_EQ(has("cast"), c.bf16_dy) << fg.name;
      if (norm_bwd_flags(*n.prim)->dx) {
        EXPECT_TRUE(has("add")) << fg.name << ": the residual add is fused";
      }
    }
    expect_same_grads(execute(*exe, {r}), blk({r}), "generated kernels");
  }
}

// A GPT-2 step with bf16 linears (autocast) on the CPU: each layer norm's dx is one kernel with the cast of
// dy before it and the residual add after it, and its dw/db another; the step still matches eager.
TEST(NormBwdLowering, Gpt2StepFusesEachDxWithItsResidualAdd) {
  auto bf16_linears = [](auto& m) { m->set_compute_dtype(DType::bf16); };
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  manual_seed(7);
  auto model = testing::tiny_gpt2();
  bf16_linears(model);
  auto fn = testing::loss_and_grads(model);
  CompileStats stats;
  std::shared_ptr<Executable> exe = build_executable(std::move(trace(fn, {ids, tgt}).graph), {}, stats);
  const Graph& g = exe->graph;
  std::vector<bool> has_kernel(g.groups.size(), false);
  for (const ExecStep& s : exe->steps)
    if (s.kernel && s.group >= 0) has_kernel[static_cast<size_t>(s.group)] = true;
  int dx_kernels = 0, param_kernels = 0, dx_with_add = 0, dx_with_cast_out = 0;
  for (int32_t id : norm_bwd_nodes(g)) {
    const Node& n = g.nodes[static_cast<size_t>(id)];
    ASSERT_GE(n.group, 0);
    const FusionGroup& fg = g.groups[static_cast<size_t>(n.group)];
    ASSERT_TRUE(has_kernel[static_cast<size_t>(fg.id)]) << fg.name;
    const bool dx = norm_bwd_flags(*n.prim)->dx;
    (dx ? dx_kernels : param_kernels) += 1;
    bool cast_in = false, add = false, cast_out = false;
    for (int32_t m : fg.nodes) {
      const Node& o = g.nodes[static_cast<size_t>(m)];
      auto dtype = [&](int32_t v) { return g.values[static_cast<size_t>(v)].dtype; };
      cast_in = cast_in || (o.prim->name() == "cast" && m < id && dtype(o.inputs[0]) == DType::bf16);
      add = add || (o.prim->name() == "add" && m > id);
      cast_out = cast_out || (o.prim->name() == "cast" && m > id && dtype(o.outputs[0]) == DType::bf16);
    }
    EXPECT_TRUE(cast_in) << fg.name << ": the cast of dy from bf16 is the prologue";
    if (dx) {
      dx_with_add += add;
      dx_with_cast_out += cast_out;
    } else {
      EXPECT_FALSE(add || cast_out) << fg.name;
    }
  }
  // Two norms per block and the final one. Every dx but the final norm's is added to the residual stream's
  // gradient; the sum goes to the previous block's output projection as bf16, except in the first block,
  // where it goes to the f32 embeddings, and the final norm's dx goes to the last projection directly.
  const int norms = 2 * 2 + 1;
  EXPECT_EQ(dx_kernels, norms);
  EXPECT_EQ(param_kernels, norms);
  EXPECT_EQ(dx_with_add, norms - 1);
  EXPECT_EQ(dx_with_cast_out, norms - 1);
  std::printf("[ kernels  ] %lld generated kernels, %lld launches\n", static_cast<long long>(stats.kernels),
              static_cast<long long>(stats.launches));
  const std::vector<Tensor> got = execute(*exe, {ids, tgt}), want = fn({ids, tgt});
  ASSERT_EQ(got.size(), want.size());
  EXPECT_NEAR(got[0].item(), want[0].item(), 1e-5 * std::abs(want[0].item()));
  for (size_t i = 1; i < want.size(); ++i)
    EXPECT_LE(max_rel_error(got[i], want[i], 1e-3, 1e-4), 1.0) << "gradient of parameter " << i - 1;
}

}  // namespace
}  // namespace ingot::compiler
