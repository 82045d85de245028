// CUDA row-wise (softmax, layer_norm, rms_norm), cross-entropy and indexing kernels against the CPU kernels of
// the same name, on fresh random inputs, in every float dtype, over row lengths that take the 16-byte vector
// path and odd ones that do not, into NaN-poisoned outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/kernels/kernels.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

namespace kc = kernels::cpu;
namespace kg = kernels::cuda;

const Device kGpu = Device::cuda(0);

// [rows, C]: single elements, odd lengths (scalar path), multiples of 8 (vector path), and rows longer than
// one block's threads (strided loops).
const Shape kRowShapes[] = {{1, 1}, {3, 7}, {5, 33}, {4, 64}, {2, 1000}, {3, 4099}, {2, 40000}, {67, 256}};

// Row reductions and their backward are summed in different orders on the two devices (the CPU adds a row of
// 40000 f32 terms one by one, which alone costs ~1e-4 relative); 16-bit outputs differ by one of their own ulps.
double row_tol(DType t) {
  switch (t) {
    case DType::f32: return 2e-4;
    case DType::f64: return 1e-10;
    case DType::bf16: return 1.6e-2;
    case DType::f16: return 2e-3;
    default: return 0;
  }
}


Operand rand_operand(const Shape& s, DType dt, double scale = 1.0) {
  return make_operand(s, dt, Layout::Contiguous, [scale](double x) { return scale * x; });
}

std::string where(DType dt, const Shape& s) { return detail::str_cat(dtype_name(dt), " ", shape_str(s)); }


TEST(CudaSoftmax, ForwardAndBackwardMatchCpuForSoftmaxAndLogSoftmax) {
  INGOT_REQUIRE_CUDA();
  manual_seed(101);
  for (DType dt : kFloatDTypes) {
    for (const Shape& s : kRowShapes) {
      for (bool log : {false, true}) {
        Operand x = rand_operand(s, dt, 3.0), dy = rand_operand(s, dt);
        Tensor y_ref = empty(s, dt), y = poisoned(s, dt, kGpu);
        kc::softmax_fwd(y_ref, x.cpu, log);
        kg::softmax_fwd(y, x.gpu, log);
        EXPECT_TRUE(close_at_unit_scale(y, y_ref, row_tol(dt))) << "fwd log=" << log << " " << where(dt, s);
        // Both backward passes read the CPU forward output, so only the backward is compared.
        Tensor dx_ref = empty(s, dt), dx = poisoned(s, dt, kGpu);
        kc::softmax_bwd(dx_ref, dy.cpu, y_ref, log);
        kg::softmax_bwd(dx, dy.gpu, y_ref.to(kGpu), log);
        EXPECT_TRUE(close_at_unit_scale(dx, dx_ref, row_tol(dt))) << "bwd log=" << log << " " << where(dt, s);
      }
    }
  }
}

TEST(CudaSoftmax, MaskedMinusInfinityLogitsGetZeroProbability) {
  INGOT_REQUIRE_CUDA();
  std::vector<double> v = {1.0, -INFINITY, 2.0, -INFINITY, 0.5, 3.0, -INFINITY};
  Tensor x = from_vector(v, {1, 7}, DType::f32);
  Tensor ref = empty({1, 7}), y = poisoned({1, 7}, DType::f32, kGpu);
  kc::softmax_fwd(ref, x, false);
  kg::softmax_fwd(y, x.to(kGpu), false);
  EXPECT_TRUE(close_at_unit_scale(y, ref, 1e-6));
  EXPECT_EQ(y.to_vector()[1], 0.0);
}

TEST(CudaLayerNorm, ForwardAndBackwardMatchCpuWithAndWithoutAffine) {
  INGOT_REQUIRE_CUDA();
  manual_seed(102);
  for (DType dt : kFloatDTypes) {
    const DType st = stat_dtype(dt);
    for (const Shape& s : kRowShapes) {
      const int64_t rows = s[0], C = s[1];
      for (bool affine : {true, false}) {
        // An offset mean checks the centered variance.
        Operand x = make_operand(s, dt, Layout::Contiguous, [](double v) { return 2.0 * v + 3.0; });
        Operand dy = rand_operand(s, dt);
        Operand w = rand_operand({C}, dt), b = rand_operand({C}, dt);
        Tensor wc = affine ? w.cpu : Tensor(), bc = affine ? b.cpu : Tensor();
        Tensor wg = affine ? w.gpu : Tensor(), bg = affine ? b.gpu : Tensor();
        Tensor y_ref = empty(s, dt), mean_ref = empty({rows}, st), rstd_ref = empty({rows}, st);
        Tensor y = poisoned(s, dt, kGpu), mean = poisoned({rows}, st, kGpu), rstd = poisoned({rows}, st, kGpu);
        kc::layer_norm_fwd(y_ref, mean_ref, rstd_ref, x.cpu, wc, bc, 1e-5);
        kg::layer_norm_fwd(y, mean, rstd, x.gpu, wg, bg, 1e-5);
        const std::string at = detail::str_cat("affine=", affine, " ", where(dt, s));
        EXPECT_TRUE(close_at_unit_scale(y, y_ref, row_tol(dt))) << "y " << at;
        EXPECT_TRUE(close_at_unit_scale(mean, mean_ref, row_tol(st))) << "mean " << at;
        EXPECT_TRUE(close_at_unit_scale(rstd, rstd_ref, row_tol(st))) << "rstd " << at;

        Tensor dx_ref = empty(s, dt), dw_ref = empty({C}, st), db_ref = empty({C}, st);
        Tensor dx = poisoned(s, dt, kGpu), dw = poisoned({C}, st, kGpu), db = poisoned({C}, st, kGpu);
        kc::layer_norm_bwd(dx_ref, dw_ref, db_ref, dy.cpu, x.cpu, mean_ref, rstd_ref, wc);
        kg::layer_norm_bwd(dx, dw, db, dy.gpu, x.gpu, mean_ref.to(kGpu), rstd_ref.to(kGpu), wg);
        EXPECT_TRUE(close_at_unit_scale(dx, dx_ref, row_tol(dt))) << "dx " << at;
        EXPECT_TRUE(close_at_unit_scale(dw, dw_ref, row_tol(st))) << "dw " << at;
        EXPECT_TRUE(close_at_unit_scale(db, db_ref, row_tol(st))) << "db " << at;
      }
    }
  }
}

TEST(CudaLayerNorm, BackwardComputesOnlyTheRequestedGradients) {
  INGOT_REQUIRE_CUDA();
  manual_seed(103);
  const Shape s{9, 48};
  Operand x = rand_operand(s, DType::f32), dy = rand_operand(s, DType::f32), w = rand_operand({48}, DType::f32);
  Tensor y = empty(s), mean = empty({9}), rstd = empty({9});
  kc::layer_norm_fwd(y, mean, rstd, x.cpu, w.cpu, Tensor(), 1e-5);
  Tensor dw_ref = empty({48}), dw = poisoned({48}, DType::f32, kGpu), dx_ref = empty(s);
  kc::layer_norm_bwd(dx_ref, dw_ref, Tensor(), dy.cpu, x.cpu, mean, rstd, w.cpu);
  kg::layer_norm_bwd(Tensor(), dw, Tensor(), dy.gpu, x.gpu, mean.to(kGpu), rstd.to(kGpu), w.gpu);
  EXPECT_TRUE(close_at_unit_scale(dw, dw_ref, 2e-5));
}

TEST(CudaRmsNorm, ForwardAndBackwardMatchCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(104);
  for (DType dt : kFloatDTypes) {
    const DType st = stat_dtype(dt);
    for (const Shape& s : kRowShapes) {
      const int64_t rows = s[0], C = s[1];
      Operand x = rand_operand(s, dt, 2.0), dy = rand_operand(s, dt), w = rand_operand({C}, dt);
      Tensor y_ref = empty(s, dt), rstd_ref = empty({rows}, st);
      Tensor y = poisoned(s, dt, kGpu), rstd = poisoned({rows}, st, kGpu);
      kc::rms_norm_fwd(y_ref, rstd_ref, x.cpu, w.cpu, 1e-6);
      kg::rms_norm_fwd(y, rstd, x.gpu, w.gpu, 1e-6);
      EXPECT_TRUE(close_at_unit_scale(y, y_ref, row_tol(dt))) << "y " << where(dt, s);
      EXPECT_TRUE(close_at_unit_scale(rstd, rstd_ref, row_tol(st))) << "rstd " << where(dt, s);

      Tensor dx_ref = empty(s, dt), dw_ref = empty({C}, st);
      Tensor dx = poisoned(s, dt, kGpu), dw = poisoned({C}, st, kGpu);
      kc::rms_norm_bwd(dx_ref, dw_ref, dy.cpu, x.cpu, rstd_ref, w.cpu);
      kg::rms_norm_bwd(dx, dw, dy.gpu, x.gpu, rstd_ref.to(kGpu), w.gpu);
      EXPECT_TRUE(close_at_unit_scale(dx, dx_ref, row_tol(dt))) << "dx " << where(dt, s);
      EXPECT_TRUE(close_at_unit_scale(dw, dw_ref, row_tol(st))) << "dw " << where(dt, s);
    }
  }
}

TEST(CudaCrossEntropy, ForwardAndBackwardMatchCpuWithIgnoreIndexAndLabelSmoothing) {
  INGOT_REQUIRE_CUDA();
  manual_seed(105);
  const Shape shapes[] = {{1, 1}, {4, 7}, {6, 64}, {5, 1001}, {3, 32000}, {70, 50}};
  for (DType dt : kFloatDTypes) {
    const DType st = stat_dtype(dt);
    for (const Shape& s : shapes) {
      const int64_t rows = s[0];
      for (double ls : {0.0, 0.1}) {
        Operand x = rand_operand(s, dt, 4.0);
        Tensor target = targets_with_ignored_rows(rows, s[1]);
        Tensor loss_ref = empty({rows}, st), lse_ref = empty({rows}, st);
        Tensor loss = poisoned({rows}, st, kGpu), lse = poisoned({rows}, st, kGpu);
        kc::cross_entropy_fwd(loss_ref, lse_ref, x.cpu, target, -100, ls);
        kg::cross_entropy_fwd(loss, lse, x.gpu, target.to(kGpu), -100, ls);
        const std::string at = detail::str_cat("ls=", ls, " ", where(dt, s));
        EXPECT_TRUE(close_at_unit_scale(loss, loss_ref, row_tol(st))) << "loss " << at;
        EXPECT_TRUE(close_at_unit_scale(lse, lse_ref, row_tol(st))) << "lse " << at;

        Operand dloss = rand_operand({rows}, st);
        Tensor dx_ref = empty(s, dt), dx = poisoned(s, dt, kGpu);
        kc::cross_entropy_bwd(dx_ref, dloss.cpu, x.cpu, lse_ref, target, -100, ls);
        kg::cross_entropy_bwd(dx, dloss.gpu, x.gpu, lse_ref.to(kGpu), target.to(kGpu), -100, ls);
        EXPECT_TRUE(close_at_unit_scale(dx, dx_ref, row_tol(dt))) << "dlogits " << at;
      }
    }
  }
}

// Random indices in [0, n) (with repeats), of the given dtype.
Tensor rand_index(const Shape& shape, int64_t n, DType dt) {
  std::vector<double> u = rand(shape, DType::f64).to_vector();
  for (double& v : u) v = std::min<double>(static_cast<double>(n - 1), std::floor(v * static_cast<double>(n)));
  return from_vector(u, shape, dt);
}

const DType kIndexValueTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i64};

// Accumulations into 16-bit outputs round after every addition on both devices, in different orders.
double add_tol(DType t) { return t == DType::i64 ? 0.0 : t == DType::bf16 ? 3e-2 : t == DType::f16 ? 4e-3 : row_tol(t); }

Operand values(const Shape& s, DType dt) {
  return make_operand(s, dt, Layout::Contiguous, [dt](double x) { return dt == DType::i64 ? std::round(9 * x) : x; });
}

TEST(CudaIndex, IndexSelectAndIndexAddMatchCpuAlongEveryDim) {
  INGOT_REQUIRE_CUDA();
  manual_seed(106);
  const Shape src_shape{6, 5, 7};
  for (DType dt : kIndexValueTypes) {
    for (DType it : {DType::i64, DType::i32}) {
      for (int64_t dim = 0; dim < 3; ++dim) {
        const int64_t n = src_shape[dim], count = 11;  // more indices than rows: repeats
        Tensor index = rand_index({count}, n, it);
        Shape sel_shape = src_shape;
        sel_shape[dim] = count;
        Operand src = values(src_shape, dt);
        Tensor ref = empty(sel_shape, dt), out = poisoned(sel_shape, dt, kGpu);
        kc::index_select(ref, src.cpu, index, dim);
        kg::index_select(out, src.gpu, index.to(kGpu), dim);
        const std::string at = detail::str_cat(dtype_name(dt), " index ", dtype_name(it), " dim ", dim);
        EXPECT_EQ(count_unequal(out, ref), 0) << "index_select " << at;

        Operand add = values(sel_shape, dt), base = values(src_shape, dt);
        Tensor acc_ref = base.cpu.clone_raw(), acc = base.gpu.clone_raw();
        kc::index_add(acc_ref, add.cpu, index, dim);
        kg::index_add(acc, add.gpu, index.to(kGpu), dim);
        EXPECT_TRUE(close_at_unit_scale(acc, acc_ref, add_tol(dt))) << "index_add " << at;
      }
    }
  }
}

// Vocabulary-parallel lookups (Note [Vocabulary-parallel embeddings], distributed/fsdp.h): a rank's rows [base,
// base + R) of a table, ids over the whole vocabulary (most of them another rank's), rows converted to the output's
// dtype (f32 masters looked up as bf16), and the gradient of bf16 outputs accumulated into f32 rows.
TEST(CudaIndex, EmbeddingRowsAndTheirGradientMatchCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(108);
  const int64_t vocab = 1000, rows = 250, base = 500, d = 96;
  for (DType rows_dt : {DType::f32, DType::bf16}) {
    for (DType out_dt : {DType::f32, DType::bf16}) {
      for (DType it : {DType::i64, DType::i32}) {
        const std::string at = detail::str_cat(dtype_name(rows_dt), " rows -> ", dtype_name(out_dt), ", ids ",
                                               dtype_name(it));
        Operand table = values({rows, d}, rows_dt);
        Tensor ids = rand_index({8 * 64}, vocab, it);
        Tensor ref = empty({8 * 64, d}, out_dt), out = poisoned({8 * 64, d}, out_dt, kGpu);
        kc::embedding_rows(ref, table.cpu, ids, base);
        kg::embedding_rows(out, table.gpu, ids.to(kGpu), base);
        EXPECT_EQ(count_unequal(out, ref), 0) << "embedding_rows " << at;
        Operand grad = values({8 * 64, d}, out_dt);
        Tensor acc_ref = zeros({rows, d}, DType::f32), acc = zeros({rows, d}, DType::f32).to(kGpu);
        kc::embedding_rows_add(acc_ref, grad.cpu, ids, base);
        kg::embedding_rows_add(acc, grad.gpu, ids.to(kGpu), base);
        EXPECT_TRUE(close_at_unit_scale(acc, acc_ref, row_tol(DType::f32))) << "embedding_rows_add " << at;
        EXPECT_GT(sum(abs(acc_ref)).item(), 0.0) << "some ids fall in the rows: " << at;
      }
    }
  }
}

// Note [Narrow wire, wide sum] (distributed/process_group.h): a chunk's pieces from every rank added in out's dtype
// in piece order and scaled once: the same bits on both devices, on the 16-byte vector path (lengths of whole
// vectors, aligned) and the scalar one (odd lengths, pieces one element into their buffer), for more pieces than
// one launch takes (9 > 8: out's running sum carried into the second launch).
TEST(CudaReduce, SumPiecesMatchesCpuBitForBit) {
  INGOT_REQUIRE_CUDA();
  manual_seed(109);
  for (DType piece_dt : {DType::bf16, DType::f16, DType::f32}) {
    for (DType out_dt : {DType::f32, DType::f64}) {
      for (int count : {1, 4, 9}) {
        for (int64_t n : {int64_t{8192}, int64_t{1001}}) {
          for (bool offset : {false, true}) {
            const std::string at = detail::str_cat(count, " ", dtype_name(piece_dt), " pieces of ", n, " -> ",
                                                   dtype_name(out_dt), offset ? ", offset by one" : "");
            std::vector<Tensor> cpu, gpu;
            for (int k = 0; k < count; ++k) {
              Operand base = values({n + 1}, piece_dt);
              const int64_t at0 = offset ? 1 : 0;
              cpu.push_back(base.cpu.as_strided({n}, {1}, base.cpu.offset() + at0));
              gpu.push_back(base.gpu.as_strided({n}, {1}, base.gpu.offset() + at0));
            }
            Tensor ref = empty({n}, out_dt), out = poisoned({n}, out_dt, kGpu);
            kc::sum_pieces(ref, cpu, 1.0 / 3, 0);
            kg::sum_pieces(out, gpu, 1.0 / 3, 0);
            EXPECT_EQ(count_unequal(out, ref), 0) << at;
            // Two blocks: each strides over the whole length.
            Tensor few = poisoned({n}, out_dt, kGpu);
            kg::sum_pieces(few, gpu, 1.0 / 3, 2);
            EXPECT_EQ(count_unequal(few, ref), 0) << at << ", two blocks";
          }
        }
      }
    }
  }
  EXPECT_THROW(kg::sum_pieces(empty({8}, DType::bf16, kGpu), {empty({8}, DType::bf16, kGpu)}, 1.0, 0), Error);
}

// The embedding op's layout: a [B, T] index, a [B, T, D] output (and gradient), as the models call it.
TEST(CudaIndex, EmbeddingSizedIndexSelectAndIndexAddMatchCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(107);
  for (DType dt : {DType::f32, DType::bf16}) {
    Operand table = values({1000, 96}, dt);
    Tensor ids = rand_index({8, 64}, 1000, DType::i64);
    Tensor ref = empty({8, 64, 96}, dt), out = poisoned({8, 64, 96}, dt, kGpu);
    kc::index_select(ref, table.cpu, ids, 0);
    kg::index_select(out, table.gpu, ids.to(kGpu), 0);
    EXPECT_EQ(count_unequal(out, ref), 0) << dtype_name(dt);
    Operand grad = values({8, 64, 96}, dt);
    Tensor acc_ref = zeros({1000, 96}, dt), acc = zeros({1000, 96}, dt).to(kGpu);
    kc::index_add(acc_ref, grad.cpu, ids, 0);
    kg::index_add(acc, grad.gpu, ids.to(kGpu), 0);
    EXPECT_TRUE(close_at_unit_scale(acc, acc_ref, add_tol(dt))) << dtype_name(dt);
  }
  EXPECT_THROW(kg::index_select(empty({8, 63, 96}, DType::f32, kGpu), empty({1000, 96}, DType::f32, kGpu),
                                empty({8, 64}, DType::i64, kGpu), 0),
               Error);
}

TEST(CudaIndex, GatherAndScatterAddMatchCpuAlongEveryDim) {
  INGOT_REQUIRE_CUDA();
  manual_seed(108);
  const Shape shape{4, 6, 5};
  for (DType dt : kIndexValueTypes) {
    for (DType it : {DType::i64, DType::i32}) {
      for (int64_t dim = 0; dim < 3; ++dim) {
        // index has src's shape except along dim, where it is longer (repeats) than src.
        Shape idx_shape = shape;
        idx_shape[dim] = shape[dim] + 3;
        Tensor index = rand_index(idx_shape, shape[dim], it);
        Operand src = values(shape, dt);
        Tensor ref = empty(idx_shape, dt), out = poisoned(idx_shape, dt, kGpu);
        kc::gather(ref, src.cpu, index, dim);
        kg::gather(out, src.gpu, index.to(kGpu), dim);
        const std::string at = detail::str_cat(dtype_name(dt), " index ", dtype_name(it), " dim ", dim);
        EXPECT_EQ(count_unequal(out, ref), 0) << "gather " << at;

        Operand upd = values(idx_shape, dt), base = values(shape, dt);
        Tensor acc_ref = base.cpu.clone_raw(), acc = base.gpu.clone_raw();
        kc::scatter_add(acc_ref, upd.cpu, index, dim);
        kg::scatter_add(acc, upd.gpu, index.to(kGpu), dim);
        EXPECT_TRUE(close_at_unit_scale(acc, acc_ref, add_tol(dt))) << "scatter_add " << at;
      }
    }
  }
}

}  // namespace
}  // namespace ingot::testing
