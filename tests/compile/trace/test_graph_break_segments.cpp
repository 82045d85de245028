// Graph breaks split the graph and the function continues (compile/trace/segments.h): calls after the first run
// the pieces between breaks as compiled graphs, with eager's results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "compile/explain.h"
#include "compile/step_fixture.h"
#include "compile/trace/trace.h"
#include "optim/clip.h"

namespace ingot::testing {
namespace {

CompileOptions node_by_node() {
  CompileOptions o;
  o.backend = CompileBackend::Eager;
  return o;
}

// Generated kernels round fused expressions differently from eager's op-by-op kernels (no intermediate
// stores): the same tolerance the other compiled-vs-eager tests use for a few ops.
void expect_close(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  if (rtol == 0) EXPECT_EQ(got.to_vector(), want.to_vector()) << what;
  else EXPECT_LE(max_rel_error(got, want, rtol, rtol), 1.0) << what;
}

int g_item_line = 0, g_branch_line = 0;

// A loss read on the host in the middle (logged), and a branch on the data.
std::vector<Tensor> item_and_branch(const Tensor& w, const std::vector<Tensor>& a, std::vector<double>* logged) {
  Tensor y = relu(matmul(a[0], w)) * 2.0 + 1.0;
  Tensor loss = sum(square(y));
  g_item_line = __LINE__ + 1;
  logged->push_back(loss.item());
  Tensor z = tanh(y * 0.1);
  g_branch_line = __LINE__ + 1;
  if (sum(a[0]).item() > 0) z = z * 2.0;
  else z = z + 1.0;
  return {exp(z * 0.5) - 1.0, loss};
}

void item_and_branch_matches_eager(CompileOptions opts, double rtol) {
  manual_seed(11);
  Tensor w = randn({8, 8});
  std::vector<double> eager_log, comp_log;
  auto eager = [&](const std::vector<Tensor>& a) { return item_and_branch(w, a, &eager_log); };
  CompiledFunction c = compile([&](const std::vector<Tensor>& a) { return item_and_branch(w, a, &comp_log); }, opts);
  int64_t compiled_after_warmup = -1, generated_after_warmup = -1;
  for (int call = 0; call < 8; ++call) {
    // Both directions of the branch, from the first compiled call on.
    Tensor x = add(randn({4, 8}), call % 2 == 0 ? 1.0 : -1.0);
    std::vector<Tensor> want = eager({x});
    std::vector<Tensor> got = c({x});
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) expect_close(got[k], want[k], rtol, "call " + std::to_string(call));
    if (call == 2) {  // calls 1 and 2 compiled each direction's segments
      compiled_after_warmup = c.stats().segments_compiled;
      generated_after_warmup = c.stats().kernels_generated + c.stats().kernels_reused;
    }
  }
  ASSERT_EQ(comp_log.size(), eager_log.size());
  for (size_t i = 0; i < comp_log.size(); ++i) EXPECT_NEAR(comp_log[i], eager_log[i], 1e-5 * std::abs(eager_log[i]));
  const CompileStats& s = c.stats();
  EXPECT_EQ(s.graphs, 3) << "split at the two host reads";
  EXPECT_EQ(s.eager_calls, 0);
  EXPECT_EQ(s.compiled_calls, 7);
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.recompiles, 0);
  // Segments: the part before the item(), the part up to the branch, and each direction's tail.
  EXPECT_EQ(compiled_after_warmup, 4);
  EXPECT_EQ(s.segments_compiled, compiled_after_warmup) << "calls 3..7 compile nothing";
  EXPECT_EQ(s.kernels_generated + s.kernels_reused, generated_after_warmup) << "no kernel is even looked up again";
  ASSERT_EQ(s.graph_breaks.size(), 2u);
  EXPECT_NE(s.graph_breaks[0].find("test_graph_break_segments.cpp:" + std::to_string(g_item_line)), std::string::npos)
      << s.graph_breaks[0];
  EXPECT_NE(s.graph_breaks[1].find("test_graph_break_segments.cpp:" + std::to_string(g_branch_line)),
            std::string::npos) << s.graph_breaks[1];
  EXPECT_NE(s.graph_breaks[1].find("read on the host"), std::string::npos) << s.graph_breaks[1];
  const std::string report = explain_report(c);
  EXPECT_NE(report.find("graphs: 3"), std::string::npos) << report;
  EXPECT_NE(report.find("segment 3:"), std::string::npos) << report;
  EXPECT_NE(report.find("ends at test_graph_break_segments.cpp:" + std::to_string(g_item_line)), std::string::npos)
      << report;
  std::printf("%s", report.c_str());
}

TEST(GraphBreakSegments, ItemAndDataDependentBranchMatchEagerNodeByNode) {
  item_and_branch_matches_eager(node_by_node(), 0.0);
}

TEST(GraphBreakSegments, ItemAndDataDependentBranchMatchEagerWithGeneratedKernels) {
  item_and_branch_matches_eager({}, 1e-5);
}

// A training step that reads the gradient norm between backward and the optimizer step and clips with it
// (the host scale reaches the fused update as a runtime input, like the learning rate).
StepRun train_with_grad_norm(bool compiled, int steps, CompileOptions opts, std::vector<double>* norms) {
  manual_seed(7);
  auto model = tiny_gpt2();
  optim::AdamW opt(model->parameters(), optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
  auto [ids, tgt] = repeating_batch(2, 8);
  auto fn = [&](const std::vector<Tensor>& batch) {
    Tensor loss = model->loss(batch[0], batch[1]);
    loss.backward();
    const double norm = optim::grad_norm(model->parameters());
    norms->push_back(norm);
    opt.set_grad_scale(optim::clip_coefficient(norm, 0.5));
    opt.step();
    opt.zero_grad();
    return std::vector<Tensor>{loss};
  };
  CompiledFunction step = compile(fn, opts);
  StepRun r;
  for (int i = 0; i < steps; ++i) {
    opt.set_lr(3e-3 * (i + 1) / steps);
    std::vector<Tensor> out = compiled ? step({ids, tgt}) : fn({ids, tgt});
    r.losses.push_back(out[0].item());
  }
  for (const Tensor& p : model->parameters()) r.params.push_back(p.clone_raw());
  r.stats = step.stats();
  return r;
}

void grad_norm_step_matches_eager(CompileOptions opts, double tol) {
  std::vector<double> eager_norms, comp_norms;
  StepRun eager = train_with_grad_norm(false, 5, {}, &eager_norms);
  StepRun comp = train_with_grad_norm(true, 5, opts, &comp_norms);
  ASSERT_EQ(comp.losses.size(), eager.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    if (tol == 0) {
      EXPECT_EQ(comp.losses[i], eager.losses[i]) << "step " << i;
      EXPECT_EQ(comp_norms[i], eager_norms[i]) << "step " << i;
    } else {
      EXPECT_NEAR(comp.losses[i], eager.losses[i], tol * std::abs(eager.losses[i])) << "step " << i;
      EXPECT_NEAR(comp_norms[i], eager_norms[i], tol * std::abs(eager_norms[i])) << "step " << i;
    }
  }
  ASSERT_EQ(comp.params.size(), eager.params.size());
  double worst = 0;
  for (size_t k = 0; k < eager.params.size(); ++k) {
    const double e = tol == 0 ? (comp.params[k].to_vector() == eager.params[k].to_vector() ? 0.0 : 2.0)
                              : max_rel_error(comp.params[k], eager.params[k], tol, tol);
    worst = std::max(worst, e);
    EXPECT_LE(e, 1.0) << "parameter " << k;
  }
  std::printf("[ compare  ] worst parameter error %.3g of the tolerance %g\n", worst, tol);
  EXPECT_LT(eager_norms.back(), eager_norms.front() * 10) << "sanity";
  const CompileStats& s = comp.stats;
  EXPECT_EQ(s.graphs, 2) << "forward+backward+norm, then the update";
  EXPECT_EQ(s.compiled_calls, 4);
  EXPECT_EQ(s.segments_compiled, 2) << "steps 3..5 reuse step 2's segments";
  EXPECT_GE(s.graph_breaks.size(), 1u);
}

TEST(GraphBreakSegments, GradNormBetweenBackwardAndStepIsBitIdenticalNodeByNode) {
  grad_norm_step_matches_eager(node_by_node(), 0.0);
}

// Fused kernels round differently (no intermediate stores) and AdamW's division by sqrt(v) amplifies that for
// parameters with tiny gradients: after 5 steps about 1.5e-6 relative, within 1e-5.
TEST(GraphBreakSegments, GradNormBetweenBackwardAndStepMatchesEagerWithGeneratedKernels) {
  grad_norm_step_matches_eager({}, 1e-5);
}

// A custom op kept out of graphs: it squares on the host, element by element.
class HostSquarePrim final : public Primitive {
 public:
  std::string_view name() const override { return "test_host_square"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[0]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor x = in[0].contiguous_raw(), out = empty(x.shape(), DType::f32);
    INGOT_CHECK(x.dtype() == DType::f32, "test_host_square: f32 only");
    for (int64_t i = 0; i < x.numel(); ++i) out.data<float>()[i] = x.data<float>()[i] * x.data<float>()[i];
    return {out};
  }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    return {mul(g[0], c.inputs[0] * 2.0)};
  }
};

int g_host_square_line = 0;
Tensor host_square(const Tensor& x, std::source_location loc = std::source_location::current()) {
  return apply1(std::make_shared<HostSquarePrim>(), {x}, loc);
}

std::vector<Tensor> with_host_op(Tensor& w, const std::vector<Tensor>& a) {
  w.zero_grad();
  Tensor h = tanh(matmul(a[0], w));
  g_host_square_line = __LINE__ + 1;
  Tensor sq = host_square(h * 0.5 + 0.25);
  Tensor loss = sum(sq * 3.0);
  loss.backward();
  return {loss, w.grad()};
}

TEST(GraphBreakSegments, OpWithNoLoweringRunsEagerlyBetweenTwoCompiledSegments) {
  compiler::disallow_in_graph("test_host_square", "computes on the host (test op)");
  manual_seed(5);
  Tensor w = randn({6, 6}).set_requires_grad(true);
  CompiledFunction c = compile([&](const std::vector<Tensor>& a) { return with_host_op(w, a); }, node_by_node());
  for (int call = 0; call < 4; ++call) {
    Tensor x = randn({3, 6});
    std::vector<Tensor> want = with_host_op(w, {x});
    std::vector<Tensor> got = c({x});
    ASSERT_EQ(got.size(), 2u);
    expect_close(got[0], want[0], 0.0, "loss, call " + std::to_string(call));
    expect_close(got[1], want[1], 0.0, "grad, call " + std::to_string(call));
  }
  const CompileStats& s = c.stats();
  // Before the op, after it up to backward's VJP of it (which is an ordinary op), the rest.
  EXPECT_GE(s.graphs, 2);
  EXPECT_EQ(s.compiled_calls, 3);
  ASSERT_EQ(s.graph_breaks.size(), 1u);
  EXPECT_NE(s.graph_breaks[0].find("test_graph_break_segments.cpp:" + std::to_string(g_host_square_line)),
            std::string::npos) << s.graph_breaks[0];
  EXPECT_NE(s.graph_breaks[0].find("test_host_square: computes on the host"), std::string::npos) << s.graph_breaks[0];
  const int64_t compiled = s.segments_compiled;
  c({randn({3, 6})});
  EXPECT_EQ(c.stats().segments_compiled, compiled);

  CompileOptions full = node_by_node();
  full.fullgraph = true;
  CompiledFunction f = compile([&](const std::vector<Tensor>& a) { return with_host_op(w, a); }, full);
  try {
    f({randn({3, 6})});
    FAIL() << "expected a fullgraph error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fullgraph: graph break at test_graph_break_segments.cpp:" +
                       std::to_string(g_host_square_line)), std::string::npos) << msg;
    EXPECT_NE(msg.find("computes on the host"), std::string::npos) << msg;
  }
}

// Dropout around a break draws eager's masks: its (seed, offset) is reserved on the host as eager does.
TEST(GraphBreakSegments, DropoutOnBothSidesOfABreakDrawsEagersMasks) {
  std::vector<double> sums;
  auto fn = [&](const std::vector<Tensor>& a) {
    Tensor y = dropout(a[0] * 3.0, 0.5, true);
    sums.push_back(sum(y).item());
    return std::vector<Tensor>{dropout(y + 1.0, 0.25, true)};
  };
  const Tensor x = add(rand({64}), 0.5);
  manual_seed(41);
  std::vector<std::vector<double>> eager;
  for (int i = 0; i < 4; ++i) eager.push_back(fn({x})[0].to_vector());
  const uint64_t eager_offset = default_generator(Device::cpu()).offset();
  manual_seed(41);
  CompiledFunction c = compile(fn);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c({x})[0].to_vector(), eager[static_cast<size_t>(i)]) << "call " << i;
  EXPECT_EQ(default_generator(Device::cpu()).offset(), eager_offset) << "compiled calls draw what eager draws";
  for (int i = 0; i < 4; ++i)  // a generated reduction: eager's mask, a different summation order
    EXPECT_NEAR(sums[static_cast<size_t>(4 + i)], sums[static_cast<size_t>(i)], 1e-5 * sums[static_cast<size_t>(i)]);
  EXPECT_EQ(c.stats().graphs, 2);
  EXPECT_EQ(c.stats().segments_compiled, 2);
}

// Host code that copies and writes tensor data between ops sees, and leaves, eager's values.
TEST(GraphBreakSegments, RawCopiesOfDeferredValuesKeepEagerSemantics) {
  Tensor state = zeros({5});
  auto fn = [&](const std::vector<Tensor>& a) {
    Tensor y = a[0] * 2.0 + state;    // reads state
    state.copy_(y);                   // from a deferred value: the segment writes state back
    Tensor z = state * 3.0;           // reads the new state
    Tensor snapshot = z.clone_raw();  // a raw read of a deferred value: runs the segment first
    Tensor u = state * 1.5;
    state.fill_(0.5);                 // a raw write into a tensor the pending segment reads: runs it first
    const double m = sum(z).item();
    return std::vector<Tensor>{z + state * m, snapshot, u};
  };
  std::vector<std::vector<double>> eager;
  Tensor x = from_vector({1, 2, 3, 4, 5}, {5});
  for (int i = 0; i < 4; ++i) {
    for (const Tensor& r : fn({x})) eager.push_back(r.to_vector());
    eager.push_back(state.to_vector());
  }
  state.zero_();
  CompiledFunction c = compile(fn, node_by_node());
  for (int i = 0; i < 4; ++i) {
    std::vector<Tensor> r = c({x});
    ASSERT_EQ(r.size(), 3u);
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(r[k].to_vector(), eager[static_cast<size_t>(4 * i) + k]) << "call " << i;
    EXPECT_EQ(state.to_vector(), eager[static_cast<size_t>(4 * i + 3)]) << "call " << i;
  }
  EXPECT_EQ(c.stats().compiled_calls, 3);
  EXPECT_GE(c.stats().graphs, 3);
}

// An op whose shape rule disagrees with its kernel cannot be deferred (its stand-ins would be wrong): the
// trace notices, and the calls after it run eagerly, with a warning instead of wrong results.
class WrongShapeRulePrim final : public Primitive {
 public:
  std::string_view name() const override { return "test_wrong_shape_rule"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{Shape{1}, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return {in[0].clone_raw()}; }
};

TEST(GraphBreakSegments, AnOpThatCannotBeDeferredKeepsTheCallsEager) {
  auto fn = [](const std::vector<Tensor>& a) {
    Tensor y = apply1(std::make_shared<WrongShapeRulePrim>(), {a[0] * 2.0});
    if (sum(y).item() > 0) y = y + 1.0;
    return std::vector<Tensor>{y};
  };
  CompiledFunction c = compile(fn, node_by_node());
  for (int i = 0; i < 3; ++i) {
    Tensor x = randn({4});
    EXPECT_EQ(c({x})[0].to_vector(), fn({x})[0].to_vector()) << "call " << i;
  }
  EXPECT_EQ(c.stats().graph_breaks.size(), 1u);
  EXPECT_EQ(c.stats().eager_calls, 2);
  EXPECT_EQ(c.stats().segments_compiled, 0);
}

// A host value used as an op attribute makes a new segment graph at every call: past recompile_limit that
// segment runs op by op instead of compiling again, with the same results.
TEST(GraphBreakSegments, ASegmentThatKeepsChangingStopsCompilingAtTheRecompileLimit) {
  auto fn = [](const std::vector<Tensor>& a) {
    const double m = sum(a[0]).item();
    return std::vector<Tensor>{exp(a[0] * m)};
  };
  CompileOptions o = node_by_node();
  o.recompile_limit = 2;
  CompiledFunction c = compile(fn, o);
  for (int i = 0; i < 8; ++i) {
    Tensor x = rand({6}, DType::f32, Device::cpu(), 0.0, 0.1);
    EXPECT_EQ(c({x})[0].to_vector(), fn({x})[0].to_vector()) << "call " << i;
  }
  EXPECT_EQ(c.stats().segments_compiled, 4) << "the first segment once, the second up to the limit";
  EXPECT_EQ(c.stats().compiled_calls, 7);
  EXPECT_NE(explain_report(c).find("(node by node)"), std::string::npos) << explain_report(c);
}

// An exception thrown by the function after deferred work: that work has run, as it had eagerly.
TEST(GraphBreakSegments, AnExceptionInTheFunctionStillRunsTheOpsBeforeIt) {
  Tensor state = zeros({3});
  bool fail = false;
  auto fn = [&](const std::vector<Tensor>& a) {
    state.copy_(state + a[0]);
    if (sum(state).item() > 1e30) state.zero_();
    Tensor t = state * 2.0;
    state.copy_(t);
    if (fail) INGOT_FAIL("test: failing after the update");
    return std::vector<Tensor>{t};
  };
  auto run = [&](auto&& f) {
    std::vector<std::vector<double>> seen;
    state.zero_();
    for (int i = 0; i < 4; ++i) {
      fail = i == 2;
      Tensor x = from_vector({1.0 + i, 2.0, 3.0}, {3});
      try {
        seen.push_back(f({x})[0].to_vector());
      } catch (const Error&) {
        seen.push_back({-1.0});
      }
      seen.push_back(state.to_vector());
    }
    return seen;
  };
  const auto eager = run(fn);
  CompiledFunction c = compile(fn, node_by_node());
  const auto compiled = run(c);
  EXPECT_EQ(compiled, eager);
  EXPECT_EQ(eager[4], std::vector<double>{-1.0}) << "call 2 threw";
}

// Scalars that print alike at 6 digits (0.5000001, 0.5000002) are different graphs: a segment is never reused
// with another call's scalar.
TEST(GraphBreakSegments, ScalarAttributesThatDifferPastSixDigitsAreDifferentSegments) {
  double scale = 0.5;
  auto fn = [&](const std::vector<Tensor>& a) {
    if (sum(a[0]).item() > 1e30) return std::vector<Tensor>{a[0]};
    return std::vector<Tensor>{a[0] * scale};
  };
  CompiledFunction c = compile(fn, node_by_node());
  Tensor x = from_vector({1000.0, 2000.0, 3000.0}, {3}, DType::f64);
  for (int i = 0; i < 4; ++i) {
    scale = 0.5000001 + 1e-7 * i;
    EXPECT_EQ(c({x})[0].to_vector(), fn({x})[0].to_vector()) << "call " << i;
  }
  EXPECT_EQ(c.stats().segments_compiled, 4) << "one first segment, three scales";
}

}  // namespace
}  // namespace ingot::testing
