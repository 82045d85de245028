// CUDA elementwise, reduction and random kernels against their CPU versions, on fresh random inputs with
// contiguous, transposed, strided and broadcast operands, in every float dtype, into NaN-poisoned outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "runtime/kernels/kernels.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

namespace kc = kernels::cpu;
namespace kg = kernels::cuda;
using kernels::BinaryOp;
using kernels::ReduceOp;
using kernels::UnaryOp;

const Device kGpu = Device::cuda(0);

struct Case {
  Shape shape;
  Layout layout;
};
// One shape per layout keeps the sweep small; the 4-d and 5-d shapes need the strided index path.
const Case kCases[] = {{{1000}, Layout::Contiguous},
                       {{33, 65}, Layout::Transposed},
                       {{4, 5, 37}, Layout::Strided},
                       {{3, 6, 2, 9}, Layout::Broadcast},
                       {{2, 3, 4, 5, 6}, Layout::Transposed}};

std::string where_str(DType dt, const Case& c) {
  return detail::str_cat(dtype_name(dt), " ", shape_str(c.shape), " ", layout_name(c.layout));
}

double positive(double x) { return std::abs(x) + 0.2; }
double spread(double x) { return 2.0 * x; }
// Small integers, so comparisons see equal operands and logical ops see zeros.
double small_int(double x) { return std::round(1.5 * x); }

bool positive_domain(UnaryOp op) {
  return op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt || op == UnaryOp::PowScalar ||
         op == UnaryOp::Log1p || op == UnaryOp::Reciprocal || op == UnaryOp::RDivScalar;
}

TEST(CudaElementwise, UnaryMatchesCpuOnRandomStridedInputs) {
  INGOT_REQUIRE_CUDA();
  manual_seed(11);
  for (int o = 0; o <= static_cast<int>(UnaryOp::LogicalNot); ++o) {
    const auto op = static_cast<UnaryOp>(o);
    for (DType dt : kFloatDTypes) {
      for (const Case& c : kCases) {
        Operand in = make_operand(c.shape, dt, c.layout, positive_domain(op) ? positive : spread);
        Tensor ref = empty(c.shape, dt);
        kc::unary(op, ref, in.cpu, 1.7);
        Tensor out = poisoned(c.shape, dt, kGpu, c.layout == Layout::Transposed);
        kg::unary(op, out, in.gpu, 1.7);
        Tol t = tol_for(dt);
        EXPECT_LE(max_rel_error(out, ref, t.rtol, t.atol), 1.0) << kernels::unary_name(op) << " " << where_str(dt, c);
      }
    }
  }
}

TEST(CudaElementwise, BinaryMatchesCpuWithBroadcastAndStridedOperands) {
  INGOT_REQUIRE_CUDA();
  manual_seed(12);
  const Layout others[] = {Layout::Broadcast, Layout::Strided, Layout::Contiguous, Layout::Transposed,
                           Layout::Broadcast};
  for (int o = 0; o <= static_cast<int>(BinaryOp::ReluGrad); ++o) {
    const auto op = static_cast<BinaryOp>(o);
    const bool cmp = kernels::is_comparison(op);
    for (DType dt : kFloatDTypes) {
      for (size_t ci = 0; ci < std::size(kCases); ++ci) {
        const Case& c = kCases[ci];
        auto map_a = cmp ? small_int : op == BinaryOp::Pow ? positive : spread;
        auto map_b = cmp ? small_int : op == BinaryOp::Div ? positive : spread;
        Operand a = make_operand(c.shape, dt, c.layout, map_a);
        Operand b = make_operand(c.shape, dt, others[ci], map_b);
        const DType odt = cmp ? DType::b8 : dt;
        Tensor ref = empty(c.shape, odt);
        kc::binary(op, ref, a.cpu, b.cpu);
        Tensor out = poisoned(c.shape, odt, kGpu);
        kg::binary(op, out, a.gpu, b.gpu);
        Tol t = tol_for(odt);
        EXPECT_LE(max_rel_error(out, ref, t.rtol, t.atol), 1.0)
            << kernels::binary_name(op) << " " << where_str(dt, c) << " with b " << layout_name(others[ci]);
      }
    }
  }
}

TEST(CudaElementwise, MixedDTypesAndIntegersMatchCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(13);
  const Shape s{17, 31};
  // f32 out from a bf16 and an f16 operand; i64 arithmetic (f64 math, truncating division).
  Operand a = make_operand(s, DType::bf16, Layout::Transposed, spread);
  Operand b = make_operand(s, DType::f16, Layout::Broadcast, positive);
  Tensor ref = empty(s, DType::f32), out = poisoned(s, DType::f32, kGpu);
  kc::binary(BinaryOp::Div, ref, a.cpu, b.cpu);
  kg::binary(BinaryOp::Div, out, a.gpu, b.gpu);
  EXPECT_LE(max_rel_error(out, ref, 1e-5, 1e-6), 1.0);
  auto ints = [](double x) { return std::round(20 * x) + (x > 0 ? 1 : -1); };  // never 0
  Operand ia = make_operand(s, DType::i64, Layout::Strided, ints), ib = make_operand(s, DType::i64, Layout::Contiguous, ints);
  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum}) {
    Tensor iref = empty(s, DType::i64), iout = poisoned(s, DType::i64, kGpu);
    kc::binary(op, iref, ia.cpu, ib.cpu);
    kg::binary(op, iout, ia.gpu, ib.gpu);
    EXPECT_EQ(count_unequal(iout, iref), 0) << kernels::binary_name(op);
  }
}

// Note [Contiguous elementwise in vectors] (elementwise.cu): dense f32 / bf16 / f16 operands take 8 elements per
// thread with 16-byte loads, the last numel % 8 the scalar path; an operand starting off a 16-byte boundary sends
// the whole op to the general kernel. Every length here (below one vector, whole vectors, a tail; one and several
// grid strides) and start (aligned; misaligned input; misaligned output) equals the CPU: unary and binary ops in
// one dtype and mixed, casts (bit for bit) and SwiGLU's forward.
TEST(CudaElementwise, DenseOperandsOfEveryLengthAndAlignmentMatchCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(16);
  const DType dts[] = {DType::f32, DType::bf16, DType::f16};
  // `n` elements from element `offset` of a fresh random vector, on the CPU and the same bytes on the GPU.
  auto dense = [](int64_t n, int64_t offset, DType dt, double scale) {
    Tensor base = (randn({n + offset}) * scale).to(dt);
    return Operand{narrow(base, 0, offset, n), narrow(base.to(kGpu), 0, offset, n)};
  };
  auto out_at = [](int64_t n, int64_t offset, DType dt) { return narrow(poisoned({n + offset}, dt, kGpu), 0, offset, n); };
  // 4,500,007: more vectors than a grid of threads (132 SMs x 8 blocks x 256), so the vector loop strides too.
  for (int64_t n : {5, 8, 13, 1000, 8195, 1000003, 4500007}) {
    for (auto [in_off, out_off] : {std::pair<int64_t, int64_t>{0, 0}, {8, 0}, {1, 0}, {0, 1}}) {
      if (n > 1000003 && (in_off != 0 || out_off != 0)) continue;  // the misaligned starts take the general kernel
      for (DType dt : dts) {
        const std::string where = detail::str_cat(dtype_name(dt), " n=", n, " input at ", in_off, " output at ", out_off);
        const Tol t = tol_for(dt);
        for (UnaryOp op : {UnaryOp::Exp, UnaryOp::GeluTanh, UnaryOp::Silu, UnaryOp::MulScalar}) {
          const Operand in = dense(n, in_off, dt, 1.0);
          Tensor ref = empty({n}, dt), out = out_at(n, out_off, dt);
          kc::unary(op, ref, in.cpu, 1.7);
          kg::unary(op, out, in.gpu, 1.7);
          EXPECT_LE(max_rel_error(out, ref, t.rtol, t.atol), 1.0) << kernels::unary_name(op) << " " << where;
        }
        for (DType bdt : dts) {  // b in every dtype, out in a's
          for (BinaryOp op : {BinaryOp::Add, BinaryOp::Mul, BinaryOp::SiluGrad}) {
            const Operand a = dense(n, in_off, dt, 1.0), b = dense(n, 0, bdt, 2.0);
            Tensor ref = empty({n}, dt), out = out_at(n, out_off, dt);
            kc::binary(op, ref, a.cpu, b.cpu);
            kg::binary(op, out, a.gpu, b.gpu);
            EXPECT_LE(max_rel_error(out, ref, t.rtol, t.atol), 1.0)
                << kernels::binary_name(op) << " " << where << ", b " << dtype_name(bdt);
          }
        }
        for (DType to : dts) {
          const Operand src = dense(n, in_off, dt, 40.0);
          Tensor ref = empty({n}, to), out = out_at(n, out_off, to);
          kc::copy(ref, src.cpu);
          kg::copy(out, src.gpu);
          EXPECT_EQ(count_unequal(out, ref), 0) << "copy to " << dtype_name(to) << " " << where;
        }
        const Operand a = dense(n, in_off, dt, 1.0), b = dense(n, in_off, dt, 1.0);
        Tensor ref = empty({n}, dt), out = out_at(n, out_off, dt);
        kc::silu_mul_fwd(ref, a.cpu, b.cpu);
        kg::silu_mul_fwd(out, a.gpu, b.gpu);
        EXPECT_LE(max_rel_error(out, ref, t.rtol, t.atol), 1.0) << "silu_mul " << where;
        // In place: the output is the first input (each thread loads its whole vector before it stores).
        Tensor in_place = a.gpu.clone_raw(), ref_in_place = empty({n}, dt);
        kc::binary(BinaryOp::Mul, ref_in_place, a.cpu, b.cpu);
        kg::binary(BinaryOp::Mul, in_place, in_place, b.gpu);
        EXPECT_LE(max_rel_error(in_place, ref_in_place, t.rtol, t.atol), 1.0) << "mul in place " << where;
      }
    }
  }
}

TEST(CudaElementwise, WhereMatchesCpuWithBroadcastCondition) {
  INGOT_REQUIRE_CUDA();
  manual_seed(14);
  for (DType dt : kFloatDTypes) {
    for (const Case& c : kCases) {
      Operand cond = make_operand(c.shape, DType::b8, Layout::Broadcast, [](double x) { return x > 0 ? 1.0 : 0.0; });
      Operand a = make_operand(c.shape, dt, c.layout), b = make_operand(c.shape, dt, Layout::Strided);
      Tensor ref = empty(c.shape, dt), out = poisoned(c.shape, dt, kGpu);
      kc::where(ref, cond.cpu, a.cpu, b.cpu);
      kg::where(out, cond.gpu, a.gpu, b.gpu);
      EXPECT_EQ(count_unequal(out, ref), 0) << where_str(dt, c);
    }
  }
}

TEST(CudaElementwise, CopyConvertsEveryDTypePairLikeCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(15);
  const Shape s{19, 23};
  for (DType from : kAllDTypes) {
    for (DType to : kAllDTypes) {
      auto map = [](double x) { return 40.0 * x; };  // out of f16's fine range sometimes, and of int8 never
      Operand src = make_operand(s, from, Layout::Transposed, map);
      for (bool strided_dst : {false, true}) {
        Tensor ref = empty(s, to), out = poisoned(s, to, kGpu, strided_dst);
        kc::copy(ref, src.cpu);
        kg::copy(out, src.gpu);
        EXPECT_EQ(count_unequal(out, ref), 0) << dtype_name(from) << " -> " << dtype_name(to);
      }
    }
    // Same dtype, both contiguous: the memcpy path.
    Operand c = make_operand(s, from, Layout::Contiguous, [](double x) { return 9 * x; });
    Tensor out = poisoned(s, from, kGpu);
    kg::copy(out, c.gpu);
    EXPECT_EQ(count_unequal(out, c.cpu), 0) << dtype_name(from);
  }
}

// Same-dtype copies whose last dim is contiguous take the 16-byte row kernel (Note [Row copies]) when every row
// is 16-byte aligned, and the generic kernel otherwise (a narrowed row start, an odd row length): both equal
// the CPU on random data.
TEST(CudaElementwise, RowCopiesOfPermutedLeadingDimsMatchCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(16);
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (int64_t d : {16, 64, 12, 5}) {
      for (int64_t start : {0, 1}) {
        // [B, T, H, D] -> [B, H, T, D]; start 1 narrows a wider last dim, so rows start unaligned.
        Tensor cpu = randn({3, 7, 4, d + start}).to(dt);
        Tensor gpu = cpu.to(kGpu);
        Tensor vc = permute(narrow(cpu, 3, start, d), {0, 2, 1, 3});
        Tensor vg = permute(narrow(gpu, 3, start, d), {0, 2, 1, 3});
        Tensor ref = empty(vc.shape(), dt), out = poisoned(vg.shape(), dt, kGpu);
        kc::copy(ref, vc);
        kg::copy(out, vg);
        EXPECT_EQ(count_unequal(out, ref), 0) << dtype_name(dt) << " D=" << d << " start=" << start;
      }
    }
  }
}

TEST(CudaElementwise, FillWritesEveryElementOfStridedViews) {
  INGOT_REQUIRE_CUDA();
  for (DType dt : kAllDTypes) {
    for (double v : {3.25, -1.0e5, 0.1}) {
      Tensor ref = empty({7, 9}, dt), out = poisoned({7, 9}, dt, kGpu, true);
      kc::fill(ref, v);
      kg::fill(out, v);
      EXPECT_EQ(count_unequal(out, ref), 0) << dtype_name(dt) << " " << v;
    }
  }
}

// ---- reductions ------------------------------------------------------------------------------------------------

struct ReduceShape {
  int64_t outer, n, inner;
};
// Warp-per-row, block-per-row, split rows, column tiles of several widths, split columns, a full reduction.
const ReduceShape kReduceShapes[] = {{5, 7, 1},  {100, 1000, 1}, {3, 50000, 1}, {1, 100000, 1},
                                     {4, 33, 5}, {2, 600, 2},     {64, 3, 300},  {1, 5000, 40}};

TEST(CudaReduce, EveryOpMatchesCpuOnEveryPathAndDType) {
  INGOT_REQUIRE_CUDA();
  manual_seed(21);
  for (DType dt : kFloatDTypes) {
    for (const ReduceShape& r : kReduceShapes) {
      const Shape shape{r.outer, r.n, r.inner};
      Operand in = make_operand(shape, dt, Layout::Contiguous, [](double x) { return 3.0 * x; });
      // Products of thousands of factors stay finite near 1.
      Operand near_one = make_operand(shape, dt, Layout::Contiguous, [](double x) { return 1.0 + 0.01 * x; });
      for (int o = 0; o <= static_cast<int>(ReduceOp::Prod); ++o) {
        const auto op = static_cast<ReduceOp>(o);
        const bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
        const Operand& x = op == ReduceOp::Prod ? near_one : in;
        const DType odt = arg ? DType::i64 : dt;
        Tensor ref = empty({r.outer, r.inner}, odt), out = poisoned({r.outer, r.inner}, odt, kGpu);
        kc::reduce(op, ref, x.cpu, r.outer, r.n, r.inner);
        kg::reduce(op, out, x.gpu, r.outer, r.n, r.inner);
        // Both accumulate in f64 and round once: results agree to the output's rounding, but long sums of mixed
        // signs can cancel, so the absolute tolerance grows with sqrt(n).
        Tol t = tol_for(odt);
        const double atol = arg ? 1e-300 : t.atol * std::sqrt(static_cast<double>(r.n)) * 3.0;
        EXPECT_LE(max_rel_error(out, ref, t.rtol, atol), 1.0)
            << kernels::reduce_name(op) << " " << dtype_name(dt) << " [" << r.outer << ", " << r.n << ", "
            << r.inner << "]";
      }
    }
  }
}

// Note [Column sums] (runtime/kernels/cuda/reduce.cu): bias-gradient shapes take the 16-byte column path (f32
// partials, deterministic); a width that is not a multiple of 8 and a misaligned start take the generic path.
TEST(CudaReduce, ColumnSumsOfTallHalfMatricesMatchCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(24);
  struct Case { int64_t n, inner, offset; };
  for (DType dt : {DType::bf16, DType::f16}) {
    for (const Case& c : {Case{16384, 3072, 0}, Case{4096, 768, 0}, Case{3000, 264, 0}, Case{2048, 256, 0},
                          Case{2050, 260, 0}, Case{4096, 768, 1}}) {
      Operand buf = make_operand({c.n * c.inner + c.offset}, dt, Layout::Contiguous);
      auto view = [&](const Tensor& t) { return t.as_strided({c.n, c.inner}, {c.inner, 1}, c.offset); };
      for (DType odt : {dt, DType::f32}) {
        Tensor ref = empty({c.inner}, odt), out = poisoned({c.inner}, odt, kGpu);
        kc::reduce(ReduceOp::Sum, ref, view(buf.cpu).contiguous_raw(), 1, c.n, c.inner);
        kg::reduce(ReduceOp::Sum, out, view(buf.gpu), 1, c.n, c.inner);
        // f32 accumulation over n terms of unit size against the CPU's f64.
        const Tol t = tol_for(odt);
        EXPECT_LE(max_rel_error(out, ref, t.rtol, 1e-6 * static_cast<double>(c.n) + t.atol), 1.0)
            << dtype_name(dt) << " -> " << dtype_name(odt) << " [" << c.n << ", " << c.inner << "] offset " << c.offset;
      }
      // Deterministic: the same bits twice.
      Tensor a = poisoned({c.inner}, dt, kGpu), b = poisoned({c.inner}, dt, kGpu);
      kg::reduce(ReduceOp::Sum, a, view(buf.gpu), 1, c.n, c.inner);
      kg::reduce(ReduceOp::Sum, b, view(buf.gpu), 1, c.n, c.inner);
      EXPECT_EQ(count_unequal(a, b), 0);
    }
  }
}

TEST(CudaReduce, IntegersSumExactlyAndArgReductionsBreakTiesLikeCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(22);
  for (const ReduceShape& r : kReduceShapes) {
    // Few distinct values: many ties for argmax/argmin, exact int64 sums.
    Operand in = make_operand({r.outer, r.n, r.inner}, DType::i64, Layout::Contiguous, small_int);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax, ReduceOp::ArgMin}) {
      Tensor ref = empty({r.outer, r.inner}, DType::i64), out = poisoned({r.outer, r.inner}, DType::i64, kGpu);
      kc::reduce(op, ref, in.cpu, r.outer, r.n, r.inner);
      kg::reduce(op, out, in.gpu, r.outer, r.n, r.inner);
      EXPECT_EQ(count_unequal(out, ref), 0) << kernels::reduce_name(op) << " [" << r.outer << ", " << r.n << ", "
                                            << r.inner << "]";
    }
  }
}

TEST(CudaReduce, NaNPropagatesAndEmptyDimsGiveIdentities) {
  INGOT_REQUIRE_CUDA();
  manual_seed(23);
  std::vector<double> v = randn({4, 3000}, DType::f64).to_vector();
  v[1 * 3000 + 2500] = NAN;
  v[2 * 3000 + 7] = NAN;
  v[2 * 3000 + 900] = NAN;
  Tensor cpu_in = from_vector(v, {4, 3000}, DType::f32), gpu_in = cpu_in.to(kGpu);
  for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax, ReduceOp::ArgMin, ReduceOp::LogSumExp,
                      ReduceOp::Sum}) {
    const DType odt = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin ? DType::i64 : DType::f32;
    Tensor ref = empty({4}, odt), out = poisoned({4}, odt, kGpu);
    kc::reduce(op, ref, cpu_in, 4, 3000, 1);
    kg::reduce(op, out, gpu_in, 4, 3000, 1);
    EXPECT_LE(max_rel_error(out, ref, 1e-5, 1e-5), 1.0) << kernels::reduce_name(op);
  }
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::LogSumExp}) {
    Tensor ref = empty({3, 2}), out = poisoned({3, 2}, DType::f32, kGpu);
    kc::reduce(op, ref, empty({3, 0, 2}), 3, 0, 2);
    kg::reduce(op, out, empty({3, 0, 2}, DType::f32, kGpu), 3, 0, 2);
    EXPECT_EQ(count_unequal(out, ref), 0) << kernels::reduce_name(op);
  }
  EXPECT_THROW(kg::reduce(ReduceOp::Max, empty({3, 2}, DType::f32, kGpu), empty({3, 0, 2}, DType::f32, kGpu), 3, 0, 2),
               Error);
}

// ---- random ----------------------------------------------------------------------------------------------------

TEST(CudaRandom, UniformDrawsEqualCpuBitForBit) {
  INGOT_REQUIRE_CUDA();
  for (DType dt : kFloatDTypes) {
    // Odd offsets and lengths: counters shared with neighbouring draws at both ends.
    for (uint64_t offset : {0ull, 6ull, 1ull << 33}) {
      Tensor ref = empty({1001}, dt), out = poisoned({1001}, dt, kGpu);
      kc::rand_uniform(ref, 1234, offset, -2.0, 3.0);
      kg::rand_uniform(out, 1234, offset, -2.0, 3.0);
      EXPECT_EQ(count_unequal(out, ref), 0) << dtype_name(dt) << " offset " << offset;
    }
  }
}

TEST(CudaRandom, NormalDrawsEqualCpu) {
  INGOT_REQUIRE_CUDA();
  // Box-Muller calls logf, sinf, cosf, whose CUDA versions may differ from glibc's by an ulp: such elements are
  // counted and reported; every element must agree to a few f32 ulps.
  for (DType dt : {DType::f32, DType::f64}) {
    const int64_t n = 100003;
    Tensor ref = empty({n}, dt), out = poisoned({n}, dt, kGpu);
    kc::rand_normal(ref, 99, 10, 0.5, 2.0);
    kg::rand_normal(out, 99, 10, 0.5, 2.0);
    const int64_t unequal = count_unequal(out, ref);
    RecordProperty(std::string("unequal_") + std::string(dtype_name(dt)), static_cast<int>(unequal));
    std::printf("rand_normal %s: %lld of %lld elements differ from the CPU in their bits\n",
                std::string(dtype_name(dt)).c_str(), static_cast<long long>(unequal), static_cast<long long>(n));
    EXPECT_LE(max_rel_error(out, ref, 1e-6, 1e-6), 1.0);
  }
  // The tensor-level API draws the same numbers on both devices for the same seed.
  manual_seed(5);
  Tensor c = randn({4097});
  manual_seed(5);
  Tensor g = randn({4097}, DType::f32, kGpu);
  EXPECT_LE(max_rel_error(g, c, 1e-6, 1e-6), 1.0);
  manual_seed(6);
  Tensor cu = rand({4097});
  manual_seed(6);
  Tensor gu = rand({4097}, DType::f32, kGpu);
  EXPECT_EQ(count_unequal(gu, cu), 0);
}

}  // namespace
}  // namespace ingot::testing
