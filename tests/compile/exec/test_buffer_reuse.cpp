// Note [Outputs over dead inputs] (autograd/primitive.h, compile/exec/executor.cpp): in a compiled step the
// cross-entropy gradient is written over the logits, which nothing reads afterwards, so the step's peak stays
// below two logits buffers (eager holds both), and the gradients are unchanged. When the
// logits are also returned (still held), they must not be overwritten.
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "compile/api.h"
#include "compile/passes/passes.h"
#include "compile/trace/trace.h"
#include "compile/step_fixture.h"
#include "runtime/allocator.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

TEST(BufferReuse, CrossEntropyGradientTakesTheLogitsBuffer) {
  const int64_t n = 64, vocab = 16384, d = 8;
  LinearHeadStep step = linear_head_step(17, n, vocab, d);
  const Tensor x = step.x, t = step.t;
  auto peak_of = [&](auto&& fn) {
    fn({x, t});  // warm-up (the compiled one traces here)
    cpu_allocator().reset_peak();
    std::vector<Tensor> r = fn({x, t});
    return std::pair{cpu_allocator().stats().peak_allocated_bytes, r};
  };
  const auto [eager_peak, eager] = peak_of(step);
  // Node by node, so the cross-entropy backward runs as its eager kernel as on the GPU (the CPU backend
  // generates a fused kernel for it instead).
  CompileOptions o;
  o.backend = CompileBackend::Eager;
  CompiledFunction compiled = compile(step, o);
  const auto [compiled_peak, got] = peak_of([&](const std::vector<Tensor>& a) { return compiled(a); });
  const int64_t logits_bytes = n * vocab * 4;
  std::printf("[ memory   ] peak: eager %lld bytes, compiled %lld bytes (logits %lld)\n",
              static_cast<long long>(eager_peak), static_cast<long long>(compiled_peak),
              static_cast<long long>(logits_bytes));
  // Without the reuse the logits and their gradient (each logits_bytes) are alive together.
  EXPECT_LT(compiled_peak, 2 * logits_bytes);
  EXPECT_GE(eager_peak, 2 * logits_bytes);
  EXPECT_NEAR(got[0].item(), eager[0].item(), 1e-6 * std::abs(eager[0].item()));
  EXPECT_LE(max_rel_error(got[1], eager[1], 1e-5, 1e-6), 1.0);
}

// The memory plan (compile/passes/memory_plan.cpp) counts the gradient over the logits as the logits' buffer, as
// the executor does: its peak stays below two logits buffers.
TEST(BufferReuse, TheMemoryPlanCountsTheGradientInTheLogitsBuffer) {
  const int64_t n = 64, vocab = 16384, d = 8;
  LinearHeadStep step = linear_head_step(17, n, vocab, d);
  // As in a language model, the loss may read the logits through a reshape ([B, T, V] -> [B * T, V]).
  auto reshaped = [&](const std::vector<Tensor>& a) {
    Tensor logits = linear(reshape(a[0], {2, n / 2, d}), step.w, Tensor());
    Tensor loss = cross_entropy(reshape(logits, {n, vocab}), a[1]);
    loss.backward();
    Tensor g = step.w.grad();
    step.w.zero_grad();
    return std::vector<Tensor>{loss, g};
  };
  for (bool view : {false, true}) {
    compiler::Graph g = view ? compiler::trace(reshaped, {step.x, step.t}).graph
                             : compiler::trace(step, {step.x, step.t}).graph;
    ASSERT_TRUE(compiler::passes::fuse_cross_entropy(g, {}));
    compiler::passes::dce(g, {});
    const compiler::passes::MemoryPlan plan = compiler::passes::memory_plan(g);
    const int64_t logits_bytes = n * vocab * 4;
    EXPECT_GE(plan.unplanned_peak, logits_bytes) << "through a view: " << view;
    EXPECT_LT(plan.unplanned_peak, 2 * logits_bytes) << "through a view: " << view;
    EXPECT_LT(plan.arena_bytes, 2 * logits_bytes) << "through a view: " << view;
  }
}

TEST(BufferReuse, LogitsThatAreReturnedAreNotOverwritten) {
  manual_seed(18);
  Tensor w = randn({512, 8}).set_requires_grad(true);
  Tensor x = randn({16, 8}), t = randint(0, 512, {16});
  auto step = [&](const std::vector<Tensor>& a) {
    Tensor logits = linear(a[0], w, Tensor());
    Tensor loss = cross_entropy(logits, a[1]);
    loss.backward();
    Tensor g = w.grad();
    w.zero_grad();
    return std::vector<Tensor>{loss, g, logits};
  };
  CompileOptions o;
  o.backend = CompileBackend::Eager;
  CompiledFunction compiled = compile(step, o);
  for (int i = 0; i < 3; ++i) {
    x = randn({16, 8});
    const std::vector<Tensor> got = compiled({x, t}), want = step({x, t});
    EXPECT_LE(max_rel_error(got[2], want[2], 1e-6, 1e-6), 1.0) << "call " << i << ": the returned logits";
    EXPECT_LE(max_rel_error(got[1], want[1], 1e-5, 1e-6), 1.0) << "call " << i;
  }
}

// A trained head's gradient from linear_cross_entropy in chunks (Note [Logits in chunks], autograd/ops/loss.cpp) is
// summed in the forward and scaled in the backward by the rows' one cotangent: in a compiled step the scale is
// written over the unscaled gradient, which nothing else reads, so the step holds one head gradient, not two as
// eager does (the 8B's 1.05 GB head gradient at its compiled in-backward peak), and the results are eager's.
TEST(BufferReuse, AChunkedHeadsGradientIsScaledOverItsOwnBuffer) {
  const int64_t n = 64, vocab = 16384, d = 64;
  manual_seed(19);
  Tensor w = randn({vocab, d}).set_requires_grad(true);
  const Tensor x = randn({n, d}), t = randint(0, vocab, {n});
  auto step = [&](const std::vector<Tensor>& a) {
    // 8 rows a chunk: the logits buffer (8 x vocab) is small beside the head gradient (vocab x d).
    Tensor loss = linear_cross_entropy(a[0], w, a[1], -100, 0.0, Reduction::Mean, 8);
    loss.backward();
    Tensor g = w.grad();
    w.zero_grad();
    return std::vector<Tensor>{loss, g};
  };
  // The bytes a call adds at its peak to what was allocated before it (the other step's results stay alive).
  auto peak_of = [&](auto&& fn) {
    fn({x, t});  // warm-up (the compiled one traces here)
    cpu_allocator().reset_peak();
    const int64_t before = cpu_allocator().stats().allocated_bytes;
    std::vector<Tensor> r = fn({x, t});
    return std::pair{cpu_allocator().stats().peak_allocated_bytes - before, r};
  };
  const auto [eager_peak, eager] = peak_of(step);
  const int64_t grad_bytes = vocab * d * 4;
  for (CompileBackend backend : {CompileBackend::Eager, CompileBackend::Cpu}) {
    CompileOptions o;
    o.backend = backend;
    CompiledFunction compiled = compile(step, o);
    const auto [compiled_peak, got] = peak_of([&](const std::vector<Tensor>& a) { return compiled(a); });
    std::printf("[ memory   ] peak above the start: eager %lld bytes, compiled %lld bytes (head gradient %lld)\n",
                static_cast<long long>(eager_peak), static_cast<long long>(compiled_peak),
                static_cast<long long>(grad_bytes));
    // Eager holds the unscaled and the scaled gradient at once; the compiled step one of them (and a logits chunk).
    EXPECT_GE(eager_peak, 2 * grad_bytes);
    EXPECT_LT(compiled_peak, grad_bytes * 3 / 2);
    EXPECT_NEAR(got[0].item(), eager[0].item(), 1e-6 * std::abs(eager[0].item()));
    EXPECT_LE(max_rel_error(got[1], eager[1], 1e-5, 1e-6), 1.0);
  }
}

}  // namespace
}  // namespace ingot::testing
