// silu_mul (autograd/ops/pointwise.cpp): SwiGLU's silu(a) * b as one op. Eagerly it keeps a and b for its backward
// (not silu(a)), rounds once like the generated kernel of silu(a) * b, and the Llama MLP uses it, eagerly and traced
// (Note [SwiGLU eager and traced], models/decoder.cpp).
// Finite differences, compiled-vs-eager and CUDA-vs-CPU: tests/ops/test_op_consistency.cpp; CUDA kernels bit for bit:
// tests/gpu/test_cuda_silu_mul.cpp.
#include <gtest/gtest.h>

#include "compile/trace/trace.h"
#include "runtime/allocator.h"
#include "tests/models/tiny_models.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

int64_t allocated() { return cpu_allocator().stats().allocated_bytes; }

TEST(SiluMul, KeepsItsTwoInputsButNotSiluOfTheFirst) {
  manual_seed(1);
  const Tensor a0 = randn({256, 64}), b0 = randn({256, 64});
  const int64_t bytes = 256 * 64 * 4;
  auto kept = [&](bool fused) {
    Tensor a = leaf(a0), b = leaf(b0);
    // a * 1 and b * 1 are made inside: only the graph can keep them.
    Tensor x = mul(a, 1.0), y = mul(b, 1.0);
    const int64_t before = allocated();
    Tensor out = fused ? silu_mul(x, y) : mul(silu(x), y);
    x = Tensor();
    y = Tensor();
    const int64_t k = allocated() - before + 2 * bytes - bytes;  // x, y released by us; out is the result
    out.backward(ones({256, 64}));
    return std::tuple{k, a.grad(), b.grad()};
  };
  const auto [fused_kept, fa, fb] = kept(true);
  const auto [pair_kept, pa, pb] = kept(false);
  EXPECT_EQ(fused_kept, 2 * bytes);
  EXPECT_EQ(pair_kept, 3 * bytes);
  EXPECT_LE(max_rel_error(fa, pa, 1e-6, 1e-7), 1.0);
  EXPECT_LE(max_rel_error(fb, pb, 1e-6, 1e-7), 1.0);
}

TEST(SiluMul, Bf16RoundsOnceAsTheGeneratedKernelDoes) {
  manual_seed(2);
  const Tensor a = randn({1000}), b = randn({1000});
  const Tensor got = silu_mul(a.to(DType::bf16), b.to(DType::bf16));
  // f32 math on the bf16 values, one rounding at the end.
  const Tensor want = mul(silu(a.to(DType::bf16).to(DType::f32)), b.to(DType::bf16).to(DType::f32)).to(DType::bf16);
  EXPECT_EQ(got.to_vector(), want.to_vector());
}

TEST(SiluMul, OperandsOfDifferentShapesOrDtypesAreErrors) {
  EXPECT_NE(error_of([] { silu_mul(randn({2, 3}), randn({3})); }).find("silu_mul: expected operands of one shape"),
            std::string::npos);
  EXPECT_NE(error_of([] { silu_mul(randn({2, 3}), randn({2, 3}).to(DType::bf16)); }).find("silu_mul"),
            std::string::npos);
}

// The primitives applied, by name.
class Applied final : public OpProfilerHook {
 public:
  Applied() { set_op_profiler_hook(this); }
  ~Applied() override { set_op_profiler_hook(nullptr); }
  void begin_op(const Primitive& p) override { ++count[std::string(p.name())]; }
  void end_op(const Primitive&, const std::vector<Tensor>&, const std::vector<Tensor>&) override {}
  std::map<std::string, int> count;
};

// Note [SwiGLU eager and traced]: the Llama MLP runs silu_mul eagerly and records it when traced, so the traced
// (eager) first step of a compiled run keeps a and b only, as eager steps do.
TEST(SiluMul, TheLlamaMlpUsesItEagerlyAndTraced) {
  manual_seed(3);
  models::Llama model(tiny_llama_config());
  auto [ids, tgt] = repeating_batch(2, 8);
  {
    Applied eager;
    model.loss(ids, tgt).backward();
    EXPECT_EQ(eager.count["silu_mul"], 2);  // one per layer
    EXPECT_EQ(eager.count["silu_mul_bwd"], 2);
    EXPECT_EQ(eager.count["silu"], 0);
  }
  const compiler::Graph g = compiler::trace([&](const std::vector<Tensor>& b) {
                              Tensor loss = model.loss(b[0], b[1]);
                              loss.backward();
                              return std::vector<Tensor>{loss};
                            },
                                            {ids, tgt})
                                .graph;
  int silu_nodes = 0, fwd = 0, bwd = 0;
  for (const compiler::Node& n : g.nodes) {
    silu_nodes += n.prim->name() == "silu";
    fwd += n.prim->name() == "silu_mul";
    bwd += n.prim->name() == "silu_mul_bwd";
  }
  EXPECT_EQ(silu_nodes, 0);
  EXPECT_EQ(fwd, 2);
  EXPECT_EQ(bwd, 2);
}

}  // namespace
}  // namespace ingot::testing
