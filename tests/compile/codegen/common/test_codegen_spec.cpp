// KernelSpec: structural identity, canonical form, validation errors, and the rendered C++ (no compiler).
#include <gtest/gtest.h>

#include "compile/codegen/cpu/render_cpp.h"
#include "compile/codegen/common/kernel_spec.h"
#include "runtime/error.h"

namespace ingot::codegen {
namespace {

// y = exp(x * s) + b over [4, 8], b broadcast along dim 0; built in two node orders.
KernelSpec scaled_exp(const std::string& name, bool reorder, double s = 0.5) {
  KernelSpec k;
  k.name = name;
  k.dims = {SymInt::constant(4), SymInt::constant(8)};
  const int x = k.input(DType::f32, {SymInt::constant(8), SymInt::constant(1)}, name + ".x");
  const int b = k.input(DType::f32, {SymInt::constant(0), SymInt::constant(1)}, name + ".b");
  const int y = k.output(DType::f32, k.contiguous_strides(), name + ".y");
  int lb = -1;
  if (reorder) lb = k.load(b);
  const int e = k.unary(Op::Exp, k.binary(Op::Mul, k.load(x), k.constant(s, DType::f32)));
  if (!reorder) lb = k.load(b);
  k.unary(Op::Sin, e);  // dead
  k.store(y, k.binary(Op::Add, e, lb));
  return k;
}

TEST(KernelSpec, StructuralHashIgnoresNamesAndNodeOrder) {
  const KernelSpec a = scaled_exp("layer3_exp", false), b = scaled_exp("layer7_exp", true);
  EXPECT_EQ(a.structural_key(), b.structural_key());
  EXPECT_EQ(a.structural_hash(), b.structural_hash());
  EXPECT_NE(a.symbol(), b.symbol());  // names stay readable
  EXPECT_NE(a.structural_hash(), scaled_exp("x", false, 0.25).structural_hash());
}

TEST(KernelSpec, StructuralHashSeesDtypesStridesAndSizes) {
  const uint64_t base = scaled_exp("k", false).structural_hash();
  KernelSpec d = scaled_exp("k", false);
  d.buffers[2].dtype = DType::bf16;
  EXPECT_NE(d.structural_hash(), base);
  KernelSpec s = scaled_exp("k", false);
  s.buffers[0].strides = {SymInt::constant(1), SymInt::constant(4)};
  EXPECT_NE(s.structural_hash(), base);
  KernelSpec z = scaled_exp("k", false);
  z.dims[0] = SymInt::slot(0);
  z.num_syms = 1;
  EXPECT_NE(z.structural_hash(), base);
}

TEST(KernelSpec, CanonicalizeDropsDeadNodesAndMergesDuplicates) {
  KernelSpec k = scaled_exp("k", false);
  const int x2 = k.load(0);  // a second load of x, then the same product again, stored to a second output
  const int dup = k.binary(Op::Mul, x2, k.constant(0.5, DType::f32));
  k.store(k.output(DType::f32, k.contiguous_strides(), "y2"), dup);
  const KernelSpec c = canonicalize(k);
  EXPECT_EQ(c.nodes.size(), 6u);  // load x, const, mul, exp, load b, add: the sin is dead, the copy merged
  ASSERT_EQ(c.stores.size(), 2u);
  EXPECT_EQ(c.nodes[c.stores[1].node].op, Op::Mul);
  c.validate();
}

std::string error_of(const KernelSpec& k) {
  try {
    k.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(KernelSpec, ValidateRejectsABroadcastPointwiseOutput) {
  KernelSpec k = scaled_exp("bcast", false);
  k.buffers[2].strides[0] = SymInt::constant(0);
  EXPECT_NE(error_of(k).find("kernel 'bcast': buffer 2 ('bcast.y') is an output broadcast along dim 0"),
            std::string::npos)
      << error_of(k);
}

TEST(KernelSpec, ValidateRejectsStrideCountMismatch) {
  KernelSpec k = scaled_exp("k", false);
  k.buffers[0].strides.pop_back();
  EXPECT_NE(error_of(k).find("has 1 strides, expected 2"), std::string::npos) << error_of(k);
}

TEST(KernelSpec, ValidateRejectsLoadOfAnOutputAndBadOperands) {
  KernelSpec k = scaled_exp("k", false);
  for (Node& n : k.nodes)
    if (n.op == Op::Load) n.arg = 2;
  EXPECT_NE(error_of(k).find("reads buffer 2, which is not an input"), std::string::npos) << error_of(k);
  KernelSpec f = scaled_exp("k", false);
  f.nodes[2].a = 5;  // a later node
  EXPECT_NE(error_of(f).find("operands must be earlier nodes"), std::string::npos) << error_of(f);
}

TEST(KernelSpec, ValidateRejectsOutOfRangeSlots) {
  KernelSpec k = scaled_exp("k", false);
  k.dims[0] = SymInt::slot(3);
  EXPECT_NE(error_of(k).find("dim 0 uses sym slot 3 but num_syms is 0"), std::string::npos) << error_of(k);
  KernelSpec s = scaled_exp("k", false);
  s.nodes[1] = Node{Op::Scalar, DType::f32, -1, -1, -1, 2, 0};
  EXPECT_NE(error_of(s).find("reads scalar slot 2 but num_scalars is 0"), std::string::npos) << error_of(s);
}

TEST(KernelSpec, ValidateRejectsOutputsStoredTwiceOrNever) {
  KernelSpec k = scaled_exp("k", false);
  k.store(2, 0);
  EXPECT_NE(error_of(k).find("is stored twice"), std::string::npos) << error_of(k);
  KernelSpec n = scaled_exp("k", false);
  n.output(DType::f32, n.contiguous_strides(), "unused");
  EXPECT_NE(error_of(n).find("('unused') is never stored"), std::string::npos) << error_of(n);
}

TEST(KernelSpec, ValidateRejectsAReductionOutsideRowKernels) {
  KernelSpec k = scaled_exp("k", false);
  k.reduce(Op::ReduceSum, 0);
  k.stores[0].node = static_cast<int>(k.nodes.size()) - 1;
  EXPECT_NE(error_of(k).find("is a reduction in a pointwise kernel"), std::string::npos) << error_of(k);
}

TEST(KernelSpec, ValidateRejectsARowOutputOfAnElementValue) {
  KernelSpec k;
  k.name = "rows";
  k.kind = KernelKind::RowReduction;
  k.dims = {SymInt::constant(3), SymInt::constant(5)};
  const int x = k.input(DType::f32, {SymInt::constant(5), SymInt::constant(1)});
  const int r = k.output(DType::f32, {SymInt::constant(1), SymInt::constant(0)}, "row_out");
  k.store(r, k.unary(Op::Exp, k.load(x)));
  EXPECT_NE(error_of(k).find("is a row output (last-dim stride 0) but node 1 depends on the reduced dim"),
            std::string::npos)
      << error_of(k);
  k.stores[0].node = k.reduce(Op::ReduceMax, 1);
  EXPECT_EQ(error_of(k), "no error");
}

// Note [Column sums in row reductions]: a ColumnSum goes into a column output (stride 0 on every row dim),
// nothing reads it, and only the CUDA backend renders it.
TEST(KernelSpec, ColumnSumsAreOnlyStoredIntoColumnOutputs) {
  auto spec = [] {
    KernelSpec k;
    k.name = "cols";
    k.kind = KernelKind::RowReduction;
    k.dims = {SymInt::constant(3), SymInt::constant(5)};
    const int x = k.load(k.input(DType::f32, {SymInt::constant(5), SymInt::constant(1)}, "x"));
    k.store(k.output(DType::f32, {SymInt::constant(5), SymInt::constant(1)}, "y"), k.unary(Op::Exp, x));
    return k;
  };
  KernelSpec ok = spec();
  const int cs = ok.column_sum(ok.load(0));
  ok.store(ok.output(DType::f32, {SymInt::constant(0), SymInt::constant(1)}, "col"), cs);
  EXPECT_EQ(error_of(ok), "no error");
  EXPECT_EQ(element_level_nodes(ok)[static_cast<size_t>(cs)], false) << "one value per column, not per element";

  KernelSpec read = ok;
  read.store(read.output(DType::f32, {SymInt::constant(5), SymInt::constant(1)}, "z"),
             read.unary(Op::Neg, cs));
  EXPECT_NE(error_of(read).find("reads column sum " + std::to_string(cs) + "; column sums may only be stored"),
            std::string::npos)
      << error_of(read);

  KernelSpec element = spec();
  element.store(element.output(DType::f32, {SymInt::constant(5), SymInt::constant(1)}, "e"),
                element.column_sum(element.load(0)));
  EXPECT_NE(error_of(element).find("('e') holds column sums but its stride along row dim 0 is not 0"),
            std::string::npos)
      << error_of(element);

  KernelSpec pointwise = scaled_exp("k", false);
  pointwise.store(pointwise.output(DType::f32, {SymInt::constant(0), SymInt::constant(1)}, "col"),
                  pointwise.column_sum(0));
  EXPECT_NE(error_of(pointwise).find("is a column sum in a pointwise kernel"), std::string::npos) << error_of(pointwise);

  std::string cpu_error = "no error";
  try {
    cpu::render_kernel(ok, "cols_0");
  } catch (const Error& e) {
    cpu_error = e.what();
  }
  EXPECT_NE(cpu_error.find("column sums are generated for CUDA only"), std::string::npos) << cpu_error;
}

TEST(KernelSpec, ValidateRejectsNonBoolConditionsAndMismatchedInPlace) {
  KernelSpec k = scaled_exp("k", false);
  const int w = k.where(0, 0, 0);
  k.stores[0].node = w;
  EXPECT_NE(error_of(k).find("condition must be b8, got f32"), std::string::npos) << error_of(k);
  KernelSpec a = scaled_exp("k", false);
  a.buffers[2].alias_of = 1;  // b is broadcast: its index map differs from y's
  EXPECT_NE(error_of(a).find("is in place on buffer 1 but their dtype or index map differ"), std::string::npos)
      << error_of(a);
}

TEST(KernelSpec, ValidateRejectsDimsOnMultiTensorKernels) {
  KernelSpec k;
  k.name = "mt";
  k.kind = KernelKind::MultiTensor;
  k.dims = {SymInt::constant(4)};
  const int p = k.input(DType::f32, {});
  k.store(k.output(DType::f32, {}), k.load(p));
  EXPECT_NE(error_of(k).find("a multi-tensor kernel has no dims"), std::string::npos) << error_of(k);
}

TEST(RenderCpp, GeneratedCodeIsReadableAndVectorizable) {
  const std::string src = cpu::render_kernel(scaled_exp("bias_exp", false), "bias_exp_0123");
  EXPECT_NE(src.find("// bias_exp: pointwise over [4, 8]"), std::string::npos) << src;
  EXPECT_NE(src.find("//   b1 in  f32 strides [0, 1]  bias_exp.b"), std::string::npos) << src;
  EXPECT_NE(src.find("extern \"C\" void bias_exp_0123(void* const* bufs"), std::string::npos) << src;
  EXPECT_NE(src.find("#pragma omp simd"), std::string::npos) << src;
  EXPECT_NE(src.find("__builtin_expf("), std::string::npos) << src;
  EXPECT_EQ(src.find("__builtin_sinf("), std::string::npos) << "dead nodes are not rendered\n" << src;
}

TEST(RenderCpp, DenseDimsAreMergedIntoOneLoop) {
  KernelSpec k;
  k.name = "dense";
  k.dims = {SymInt::constant(4), SymInt::constant(1), SymInt::constant(8)};
  const int x = k.input(DType::bf16, k.contiguous_strides());
  k.store(k.output(DType::f32, k.contiguous_strides()), k.unary(Op::Neg, k.load(x)));
  const std::string src = cpu::render_kernel(k, "dense_0");
  EXPECT_NE(src.find("// dense: pointwise over [32]"), std::string::npos) << src;
  EXPECT_NE(src.find("#pragma omp parallel for simd"), std::string::npos) << src;
  EXPECT_NE(src.find("ig_ld_bf16(b0[i0])"), std::string::npos) << src;
}

TEST(RenderCpp, TheRendererFingerprintIsStable) {
  const std::string& fp = cpu::renderer_fingerprint();
  EXPECT_EQ(fp.rfind("renderer-", 0), 0u) << fp;
  EXPECT_EQ(fp.size(), 9u + 16u);
  EXPECT_EQ(&fp, &cpu::renderer_fingerprint());
}

}  // namespace
}  // namespace ingot::codegen
