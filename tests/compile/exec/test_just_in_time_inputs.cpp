// Note [Inputs bound just in time] (compile/ir/graph.h): a compiled step binds such inputs right before the first step
// that reads them and hands them back after their last use (write-backs copied in first), holding nothing of them in
// between runs; its host work runs once the forward is done and at the end. Here the "offloaded" state is a host
// tensor copied into a fresh working tensor for its update and back after it, as the optimizer does with its state
// (Note [Optimizer state offloaded], optim/optimizer.cpp: GPU-only, tested in tests/recipes/
// test_optimizer_in_backward.cpp), and every compiled run must leave the same values as the eager step.
#include <gtest/gtest.h>

#include <memory>

#include "autograd/ops.h"
#include "compile/api.h"
#include "compile/trace/trace.h"
#include "runtime/rng.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

// A parameter w and a state s kept "offloaded" in `host` between steps: the step computes loss = sum(w * x), its
// backward, then s <- s + w.grad (the "update", in place, in the backward's wake) and w <- w - 0.1 * s.
struct OffloadedStep {
  OffloadedStep(Tensor w0, Tensor host0) : w(std::move(w0)), host(std::move(host0)) {}
  Tensor w, host, bound;
  std::vector<std::string> events;  // what ran, in order, in compiled runs (the callbacks) and eager ones alike
  std::weak_ptr<Storage> last_bound;
  bool wrong_shape = false;

  void restore() {
    bound = wrong_shape ? zeros({host.numel() + 1}) : host.clone_raw();
    last_bound = bound.storage();
  }
  void offload() {
    host.copy_(bound);
    bound = Tensor();
  }
  std::vector<Tensor> operator()(const std::vector<Tensor>& a) {
    Tensor loss = sum(mul(w, a[0]));
    TraceObserver* obs = trace_observer();
    if (obs) {
      EXPECT_TRUE(obs->on_run_host_work([this] { events.push_back("before backward"); },
                                        [this] { events.push_back("end"); }));
    }
    loss.backward();
    restore();
    if (obs) {
      EXPECT_TRUE(obs->on_inputs_bound_just_in_time(
          {bound},
          [this] {
            events.push_back("bind");
            restore();
            return std::vector<Tensor>{bound};
          },
          [this] {
            events.push_back("done");
            offload();
          }));
    }
    {
      NoGradGuard ng;
      Tensor s = add(bound, w.grad());
      bound.copy_(s);
      if (obs) obs->on_assign(bound, s);
      Tensor next = sub(w, mul(s, 0.1));
      w.copy_(next);
      if (obs) obs->on_assign(w, next);
    }
    w.zero_grad();
    offload();
    return {loss};
  }
};

TEST(JustInTimeInputs, AreBoundForTheirUpdateAndHandedBackEachRun) {
  for (CompileBackend backend : {CompileBackend::Eager, CompileBackend::Cpu}) {
    manual_seed(31);
    const Tensor w0 = randn({64}), s0 = randn({64});
    OffloadedStep eager(w0.clone_raw().set_requires_grad(true), s0.clone_raw());
    OffloadedStep step(w0.clone_raw().set_requires_grad(true), s0.clone_raw());
    CompileOptions o;
    o.backend = backend;
    o.fullgraph = true;
    CompiledFunction compiled = compile([&step](const std::vector<Tensor>& a) { return step(a); }, o);
    for (int call = 0; call < 4; ++call) {
      const Tensor x = randn({64});
      const std::vector<Tensor> want = eager({x});
      step.events.clear();
      const std::vector<Tensor> got = compiled({x});
      EXPECT_NEAR(got[0].item(), want[0].item(), 1e-5 * std::abs(want[0].item()) + 1e-6) << "call " << call;
      EXPECT_LE(max_rel_error(step.host, eager.host, 1e-5, 1e-6), 1.0) << "call " << call << ": the state";
      EXPECT_LE(max_rel_error(step.w, eager.w, 1e-5, 1e-6), 1.0) << "call " << call << ": the parameter";
      // Nothing holds the bound copy after the run: not the graph, not the run's values.
      EXPECT_TRUE(step.last_bound.expired()) << "call " << call;
      if (call == 0) continue;  // the traced call ran the step's own code
      EXPECT_EQ(step.events, (std::vector<std::string>{"before backward", "bind", "done", "end"})) << "call " << call;
    }
    EXPECT_EQ(compiled.stats().graphs, 1);
    EXPECT_NE(compiled.stats().last_graph.find("(bound just in time, group 0)"), std::string::npos)
        << compiled.stats().last_graph;
    EXPECT_EQ(compiled.stats().eager_calls, 0);
  }
}

TEST(JustInTimeInputs, ATensorBoundUnlikeItsTraceIsRefusedByName) {
  manual_seed(32);
  OffloadedStep step(randn({8}).set_requires_grad(true), randn({8}));
  CompiledFunction compiled = compile([&step](const std::vector<Tensor>& a) { return step(a); });
  compiled({randn({8})});  // traced
  step.wrong_shape = true;
  try {
    compiled({randn({8})});
    FAIL() << "a bound tensor of another shape ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bound just in time, is f32[9]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ingot::testing
