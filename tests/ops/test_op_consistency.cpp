// The op-consistency test (issue 23): every op of the op list below is checked the same way:
//   - it lowers to a generated kernel (Note [Ops lower themselves], autograd/kernel_lowering.h), so a compiled
//     call of it alone runs no op eagerly, unless its entry says why it runs its eager kernel in compiled steps;
//   - its gradient matches central finite differences in f64;
//   - compiled CPU (forward and backward) matches eager CPU;
//   - on a GPU, eager CUDA and compiled CUDA match the CPU (skipped without one).
// The list must cover every op of the eager kernel enums and every op a model's training step applies
// (CoverageOfTheOpList below), so a new op fails here until it has its entry, and then until it has all its
// pieces.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "autograd/kernel_lowering.h"
#include "autograd/nn/lora.h"
#include "compile/api.h"
#include "runtime/file_util.h"
#include "runtime/kernels/kernels.h"
#include "tests/models/tiny_models.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct OpCase {
  OpCase(std::string op_, std::function<std::vector<Tensor>(DType)> inputs_, Fn fn_, std::string eager_only_ = "",
         bool differentiable_ = true, std::string no_gradcheck_ = "", size_t grad_inputs_ = 99)
      : op(std::move(op_)), inputs(std::move(inputs_)), fn(std::move(fn_)), eager_only(std::move(eager_only_)),
        differentiable(differentiable_), no_gradcheck(std::move(no_gradcheck_)), grad_inputs(grad_inputs_) {}
  std::string op;  // the primitive's name (what graphs and the coverage check see)
  // Sample inputs of dtype `dt` (floating ones; indices stay integer) on the CPU, inside the op's domain.
  std::function<std::vector<Tensor>(DType dt)> inputs;
  Fn fn;
  std::string eager_only;  // why the op has no kernel lowering; empty: it lowers
  bool differentiable;
  std::string no_gradcheck;  // why finite differences do not apply (besides !differentiable)
  size_t grad_inputs;        // the leading floating inputs that are differentiated (rope's tables are not)
};

Tensor normal(const Shape& s, DType dt) { return randn(s, DType::f64).to(dt); }
Tensor positive(const Shape& s, DType dt) { return add(rand(s, DType::f64), 0.5).to(dt); }
// Distinct values (no ties for max / min style ops): a shuffled ramp.
Tensor ramp(const Shape& s, DType dt) {
  const Tensor r = rand(s, DType::f64);
  return add(mul(r, 4.0), -2.0).to(dt);
}
Tensor ids(const Shape& s, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7 + 3) % static_cast<size_t>(n));
  return from_vector_i64(v, s);
}

OpCase unary(std::string op, Tensor (*f)(const Tensor&), bool pos = false) {
  return {op, [pos](DType dt) { return std::vector<Tensor>{pos ? positive({3, 5}, dt) : normal({3, 5}, dt)}; },
          [f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x[0])}; }};
}
OpCase binary(std::string op, Tensor (*f)(const Tensor&, const Tensor&), bool pos_a = false, bool pos_b = false,
              bool differentiable = true) {
  OpCase c{op,
           [=](DType dt) {
             return std::vector<Tensor>{pos_a ? positive({3, 5}, dt) : ramp({3, 5}, dt),
                                        pos_b ? positive({5}, dt) : ramp({5}, dt)};
           },
           [f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x[0], x[1])}; }};
  c.differentiable = differentiable;
  return c;
}
OpCase with(OpCase c, std::string eager_only) {
  c.eager_only = std::move(eager_only);
  return c;
}

const std::vector<OpCase>& op_list() {
  static const std::vector<OpCase> list = [] {
    using V = std::vector<Tensor>;
    std::vector<OpCase> l = {
        // pointwise (autograd/ops/pointwise.cpp)
        unary("neg", neg), unary("exp", exp), unary("log", log, true), unary("sqrt", sqrt, true),
        unary("rsqrt", rsqrt, true), unary("abs", abs), unary("tanh", tanh), unary("sigmoid", sigmoid),
        unary("relu", relu), unary("silu", silu), unary("sin", sin), unary("cos", cos),
        unary("reciprocal", reciprocal, true), unary("square", square), unary("relu2", relu2),
        {"silu_mul", [](DType dt) { return V{normal({3, 5}, dt), normal({3, 5}, dt)}; },
         [](const V& x) { return V{silu_mul(x[0], x[1])}; }},
        {"silu_mul_sums",
         [](DType dt) { return V{normal({3, 5}, dt), normal({3, 5}, dt), normal({3, 5}, dt), normal({3, 5}, dt)}; },
         [](const V& x) { return V{silu_mul_sums(x[0], x[1], x[2], x[3])}; }},
        {"gelu_tanh_sum", [](DType dt) { return V{normal({3, 5}, dt), normal({3, 5}, dt)}; },
         [](const V& x) { return V{gelu_tanh_sum(x[0], x[1])}; }},
        {"gelu_tanh", [](DType dt) { return V{normal({3, 5}, dt)}; }, [](const V& x) { return V{gelu(x[0], true)}; }},
        {"gelu_erf", [](DType dt) { return V{normal({3, 5}, dt)}; }, [](const V& x) { return V{gelu(x[0], false)}; }},
        {"pow_scalar", [](DType dt) { return V{positive({3, 5}, dt)}; }, [](const V& x) { return V{pow(x[0], 2.5)}; }},
        {"add_scalar", [](DType dt) { return V{normal({3, 5}, dt)}; }, [](const V& x) { return V{add(x[0], 1.5)}; }},
        {"mul_scalar", [](DType dt) { return V{normal({3, 5}, dt)}; }, [](const V& x) { return V{mul(x[0], -3.0)}; }},
        {"rsub_scalar", [](DType dt) { return V{normal({3, 5}, dt)}; }, [](const V& x) { return V{rsub(x[0], 2.0)}; }},
        {"rdiv_scalar", [](DType dt) { return V{positive({3, 5}, dt)}; }, [](const V& x) { return V{rdiv(x[0], 2.0)}; }},
        binary("add", add), binary("sub", sub), binary("mul", mul), binary("div", div, false, true),
        binary("pow", pow, true), binary("maximum", maximum), binary("minimum", minimum),
        binary("eq", eq, false, false, false), binary("ne", ne, false, false, false), binary("lt", lt, false, false, false),
        binary("le", le, false, false, false), binary("gt", gt, false, false, false), binary("ge", ge, false, false, false),
        {"where", [](DType dt) { return V{gt(normal({3, 5}, DType::f32), zeros({})), normal({3, 5}, dt), normal({5}, dt)}; },
         [](const V& x) { return V{where(x[0], x[1], x[2])}; }},
        {"cast", [](DType dt) { return V{normal({3, 5}, dt)}; },
         [](const V& x) { return V{cast(x[0], x[0].dtype() == DType::f64 ? DType::f32 : DType::f64)}; }, "", true,
         "an f32 result rounds away the finite differences"},
        {"clone", [](DType dt) { return V{normal({3, 5}, dt)}; }, [](const V& x) { return V{clone(x[0])}; }},
        // reductions (autograd/ops/reduce.cpp)
        {"sum", [](DType dt) { return V{normal({3, 4, 5}, dt)}; }, [](const V& x) { return V{sum(x[0], {1, 2})}; }},
        {"mean", [](DType dt) { return V{normal({3, 5}, dt)}; }, [](const V& x) { return V{mean(x[0], {0})}; }},
        {"max", [](DType dt) { return V{ramp({3, 5}, dt)}; }, [](const V& x) { return V{amax(x[0], {1})}; }},
        {"min", [](DType dt) { return V{ramp({3, 5}, dt)}; }, [](const V& x) { return V{amin(x[0], {1}, true)}; }},
        with({"logsumexp", [](DType dt) { return V{normal({3, 5}, dt)}; },
              [](const V& x) { return V{logsumexp(x[0], {1})}; }},
             "the row kernels have no log-sum-exp yet"),
        with({"argmax", [](DType dt) { return V{ramp({3, 5}, dt)}; }, [](const V& x) { return V{argmax(x[0], 1)}; },
              "", false},
             "an index result"),
        with({"argmin", [](DType dt) { return V{ramp({3, 5}, dt)}; }, [](const V& x) { return V{argmin(x[0], 0)}; },
              "", false},
             "an index result"),
        // normalization (autograd/ops/norm.cpp)
        {"softmax", [](DType dt) { return V{normal({3, 5}, dt)}; }, [](const V& x) { return V{softmax(x[0])}; }},
        {"log_softmax", [](DType dt) { return V{normal({3, 5}, dt)}; }, [](const V& x) { return V{log_softmax(x[0])}; }},
        {"layer_norm", [](DType dt) { return V{normal({3, 6}, dt), normal({6}, dt), normal({6}, dt)}; },
         [](const V& x) { return V{layer_norm(x[0], x[1], x[2])}; }},
        {"rms_norm", [](DType dt) { return V{normal({3, 6}, dt), normal({6}, dt)}; },
         [](const V& x) { return V{rms_norm(x[0], x[1])}; }},
        // shapes and views (autograd/ops/shape.cpp)
        with({"reshape", [](DType dt) { return V{normal({3, 4}, dt)}; }, [](const V& x) { return V{reshape(x[0], {2, 6})}; }},
             "a view"),
        with({"permute", [](DType dt) { return V{normal({3, 4, 2}, dt)}; },
              [](const V& x) { return V{permute(x[0], {2, 0, 1})}; }},
             "a view"),
        with({"slice", [](DType dt) { return V{normal({6, 4}, dt)}; }, [](const V& x) { return V{slice(x[0], 0, 1, 5, 2)}; }},
             "a view"),
        with({"expand", [](DType dt) { return V{normal({1, 4}, dt)}; }, [](const V& x) { return V{expand(x[0], {3, 4})}; }},
             "a view"),
        with({"split", [](DType dt) { return V{normal({6, 4}, dt)}; }, [](const V& x) { return split(x[0], 2, 0); }},
             "a view"),
        {"contiguous", [](DType dt) { return V{normal({3, 4}, dt)}; },
         [](const V& x) { return V{contiguous(transpose(x[0], 0, 1))}; }},
        with({"cat", [](DType dt) { return V{normal({2, 4}, dt), normal({3, 4}, dt)}; },
              [](const V& x) { return V{cat({x[0], x[1]}, 0)}; }},
             "a copy into slices of one buffer, run by the executor"),
        // matrix products (autograd/ops/matmul.cpp)
        with({"matmul", [](DType dt) { return V{normal({2, 3, 4}, dt), normal({4, 5}, dt)}; },
              [](const V& x) { return V{matmul(x[0], x[1])}; }},
             "an extern product (BLAS, cuBLASLt)"),
        with({"linear", [](DType dt) { return V{normal({3, 4}, dt), normal({5, 4}, dt), normal({5}, dt)}; },
              [](const V& x) { return V{linear(x[0], x[1], x[2])}; }},
             "an extern product (BLAS, cuBLASLt)"),
        // losses (autograd/ops/loss.cpp)
        with({"cross_entropy", [](DType dt) { return V{normal({4, 7}, dt), ids({4}, 7)}; },
              [](const V& x) { return V{cross_entropy(x[0], x[1])}; }},
             "its own row kernels (fused with its gradient by compile/passes/fuse_cross_entropy.cpp)"),
        // Chunks of 2 of the 5 rows (the last one short), one target ignored; the rows' mean, so that w gets its
        // gradient from the chunks too (a trained head; a frozen one is the same without dw: tests/ops/test_loss.cpp).
        with({"linear_cross_entropy",
              [](DType dt) {
                std::vector<int64_t> t = {3, -100, 6, 0, 2};
                return V{normal({5, 4}, dt), normal({7, 4}, dt), from_vector_i64(t, {5})};
              },
              [](const V& x) { return V{linear_cross_entropy(x[0], x[1], x[2], -100, 0.0, Reduction::Mean, 2)}; },
              "", true, "", 2},
             "its products and row kernels a chunk of rows at a time (Note [Logits in chunks])"),
        // indexing (autograd/ops/index.cpp)
        with({"index_select", [](DType dt) { return V{normal({6, 4}, dt), ids({5}, 6)}; },
              [](const V& x) { return V{index_select(x[0], 0, x[1])}; }},
             "a gather by index"),
        // rows 2..5 of a 9-row table (vocabulary-parallel embeddings); ids over all 9: most give zeros
        with({"embedding_rows", [](DType dt) { return V{normal({4, 3}, dt), ids({2, 5}, 9)}; },
              [](const V& x) { return V{embedding_rows(x[0], x[1], 2, 9)}; }},
             "a gather by index"),
        with({"embedding_rows_grad", [](DType dt) { return V{normal({2, 5, 3}, dt), ids({2, 5}, 9)}; },
              [](const V& x) { return V{embedding_rows_grad(x[0], x[1], 2, 4, x[0].dtype())}; }},
             "a scatter by index"),
        with({"gather", [](DType dt) { return V{normal({3, 6}, dt), ids({3, 4}, 6)}; },
              [](const V& x) { return V{gather(x[0], 1, x[1])}; }},
             "a gather by index"),
        with({"scatter_add", [](DType dt) { return V{normal({3, 6}, dt), ids({3, 4}, 6), normal({3, 4}, dt)}; },
              [](const V& x) { return V{scatter_add(x[0], 1, x[1], x[2])}; }},
             "a scatter by index"),
        // transformer pieces (autograd/ops/attention.cpp)
        with({"attention", [](DType dt) { return V{normal({1, 2, 4, 8}, dt), normal({1, 2, 4, 8}, dt), normal({1, 2, 4, 8}, dt)}; },
              [](const V& x) { return V{scaled_dot_product_attention(x[0], x[1], x[2])}; }},
             "its own kernels (cuDNN or the fallback)"),
        // Plain, and of a sum (Note [Rope of a sum]: a LoRA projection's base and delta).
        with({"rope", [](DType dt) {
                auto [c, s] = rope_tables(4, 8, 10000.0, Device::cpu());
                return V{normal({1, 2, 4, 8}, dt), normal({1, 2, 4, 8}, dt), c, s};
              },
              [](const V& x) { return V{rotary_embedding(x[0], x[2], x[3]), rotary_embedding(x[0], x[2], x[3], x[1])}; },
              "", true, "", 2},
             "its own kernel"),
    };
    return l;
  }();
  return list;
}

// Ops that no user-facing function builds (enum entries of runtime/kernels with no caller): nothing to test.
const std::set<std::string> kUnreachable = {"log1p", "expm1", "floor", "logical_not", "logical_and", "logical_or",
                                            "prod"};

// The primitives an eager call applies (forward, and backward when it runs), by name.
class Recorder final : public OpProfilerHook {
 public:
  Recorder() { set_op_profiler_hook(this); }
  ~Recorder() override { set_op_profiler_hook(nullptr); }
  void begin_op(const Primitive& p) override {
    std::string n(p.name());
    if (!prims.count(n)) prims[n] = as_kernel_lowering(p) != nullptr;
  }
  void end_op(const Primitive&, const std::vector<Tensor>&, const std::vector<Tensor>&) override {}
  std::map<std::string, bool> prims;  // name -> lowers itself
};

bool differentiated(const OpCase& c, const Tensor& t, size_t i) {
  return c.differentiable && is_floating(t.dtype()) && i < c.grad_inputs;
}

// A fixed cotangent per floating output (cos of the element index), in the output's dtype and device.
std::vector<Tensor> cotangents(const std::vector<Tensor>& outs) {
  std::vector<Tensor> w;
  for (const Tensor& o : outs) {
    if (!is_floating(o.dtype())) {
      w.emplace_back();
      continue;
    }
    std::vector<double> v(static_cast<size_t>(o.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(static_cast<double>(i));
    w.push_back(from_vector(v, o.shape(), o.dtype()).to(o.device()));
  }
  return w;
}

// Outputs, then the gradient of sum(out_k * w_k) w.r.t. each differentiated input (leaves made here), with w the
// cotangents of `w` (from an earlier call).
std::vector<Tensor> forward_backward(const OpCase& c, std::vector<Tensor> in, const std::vector<Tensor>& w) {
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < in.size(); ++i)
    if (differentiated(c, in[i], i)) {
      in[i] = leaf(in[i]);
      leaves.push_back(in[i]);
    }
  std::vector<Tensor> r = c.fn(in);
  if (!leaves.empty()) {
    Tensor loss;
    for (size_t k = 0; k < r.size(); ++k) {
      if (!w.at(k).defined()) continue;
      Tensor term = sum(mul(r[k], w[k]));
      loss = loss.defined() ? add(loss, term) : term;
    }
    loss.backward();
    for (Tensor& l : leaves) {
      r.push_back(l.grad());
      l.zero_grad();
    }
  }
  return r;
}

class OpConsistency : public ::testing::TestWithParam<std::string> {
 protected:
  const OpCase& op() const {
    for (const OpCase& c : op_list())
      if (c.op == GetParam()) return c;
    throw std::runtime_error("no op " + GetParam());
  }
};

void expect_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].shape(), want[i].shape()) << what << " result " << i;
    EXPECT_LE(max_rel_error(got[i].to(Device::cpu()).to(DType::f64), want[i].to(Device::cpu()).to(DType::f64), rtol,
                            atol),
              1.0)
        << what << " result " << i;
  }
}

// An op lowers itself unless its entry says why not: a compiled call of the op alone then runs nothing eagerly
// (and an eager-only op that starts to lower fails here until its reason goes).
TEST_P(OpConsistency, LowersToAKernelUnlessDeclaredEagerOnly) {
  const OpCase& c = op();
  manual_seed(1);
  const std::vector<Tensor> in = c.inputs(DType::f32);
  Recorder rec;
  c.fn(in);
  ASSERT_TRUE(rec.prims.count(c.op)) << "the entry's function does not apply '" << c.op << "'";
  if (c.eager_only.empty()) {
    EXPECT_TRUE(rec.prims[c.op]) << c.op << ": no kernel lowering (Note [Ops lower themselves]) and no eager_only reason";
  }
  TempDir dir("ingot-opcheck-");
  CompileOptions o;
  o.backend = CompileBackend::Cpu;
  o.cache_dir = dir.path();
  CompiledFunction f = compile([&](const std::vector<Tensor>& args) { return c.fn(args); }, o);
  f(in);
  f(in);
  const CompileStats& st = f.stats();
  EXPECT_EQ(st.compiled_calls, 1);
  if (c.eager_only.empty()) {
    EXPECT_EQ(st.launches, st.kernels) << "an op ran eagerly in the compiled call:\n" << st.last_graph;
    const bool identity = c.op == "clone" || c.op == "contiguous";  // simplify drops them
    if (!identity) {
      EXPECT_GT(st.kernels, 0) << st.last_graph;
    }
  } else {
    EXPECT_FALSE(st.kernels > 0 && st.launches == st.kernels) << c.op << " lowers now: drop its eager_only reason";
  }
}

TEST_P(OpConsistency, GradientMatchesFiniteDifferencesInF64) {
  const OpCase& c = op();
  if (!c.differentiable) GTEST_SKIP() << c.op << " has no gradient";
  if (!c.no_gradcheck.empty()) GTEST_SKIP() << c.no_gradcheck;
  manual_seed(2);
  std::vector<Tensor> in = c.inputs(DType::f64);
  for (size_t i = 0; i < in.size(); ++i)
    if (differentiated(c, in[i], i)) in[i] = leaf(in[i]);
  EXPECT_GRADCHECK(c.fn, in);
}

// Forward and backward compiled for the CPU (fused kernels, the eager kernels of eager-only ops) against eager.
TEST_P(OpConsistency, CompiledCpuMatchesEagerForwardAndBackward) {
  const OpCase& c = op();
  for (DType dt : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(3);
    const std::vector<Tensor> in = c.inputs(dt);
    const std::vector<Tensor> w = cotangents(c.fn(in));
    const std::vector<Tensor> want = forward_backward(c, in, w);
    TempDir dir("ingot-opcheck-");
    CompileOptions o;
    o.backend = CompileBackend::Cpu;
    o.cache_dir = dir.path();
    CompiledFunction f = compile([&](const std::vector<Tensor>&) { return forward_backward(c, in, w); }, o);
    const Tensor dummy = zeros({1});
    f({dummy});
    const std::vector<Tensor> got = f({dummy});
    EXPECT_EQ(f.stats().compiled_calls, 1);
    if (dt == DType::f64) expect_close(got, want, 1e-10, 1e-12, c.op + " compiled vs eager");
    else expect_close(got, want, 1e-4, 1e-5, c.op + " compiled vs eager");
  }
}

// On a GPU: eager CUDA and compiled CUDA (forward and backward) against the CPU.
TEST_P(OpConsistency, CudaMatchesCpuEagerAndCompiled) {
  INGOT_REQUIRE_CUDA();
  const OpCase& c = op();
  manual_seed(4);
  const std::vector<Tensor> in = c.inputs(DType::f32);
  const std::vector<Tensor> w = cotangents(c.fn(in));
  const std::vector<Tensor> want = forward_backward(c, in, w);
  std::vector<Tensor> in_gpu, w_gpu;
  for (const Tensor& t : in) in_gpu.push_back(t.to(Device::cuda(0)));
  for (const Tensor& t : w) w_gpu.push_back(t.defined() ? t.to(Device::cuda(0)) : t);
  expect_close(forward_backward(c, in_gpu, w_gpu), want, 1e-4, 1e-5, c.op + " eager CUDA vs CPU");
  TempDir dir("ingot-opcheck-");
  CompileOptions o;
  o.cache_dir = dir.path();
  CompiledFunction f = compile([&](const std::vector<Tensor>&) { return forward_backward(c, in_gpu, w_gpu); }, o);
  const Tensor dummy = zeros({1}, DType::f32, Device::cuda(0));
  f({dummy});
  expect_close(f({dummy}), want, 1e-4, 1e-5, c.op + " compiled CUDA vs CPU");
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const OpCase& c : op_list()) names.push_back(c.op);
  return names;
}
INSTANTIATE_TEST_SUITE_P(Ops, OpConsistency, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Every op the eager kernels define and every op a model's training step applies (forward and backward) is
// applied by some entry of the op list, directly or by its backward.
TEST(OpConsistencyList, CoversEveryKernelOpAndEveryOpOfTheModels) {
  Recorder listed;
  for (const OpCase& c : op_list()) {
    manual_seed(5);
    const std::vector<Tensor> in = c.inputs(DType::f32);
    forward_backward(c, in, cotangents(c.fn(in)));
  }
  std::set<std::string> required;
  for (int i = 0; i <= static_cast<int>(kernels::UnaryOp::LogicalNot); ++i)
    required.insert(kernels::unary_name(static_cast<kernels::UnaryOp>(i)));
  for (int i = 0; i <= static_cast<int>(kernels::BinaryOp::ReluGrad); ++i)
    required.insert(kernels::binary_name(static_cast<kernels::BinaryOp>(i)));
  for (int i = 0; i <= static_cast<int>(kernels::ReduceOp::Prod); ++i)
    required.insert(kernels::reduce_name(static_cast<kernels::ReduceOp>(i)));
  {
    Recorder models_rec;
    auto [ids_, tgt] = repeating_batch(2, 8);
    manual_seed(6);
    models::GPT2 gpt2(tiny_gpt2_config());
    gpt2.loss(ids_, tgt).backward();
    models::Llama llama(tiny_llama_config());
    llama.loss(ids_, tgt).backward();
    // A LoRA fine-tune's frozen head: the loss without the logits (Note [Logits in chunks]).
    models::Llama lora(tiny_llama_config());
    nn::apply_lora(lora, nn::LoRAConfig{});
    lora.loss(ids_, tgt).backward();
    for (const auto& [name, lowers] : models_rec.prims) required.insert(name);
    for (const char* op :
         {"index_select", "layer_norm_bwd", "rms_norm_bwd", "attention_bwd", "rope", "linear", "linear_cross_entropy"})
      EXPECT_TRUE(models_rec.prims.count(op)) << "the models' step did not apply " << op;
  }
  for (const std::string& name : required) {
    if (kUnreachable.count(name)) continue;
    EXPECT_TRUE(listed.prims.count(name)) << "op '" << name << "' is not covered by the op list of "
                                          << "tests/ops/test_op_consistency.cpp: add its entry";
  }
}

}  // namespace
}  // namespace ingot::testing
