// CUDA code generation of row reductions and multi-tensor kernels on the GPU: softmax, layer_norm forward and
// backward (dx, dw/db), rms_norm, cross-entropy forward and backward, a full reduction with NaNs, AdamW over
// many parameters in one launch, each against the eager CPU ops (and the CPU code generator) in f32, bf16,
// f16 and f64, under warp-per-row, block-per-row, vector and scalar launch configurations; and a second
// process with a warm cache that runs no NVRTC.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "runtime/cuda_runtime.h"
#include "runtime/file_util.h"
#include "runtime/kernels/kernels.h"
#include "tests/compile/codegen/test_codegen_cuda_util.h"
#include "tests/testing.h"

namespace ingot::codegen {
namespace {

#ifndef INGOT_WITH_CUDA_CODEGEN
TEST(CodegenCudaRows, NeedsACudaBuild) {
  INGOT_REQUIRE_CUDA();
  GTEST_SKIP() << "built without the CUDA code generator (INGOT_CUDA=OFF)";
}
#else

using namespace ingot::codegen::testing;
using ingot::testing::count_occurrences;
constexpr DType kDTypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};

DType stat_type(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

KernelSpec row_kernel(const std::string& name, const Shape& shape) {
  KernelSpec k;
  k.kind = KernelKind::RowReduction;
  k.name = name;
  k.dims = dims_of(shape);
  return k;
}

// A per-row buffer [rows...] (contiguous) as an index map over [rows..., cols]: stride 0 along cols.
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

KernelSpec softmax_spec(DType dt, const Shape& shape, std::vector<SymInt> x_strides) {
  KernelSpec k = row_kernel("softmax", shape);
  const int ix = k.input(dt, std::move(x_strides), "x");
  const int iy = k.output(dt, k.contiguous_strides(), "y");
  const int lx = k.load(ix);
  const int e = k.unary(Op::Exp, k.binary(Op::Sub, lx, k.reduce(Op::ReduceMax, lx)));
  k.store(iy, k.binary(Op::Div, e, k.reduce(Op::ReduceSum, e)));
  return k;
}

TEST(CodegenCudaRows, SoftmaxMatchesEagerForShortPermutedAndLongRowsUnderEveryLaunchConfig) {
  INGOT_REQUIRE_CUDA();
  struct Case {
    Shape shape;  // [B, R, C]
    bool permuted;
  };
  const Case cases[] = {{{3, 5, 41}, true}, {{2, 3, 64}, false}, {{1, 4, 3000}, false}};
  std::vector<KernelSpec> specs;
  for (const Case& cs : cases)
    for (DType dt : kDTypes) {
      const int64_t B = cs.shape[0], R = cs.shape[1], C = cs.shape[2];
      specs.push_back(softmax_spec(dt, cs.shape, cs.permuted ? dims_of({R * C, 1, R}) : dims_of({R * C, C, 1})));
      (void)B;
    }
  const auto kernels = cuda_codegen().compile(specs);
  size_t i = 0;
  for (const Case& cs : cases)
    for (DType dt : kDTypes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " cols " + std::to_string(cs.shape[2]));
      const int64_t B = cs.shape[0], R = cs.shape[1], C = cs.shape[2];
      Both x = cs.permuted ? both(mul(randn({B, C, R}, DType::f64), 3.0).to(dt),
                                  [](const Tensor& t) { return permute(t, {0, 2, 1}); })
                           : both(mul(randn(cs.shape, DType::f64), 3.0).to(dt));
      const Tensor want = softmax(x.cpu.to(DType::f64), -1);  // exact on the same (rounded) inputs
      for (const cuda::LaunchConfig& cfg : row_configs()) {
        Tensor y = zeros(cs.shape, dt, kGpu);
        run_cuda(kernels[i], {x.gpu, y}, {}, {}, &cfg);
        EXPECT_TENSOR_CLOSE(host(y), want, dt);
      }
      ++i;
    }
}

// y = (x - mean) * rstd * w + b, with mean and rstd also written per row (what backward reads).
KernelSpec layer_norm_fwd_spec(DType dt, int64_t R, int64_t C, double eps) {
  const DType st = stat_type(dt);
  KernelSpec k = row_kernel("layer_norm_fwd", {R, C});
  const int ix = k.input(dt, k.contiguous_strides(), "x");
  const int iw = k.input(dt, dims_of({0, 1}), "w"), ib = k.input(dt, dims_of({0, 1}), "b");
  const int iy = k.output(dt, k.contiguous_strides(), "y");
  const int imean = k.output(st, row_strides({R, C}), "mean"), irstd = k.output(st, row_strides({R, C}), "rstd");
  const int lx = k.cast(k.load(ix), st);
  const int inv_c = k.constant(1.0 / static_cast<double>(C), st);
  const int mean = k.binary(Op::Mul, k.reduce(Op::ReduceSum, lx), inv_c);
  const int d = k.binary(Op::Sub, lx, mean);
  const int var = k.binary(Op::Mul, k.reduce(Op::ReduceSum, k.unary(Op::Square, d)), inv_c);
  const int rstd = k.unary(Op::Rsqrt, k.binary(Op::Add, var, k.constant(eps, st)));
  k.store(iy, k.binary(Op::Add, k.binary(Op::Mul, k.binary(Op::Mul, d, rstd), k.load(iw)), k.load(ib)));
  k.store(imean, mean);
  k.store(irstd, rstd);
  return k;
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w: two independent reductions in one phase.
KernelSpec layer_norm_bwd_spec(DType dt, int64_t R, int64_t C) {
  const DType st = stat_type(dt);
  KernelSpec k = row_kernel("layer_norm_bwd_dx", {R, C});
  const int ix = k.input(dt, k.contiguous_strides(), "x"), idy = k.input(dt, k.contiguous_strides(), "dy");
  const int iw = k.input(dt, dims_of({0, 1}), "w");
  const int imean = k.input(st, row_strides({R, C}), "mean"), irstd = k.input(st, row_strides({R, C}), "rstd");
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

// dw[c] = sum over rows of dy * xhat, db[c] = sum of dy: rows made the reduced (last) dim by strides.
KernelSpec layer_norm_dw_spec(DType dt, int64_t R, int64_t C) {
  const DType st = stat_type(dt);
  KernelSpec k = row_kernel("layer_norm_bwd_dw", {C, R});
  const std::vector<SymInt> tr = dims_of({1, C});
  const int ix = k.input(dt, tr, "x"), idy = k.input(dt, tr, "dy");
  const int imean = k.input(st, dims_of({0, 1}), "mean"), irstd = k.input(st, dims_of({0, 1}), "rstd");
  const int idw = k.output(dt, dims_of({1, 0}), "dw"), idb = k.output(dt, dims_of({1, 0}), "db");
  const int xhat = k.binary(Op::Mul, k.binary(Op::Sub, k.load(ix), k.load(imean)), k.load(irstd));
  const int dy = k.cast(k.load(idy), st);
  k.store(idw, k.reduce(Op::ReduceSum, k.binary(Op::Mul, dy, xhat)));
  k.store(idb, k.reduce(Op::ReduceSum, dy));
  return k;
}

TEST(CodegenCudaRows, LayerNormForwardAndBackwardMatchEagerAndAutograd) {
  INGOT_REQUIRE_CUDA();
  const int64_t R = 19, C = 96;
  const double eps = 1e-5;
  std::vector<KernelSpec> specs;
  for (DType dt : kDTypes) {
    specs.push_back(layer_norm_fwd_spec(dt, R, C, eps));
    specs.push_back(layer_norm_bwd_spec(dt, R, C));
    specs.push_back(layer_norm_dw_spec(dt, R, C));
  }
  const auto all = cuda_codegen().compile(specs);
  for (size_t i = 0; i < 4; ++i) {
    const DType dt = kDTypes[i], st = stat_type(dt);
    EXPECT_FALSE(all[3 * i].abi.prefer_columns);
    EXPECT_TRUE(all[3 * i + 2].abi.prefer_columns) << "dw reduces over rows of a row-major tensor";
    SCOPED_TRACE(dtype_name(dt));
    Both x = both(add(mul(randn({R, C}, DType::f64), 2.0), 0.5).to(dt));
    Both w = both(randn({C}, DType::f64).to(dt)), b = both(randn({C}, DType::f64).to(dt));
    Both dy = both(randn({R, C}, DType::f64).to(dt));
    // The reference runs in f64 on the same (rounded) inputs: the kernel's only errors are its own.
    Tensor xg = ::ingot::testing::leaf(x.cpu.to(DType::f64)), wg = ::ingot::testing::leaf(w.cpu.to(DType::f64)),
           bg = ::ingot::testing::leaf(b.cpu.to(DType::f64));
    const Tensor want = layer_norm(xg, wg, bg, eps);
    want.backward(dy.cpu.to(DType::f64));
    for (const cuda::LaunchConfig& cfg : row_configs()) {
      Tensor y = zeros({R, C}, dt, kGpu), mean = zeros({R}, st, kGpu), rstd = zeros({R}, st, kGpu);
      run_cuda(all[3 * i], {x.gpu, w.gpu.expand_raw({R, C}), b.gpu.expand_raw({R, C}), y, mean, rstd}, {}, {}, &cfg);
      EXPECT_TENSOR_CLOSE(host(y), want.detach(), dt);
      const Tensor x64 = x.cpu.to(DType::f64), mean_ref = ingot::mean(x64, {-1});
      EXPECT_TENSOR_CLOSE(host(mean), mean_ref, st);
      Tensor dx = zeros({R, C}, dt, kGpu), dw = zeros({C}, dt, kGpu), db = zeros({C}, dt, kGpu);
      run_cuda(all[3 * i + 1], {x.gpu, dy.gpu, w.gpu.expand_raw({R, C}), mean, rstd, dx}, {}, {}, &cfg);
      run_cuda(all[3 * i + 2], {x.gpu, dy.gpu, mean, rstd, dw, db}, {}, {}, &cfg);
      EXPECT_TENSOR_CLOSE(host(dx), xg.grad(), dt);
      EXPECT_TENSOR_CLOSE(host(dw), wg.grad(), dt);
      EXPECT_TENSOR_CLOSE(host(db), bg.grad(), dt);
    }
  }
}

// Note [Split column reductions]: a bias gradient (column sums of a [tokens, channels] bf16 matrix) and a
// layer-norm-dw-like pair of sums, at sizes where the heuristic splits the columns across blocks. The result
// must match the f64 reference, repeat bit for bit (the partials combine in a fixed order) and stay right
// when the same kernel runs again with fewer splits (the tile counters are back at zero after every launch).
TEST(CodegenCudaRows, ColumnSumsSplitAcrossBlocksMatchEagerAndRepeatBitForBit) {
  INGOT_REQUIRE_CUDA();
  const int64_t R = 4096, C = 768;
  KernelSpec k = row_kernel("bias_grad", {C, R});
  const int ig = k.input(DType::bf16, dims_of({1, C}), "g"), ix = k.input(DType::bf16, dims_of({1, C}), "x");
  const int idb = k.output(DType::f32, dims_of({1, 0}), "db"), idw = k.output(DType::f32, dims_of({1, 0}), "dw");
  const int g = k.cast(k.load(ig), DType::f32);
  k.store(idb, k.reduce(Op::ReduceSum, g));
  k.store(idw, k.reduce(Op::ReduceSum, k.binary(Op::Mul, g, k.cast(k.load(ix), DType::f32))));
  const cuda::CudaKernel kern = cuda_codegen().compile(k);
  ASSERT_EQ(kern.abi.functions.size(), 4u) << "a one-phase transposed reduction gets a _colsplit function";
  EXPECT_EQ(kern.abi.split_reductions, 2);
  Both gr = both(randn({R, C}, DType::f64).to(DType::bf16)), xr = both(randn({R, C}, DType::f64).to(DType::bf16));
  const Tensor g64 = gr.cpu.to(DType::f64), gx64 = mul(g64, xr.cpu.to(DType::f64));
  const Tensor db_ref = sum(g64, {0}), dw_ref = sum(gx64, {0});
  // An f32 sum of R terms in any order is within a few ulps of the sum of |terms| (a split lost or counted
  // twice is off by ~1e-2 of it).
  auto close_to_sum = [&](const Tensor& got, const Tensor& ref, const Tensor& terms, const char* what) {
    const std::vector<double> a = host(got).to_vector(), b = ref.to_vector(), l1 = sum(abs(terms), {0}).to_vector();
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_LE(std::abs(a[i] - b[i]), 2e-6 * l1[i] + 1e-6) << what << " column " << i << ": " << a[i] << " vs " << b[i];
  };
  std::vector<double> first_db, first_dw;
  cuda::LaunchConfig fewer;
  fewer.col_grid_splits = 3;
  const std::vector<const cuda::LaunchConfig*> runs{nullptr, &fewer, nullptr};
  for (const cuda::LaunchConfig* cfg : runs) {
    Tensor db = full({C}, NAN, DType::f32, kGpu), dw = full({C}, NAN, DType::f32, kGpu);
    run_cuda(kern, {gr.gpu, xr.gpu, db, dw}, {}, {}, cfg);
    EXPECT_GT(kern.split_workspace_bytes(), 0u) << "the heuristic splits the few tiles of rows on any GPU";
    close_to_sum(db, db_ref, g64, "db");
    close_to_sum(dw, dw_ref, gx64, "dw");
    if (cfg != nullptr) continue;
    if (first_db.empty()) {
      first_db = host(db).to_vector();
      first_dw = host(dw).to_vector();
    } else {
      EXPECT_EQ(host(db).to_vector(), first_db) << "split partials must combine in a fixed order";
      EXPECT_EQ(host(dw).to_vector(), first_dw);
    }
  }
}

// Note [Column sums in row reductions]: dx as above, and dw, db summed over the rows in the same kernel.
KernelSpec layer_norm_bwd_whole_spec(DType dt, int64_t R, int64_t C) {
  KernelSpec k = layer_norm_bwd_spec(dt, R, C);
  k.name = "layer_norm_bwd_whole";
  const DType st = stat_type(dt);
  const int idw = k.output(DType::f32, dims_of({0, 1}), "dw"), idb = k.output(DType::f32, dims_of({0, 1}), "db");
  // Loads of x, dy, mean, rstd again: canonicalize merges them with dx's.
  const int xhat = k.binary(Op::Mul, k.binary(Op::Sub, k.load(0), k.load(3)), k.load(4));
  const int dy = k.cast(k.load(1), st);
  k.store(idw, k.column_sum(k.binary(Op::Mul, dy, xhat)));
  k.store(idb, k.column_sum(dy));
  return k;
}

TEST(CodegenCudaRows, ColumnSumsRenderOnlyTheWarpVariantAndCompileWithoutAGpu) {
  const int arch = cuda_available() ? cuda::device_arch(0) : 90;
  const KernelSpec k = layer_norm_bwd_whole_spec(DType::bf16, 64, 768);
  const cuda::RenderedKernel r = cuda::render_kernel(k, "lnw");
  EXPECT_EQ(r.abi.column_sums, 2);
  EXPECT_EQ(r.abi.functions, (std::vector<std::string>{"lnw_warp", "", "", "", "lnw_colfin"}));
  EXPECT_NE(r.source.find("ig_cs1["), std::string::npos) << r.source;
  const std::vector<std::string> cubins =
      cuda::compile_cubins({{"column_sums.cu", cuda::render_preamble() + "\n" + r.source}}, arch, 1);
  ASSERT_EQ(cubins.size(), 1u);
  EXPECT_EQ(cubins[0].substr(1, 3), "ELF");
  // The cubin cache's renderer fingerprint renders a column-sum probe too (a change to this code must not load
  // cubins an older renderer built).
  EXPECT_EQ(cuda::renderer_fingerprint().rfind("cuda-renderer-", 0), 0u);
}

// Note [Rows kept in registers] / [Warp-per-row launch bounds]: a bf16 layer norm of 768 columns keeps each lane's
// three 8-wide chunks of x in rb0 (loaded once per row, read by the mean, variance and output phases) and its
// _warp function is built for 256-thread blocks; rows too long for that keep the 1024-thread build and load per
// phase. Both compile with NVRTC.
TEST(CodegenCudaRows, RowsKeptInRegistersLoadOncePerRowAndBoundTheWarpFunction) {
  const int arch = cuda_available() ? cuda::device_arch(0) : 90;
  auto function = [](const std::string& source, const std::string& name) {
    const size_t begin = source.find(name + "(const");
    const size_t end = source.find("extern \"C\"", begin);
    return begin == std::string::npos ? std::string() : source.substr(begin, end - begin);
  };
  const cuda::RenderedKernel r = cuda::render_kernel(layer_norm_fwd_spec(DType::bf16, 64, 768, 1e-5), "lnf");
  const std::string warp = function(r.source, "lnf_warp"), block = function(r.source, "lnf_block");
  ASSERT_FALSE(warp.empty()) << r.source;
  EXPECT_NE(r.source.find("__launch_bounds__(" + std::to_string(cuda::kWarpRowMaxThreads) + ", 2) lnf_warp("),
            std::string::npos);
  EXPECT_NE(r.source.find("__launch_bounds__(1024) lnf_block("), std::string::npos);
  EXPECT_NE(warp.find("rb0[3][8];"), std::string::npos) << warp;
  EXPECT_EQ(count_occurrences(warp, "ig_ldv<8>(rb0[k]"), 1u) << "x loaded once per row";
  EXPECT_EQ(count_occurrences(warp, "ig_ldv<8>(vb0"), 0u) << "no phase loads x again";
  EXPECT_EQ(count_occurrences(block, "rb0["), 0u) << "only the warp-per-row function caches rows";

  const cuda::RenderedKernel wide = cuda::render_kernel(layer_norm_fwd_spec(DType::bf16, 64, 4096, 1e-5), "lnw");
  EXPECT_NE(wide.source.find("__launch_bounds__(1024) lnw_warp("), std::string::npos);
  EXPECT_EQ(count_occurrences(wide.source, "rb0["), 0u) << "16 chunks per lane: too many registers";

  const std::vector<std::string> cubins = cuda::compile_cubins(
      {{"rows.cu", cuda::render_preamble() + "\n" + r.source + "\n" + wide.source}}, arch, 1);
  ASSERT_EQ(cubins.size(), 1u);
  EXPECT_EQ(cubins[0].substr(1, 3), "ELF");
}

// More rows than the capped grid has warps (so warps loop and blocks combine), vector and scalar paths, fewer
// warps per block; dw and db must be the sums over every row, and a second launch must repeat them bit for bit
// (warps, then blocks, are added in a fixed order).
TEST(CodegenCudaRows, LayerNormBackwardWithColumnSumsMatchesAutogradAndRepeatsBitForBit) {
  INGOT_REQUIRE_CUDA();
  const int64_t R = 9000;
  for (int64_t C : {96, 768}) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(detail::str_cat(dtype_name(dt), " C=", C));
      const cuda::CudaKernel kern = cuda_codegen().compile(layer_norm_bwd_whole_spec(dt, R, C));
      ASSERT_EQ(kern.abi.column_sums, 2);
      Both x = both(add(mul(randn({R, C}, DType::f64), 2.0), 0.5).to(dt));
      Both w = both(randn({C}, DType::f64).to(dt)), b = both(randn({C}, DType::f64).to(dt));
      Both dy = both(randn({R, C}, DType::f64).to(dt));
      Tensor xg = ::ingot::testing::leaf(x.cpu.to(DType::f64)), wg = ::ingot::testing::leaf(w.cpu.to(DType::f64)),
             bg = ::ingot::testing::leaf(b.cpu.to(DType::f64));
      layer_norm(xg, wg, bg, 1e-5).backward(dy.cpu.to(DType::f64));
      const Tensor x64 = x.cpu.to(DType::f64), mean64 = ingot::mean(x64, {-1});
      const Tensor xc = sub(x64, unsqueeze(mean64, -1));
      const Tensor rstd64 = rsqrt(add(ingot::mean(mul(xc, xc), {-1}), 1e-5));
      const Tensor mean = mean64.to(DType::f32).to(kGpu), rstd = rstd64.to(DType::f32).to(kGpu);
      // |terms| per column: an f32 sum of R of them in any order is within a few ulps of their sum.
      const Tensor dy64 = dy.cpu.to(DType::f64), gx = mul(dy64, mul(xc, unsqueeze(rstd64, -1)));
      const std::vector<double> l1_dw = sum(abs(gx), {0}).to_vector(), l1_db = sum(abs(dy64), {0}).to_vector();
      auto close_to_sum = [&](const Tensor& got, const Tensor& ref, const std::vector<double>& l1, const char* what) {
        const std::vector<double> a = host(got).to_vector(), want = ref.to_vector();
        for (size_t i = 0; i < a.size(); ++i)
          ASSERT_LE(std::abs(a[i] - want[i]), 4e-6 * l1[i] + 1e-5) << what << " column " << i << ": " << a[i] << " vs " << want[i];
      };
      cuda::LaunchConfig two_warps, scalar;
      two_warps.block_threads = 64;
      scalar.vectorize = false;
      std::vector<double> first_dw;
      const std::vector<const cuda::LaunchConfig*> runs{nullptr, &two_warps, &scalar, nullptr};
      for (const cuda::LaunchConfig* cfg : runs) {
        Tensor dx = full({R, C}, NAN, dt, kGpu), dw = full({C}, NAN, DType::f32, kGpu), db = full({C}, NAN, DType::f32, kGpu);
        run_cuda(kern, {x.gpu, dy.gpu, w.gpu.expand_raw({R, C}), mean, rstd, dx, dw, db}, {}, {}, cfg);
        EXPECT_TENSOR_CLOSE(host(dx), xg.grad(), dt);
        close_to_sum(dw, wg.grad(), l1_dw, "dw");
        close_to_sum(db, bg.grad(), l1_db, "db");
        if (cfg != nullptr) continue;
        if (first_dw.empty()) first_dw = host(dw).to_vector();
        else EXPECT_EQ(host(dw).to_vector(), first_dw) << "the partials must combine in a fixed order";
      }
    }
  }
}

TEST(CodegenCudaRows, RmsNormMatchesEager) {
  INGOT_REQUIRE_CUDA();
  const Shape shape = {2, 7, 200};
  std::vector<KernelSpec> specs;
  for (DType dt : kDTypes) {
    KernelSpec k = row_kernel("rms_norm", shape);
    const int ix = k.input(dt, k.contiguous_strides(), "x");
    const int iw = k.input(dt, dims_of({0, 0, 1}), "w");
    const int iy = k.output(dt, k.contiguous_strides(), "y");
    const int lx = k.load(ix);
    const int ms = k.binary(Op::Mul, k.reduce(Op::ReduceSum, k.unary(Op::Square, lx)), k.constant(1.0 / 200, dt));
    const int r = k.unary(Op::Rsqrt, k.binary(Op::Add, ms, k.constant(1e-6, dt)));
    k.store(iy, k.binary(Op::Mul, k.binary(Op::Mul, lx, r), k.load(iw)));
    specs.push_back(k);
  }
  const auto kernels = cuda_codegen().compile(specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    const DType dt = kDTypes[i];
    SCOPED_TRACE(dtype_name(dt));
    Both x = both(randn(shape, DType::f64).to(dt)), w = both(randn({200}, DType::f64).to(dt));
    const Tensor want = rms_norm(x.cpu.to(DType::f64), w.cpu.to(DType::f64), 1e-6);
    for (const cuda::LaunchConfig& cfg : row_configs()) {
      Tensor y = zeros(shape, dt, kGpu);
      run_cuda(kernels[i], {x.gpu, w.gpu.expand_raw(shape), y}, {}, {}, &cfg);
      EXPECT_TENSOR_CLOSE(host(y), want, dt);
    }
  }
}

// Forward: per-row loss = lse - z[t] (0 where t == ignore_index) and lse, as row outputs.
// Backward: dz = (exp(z - lse) - onehot(t)) * g, g = 1 / (counted rows) as a run-time scalar.
std::vector<KernelSpec> cross_entropy_specs(const Shape& shape, DType dt) {
  const DType st = stat_type(dt);
  KernelSpec f = row_kernel("cross_entropy_fwd", shape);
  {
    const int iz = f.input(dt, f.contiguous_strides(), "logits");
    const int it = f.input(DType::i64, row_strides(shape), "target");
    const int iloss = f.output(st, row_strides(shape), "loss"), ilse = f.output(st, row_strides(shape), "lse");
    const int z = f.cast(f.load(iz), st), t = f.load(it);
    const int m = f.reduce(Op::ReduceMax, z);
    const int lse = f.binary(Op::Add, m, f.unary(Op::Log, f.reduce(Op::ReduceSum, f.unary(Op::Exp, f.binary(Op::Sub, z, m)))));
    const int zt = f.reduce(Op::ReduceSum, f.where(f.binary(Op::Eq, f.index(1), t), z, f.constant(0, st)));
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

TEST(CodegenCudaRows, CrossEntropyForwardAndBackwardMatchEagerForShortAndLongRows) {
  INGOT_REQUIRE_CUDA();
  const int64_t N = 10;
  for (int64_t C : {77, 4104}) {
    SCOPED_TRACE("classes " + std::to_string(C));
    std::vector<KernelSpec> specs;
    for (DType dt : kDTypes)
      for (KernelSpec& k : cross_entropy_specs({N, C}, dt)) specs.push_back(k);
    const auto kernels = cuda_codegen().compile(specs);
    std::vector<int64_t> tv = {3, C - 1, 0, -100, 12, 12, 40, -100, 5, 60};
    const Tensor t = from_vector_i64(tv, {N});
    const Tensor tg = t.to(kGpu);
    for (size_t i = 0; i < 4; ++i) {
      const DType dt = kDTypes[i], st = stat_type(dt);
      SCOPED_TRACE(dtype_name(dt));
      Both z = both(mul(randn({N, C}, DType::f64), 3.0).to(dt));
      Tensor zg = ::ingot::testing::leaf(z.cpu.to(DType::f64));
      const Tensor want = cross_entropy(zg, t, -100, 0.0, Reduction::None);
      cross_entropy(zg, t).backward();
      for (const cuda::LaunchConfig& cfg : row_configs()) {
        Tensor loss = zeros({N}, st, kGpu), lse = zeros({N}, st, kGpu), dz = zeros({N, C}, dt, kGpu);
        run_cuda(kernels[2 * i], {z.gpu, tg, loss, lse}, {}, {}, &cfg);
        EXPECT_TENSOR_CLOSE(host(loss), want.detach(), dt);
        run_cuda(kernels[2 * i + 1], {z.gpu, tg, lse, dz}, {}, {1.0 / 8}, &cfg);  // 8 counted rows
        EXPECT_TENSOR_CLOSE(host(dz), zg.grad(), dt);
      }
    }
  }
}

TEST(CodegenCudaRows, AFullReductionIsOneRowAndPropagatesNaN) {
  INGOT_REQUIRE_CUDA();
  const int64_t n = 50001;
  KernelSpec k = row_kernel("sum_sq", {n});
  const int ix = k.input(DType::f32, dims_of({1}), "x");
  const int isum = k.output(DType::f32, dims_of({0}), "sum_sq"), imax = k.output(DType::f32, dims_of({0}), "max");
  const int lx = k.load(ix);
  k.store(isum, k.reduce(Op::ReduceSum, k.unary(Op::Square, lx)));
  k.store(imax, k.reduce(Op::ReduceMax, lx));
  const cuda::CudaKernel kern = cuda_codegen().compile(k);
  Tensor x = randn({n});
  Tensor s = zeros({1}, DType::f32, kGpu), m = zeros({1}, DType::f32, kGpu);
  run_cuda(kern, {x.to(kGpu), s, m});
  EXPECT_NEAR(host(s).item(), sum(square(x.to(DType::f64))).item(), 1e-5 * n);
  EXPECT_EQ(host(m).item(), amax(x).item());
  for (int64_t at : {int64_t{0}, int64_t{777}, n - 1}) {
    Tensor xn = x.clone_raw();
    xn.data<float>()[at] = NAN;
    for (const cuda::LaunchConfig& cfg : row_configs()) {
      run_cuda(kern, {xn.to(kGpu), s, m}, {}, {}, &cfg);
      EXPECT_TRUE(std::isnan(host(m).item())) << "NaN at " << at;
    }
  }
}

// AdamW over parameters of different sizes in ONE launch; p, m, v updated in place (as the CPU test).
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

TEST(CodegenCudaRows, MultiTensorAdamWUpdatesEveryParameterInOneLaunchLikeTheCpuKernels) {
  INGOT_REQUIRE_CUDA();
  kernels::AdamWArgs a;
  a.lr = 3e-3, a.beta1 = 0.8, a.beta2 = 0.95, a.eps = 1e-6, a.weight_decay = 0.1, a.step = 3, a.grad_scale = 0.5;
  const double bc1 = 1 - std::pow(a.beta1, 3), bc2 = 1 - std::pow(a.beta2, 3);
  const std::vector<double> scalars = {a.lr, a.beta1, a.beta2, a.eps, 1 - a.lr * a.weight_decay, a.grad_scale, bc1, bc2};
  for (DType gdt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(gdt));
    const KernelSpec spec = adamw_spec(gdt);
    const cuda::CudaKernel kern = cuda_codegen().compile(spec);
    const cpu::CpuKernel cpu_kern = test_codegen().compile(spec);
    // Sizes: one element, odd, several chunks (70000 > the 65536 chunk), and a view at an odd offset.
    std::vector<Tensor> p, g, m, v, pe, me, ve;
    for (int64_t n : {1, 300, 70001, 129}) {
      p.push_back(randn({n})), g.push_back(randn({n}).to(gdt)), m.push_back(randn({n}, DType::f32, Device::cpu(), 0, 0.1));
      v.push_back(rand({n}, DType::f32, Device::cpu(), 0, 0.1));
      pe.push_back(p.back().clone_raw()), me.push_back(m.back().clone_raw()), ve.push_back(v.back().clone_raw());
    }
    const bool eager = gdt != DType::f16;  // the eager kernel takes f32/bf16 grads; f16 checks against the CPU codegen
    if (eager) kernels::cpu::adamw_multi(pe, g, me, ve, a);
    for (const cuda::LaunchConfig& cfg : row_configs()) {
      std::vector<Tensor> pg, gg, mg, vg;
      std::vector<void*> bufs, cpu_bufs;
      std::vector<int64_t> syms = {static_cast<int64_t>(p.size())};
      std::vector<Tensor> pc, mc, vc;  // the CPU code generator's copies
      for (size_t t = 0; t < p.size(); ++t) {
        const bool odd = t == 3;  // misaligned: the tensor starts one element into its buffer
        auto up = [&](const Tensor& x) {
          if (!odd) return x.to(kGpu);
          Tensor big = zeros({x.numel() + 1}, x.dtype(), kGpu);
          Tensor view = big.as_strided({x.numel()}, {1}, 1);
          ingot::cuda::memcpy(view.data_ptr(), x.data_ptr(), x.numel() * itemsize(x.dtype()),
                              ingot::cuda::CopyKind::HostToDevice, 0);
          return view;
        };
        pg.push_back(up(p[t])), gg.push_back(up(g[t])), mg.push_back(up(m[t])), vg.push_back(up(v[t]));
        pc.push_back(p[t].clone_raw()), mc.push_back(m[t].clone_raw()), vc.push_back(v[t].clone_raw());
        syms.push_back(p[t].numel());
        for (const Tensor& x : {pg[t], gg[t], mg[t], vg[t], pg[t], mg[t], vg[t]}) bufs.push_back(x.data_ptr());
        for (const Tensor& x : {pc[t], g[t], mc[t], vc[t], pc[t], mc[t], vc[t]}) cpu_bufs.push_back(x.data_ptr());
      }
      kern.launch(bufs.data(), syms.data(), scalars.data(), cfg);
      cpu_kern(cpu_bufs.data(), syms.data(), scalars.data());
      for (size_t t = 0; t < p.size(); ++t) {
        SCOPED_TRACE("tensor " + std::to_string(t));
        const Tensor got_p = host(pg[t].contiguous_raw());
        EXPECT_TENSOR_CLOSE(got_p, pc[t], DType::f32);
        EXPECT_TENSOR_CLOSE(host(mg[t].contiguous_raw()), mc[t], DType::f32);
        EXPECT_TENSOR_CLOSE(host(vg[t].contiguous_raw()), vc[t], DType::f32);
        if (!eager) continue;
        EXPECT_TENSOR_CLOSE(got_p, pe[t], DType::f32);
        EXPECT_TENSOR_CLOSE(host(mg[t].contiguous_raw()), me[t], DType::f32);
        EXPECT_TENSOR_CLOSE(host(vg[t].contiguous_raw()), ve[t], DType::f32);
      }
    }
  }
}

TEST(CodegenCudaRows, MultiTensorTablesStayRightWhenThePointersKeepChanging) {
  INGOT_REQUIRE_CUDA();
  KernelSpec k;
  k.kind = KernelKind::MultiTensor;
  k.name = "scale_in_place";
  const int ip = k.input(DType::f32, {}, "p");
  k.store(k.output(DType::f32, {}, "p", ip), k.binary(Op::Mul, k.load(ip), k.scalar(0, DType::f32)));
  const cuda::CudaKernel kern = cuda_codegen().compile(k);
  // 100 distinct parameter lists (all kept alive, so every pointer set is new): past the per-kernel bound on
  // cached tables they are dropped after a synchronize, never reused while a launch may read them.
  std::vector<Tensor> cpu, gpu;
  for (int i = 0; i < 100; ++i) {
    cpu.push_back(randn({257 + i}));
    gpu.push_back(cpu.back().to(kGpu));
    void* bufs[] = {gpu.back().data_ptr(), gpu.back().data_ptr()};
    const int64_t syms[] = {1, gpu.back().numel()};
    const double scale[] = {0.5 + i};
    kern(bufs, syms, scale);
  }
  for (int i = 0; i < 100; ++i) EXPECT_TENSOR_CLOSE(host(gpu[i]), mul(cpu[i], 0.5 + i), DType::f32);
}

// Child half of the cross-process test (run with --gtest_also_run_disabled_tests): compiles three kernels
// against $INGOT_TEST_CACHE, runs one, and writes "<compiled> <disk hits> <nvrtc programs> <max error>".
TEST(CodegenCudaCache, DISABLED_ChildCompilesAgainstTheSharedCache) {
  INGOT_REQUIRE_CUDA();
  const char* dir = std::getenv("INGOT_TEST_CACHE");
  const char* out = std::getenv("INGOT_TEST_OUT");
  ASSERT_TRUE(dir && out);
  cuda::CudaCodegen cg(cuda::CudaCodegenOptions{dir, true, 2, {}});
  CodegenStats st;
  const Shape shape = {6, 33};
  const auto kernels = cg.compile({softmax_spec(DType::f32, shape, dims_of({33, 1})), adamw_spec(DType::bf16),
                                   layer_norm_fwd_spec(DType::bf16, 4, 64, 1e-5)},
                                  &st);
  Tensor x = randn(shape), y = zeros(shape, DType::f32, kGpu);
  run_cuda(kernels[0], {x.to(kGpu), y});
  const double err = max_rel_error(host(y), softmax(x, -1), 2e-5, 2e-6);
  std::ofstream(out) << st.compiled << " " << st.disk_hits << " " << st.compiler_processes << " " << err << "\n";
}

struct ChildResult {
  long long compiled = -1, disk_hits = -1, programs = -1;
  double err = 1e9;
};

ChildResult run_child(const std::string& cache, const std::string& out) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "INGOT_TEST_CACHE='" + cache + "' INGOT_TEST_OUT='" + out + "' '" + self +
                          "' --gtest_also_run_disabled_tests "
                          "--gtest_filter=CodegenCudaCache.DISABLED_ChildCompilesAgainstTheSharedCache > '" + out +
                          ".log' 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_file(out + ".log");
  ChildResult r;
  std::ifstream in(out);
  in >> r.compiled >> r.disk_hits >> r.programs >> r.err;
  return r;
}

TEST(CodegenCudaCache, ASecondProcessWithAWarmCacheRunsNoNvrtc) {
  INGOT_REQUIRE_CUDA();
  TempDir tmp("ingot_cuda_cache_test");
  const std::string cache = tmp.path() + "/cache";
  const ChildResult cold = run_child(cache, tmp.path() + "/cold.txt");
  EXPECT_EQ(cold.compiled, 3);
  EXPECT_EQ(cold.disk_hits, 0);
  EXPECT_EQ(cold.programs, 2);
  EXPECT_LE(cold.err, 1.0);
  const ChildResult warm = run_child(cache, tmp.path() + "/warm.txt");
  EXPECT_EQ(warm.compiled, 0);
  EXPECT_EQ(warm.programs, 0) << "a warm process runs no NVRTC";
  EXPECT_EQ(warm.disk_hits, 3);
  EXPECT_LE(warm.err, 1.0);
  // A truncated cubin is a bad entry: warned about, recompiled, results still right.
  int truncated = 0;
  for (const auto& e : std::filesystem::directory_iterator(cache + "/files"))
    if (e.path().extension() == ".cubin") {
      std::filesystem::resize_file(e.path(), std::filesystem::file_size(e.path()) / 2);
      ++truncated;
    }
  ASSERT_GT(truncated, 0);
  const ChildResult again = run_child(cache, tmp.path() + "/again.txt");
  EXPECT_EQ(again.compiled + again.disk_hits, 3);
  EXPECT_GT(again.compiled, 0);
  EXPECT_LE(again.err, 1.0);
}

#endif

}  // namespace
}  // namespace ingot::codegen
