// CPU code generation: pointwise and multi-tensor KernelSpecs, compiled by the system compiler, against the
// eager ops on random, non-contiguous and broadcast inputs; kernel reuse and batching.
#include <gtest/gtest.h>

#include <cmath>

#include "compile/codegen/cpu/render_cpp.h"
#include "compile/codegen/common/scalar_math.h"
#include "runtime/file_util.h"
#include "runtime/kernels/kernels.h"
#include "tests/compile/codegen/test_codegen_util.h"

namespace ingot::codegen {
namespace {

using namespace ingot::codegen::testing;
constexpr DType kDTypes[] = {DType::f32, DType::f64, DType::bf16};

// y = gelu_tanh(x * s + b) where s is a run-time scalar and b [C] is broadcast over rows.
KernelSpec bias_gelu_spec(const Tensor& x, const Tensor& b_expanded, DType out) {
  KernelSpec k;
  k.name = "bias_gelu";
  k.dims = dims_of(x.shape());
  const int ix = k.input(x.dtype(), strides_of(x), "x");
  const int ib = k.input(b_expanded.dtype(), strides_of(b_expanded), "b");
  const int iy = k.output(out, k.contiguous_strides(), "y");
  const int v = k.binary(Op::Add, k.binary(Op::Mul, k.load(ix), k.scalar(0, x.dtype())), k.load(ib));
  k.store(iy, k.unary(Op::GeluTanh, v));
  return k;
}

TEST(CodegenCpu, PointwiseBiasGeluMatchesEagerOnTransposedAndBroadcastInputs) {
  std::vector<KernelSpec> specs;
  std::vector<std::vector<Tensor>> args;
  for (DType dt : kDTypes) {
    Tensor x = randn_transposed({33, 70}, dt);  // strides [1, 33]
    Tensor b = randn({70}, DType::f64).to(dt);
    Tensor y = empty({33, 70}, dt);
    specs.push_back(bias_gelu_spec(x, b.expand_raw({33, 70}), dt));
    args.push_back({x, b.expand_raw({33, 70}), y});
  }
  const auto kernels = test_codegen().compile(specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor &x = args[i][0], &b = args[i][1], &y = args[i][2];
    run(kernels[i], {x, b, y}, {}, {0.75});
    EXPECT_TENSOR_CLOSE(y, gelu(add(mul(x, 0.75), b)), kDTypes[i]);
  }
}

TEST(CodegenCpu, FewLongRowsAndManyShortRowsBothMatchEager) {
  // [3, 40000] + a broadcast row: the dims cannot merge and 3 rows are too few to share out, so each row is
  // split over threads; [3000, 40] takes the rows-over-threads path. Same kernel code, different branch.
  for (const Shape& shape : {Shape{3, 40000}, Shape{3000, 40}}) {
    Tensor x = randn(shape), b = randn({shape[1]}), y = empty(shape);
    run(test_codegen().compile(bias_gelu_spec(x, b.expand_raw(shape), DType::f32)), {x, b.expand_raw(shape), y}, {},
        {-1.25});
    EXPECT_TENSOR_CLOSE(y, gelu(add(mul(x, -1.25), b)), DType::f32);
  }
}

TEST(CodegenCpu, SymbolicSizeRunsAtSeveralSizesWithOneKernel) {
  // y = where(x > 0, x, expm1(x)) * w over [n, 16] with n = syms[0]: one kernel serves every n.
  KernelSpec k;
  k.name = "elu_scale";
  k.num_syms = 1;
  k.dims = {SymInt::slot(0), SymInt::constant(16)};
  const int ix = k.input(DType::f32, {SymInt::constant(16), SymInt::constant(1)}, "x");
  const int iw = k.input(DType::f32, {SymInt::constant(0), SymInt::constant(1)}, "w");
  const int iy = k.output(DType::f32, {SymInt::constant(16), SymInt::constant(1)}, "y");
  const int x = k.load(ix);
  const int e = k.where(k.binary(Op::Gt, x, k.constant(0, DType::f32)), x, k.unary(Op::Expm1, x));
  k.store(iy, k.binary(Op::Mul, e, k.load(iw)));
  CodegenStats st;
  const cpu::CpuKernel kern = test_codegen().compile(k, &st);
  Tensor w = randn({16});
  for (int64_t n : {1, 7, 3000}) {
    Tensor xs = randn({n, 16}), y = full({n, 16}, 99.0);
    run(kern, {xs, w.expand_raw({n, 16}), y}, {n});
    EXPECT_TENSOR_CLOSE(y, mul(where(gt(xs, zeros({1})), xs, add(exp(xs), -1.0)), w), DType::f32);
  }
  const cpu::CpuKernel again = test_codegen().compile(k, &st);
  EXPECT_EQ(again.fn, kern.fn);
  EXPECT_LE(st.compiled, 1);
  EXPECT_EQ(st.kernels_requested, 2);
  EXPECT_GE(st.memory_hits, 1);
}

TEST(CodegenCpu, CausalMaskFromIndicesAndNarrowOutputs) {
  // y[i, j] = j <= i ? x[i, j] : -inf, stored as f16 and bf16: index nodes, -inf constants, narrowing stores.
  constexpr int64_t T = 19;
  KernelSpec k;
  k.name = "causal_mask";
  k.dims = dims_of({T, T});
  const int ix = k.input(DType::f32, k.contiguous_strides(), "scores");
  const int o16 = k.output(DType::f16, k.contiguous_strides(), "masked_f16");
  const int obf = k.output(DType::bf16, k.contiguous_strides(), "masked_bf16");
  const int keep = k.binary(Op::Le, k.index(1), k.index(0));
  const int y = k.where(keep, k.load(ix), k.constant(-INFINITY, DType::f32));
  k.store(o16, y);
  k.store(obf, y);
  Tensor x = randn({T, T}), a = empty({T, T}, DType::f16), b = empty({T, T}, DType::bf16);
  run(test_codegen().compile(k), {x, a, b});
  std::vector<double> mask(T * T);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) mask[i * T + j] = j <= i ? 0.0 : -INFINITY;
  Tensor want = add(x, from_vector(mask, {T, T}));
  const std::vector<double> got16 = a.to_vector(), gotbf = b.to_vector(), w16 = want.to(DType::f16).to_vector(),
                            wbf = want.to(DType::bf16).to_vector();
  for (size_t i = 0; i < got16.size(); ++i) {
    EXPECT_EQ(got16[i], w16[i]) << "f16 element " << i;  // the same rounding as the eager cast, bit for bit
    EXPECT_EQ(gotbf[i], wbf[i]) << "bf16 element " << i;
  }
}

TEST(CodegenCpu, EveryPointwiseOpMatchesEager) {
  // One kernel with an output per op, on values where every op is defined (x in (0.1, 2.1), z any sign).
  struct Case {
    const char* name;
    std::function<int(KernelSpec&, int, int)> build;
    std::function<Tensor(const Tensor&, const Tensor&)> eager;
  };
  auto un = [](Op op) { return [op](KernelSpec& k, int x, int) { return k.unary(op, x); }; };
  auto bin = [](Op op) { return [op](KernelSpec& k, int x, int z) { return k.binary(op, x, z); }; };
  // A gradient op against the eager kernel of the same BinaryOp (what the ops' VJPs run), as (at, dy).
  std::vector<kernels::BinaryOp> eager_grad;
  std::vector<bool> grad_of_output;
  auto grad = [&](Op op, kernels::BinaryOp eager, bool of_output) {
    eager_grad.push_back(eager);
    grad_of_output.push_back(of_output);
    return [op, of_output](KernelSpec& k, int x, int z) { return of_output ? k.binary(op, x, x) : k.binary(op, z, x); };
  };
  auto as_float = [](const Tensor& t, DType dt) { return t.to(dt); };
  const std::vector<Case> cases = {
      {"neg", un(Op::Neg), [](auto& x, auto&) { return neg(x); }},
      {"abs", [](KernelSpec& k, int, int z) { return k.unary(Op::Abs, z); }, [](auto&, auto& z) { return abs(z); }},
      {"exp", un(Op::Exp), [](auto& x, auto&) { return exp(x); }},
      {"log", un(Op::Log), [](auto& x, auto&) { return log(x); }},
      {"log1p", un(Op::Log1p), [](auto& x, auto&) { return log(add(x, 1.0)); }},
      {"sqrt", un(Op::Sqrt), [](auto& x, auto&) { return sqrt(x); }},
      {"rsqrt", un(Op::Rsqrt), [](auto& x, auto&) { return rsqrt(x); }},
      {"reciprocal", un(Op::Reciprocal), [](auto& x, auto&) { return reciprocal(x); }},
      {"square", un(Op::Square), [](auto& x, auto&) { return square(x); }},
      {"sin", un(Op::Sin), [](auto& x, auto&) { return sin(x); }},
      {"cos", un(Op::Cos), [](auto& x, auto&) { return cos(x); }},
      {"tanh", [](KernelSpec& k, int, int z) { return k.unary(Op::Tanh, z); }, [](auto&, auto& z) { return tanh(z); }},
      {"sigmoid", [](KernelSpec& k, int, int z) { return k.unary(Op::Sigmoid, z); },
       [](auto&, auto& z) { return sigmoid(z); }},
      {"relu", [](KernelSpec& k, int, int z) { return k.unary(Op::Relu, z); }, [](auto&, auto& z) { return relu(z); }},
      {"gelu_erf", [](KernelSpec& k, int, int z) { return k.unary(Op::GeluErf, z); },
       [](auto&, auto& z) { return gelu(z, false); }},
      {"silu", [](KernelSpec& k, int, int z) { return k.unary(Op::Silu, z); }, [](auto&, auto& z) { return silu(z); }},
      {"gelu_tanh", [](KernelSpec& k, int, int z) { return k.unary(Op::GeluTanh, z); },
       [](auto&, auto& z) { return gelu(z, true); }},
      // The activation gradients: dy = x, at z (sigmoid and tanh take their output, here x itself).
      {"relu_grad", grad(Op::ReluGrad, kernels::BinaryOp::ReluGrad, false), nullptr},
      {"silu_grad", grad(Op::SiluGrad, kernels::BinaryOp::SiluGrad, false), nullptr},
      {"gelu_tanh_grad", grad(Op::GeluTanhGrad, kernels::BinaryOp::GeluTanhGrad, false), nullptr},
      {"gelu_erf_grad", grad(Op::GeluErfGrad, kernels::BinaryOp::GeluErfGrad, false), nullptr},
      {"sigmoid_grad", grad(Op::SigmoidGrad, kernels::BinaryOp::SigmoidGradFromOutput, true), nullptr},
      {"tanh_grad", grad(Op::TanhGrad, kernels::BinaryOp::TanhGradFromOutput, true), nullptr},
      {"add", bin(Op::Add), [](auto& x, auto& z) { return add(x, z); }},
      {"sub", bin(Op::Sub), [](auto& x, auto& z) { return sub(x, z); }},
      {"div", bin(Op::Div), [](auto& x, auto& z) { return div(z, x); }},
      {"pow", [](KernelSpec& k, int x, int z) { return k.binary(Op::Pow, x, z); },
       [](auto& x, auto& z) { return pow(x, z); }},
      {"max", bin(Op::Max), [](auto& x, auto& z) { return maximum(x, z); }},
      {"min", bin(Op::Min), [](auto& x, auto& z) { return minimum(x, z); }},
      {"lt", bin(Op::Lt), [](auto& x, auto& z) { return lt(x, z); }},
      {"ge", bin(Op::Ge), [](auto& x, auto& z) { return ge(x, z); }},
  };
  for (DType dt : {DType::f32, DType::f64}) {
    KernelSpec k;
    k.name = "all_ops";
    k.dims = dims_of({9, 50});
    Tensor x = add(rand({9, 50}, dt), 0.1 + 0), z = randn_transposed({9, 50}, dt);
    const int ix = k.input(dt, strides_of(x), "x"), iz = k.input(dt, strides_of(z), "z");
    const int lx = k.load(ix), lz = k.load(iz);
    std::vector<Tensor> bufs = {x, z};
    for (const Case& c : cases) {
      int node = std::string(c.name) == "div" ? k.binary(Op::Div, lz, lx) : c.build(k, lx, lz);
      const DType out_dt = k.nodes[node].dtype;
      k.store(k.output(out_dt, k.contiguous_strides(), c.name), node);
      bufs.push_back(empty({9, 50}, out_dt));
    }
    run(test_codegen().compile(k), bufs);
    size_t g = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(std::string(cases[i].name) + " " + std::string(dtype_name(dt)));
      Tensor want;
      if (cases[i].eager) {
        want = cases[i].eager(x, z);
      } else {
        want = empty({9, 50}, dt);
        kernels::cpu::binary(eager_grad[g], want, grad_of_output[g] ? x : z, x);
        ++g;
      }
      EXPECT_TENSOR_CLOSE(as_float(bufs[2 + i], DType::f64), as_float(want, DType::f64), dt);
    }
  }
}

// Note [Scalar math written once]: generated kernels call runtime/kernels/scalar_math.h, the eager kernels' own
// formulas, instead of restating them; the header they include is that file, byte for byte.
TEST(CodegenCpu, GeneratedSourceIncludesTheScalarMathHeaderInsteadOfRestatingFormulas) {
  KernelSpec k;
  k.name = "activations";
  k.dims = dims_of({4, 8});
  const int x = k.load(k.input(DType::f32, k.contiguous_strides(), "x"));
  const int dy = k.load(k.input(DType::f32, k.contiguous_strides(), "dy"));
  int acc = k.unary(Op::GeluTanh, x);
  for (Op op : {Op::GeluErf, Op::Silu, Op::Sigmoid, Op::Relu})
    acc = k.binary(Op::Add, acc, k.unary(op, x));
  for (Op op : {Op::GeluTanhGrad, Op::GeluErfGrad, Op::SiluGrad, Op::SigmoidGrad, Op::TanhGrad, Op::ReluGrad})
    acc = k.binary(Op::Add, acc, k.binary(op, x, dy));
  k.store(k.output(DType::f32, k.contiguous_strides(), "y"), acc);
  EXPECT_NE(cpu::render_preamble().find("#include \"ingot_scalar_math.h\""), std::string::npos);
  const std::string src = cpu::render_kernel(k, "activations_0");
  for (const char* call : {"ig_math::gelu_tanh<float>(", "ig_math::gelu_erf<float>(", "ig_math::silu<float>(",
                           "ig_math::sigmoid<float>(", "ig_math::relu<float>(", "ig_math::gelu_tanh_grad<float>(",
                           "ig_math::gelu_erf_grad<float>(", "ig_math::silu_grad<float>(",
                           "ig_math::sigmoid_grad<float>(", "ig_math::tanh_grad<float>(", "ig_math::relu_grad<float>("})
    EXPECT_NE(src.find(call), std::string::npos) << call << " missing from\n" << src;
  // No formula restated: none of the GELUs' constants, no exp or tanh of its own.
  for (const char* formula : {"0.797884", "0.044715", "0.707106", "0.398942", "exp", "tanh(", "erf("})
    EXPECT_EQ(src.find(formula), std::string::npos) << formula << " restated in\n" << src;
  const std::string header = read_file(std::string(INGOT_SOURCE_DIR) + "/runtime/kernels/scalar_math.h");
  EXPECT_EQ(scalar_math_source(), header);
  EXPECT_NE(header.find("INGOT_MATH_FN T gelu_tanh(T x)"), std::string::npos);
}

TEST(CodegenCpu, IdenticalKernelsFromDifferentLayersAreCompiledOnce) {
  cpu::CpuCodegen cg(cpu::CpuCodegenOptions{"", false, 2});
  std::vector<KernelSpec> specs;
  for (int layer = 0; layer < 4; ++layer) {
    Tensor x = randn({8, 24}), b = randn({24});
    KernelSpec k = bias_gelu_spec(x, b.expand_raw({8, 24}), DType::f32);
    k.name = "layer" + std::to_string(layer) + "_bias_gelu";
    for (Buffer& buf : k.buffers) buf.name = k.name + "." + buf.name;
    specs.push_back(k);
  }
  CodegenStats st;
  const auto kernels = cg.compile(specs, &st);
  EXPECT_EQ(st.compiled, 1);
  EXPECT_EQ(st.memory_hits, 3);
  EXPECT_EQ(st.compiler_processes, 1);
  for (const auto& k : kernels) EXPECT_EQ(k.fn, kernels[0].fn);
  // A second graph asking for it again compiles nothing.
  CodegenStats again;
  cg.compile(specs[2], &again);
  EXPECT_EQ(again.compiled, 0);
  EXPECT_EQ(again.compiler_s, 0.0);
  EXPECT_GT(st.compiler_s, 0.0);
  EXPECT_NE(cg.stats().summary().find("kernels 5: 4 reused, 0 from disk cache, 1 compiled in 1 compiler runs"),
            std::string::npos)
      << cg.stats().summary();
}

TEST(CodegenCpu, ABatchIsSplitOverAtMostMaxParallelCompilerRuns) {
  cpu::CpuCodegen cg(cpu::CpuCodegenOptions{"", false, 2});
  std::vector<KernelSpec> specs;
  std::vector<Tensor> xs;
  for (int i = 0; i < 5; ++i) {  // five different kernels: y = x * (i + 1)
    KernelSpec k;
    k.name = "scale" + std::to_string(i);
    k.dims = dims_of({37});
    const int ix = k.input(DType::f32, k.contiguous_strides());
    k.store(k.output(DType::f32, k.contiguous_strides()),
            k.binary(Op::Mul, k.load(ix), k.constant(i + 1, DType::f32)));
    specs.push_back(k);
  }
  CodegenStats st;
  std::vector<std::pair<int64_t, int64_t>> progress;
  const auto kernels = cg.compile(specs, &st, [&](int64_t done, int64_t total) { progress.push_back({done, total}); });
  EXPECT_EQ(st.compiled, 5);
  EXPECT_EQ(st.compiler_processes, 2);
  // 0/5 after the lookups, then one report per compiler run: 2 or 3 kernels each, ending at 5/5.
  ASSERT_EQ(progress.size(), 3u);
  EXPECT_EQ(progress[0], std::make_pair(int64_t{0}, int64_t{5}));
  EXPECT_TRUE(progress[1].first == 2 || progress[1].first == 3) << progress[1].first;
  EXPECT_EQ(progress[2], std::make_pair(int64_t{5}, int64_t{5}));
  Tensor x = randn({37});
  for (int i = 0; i < 5; ++i) {
    Tensor y = empty({37});
    run(kernels[i], {x, y});
    EXPECT_TENSOR_CLOSE(y, mul(x, i + 1.0), DType::f32);
  }
}

// AdamW over parameters of different sizes in one kernel; p, m, v updated in place. The scalars are the
// run-time hyper-parameters (a schedule changes lr without a recompile).
KernelSpec adamw_spec(DType grad_dtype) {
  KernelSpec k;
  k.kind = KernelKind::MultiTensor;
  k.name = "adamw";
  const int p = k.input(DType::f32, {}, "param"), g = k.input(grad_dtype, {}, "grad");
  const int m = k.input(DType::f32, {}, "exp_avg"), v = k.input(DType::f32, {}, "exp_avg_sq");
  const int po = k.output(DType::f32, {}, "param", p), mo = k.output(DType::f32, {}, "exp_avg", m);
  const int vo = k.output(DType::f32, {}, "exp_avg_sq", v);
  auto s = [&](int slot) { return k.scalar(slot, DType::f32); };
  const int lr = s(0), b1 = s(1), b2 = s(2), eps = s(3), decay = s(4), scale = s(5), bc1 = s(6), bc2 = s(7);
  const int one = k.constant(1, DType::f32);
  const int gj = k.binary(Op::Mul, k.cast(k.load(g), DType::f32), scale);
  const int mj = k.binary(Op::Add, k.binary(Op::Mul, b1, k.load(m)), k.binary(Op::Mul, k.binary(Op::Sub, one, b1), gj));
  const int vj = k.binary(Op::Add, k.binary(Op::Mul, b2, k.load(v)),
                          k.binary(Op::Mul, k.binary(Op::Mul, k.binary(Op::Sub, one, b2), gj), gj));
  const int denom = k.binary(Op::Add, k.unary(Op::Sqrt, k.binary(Op::Div, vj, bc2)), eps);
  const int upd = k.binary(Op::Div, k.binary(Op::Mul, lr, k.binary(Op::Div, mj, bc1)), denom);
  k.store(po, k.binary(Op::Sub, k.binary(Op::Mul, k.load(p), decay), upd));
  k.store(mo, mj);
  k.store(vo, vj);
  return k;
}

TEST(CodegenCpu, MultiTensorAdamWMatchesTheEagerKernel) {
  const std::vector<KernelSpec> specs = {adamw_spec(DType::f32), adamw_spec(DType::bf16)};
  const auto kernels = test_codegen().compile(specs);
  kernels::AdamWArgs a;
  a.lr = 3e-3, a.beta1 = 0.8, a.beta2 = 0.95, a.eps = 1e-6, a.weight_decay = 0.1, a.step = 3, a.grad_scale = 0.5;
  const double bc1 = 1 - std::pow(a.beta1, 3), bc2 = 1 - std::pow(a.beta2, 3);
  for (size_t s = 0; s < specs.size(); ++s) {
    const DType gdt = s == 0 ? DType::f32 : DType::bf16;
    std::vector<Tensor> p, g, m, v, pe, me, ve;
    for (int64_t n : {1, 300, 40000}) {  // the last one is split over threads
      p.push_back(randn({n})), g.push_back(randn({n}).to(gdt)), m.push_back(randn({n}, DType::f32, Device::cpu(), 0, 0.1));
      v.push_back(rand({n}, DType::f32, Device::cpu(), 0, 0.1));
      pe.push_back(p.back().clone_raw()), me.push_back(m.back().clone_raw()), ve.push_back(v.back().clone_raw());
    }
    kernels::cpu::adamw_multi(pe, g, me, ve, a);
    std::vector<void*> bufs;
    std::vector<int64_t> syms = {3};
    for (size_t t = 0; t < p.size(); ++t) {
      for (const Tensor* x : {&p[t], &g[t], &m[t], &v[t], &p[t], &m[t], &v[t]}) bufs.push_back(x->data_ptr());
      syms.push_back(p[t].numel());
    }
    const std::vector<double> scalars = {a.lr, a.beta1, a.beta2, a.eps, 1.0 - a.lr * a.weight_decay, a.grad_scale,
                                         bc1, bc2};
    kernels[s](bufs.data(), syms.data(), scalars.data());
    for (size_t t = 0; t < p.size(); ++t) {
      EXPECT_LE(max_rel_error(p[t], pe[t], 1e-6, 1e-7), 1.0) << "param " << t;
      EXPECT_LE(max_rel_error(m[t], me[t], 1e-6, 1e-7), 1.0) << "exp_avg " << t;
      EXPECT_LE(max_rel_error(v[t], ve[t], 1e-6, 1e-7), 1.0) << "exp_avg_sq " << t;
    }
  }
}

}  // namespace
}  // namespace ingot::codegen
