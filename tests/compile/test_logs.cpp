// INGOT_LOGS parsing and output (compile/logs.h).
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "compile/api.h"
#include "compile/logs.h"

namespace ingot::compiler {
namespace {

TEST(Logs, UnknownKindIsAnErrorListingTheValidOnes) {
  try {
    set_logs("graph,bogus");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown log kind 'bogus'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("graph_breaks"), std::string::npos) << msg;
  }
}

TEST(Logs, EnabledKindsPrintPrefixedLinesToStderr) {
  set_logs("graph, recompiles");
  EXPECT_TRUE(log_on(LogKind::Graph));
  EXPECT_TRUE(log_on(LogKind::Recompiles));
  EXPECT_FALSE(log_on(LogKind::Passes));
  Tensor w = randn({3, 3});
  CompileOptions o;
  o.backend = CompileBackend::Eager;
  o.dynamic = DynamicMode::False;
  CompiledFunction f = compile([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{matmul(a[0], w)}; }, o);
  ::testing::internal::CaptureStderr();
  f({randn({2, 3})});
  f({randn({4, 3})});
  const std::string err = ::testing::internal::GetCapturedStderr();
  set_logs("");
  EXPECT_NE(err.find("[ingot:graph] graph(in: 2, ops: 1"), std::string::npos) << err;
  EXPECT_NE(err.find("[ingot:recompiles] recompile of 'step': arg0 dim 0 changed from 2 to 4"), std::string::npos) << err;
  EXPECT_FALSE(log_on(LogKind::Graph));
}

// INGOT_LOGS=memory: each run reports the step where the allocator held the most and the largest values alive
// there; the [64, 4096] product is the biggest buffer of this step.
TEST(Logs, MemoryNamesThePeakStepAndItsLargestValues) {
  Tensor w = randn({256, 4096});
  CompileOptions o;
  o.backend = CompileBackend::Eager;
  CompiledFunction f = compile(
      [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{sum(relu(matmul(a[0], w)))}; }, o);
  f({randn({64, 256})});  // traces
  set_logs("memory");
  ::testing::internal::CaptureStderr();
  f({randn({64, 256})});
  const std::string err = ::testing::internal::GetCapturedStderr();
  set_logs("");
  EXPECT_NE(err.find("[ingot:memory] memory: peak "), std::string::npos) << err;
  EXPECT_NE(err.find("f32[64, 4096]"), std::string::npos) << err;
}

}  // namespace
}  // namespace ingot::compiler
