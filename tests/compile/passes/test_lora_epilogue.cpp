// compile/passes/lora_epilogue.cpp: a tiny Llama with LoRA on q/k/v/o, traced for one step; each adapter's scale
// and sum become part of its matrix product (matmul_scaled), and the step still matches eager in f32 and bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/nn/lora.h"
#include "autograd/ops/matmul_fused.h"
#include "compile/exec/executor.h"
#include "compile/graph_checks.h"
#include "compile/passes/lora_epilogue.h"
#include "compile/passes/passes.h"
#include "compile/pipeline.h"
#include "compile/step_fixture.h"
#include "compile/trace/trace.h"
#include "runtime/file_util.h"

namespace ingot::compiler {
namespace {

constexpr const char* kTargets[] = {"q_proj", "k_proj", "v_proj", "o_proj"};

// A tiny Llama with rank-4 adapters (alpha 8: scale 2) whose B is not zero, so the adapters change the loss and
// the A gradients; {ids, targets} -> {loss, each adapter's gradient}.
auto lora_step(bool bf16) {
  manual_seed(23);
  auto model = testing::tiny_llama();
  if (bf16) model->set_compute_dtype(DType::bf16);
  nn::apply_lora(*model, {.rank = 4, .alpha = 8, .dropout = 0.0,
                          .target_modules = std::vector<std::string>(std::begin(kTargets), std::end(kTargets))});
  for (auto& [name, t] : nn::lora_state_dict(*model))
    if (name.find("lora_B") != std::string::npos) t.copy_(randn(t.shape(), t.dtype(), t.device(), 0.0, 0.05));
  return [model](const std::vector<Tensor>& a) {
    Tensor loss = model->loss(a[0], a[1]);
    loss.backward();
    std::vector<Tensor> r{loss};
    for (Tensor p : nn::trainable_parameters(*model)) {
      r.push_back(p.grad());
      p.zero_grad();
    }
    return r;
  };
}

// The producer of `v` through reshapes: its name, or "" for a graph input.
std::string_view producer_past_reshapes(const Graph& g, int32_t v) {
  while (v >= 0 && g.values[static_cast<size_t>(v)].producer >= 0) {
    const Node& p = g.nodes[static_cast<size_t>(g.values[static_cast<size_t>(v)].producer)];
    if (p.prim->name() != "reshape") return p.prim->name();
    v = p.inputs[0];
  }
  return "";
}

// Whether some mul_scalar, or add of an adapter's product, of one dtype still reads a product (through reshapes)
// that nothing else reads. An adapter's product reads the scaled rank-r activation (a mul_scalar, or after the
// pass the matmul_scaled it became); the model's residual adds of its own projections stay, as do adds that
// promote (bf16 compute: the residual stream's f32 + a bf16 projection): the fused product writes its operands'
// dtype.
bool separate_epilogue_left(const Graph& g) {
  const std::vector<int32_t> uses = g.use_counts();
  for (const Node& n : g.nodes) {
    const std::string_view name = n.prim->name();
    if (name != "mul_scalar" && name != "add") continue;
    const DType dt = g.values[static_cast<size_t>(n.outputs[0])].dtype;
    if (std::any_of(n.inputs.begin(), n.inputs.end(),
                    [&](int32_t v) { return v >= 0 && g.values[static_cast<size_t>(v)].dtype != dt; }))
      continue;
    for (int32_t v : n.inputs) {
      while (v >= 0 && uses[static_cast<size_t>(v)] == 1 && g.values[static_cast<size_t>(v)].producer >= 0) {
        const Node& p = g.nodes[static_cast<size_t>(g.values[static_cast<size_t>(v)].producer)];
        const bool product =
            p.prim->name() == "matmul" || (p.prim->name() == "linear" && (p.inputs.size() < 3 || p.inputs[2] < 0));
        const std::string_view lhs = product ? producer_past_reshapes(g, p.inputs[0]) : "";
        if (product && (name == "mul_scalar" || lhs == "mul_scalar" || lhs == "matmul_scaled")) return true;
        if (p.prim->name() != "reshape") break;
        v = p.inputs[0];
      }
    }
  }
  return false;
}

TEST(LoraEpilogue, AdapterScalesAndSumsBecomePartOfTheirProducts) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    auto fn = lora_step(bf16);
    Graph g = trace(fn, {ids, tgt}).graph;
    passes::dce(g, {});
    ASSERT_TRUE(separate_epilogue_left(g)) << "the traced step adds and scales its adapters' products apart";
    const int layers = static_cast<int>(testing::tiny_llama_config().num_hidden_layers);
    ASSERT_TRUE(passes::lora_epilogue(g, {}));
    passes::dce(g, {});
    g.verify();
    EXPECT_FALSE(separate_epilogue_left(g)) << g.str();
    // At least each adapted projection's forward sum y + B(h) and its backward scale s * (dy_B @ B).
    EXPECT_GE(count_nodes(g, "matmul_scaled"), 2 * 4 * layers);
    // bf16: the product is rounded once instead of after the product, the scale and the add (loss within 1e-3).
    expect_graph_matches_eager(std::move(g), fn, {ids, tgt}, bf16 ? 1e-3 : 1e-5, bf16 ? 2e-2 : 1e-4,
                               bf16 ? 2e-3 : 1e-6, bf16 ? "bf16" : "f32");
  }
}

// The pass as the pipeline runs it (compile/pipeline.cpp; INGOT_SKIP_PASSES=lora_epilogue leaves it out and
// fails this test): the compiled step's graph holds the folded products and its results follow eager's.
TEST(LoraEpilogue, TheCompiledStepRunsItsAdaptersAsScaledProducts) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    auto fn = lora_step(bf16);
    // A fresh cache directory: a cached artifact would be the graph some earlier build of the pass made.
    TempDir dir("ingot-lora-epilogue-");
    CompileOptions opts;
    opts.cache_dir = dir.path();
    CompiledFunction step = compile(fn, opts);
    step({ids, tgt});  // the first call traces (eagerly); the second runs the compiled graph
    const std::vector<Tensor> got = step({ids, tgt}), want = fn({ids, tgt});
    EXPECT_GE(step.stats().compiled_calls, 1);
    EXPECT_NE(step.stats().last_graph.find("matmul_scaled"), std::string::npos) << step.stats().last_graph;
    ASSERT_EQ(got.size(), want.size());
    EXPECT_NEAR(got[0].item(), want[0].item(), (bf16 ? 1e-3 : 1e-5) * std::abs(want[0].item()));
    for (size_t i = 1; i < want.size(); ++i)
      EXPECT_LE(max_rel_error(got[i], want[i], bf16 ? 2e-2 : 1e-4, bf16 ? 2e-3 : 1e-6), 1.0) << "parameter " << i - 1;
  }
}

TEST(LoraEpilogue, AProductReadElsewhereStaysApart) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  auto fn = lora_step(false);
  Graph g = trace(fn, {ids, tgt}).graph;
  passes::dce(g, {});
  for (const Node& n : g.nodes)
    if (n.prim->name() == "matmul" || n.prim->name() == "linear") g.outputs.push_back(n.outputs[0]);
  EXPECT_FALSE(passes::lora_epilogue(g, {}));
}

// The primitive alone on the CPU: alpha * a^T @ b + c, against the unfused ops, in f32 and bf16.
TEST(LoraEpilogue, ScaledProductAccumulatesIntoItsThirdInput) {
  for (DType dt : {DType::f32, DType::bf16}) {
    manual_seed(5);
    const Tensor a = randn({5, 3}, dt), b = randn({5, 4}, dt), c = randn({3, 4}, dt);
    const Tensor want = add(c, mul(matmul(transpose(a, 0, 1), b), 0.5));
    const Tensor got = apply1(make_matmul_scaled(true, false, 0.5, true, {3, 4}), {a, b, c});
    EXPECT_LE(max_rel_error(got, want, dt == DType::bf16 ? 2e-2 : 1e-6, 1e-6), 1.0) << dtype_name(dt);
    const Tensor scaled = apply1(make_matmul_scaled(true, false, 0.5, false, {12}), {a, b});
    EXPECT_LE(max_rel_error(scaled, reshape(mul(matmul(transpose(a, 0, 1), b), 0.5), {12}),
                            dt == DType::bf16 ? 2e-2 : 1e-6, 1e-6), 1.0) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace ingot::compiler
