#include "testing.h"

namespace ingot {
namespace {

using testing::error_of;
using testing::leaf;
using testing::randn_noncontig;

using Fns = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Runs `f` and returns the error message it throws (empty when it does not throw).
#define EXPECT_ERROR_HAS(stmt, text) \
  EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << "message: " << error_of([&] { stmt; })

Tensor iota(const Shape& s, DType t = DType::f32) { return reshape(arange(0, numel(s), t), s); }

TEST(Shape, ReshapeOfAContiguousTensorIsAViewSharingStorage) {
  Tensor x = iota({2, 6});
  Tensor y = reshape(x, {3, -1});
  EXPECT_EQ(y.shape(), (Shape{3, 4}));
  EXPECT_EQ(y.storage(), x.storage());
  select(y, 0, 1).fill_(-1.0);  // elements 4..7 of x
  EXPECT_EQ(x.to_vector(), (std::vector<double>{0, 1, 2, 3, -1, -1, -1, -1, 8, 9, 10, 11}));
}

TEST(Shape, ReshapeCopiesOnlyWhenStridesForbidAView) {
  Tensor x = iota({2, 3, 4, 5});
  Tensor t = transpose(x, 0, 1);  // [3, 2, 4, 5], strides [20, 60, 5, 1]: only the last two dims merge
  Tensor merged_inner = reshape(t, {3, 2, 20});
  EXPECT_EQ(merged_inner.storage(), x.storage());
  EXPECT_EQ(merged_inner.strides(), (Strides{20, 60, 1}));
  Tensor flat = reshape(t, {120});
  EXPECT_NE(flat.storage(), x.storage());
  EXPECT_EQ(flat.to_vector(), contiguous(t).to_vector());
  EXPECT_EQ(flat.item_at(5), 5.0);    // t[0][0][1][0] = x[0][0][1][0]
  EXPECT_EQ(flat.item_at(20), 60.0);  // t[0][1][0][0] = x[1][0][0][0]
  // Size-1 dims never block a view.
  Tensor col = unsqueeze(select(iota({2, 3, 4}), 2, 1), 1);  // [2, 1, 3], strides [12, *, 4]
  EXPECT_EQ(view(col, {2, 3}).strides(), (Strides{12, 4}));
  EXPECT_EQ(view(col, {6}).strides(), Strides{4});  // rows 12 apart = 3 elements of stride 4: one run
  EXPECT_THROW(view(select(iota({2, 3, 4}), 1, 1), {8}), Error);
}

TEST(Shape, ViewRefusesWhatNeedsACopyAndReshapeNamesBadShapes) {
  Tensor x = iota({2, 3});
  EXPECT_ERROR_HAS(view(transpose(x, 0, 1), {6}), "view: cannot view a tensor of shape [3, 2] with strides [1, 3] as [6]");
  EXPECT_ERROR_HAS(reshape(x, {4}), "reshape: cannot reshape [2, 3] (6 elements) into [4]");
  EXPECT_ERROR_HAS(reshape(x, {-1, 4}), "reshape: cannot reshape [2, 3] (6 elements) into [-1, 4]");
  EXPECT_ERROR_HAS(reshape(x, {-1, -1}), "reshape: only one dim may be -1");
  EXPECT_EQ(reshape(zeros({0, 4}), {2, 0, 3}).shape(), (Shape{2, 0, 3}));
  EXPECT_ERROR_HAS(reshape(zeros({0, 4}), {0, -1}), "reshape: cannot reshape [0, 4] (0 elements) into [0, -1]");
}

TEST(Shape, FlattenSqueezeUnsqueezeRearrangeDims) {
  Tensor x = iota({2, 1, 3, 4});
  EXPECT_EQ(flatten(x).shape(), Shape{24});
  EXPECT_EQ(flatten(x, 1, 2).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(flatten(x, -2).shape(), (Shape{2, 1, 12}));
  EXPECT_EQ(flatten(full({}, 1.0)).shape(), Shape{1});
  EXPECT_EQ(squeeze(x, 1).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(squeeze(x, 0).shape(), x.shape());  // not size 1: unchanged, as in PyTorch
  EXPECT_EQ(unsqueeze(x, -1).shape(), (Shape{2, 1, 3, 4, 1}));
  EXPECT_EQ(unsqueeze(x, 0).shape(), (Shape{1, 2, 1, 3, 4}));
  EXPECT_ERROR_HAS(unsqueeze(x, 6), "unsqueeze: dim 6 out of range");
  EXPECT_ERROR_HAS(flatten(x, 3, 1), "flatten: start_dim 3 comes after end_dim 1");
}

TEST(Shape, PermuteAndTransposeMoveStridesNotData) {
  Tensor x = iota({2, 3, 4});
  Tensor p = permute(x, {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Strides{1, 12, 4}));
  EXPECT_EQ(p.storage(), x.storage());
  EXPECT_EQ(p.item_at(1 * 6 + 1 * 3 + 2), 12.0 + 8.0 + 1.0);  // p[1][1][2] = x[1][2][1]
  Tensor t = transpose(x, -1, 0);
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.item_at(3 * 6 + 2 * 2 + 1), 12.0 + 8.0 + 3.0);  // t[3][2][1] = x[1][2][3]
  EXPECT_ERROR_HAS(permute(x, {0, 0, 1}), "permute: dims [0, 0, 1] repeat dim 0");
  EXPECT_ERROR_HAS(permute(x, {1, 0}), "permute: got 2 dims [1, 0] for a tensor with 3 dims");
}

TEST(Shape, SliceNarrowSelectFollowPythonIndexing) {
  Tensor x = iota({3, 10});
  EXPECT_EQ(slice(x, 1, 1, 8, 3).to_vector(), (std::vector<double>{1, 4, 7, 11, 14, 17, 21, 24, 27}));
  EXPECT_EQ(slice(x, 1, -3, 100).to_vector(), (std::vector<double>{7, 8, 9, 17, 18, 19, 27, 28, 29}));
  EXPECT_EQ(slice(x, 0, 2, 1).shape(), (Shape{0, 10}));
  EXPECT_EQ(narrow(x, 0, 1, 2).to_vector()[0], 10.0);
  EXPECT_EQ(narrow(x, 1, -2, 2).to_vector(), (std::vector<double>{8, 9, 18, 19, 28, 29}));
  EXPECT_EQ(select(x, 1, -1).to_vector(), (std::vector<double>{9, 19, 29}));
  EXPECT_EQ(select(x, 0, 2).shape(), Shape{10});
  EXPECT_ERROR_HAS(narrow(x, 1, 8, 3), "narrow: start 8 and length 3 are out of range for dim 1 of size 10");
  EXPECT_ERROR_HAS(select(x, 0, 3), "select: index 3 is out of range for dim 0 of size 3");
  EXPECT_ERROR_HAS(slice(x, 1, 0, 5, 0), "slice: step must be positive, got 0");
}

TEST(Shape, WritingThroughASliceIsVisibleInTheBase) {
  Tensor x = zeros({4, 6});
  Tensor v = slice(narrow(x, 0, 1, 2), 1, 0, 6, 2);  // rows 1-2, even columns
  EXPECT_EQ(v.storage(), x.storage());
  v.fill_(1.0);
  EXPECT_EQ(sum(x).item(), 6.0);
  EXPECT_EQ(x.item_at(6 + 2), 1.0);
  EXPECT_EQ(x.item_at(6 + 3), 0.0);
  split(x, 2, 1)[2].fill_(5.0);
  EXPECT_EQ(x.item_at(5), 5.0);
}

TEST(Shape, ExpandBroadcastsWithZeroStrides) {
  Tensor x = from_vector({1, 2, 3}, {3, 1});
  Tensor e = expand(x, {2, -1, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Strides{0, 1, 0}));
  EXPECT_EQ(e.item_at(12 + 4 + 3), 2.0);
  EXPECT_ERROR_HAS(expand(x, {2, 2}), "expand: cannot expand shape [3, 1] to [2, 2]");
  EXPECT_ERROR_HAS(expand(x, {4}), "expand: cannot expand shape [3, 1] to [4]");
  EXPECT_ERROR_HAS(expand(x, {-1, 3, 1}), "expand: -1 is not allowed for the new leading dim 0");
}

TEST(Shape, CatStackSplitChunkRoundTrip) {
  Tensor a = iota({2, 3}), b = add(iota({2, 1}), 100.0), c = add(iota({2, 2}), 200.0);
  Tensor ab = cat({a, b, c}, 1);
  EXPECT_EQ(ab.shape(), (Shape{2, 6}));
  EXPECT_EQ(ab.to_vector(), (std::vector<double>{0, 1, 2, 100, 200, 201, 3, 4, 5, 101, 202, 203}));
  std::vector<Tensor> parts = split_sizes(ab, {3, 1, 2}, -1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].to_vector(), b.to_vector());
  EXPECT_EQ(parts[2].to_vector(), c.to_vector());
  EXPECT_EQ(parts[0].storage(), ab.storage());
  std::vector<Tensor> pieces = split(ab, 4, 1);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[1].shape(), (Shape{2, 2}));
  std::vector<Tensor> ch = chunk(iota({5}), 3);
  ASSERT_EQ(ch.size(), 3u);
  EXPECT_EQ(ch[2].to_vector(), (std::vector<double>{4}));
  EXPECT_EQ(chunk(iota({4}), 3).size(), 2u);  // pieces of ceil(4 / 3) = 2, as PyTorch
  Tensor s = stack({a, mul(a, 2.0)}, 1);
  EXPECT_EQ(s.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(s.to_vector(), (std::vector<double>{0, 1, 2, 0, 2, 4, 3, 4, 5, 6, 8, 10}));
  EXPECT_EQ(stack({a, a}, -1).shape(), (Shape{2, 3, 2}));
  // Mixed dtypes promote.
  EXPECT_EQ(cat({iota({2}, DType::i64), from_vector({0.5}, {1}, DType::f64)}).dtype(), DType::f64);
}

TEST(Shape, CatAndSplitRejectMismatchedShapes) {
  Tensor a = zeros({2, 3}), b = zeros({3, 3});
  EXPECT_ERROR_HAS(cat({a, b}, 1), "cat: tensor 1 has shape [3, 3] but tensor 0 has [2, 3]; shapes must match except in dim 1");
  EXPECT_ERROR_HAS(stack({a, b}), "stack: tensor 1 has shape [3, 3] but tensor 0 has [2, 3]");
  EXPECT_ERROR_HAS(split_sizes(a, {1, 1}, 1), "split: sizes [1, 1] sum to 2 but dim 1 of shape [2, 3] has size 3");
  EXPECT_ERROR_HAS(cat({}, 0), "cat: expected at least one tensor");
}

TEST(Shape, ViewOpGradientsMatchFiniteDifferences) {
  manual_seed(20);
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"reshape", [](const Tensor& x) { return reshape(x, {4, -1}); }},
      {"view", [](const Tensor& x) { return view(contiguous(x), {2, 2, 6}); }},
      {"flatten", [](const Tensor& x) { return flatten(x); }},
      {"squeeze_unsqueeze", [](const Tensor& x) { return squeeze(unsqueeze(x, 1), 1); }},
      {"transpose", [](const Tensor& x) { return transpose(x, 0, 2); }},
      {"permute", [](const Tensor& x) { return permute(x, {1, 2, 0}); }},
      {"narrow", [](const Tensor& x) { return narrow(x, 2, 1, 2); }},
      {"slice_step", [](const Tensor& x) { return slice(x, 1, 0, 3, 2); }},
      {"select", [](const Tensor& x) { return select(x, -1, 2); }},
      {"expand", [](const Tensor& x) { return expand(select(x, 2, 0), {4, 2, 3}); }},
      {"contiguous", [](const Tensor& x) { return contiguous(x); }},
      {"overlapping_views", [](const Tensor& x) { return mul(narrow(x, 2, 0, 2), narrow(x, 2, 1, 2)); }},
  };
  for (auto& [name, f] : ops) {
    SCOPED_TRACE(name);
    Tensor x = leaf(randn_noncontig({2, 3, 4}));
    EXPECT_GRADCHECK([&f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; }, {x});
  }
}

TEST(Shape, CatStackGradientsMatchFiniteDifferences) {
  manual_seed(21);
  Tensor a = leaf(randn_noncontig({2, 3})), b = leaf(randn({2, 1}, DType::f64)), c = leaf(randn({2, 3}, DType::f64));
  EXPECT_GRADCHECK([](const std::vector<Tensor>& x) { return std::vector<Tensor>{cat({x[0], x[1], x[2]}, 1)}; },
                   {a, b, c});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& x) { return std::vector<Tensor>{stack({x[0], x[1]}, 1)}; }, {a, c});
  // Broadcasting into cat: one input reused twice, the other broadcast first.
  EXPECT_GRADCHECK([](const std::vector<Tensor>& x) {
    return std::vector<Tensor>{cat({x[0], expand(x[1], {2, 3}), x[0]}, 0)};
  }, {a, b});
}

TEST(Shape, SplitGradientTreatsUnusedPiecesAsZero) {
  manual_seed(22);
  Tensor x = leaf(randn_noncontig({5, 4}));
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) {
    std::vector<Tensor> p = split(in[0], 2, 0);  // sizes 2, 2, 1: the middle piece is unused
    return std::vector<Tensor>{mul(p[0], p[2]), chunk(in[0], 2, 1)[1]};
  }, {x});
  Tensor y = leaf(randn({6}, DType::f64));
  sum(split_sizes(y, {1, 2, 3})[1]).backward();
  EXPECT_EQ(y.grad().to_vector(), (std::vector<double>{0, 1, 1, 0, 0, 0}));
}

}  // namespace
}  // namespace ingot
