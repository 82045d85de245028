// CPU code generation of row reductions: softmax, layer_norm and rms_norm forward/backward, cross-entropy
// forward/backward and a full reduction, written as KernelSpecs the way the fusion pass lowers them, against
// the eager kernels and autograd in f32, f64 and bf16.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/compile/codegen/test_codegen_util.h"

namespace ingot::codegen {
namespace {

using namespace ingot::codegen::testing;
constexpr DType kDTypes[] = {DType::f32, DType::f64, DType::bf16};

KernelSpec row_kernel(const std::string& name, const Shape& shape) {
  KernelSpec k;
  k.kind = KernelKind::RowReduction;
  k.name = name;
  k.dims = dims_of(shape);
  return k;
}

// Strides of a per-row buffer [rows...] (contiguous) as an index map over [rows..., cols]: 0 along cols.
std::vector<SymInt> row_strides(const Shape& shape) {
  std::vector<SymInt> s(shape.size());
  int64_t acc = 1;
  s.back() = SymInt::constant(0);
  for (size_t d = shape.size() - 1; d-- > 0;) {
    s[d] = SymInt::constant(acc);
    acc *= shape[d];
  }
  return s;
}

TEST(CodegenRows, SoftmaxOverAPermutedInputMatchesEager) {
  const Shape shape = {3, 5, 41};
  std::vector<KernelSpec> specs;
  std::vector<Tensor> xs;
  for (DType dt : kDTypes) {
    Tensor x = permute(randn({3, 41, 5}, DType::f64).to(dt), {0, 2, 1}).detach();  // strides [205, 1, 5]
    KernelSpec k = row_kernel("softmax", shape);
    const int ix = k.input(dt, strides_of(x), "x");
    const int iy = k.output(dt, k.contiguous_strides(), "y");
    const int lx = k.load(ix);
    const int m = k.reduce(Op::ReduceMax, lx);
    const int e = k.unary(Op::Exp, k.binary(Op::Sub, lx, m));
    k.store(iy, k.binary(Op::Div, e, k.reduce(Op::ReduceSum, e)));
    specs.push_back(k);
    xs.push_back(x);
  }
  const auto kernels = test_codegen().compile(specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor y = empty(shape, kDTypes[i]);
    run(kernels[i], {xs[i], y});
    EXPECT_TENSOR_CLOSE(y, softmax(xs[i], -1), kDTypes[i]);
  }
}

// y = (x - mean) * rstd * w + b, with mean and rstd also written per row (what backward reads).
KernelSpec layer_norm_fwd_spec(const Tensor& x, DType dt, double eps) {
  const int64_t R = x.size(0), C = x.size(1);
  KernelSpec k = row_kernel("layer_norm_fwd", x.shape());
  const int ix = k.input(dt, strides_of(x), "x");
  const int iw = k.input(dt, {SymInt::constant(0), SymInt::constant(1)}, "w");
  const int ib = k.input(dt, {SymInt::constant(0), SymInt::constant(1)}, "b");
  const int iy = k.output(dt, k.contiguous_strides(), "y");
  const int imean = k.output(dt == DType::f64 ? DType::f64 : DType::f32, row_strides({R, C}), "mean");
  const int irstd = k.output(k.buffers[imean].dtype, row_strides({R, C}), "rstd");
  const DType st = k.buffers[imean].dtype;  // statistics in f32 (f64 for f64 inputs), as the eager kernel
  const int lx = k.cast(k.load(ix), st);
  const int inv_c = k.constant(1.0 / static_cast<double>(C), st);
  const int mean = k.binary(Op::Mul, k.reduce(Op::ReduceSum, lx), inv_c);
  const int d = k.binary(Op::Sub, lx, mean);
  const int var = k.binary(Op::Mul, k.reduce(Op::ReduceSum, k.unary(Op::Square, d)), inv_c);
  const int rstd = k.unary(Op::Rsqrt, k.binary(Op::Add, var, k.constant(eps, st)));
  const int y = k.binary(Op::Add, k.binary(Op::Mul, k.binary(Op::Mul, d, rstd), k.load(iw)), k.load(ib));
  k.store(iy, y);
  k.store(imean, mean);
  k.store(irstd, rstd);
  return k;
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w: two independent reductions in one pass.
KernelSpec layer_norm_bwd_spec(const Shape& shape, DType dt, DType st) {
  const int64_t C = shape[1];
  KernelSpec k = row_kernel("layer_norm_bwd_dx", shape);
  const int ix = k.input(dt, k.contiguous_strides(), "x"), idy = k.input(dt, k.contiguous_strides(), "dy");
  const int iw = k.input(dt, {SymInt::constant(0), SymInt::constant(1)}, "w");
  const int imean = k.input(st, row_strides(shape), "mean"), irstd = k.input(st, row_strides(shape), "rstd");
  const int idx = k.output(dt, k.contiguous_strides(), "dx");
  const int rstd = k.load(irstd);
  const int xhat = k.binary(Op::Mul, k.binary(Op::Sub, k.load(ix), k.load(imean)), rstd);
  const int g = k.binary(Op::Mul, k.load(idy), k.load(iw));
  const int inv_c = k.constant(1.0 / static_cast<double>(C), st);
  const int a = k.binary(Op::Mul, k.reduce(Op::ReduceSum, g), inv_c);
  const int b = k.binary(Op::Mul, k.reduce(Op::ReduceSum, k.binary(Op::Mul, g, xhat)), inv_c);
  k.store(idx, k.binary(Op::Mul, rstd, k.binary(Op::Sub, k.binary(Op::Sub, g, a), k.binary(Op::Mul, xhat, b))));
  return k;
}

// dw[c] = sum over rows of dy * xhat, db[c] = sum over rows of dy: a reduction over dim 0, expressed by making
// rows the last dim of the iteration space [C, R] (transposed strides, no copy).
KernelSpec layer_norm_bwd_dw_spec(const Shape& shape, DType dt, DType st) {
  const int64_t R = shape[0], C = shape[1];
  KernelSpec k = row_kernel("layer_norm_bwd_dw", {C, R});
  const std::vector<SymInt> tr = {SymInt::constant(1), SymInt::constant(C)};
  const int ix = k.input(dt, tr, "x"), idy = k.input(dt, tr, "dy");
  const int imean = k.input(st, {SymInt::constant(0), SymInt::constant(1)}, "mean");
  const int irstd = k.input(st, {SymInt::constant(0), SymInt::constant(1)}, "rstd");
  const int idw = k.output(dt, {SymInt::constant(1), SymInt::constant(0)}, "dw");
  const int idb = k.output(dt, {SymInt::constant(1), SymInt::constant(0)}, "db");
  (void)R;
  const int xhat = k.binary(Op::Mul, k.binary(Op::Sub, k.load(ix), k.load(imean)), k.load(irstd));
  const int dy = k.cast(k.load(idy), st);
  k.store(idw, k.reduce(Op::ReduceSum, k.binary(Op::Mul, dy, xhat)));
  k.store(idb, k.reduce(Op::ReduceSum, dy));
  return k;
}

TEST(CodegenRows, LayerNormForwardAndBackwardMatchEagerAndAutograd) {
  const int64_t R = 12, C = 96;
  const double eps = 1e-5;
  std::vector<KernelSpec> specs;  // one batch for every dtype: one round of compiler processes
  std::vector<Tensor> xs;
  for (DType dt : kDTypes) {
    const DType st = dt == DType::f64 ? DType::f64 : DType::f32;
    xs.push_back(randn_transposed({R, C}, dt));
    specs.push_back(layer_norm_fwd_spec(xs.back(), dt, eps));
    specs.push_back(layer_norm_bwd_spec({R, C}, dt, st));
    specs.push_back(layer_norm_bwd_dw_spec({R, C}, dt, st));
  }
  const auto all = test_codegen().compile(specs);
  for (size_t i = 0; i < 3; ++i) {
    const DType dt = kDTypes[i], st = dt == DType::f64 ? DType::f64 : DType::f32;
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<cpu::CpuKernel> kernels(all.begin() + 3 * i, all.begin() + 3 * i + 3);
    Tensor x = xs[i], w = randn({C}, DType::f64).to(dt), b = randn({C}, DType::f64).to(dt);
    Tensor dy = randn({R, C}, DType::f64).to(dt);
    Tensor y = empty({R, C}, dt), mean = empty({R}, st), rstd = empty({R}, st);
    run(kernels[0], {x, w.expand_raw({R, C}), b.expand_raw({R, C}), y, mean, rstd});
    EXPECT_TENSOR_CLOSE(y, layer_norm(x, w, b, eps), dt);
    Tensor x64 = x.to(DType::f64);
    Tensor mean_ref = ingot::mean(x64, {-1});
    EXPECT_TENSOR_CLOSE(mean, mean_ref, st);
    Tensor var_ref = ingot::mean(square(sub(x64, unsqueeze(mean_ref, -1))), {-1});
    EXPECT_TENSOR_CLOSE(rstd, rsqrt(add(var_ref, eps)), st);

    Tensor xc = x.contiguous_raw(), dx = empty({R, C}, dt), dw = empty({C}, dt), db = empty({C}, dt);
    run(kernels[1], {xc, dy, w.expand_raw({R, C}), mean, rstd, dx});
    run(kernels[2], {xc, dy, mean, rstd, dw, db});
    Tensor xg = xc.detach().set_requires_grad(true), wg = w.detach().set_requires_grad(true),
           bg = b.detach().set_requires_grad(true);
    layer_norm(xg, wg, bg, eps).backward(dy);
    EXPECT_TENSOR_CLOSE(dx, xg.grad(), dt);
    EXPECT_TENSOR_CLOSE(dw, wg.grad(), dt);
    EXPECT_TENSOR_CLOSE(db, bg.grad(), dt);
  }
}

TEST(CodegenRows, RmsNormForwardMatchesEager) {
  const Shape shape = {2, 7, 64};
  std::vector<KernelSpec> specs;
  for (DType dt : kDTypes) {
    KernelSpec k = row_kernel("rms_norm", shape);
    const int ix = k.input(dt, k.contiguous_strides(), "x");
    const int iw = k.input(dt, {SymInt::constant(0), SymInt::constant(0), SymInt::constant(1)}, "w");
    const int iy = k.output(dt, k.contiguous_strides(), "y");
    const int lx = k.load(ix);
    const int ms = k.binary(Op::Mul, k.reduce(Op::ReduceSum, k.unary(Op::Square, lx)), k.constant(1.0 / 64, dt));
    const int r = k.unary(Op::Rsqrt, k.binary(Op::Add, ms, k.constant(1e-6, dt)));
    k.store(iy, k.binary(Op::Mul, k.binary(Op::Mul, lx, r), k.load(iw)));
    specs.push_back(k);
  }
  const auto kernels = test_codegen().compile(specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    const DType dt = kDTypes[i];
    Tensor x = randn(shape, DType::f64).to(dt), w = randn({64}, DType::f64).to(dt), y = empty(shape, dt);
    run(kernels[i], {x, w.expand_raw(shape), y});
    EXPECT_TENSOR_CLOSE(y, rms_norm(x, w, 1e-6), dt);
  }
}

// Forward: per-row loss = lse - z[t] (0 where t == ignore_index) and lse for backward, as row outputs.
// Backward: dz = (exp(z - lse) - onehot(t)) * g, g = 1 / (number of counted rows) as a run-time scalar.
std::vector<KernelSpec> cross_entropy_specs(const Shape& shape, DType dt) {
  const DType st = dt == DType::f64 ? DType::f64 : DType::f32;
  KernelSpec f = row_kernel("cross_entropy_fwd", shape);
  {
    const int iz = f.input(dt, f.contiguous_strides(), "logits");
    const int it = f.input(DType::i64, row_strides(shape), "target");
    const int iloss = f.output(st, row_strides(shape), "loss"), ilse = f.output(st, row_strides(shape), "lse");
    const int z = f.cast(f.load(iz), st), t = f.load(it);
    const int m = f.reduce(Op::ReduceMax, z);
    const int lse = f.binary(Op::Add, m, f.unary(Op::Log, f.reduce(Op::ReduceSum, f.unary(Op::Exp, f.binary(Op::Sub, z, m)))));
    const int hit = f.binary(Op::Eq, f.index(1), t);
    const int zt = f.reduce(Op::ReduceSum, f.where(hit, z, f.constant(0, st)));
    const int ignored = f.binary(Op::Eq, t, f.constant(-100, DType::i64));
    f.store(iloss, f.where(ignored, f.constant(0, st), f.binary(Op::Sub, lse, zt)));
    f.store(ilse, lse);
  }
  KernelSpec b = row_kernel("cross_entropy_bwd", shape);
  {
    const int iz = b.input(dt, b.contiguous_strides(), "logits");
    const int it = b.input(DType::i64, row_strides(shape), "target");
    const int ilse = b.input(st, row_strides(shape), "lse");
    const int idz = b.output(dt, b.contiguous_strides(), "dlogits");
    const int t = b.load(it);
    const int p = b.unary(Op::Exp, b.binary(Op::Sub, b.load(iz), b.load(ilse)));
    const int onehot = b.cast(b.binary(Op::Eq, b.index(1), t), st);
    const int ignored = b.binary(Op::Eq, t, b.constant(-100, DType::i64));
    const int g = b.where(ignored, b.constant(0, st), b.scalar(0, st));
    b.store(idz, b.binary(Op::Mul, b.binary(Op::Sub, p, onehot), g));
  }
  return {f, b};
}

TEST(CodegenRows, CrossEntropyForwardAndBackwardMatchEager) {
  const int64_t N = 10, C = 77;
  std::vector<KernelSpec> specs;
  for (DType dt : kDTypes)
    for (KernelSpec& k : cross_entropy_specs({N, C}, dt)) specs.push_back(k);
  const auto kernels = test_codegen().compile(specs);
  for (size_t i = 0; i < 3; ++i) {
    const DType dt = kDTypes[i], st = dt == DType::f64 ? DType::f64 : DType::f32;
    SCOPED_TRACE(dtype_name(dt));
    Tensor z = mul(randn({N, C}, DType::f64), 3.0).to(dt);
    std::vector<int64_t> tv = {3, 76, 0, -100, 12, 12, 40, -100, 5, 60};
    Tensor t = from_vector_i64(tv, {N});
    Tensor loss = empty({N}, st), lse = empty({N}, st), dz = empty({N, C}, dt);
    run(kernels[2 * i], {z, t, loss, lse});
    EXPECT_TENSOR_CLOSE(loss, cross_entropy(z, t, -100, 0.0, Reduction::None), dt);
    run(kernels[2 * i + 1], {z, t, lse, dz}, {}, {1.0 / 8});  // 8 counted rows
    Tensor zg = z.detach().set_requires_grad(true);
    cross_entropy(zg, t).backward();
    EXPECT_TENSOR_CLOSE(dz, zg.grad(), dt);
  }
}

TEST(CodegenRows, AFullReductionIsOneRow) {
  // sum(x * x) over all 50000 elements of a [50000] tensor into one value; also a max, as two outputs.
  KernelSpec k = row_kernel("sum_sq", {50000});
  const int ix = k.input(DType::f32, {SymInt::constant(1)}, "x");
  const int isum = k.output(DType::f32, {SymInt::constant(0)}, "sum_sq");
  const int imax = k.output(DType::f32, {SymInt::constant(0)}, "max");
  const int lx = k.load(ix);
  k.store(isum, k.reduce(Op::ReduceSum, k.unary(Op::Square, lx)));
  k.store(imax, k.reduce(Op::ReduceMax, lx));
  Tensor x = randn({50000}), s = empty({1}), m = empty({1});
  const cpu::CpuKernel kern = test_codegen().compile(k);
  run(kern, {x, s, m});
  EXPECT_NEAR(s.item(), sum(square(x.to(DType::f64))).item(), 1e-4 * 50000);
  EXPECT_EQ(m.item(), amax(x).item());
  // A NaN anywhere propagates through max (as in the eager amax), whichever thread and lane meets it.
  for (int64_t at : {0, 777, 49999}) {
    Tensor xn = x.clone_raw();
    xn.data<float>()[at] = NAN;
    run(kern, {xn, s, m});
    EXPECT_TRUE(std::isnan(m.item())) << "NaN at " << at;
    EXPECT_TRUE(std::isnan(amax(xn).item()));
  }
}

}  // namespace
}  // namespace ingot::codegen
