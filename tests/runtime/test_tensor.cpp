// runtime/tensor.h without autograd: metadata, raw views, copies with broadcasting and dtype conversion,
// factories and comparisons.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/rng.h"
#include "runtime/tensor.h"
#include "tests/testing.h"

namespace ingot {
namespace {

using ingot::testing::error_of;

TEST(Tensor, ContiguousTensorsHaveRowMajorStrides) {
  Tensor t = empty({2, 3, 4}, DType::bf16);
  EXPECT_EQ(t.strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(-3), 12);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.offset(), 0);
  EXPECT_NE(error_of([&] { t.size(3); }).find("dim 3 out of range"), std::string::npos);
  // Strides of size-1 dims do not matter for contiguity.
  EXPECT_TRUE(t.as_strided({2, 1, 12}, {12, 999, 1}, 0).is_contiguous());
  EXPECT_FALSE(t.as_strided({4, 2}, {1, 4}, 0).is_contiguous());
}

TEST(Tensor, AsStridedViewsShareStorageAndHonourOffsets) {
  Tensor base = arange(0, 12, DType::f32);
  Tensor m = base.as_strided({3, 4}, {4, 1}, 0);
  Tensor col = base.as_strided({3}, {4}, 2);  // column 2 of m
  EXPECT_EQ(col.to_vector(), (std::vector<double>{2, 6, 10}));
  EXPECT_EQ(col.item_at(1), 6.0);
  col.fill_(-1.0);
  EXPECT_EQ(m.to_vector(), (std::vector<double>{0, 1, -1, 3, 4, 5, -1, 7, 8, 9, -1, 11}));
  EXPECT_EQ(base.version(), col.version()) << "views share one version counter";
  EXPECT_GT(base.version(), 0u);
  Tensor t = base.as_strided({4, 3}, {1, 4}, 0);  // m transposed
  EXPECT_EQ(t.to_vector(), (std::vector<double>{0, 4, 8, 1, 5, 9, -1, -1, -1, 3, 7, 11}));
}

TEST(Tensor, ExpandRawBroadcastsWithZeroStridesAndRejectsBadShapes) {
  Tensor row = from_vector({1, 2, 3}, {1, 3});
  Tensor e = row.expand_raw({4, 2, 3});
  EXPECT_EQ(e.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(e.strides(), (Strides{0, 0, 1}));
  EXPECT_EQ(e.item_at(4 * 2 * 3 - 1), 3.0);
  EXPECT_FALSE(e.is_contiguous());
  EXPECT_EQ(error_of([&] { row.expand_raw({2, 4}); }), "expand: cannot expand shape [1, 3] to [2, 4]");
  EXPECT_EQ(error_of([&] { row.expand_raw({3}); }), "expand: cannot expand shape [1, 3] to [3]");
}

TEST(Tensor, CopyBroadcastsTheSourceToTheDestinationShape) {
  Tensor dst = zeros({2, 3}, DType::f32);
  dst.copy_(from_vector({1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_vector(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  dst.copy_(from_vector({7, 8}, {2, 1}));
  EXPECT_EQ(dst.to_vector(), (std::vector<double>{7, 7, 7, 8, 8, 8}));
  dst.copy_(full({}, 4.0, DType::f64));
  EXPECT_EQ(dst.to_vector(), (std::vector<double>(6, 4.0)));
  EXPECT_NE(error_of([&] { dst.copy_(ones({3, 2})); }).find("cannot expand shape [3, 2] to [2, 3]"),
            std::string::npos);
}

TEST(Tensor, CopyConvertsBetweenDTypes) {
  Tensor src = from_vector({2.7, -2.7, 0.0, 1.0 / 3.0, 65504.0, 1e6}, {6}, DType::f64);
  EXPECT_EQ(src.to(DType::i32).to_vector(), (std::vector<double>{2, -2, 0, 0, 65504, 1e6}));  // toward zero
  EXPECT_EQ(src.to(DType::b8).to_vector(), (std::vector<double>{1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(src.to(DType::f16).item_at(4), 65504.0);
  EXPECT_TRUE(std::isinf(src.to(DType::f16).item_at(5)));
  EXPECT_EQ(src.to(DType::bf16).item_at(3), bf16_to_float(float_to_bf16(1.0f / 3.0f)));
  EXPECT_EQ(src.to(DType::f32).item_at(3), static_cast<double>(1.0f / 3.0f));
  // 64-bit integers beyond float's 24 bits survive a trip through f64.
  Tensor big = from_vector_i64({(int64_t{1} << 53) - 1, -(int64_t{1} << 40) - 3}, {2});
  EXPECT_EQ(big.to(DType::f64).to(DType::i64).data<int64_t>()[0], (int64_t{1} << 53) - 1);
  EXPECT_EQ(big.to(DType::f64).to(DType::i64).data<int64_t>()[1], -(int64_t{1} << 40) - 3);
  Tensor flags = from_vector({1, 0, 1}, {3}, DType::b8);
  EXPECT_EQ(flags.to(DType::bf16).to_vector(), (std::vector<double>{1, 0, 1}));
  Tensor same = flags.to(DType::b8);
  EXPECT_TRUE(same.same(flags));
  EXPECT_TRUE(flags.to(Device::cpu()).same(flags));
}

TEST(Tensor, CopyBroadcastsAndConvertsAtOnceIntoAStridedDestination) {
  Tensor base = zeros({3, 2}, DType::f64);
  Tensor dst_t = base.as_strided({2, 3}, {1, 2}, 0);  // base transposed
  dst_t.copy_(from_vector({1, 2, 3}, {3}, DType::i32));
  EXPECT_EQ(base.to_vector(), (std::vector<double>{1, 1, 2, 2, 3, 3}));
  uint64_t v = base.version();
  dst_t.copy_(from_vector({5}, {1}, DType::bf16));
  EXPECT_EQ(base.version(), v + 1);
  EXPECT_EQ(base.to_vector(), (std::vector<double>(6, 5.0)));
}

// Large enough to run on several OpenMP threads, strided on both sides, converting f32 -> bf16.
TEST(Tensor, LargeStridedConvertingCopyMatchesElementwiseReference) {
  manual_seed(21);
  Tensor src = randn({300, 200}, DType::f32).as_strided({200, 300}, {1, 200}, 0);
  Tensor dst_base = empty({300, 200}, DType::bf16);
  Tensor dst = dst_base.as_strided({200, 300}, {1, 200}, 0);
  dst.copy_(src);
  for (int64_t i = 0; i < src.numel(); i += 97)
    ASSERT_EQ(dst.item_at(i), bf16_to_float(float_to_bf16(static_cast<float>(src.item_at(i))))) << i;
  Tensor c = dst.clone_raw();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector(), dst.to_vector());
}

TEST(Tensor, CloneAndContiguousCopyOnlyWhenNeeded) {
  Tensor a = arange(0, 6, DType::f32);
  EXPECT_TRUE(a.contiguous_raw().same(a));
  Tensor c = a.clone_raw();
  EXPECT_FALSE(c.same(a));
  EXPECT_NE(c.data_ptr(), a.data_ptr());
  Tensor t = a.as_strided({3, 2}, {1, 3}, 0);
  Tensor tc = t.contiguous_raw();
  EXPECT_TRUE(tc.is_contiguous());
  EXPECT_EQ(tc.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, FactoriesFillShapesAndDTypes) {
  EXPECT_EQ(zeros({2, 2}, DType::i32).to_vector(), (std::vector<double>(4, 0.0)));
  EXPECT_EQ(ones({3}, DType::bf16).to_vector(), (std::vector<double>(3, 1.0)));
  EXPECT_EQ(full({2}, -1.5, DType::f16).to_vector(), (std::vector<double>{-1.5, -1.5}));
  Tensor r = arange(-2, 3);
  EXPECT_EQ(r.dtype(), DType::i64);
  EXPECT_EQ(r.to_vector(), (std::vector<double>{-2, -1, 0, 1, 2}));
  EXPECT_EQ(arange(3, 3).numel(), 0);
  Tensor like = zeros_like(full({2, 3}, 9.0, DType::f64));
  EXPECT_EQ(like.dtype(), DType::f64);
  EXPECT_EQ(like.shape(), (Shape{2, 3}));
  EXPECT_EQ(full({}, 3.0).item(), 3.0);
  EXPECT_EQ(error_of([] { empty({2, -1}); }), "empty: negative dimension in shape [2, -1]");
  EXPECT_EQ(error_of([] { from_vector({1, 2, 3}, {2, 2}); }), "from_vector: 3 values for shape [2, 2]");
  EXPECT_NE(error_of([] { ones({2}).item(); }).find("expected a one-element tensor"), std::string::npos);
  EXPECT_NE(error_of([] { arange(0, 4).item_at(4); }).find("index 4 out of range"), std::string::npos);
}

TEST(Tensor, FromBlobKeepsItsOwnerAlive) {
  std::weak_ptr<std::vector<float>> watch;
  Tensor t;
  {
    auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
    watch = owner;
    t = from_blob(owner, owner->data() + 1, {3}, DType::f32, Device::cpu());
  }
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(t.to_vector(), (std::vector<double>{2, 3, 4}));
  t = Tensor();
  EXPECT_TRUE(watch.expired());
}

TEST(Tensor, DetachSharesDataButNotAutogradState) {
  Tensor a = ones({2}, DType::f32);
  a.set_requires_grad(true);
  a.set_name("w");
  Tensor d = a.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.data_ptr(), a.data_ptr());
  EXPECT_EQ(d.name(), "w");
  EXPECT_NE(error_of([] { ones({2}, DType::i64).set_requires_grad(true); }).find("only floating tensors"),
            std::string::npos);
}

TEST(Tensor, StrShowsDTypeDeviceShapeAndLeadingValues) {
  EXPECT_EQ(arange(0, 3, DType::f32).str(), "Tensor(f32, cpu, [3]) [0, 1, 2]");
  EXPECT_EQ(arange(0, 10).str(2), "Tensor(i64, cpu, [10]) [0, 1, ...]");
  EXPECT_EQ(Tensor().str(), "Tensor(undefined)");
  EXPECT_NE(error_of([] { Tensor().shape(); }).find("undefined tensor"), std::string::npos);
}

TEST(Tensor, AllcloseTreatsNanAndInfStrictly) {
  Tensor a = from_vector({1.0, NAN, INFINITY}, {3}, DType::f64);
  Tensor b = from_vector({1.0 + 1e-9, NAN, INFINITY}, {3}, DType::f64);
  EXPECT_TRUE(allclose(a, b));
  EXPECT_FALSE(allclose(a, from_vector({1.0, 0.0, INFINITY}, {3}, DType::f64)));
  EXPECT_FALSE(allclose(a, from_vector({1.0, NAN, -INFINITY}, {3}, DType::f64)));
  EXPECT_FALSE(allclose(a, from_vector({1.1, NAN, INFINITY}, {3}, DType::f64)));
  EXPECT_FALSE(allclose(a, ones({2}, DType::f64)));
  EXPECT_NEAR(max_rel_error(from_vector({1.5}, {1}), from_vector({1.0}, {1}), 0.5, 0.0), 1.0, 1e-12);
}

}  // namespace
}  // namespace ingot

namespace ingot {
namespace {

// Kernels demand contiguous operands; an empty tensor (e.g. a [2, 3, 0] matmul operand) must never be rejected
// for its strides, whatever they are.
TEST(Tensor, EmptyTensorsAreContiguousWhateverTheirStrides) {
  EXPECT_TRUE(empty({2, 3, 0}).is_contiguous());
  Tensor base = zeros({4, 5});
  EXPECT_TRUE(base.as_strided({3, 0}, {7, 1}, 0).is_contiguous());
  EXPECT_FALSE(base.as_strided({2, 2}, {1, 2}, 0).is_contiguous());
  EXPECT_TRUE(empty({0, 4}).contiguous_raw().is_contiguous());
}

}  // namespace
}  // namespace ingot
