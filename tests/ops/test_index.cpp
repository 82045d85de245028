#include "testing.h"

#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

using testing::error_of;
using testing::leaf;
using testing::randn_noncontig;

TEST(IndexSelect, PicksRowsInIndexOrderIncludingDuplicates) {
  Tensor a = from_vector({0, 1, 2, 10, 11, 12, 20, 21, 22}, {3, 3});
  Tensor rows = index_select(a, 0, from_vector_i64({2, 0, 2}, {3}));
  EXPECT_EQ(rows.shape(), (Shape{3, 3}));
  EXPECT_EQ(rows.to_vector(), (std::vector<double>{20, 21, 22, 0, 1, 2, 20, 21, 22}));
  Tensor cols = index_select(a, -1, from_vector_i64({1, 1}, {2}));
  EXPECT_EQ(cols.to_vector(), (std::vector<double>{1, 1, 11, 11, 21, 21}));
}

TEST(IndexSelect, ZeroDimIndexKeepsTheDim) {
  Tensor a = from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor r = index_select(a, 1, from_vector_i64({2}, {}));
  EXPECT_EQ(r.shape(), (Shape{2, 1}));
  EXPECT_EQ(r.to_vector(), (std::vector<double>{2, 5}));
}

TEST(IndexSelect, GradientAccumulatesOverDuplicateIndicesOnEveryDim) {
  manual_seed(11);
  for (int64_t dim = 0; dim < 3; ++dim) {
    SCOPED_TRACE(dim);
    Tensor a = leaf(randn_noncontig({3, 4, 5}));
    Tensor idx = from_vector_i64({1, 0, 1, 2, 1}, {5});
    EXPECT_GRADCHECK([&](const std::vector<Tensor>& x) { return std::vector<Tensor>{index_select(x[0], dim, idx)}; },
                     {a});
  }
}

TEST(IndexSelect, OutOfRangeIndexNamesTheOpAndTheValue) {
  Tensor a = zeros({4, 2});
  EXPECT_NE(error_of([&] { index_select(a, 0, from_vector_i64({0, 4}, {2})); })
                .find("index_select: index 4 out of range [0, 4)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { index_select(a, 0, from_vector_i64({-1}, {1})); }).find("index -1 out of range"),
            std::string::npos);
  EXPECT_NE(error_of([&] { index_select(a, 0, zeros({1})); }).find("index_select: index must be i64 or i32"),
            std::string::npos);
}

TEST(Embedding, LooksUpRowsForIdsOfAnyShape) {
  manual_seed(12);
  Tensor w = randn({10, 4});
  Tensor ids = from_vector_i64({3, 9, 3, 0, 1, 3}, {2, 3});
  Tensor e = embedding(w, ids);
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  std::vector<double> wv = w.to_vector(), ev = e.to_vector();
  const int64_t id_list[] = {3, 9, 3, 0, 1, 3};
  for (int64_t n = 0; n < 6; ++n)
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(ev[n * 4 + c], wv[id_list[n] * 4 + c]);
  Tensor i32_ids = from_vector({3, 9}, {2}, DType::i32);
  EXPECT_EQ(embedding(w, i32_ids).shape(), (Shape{2, 4}));
}

TEST(Embedding, WeightGradientMatchesFiniteDifferences) {
  manual_seed(13);
  Tensor w = leaf(randn_noncontig({6, 5}));
  Tensor ids = from_vector_i64({5, 1, 1, 0, 5, 5, 2, 1}, {2, 4});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& x) { return std::vector<Tensor>{embedding(x[0], ids)}; }, {w});
}

TEST(Embedding, OutOfRangeIdNamesTheOpAndTheBadValue) {
  Tensor w = zeros({50257, 2});
  Tensor ids = from_vector_i64({5, 70000, 3}, {3});
  EXPECT_NE(error_of([&] { embedding(w, ids); }).find("embedding: id 70000 out of range [0, 50257)"),
            std::string::npos)
      << error_of([&] { embedding(w, ids); });
}

TEST(Embedding, BackwardWithManyDuplicateIdsCountsEveryOccurrence) {
  // Large enough that index_add runs on all threads: a racy accumulation would lose counts.
  const int64_t V = 7, D = 300, N = 40000;
  Tensor w = leaf(zeros({V, D}));
  std::vector<int64_t> ids(N);
  std::vector<double> count(V, 0.0);
  for (int64_t i = 0; i < N; ++i) {
    ids[i] = (i * 5 + i / 3) % V;
    count[ids[i]] += 1;
  }
  Tensor e = embedding(w, from_vector_i64(ids, {N}));
  e.backward(ones({N, D}));
  std::vector<double> g = w.grad().to_vector();
  for (int64_t v = 0; v < V; ++v)
    for (int64_t c = 0; c < D; c += 37) ASSERT_EQ(g[v * D + c], count[v]) << "row " << v << " col " << c;
}

// Note [Vocabulary-parallel embeddings] (distributed/fsdp.h): rows [base, base + R) of a table look up the ids
// that fall there and give zeros for the others; over slices that cover the table, the lookups sum to embedding's
// and their gradients concatenate to embedding's.
TEST(EmbeddingRows, LooksUpItsRowsAndGivesZerosForTheOthers) {
  manual_seed(21);
  Tensor w = randn({10, 4});
  Tensor ids = from_vector_i64({3, 9, 6, 0, 5, 6}, {2, 3});
  Tensor e = embedding_rows(narrow(w, 0, 5, 3), ids, 5, 10);  // rows 5, 6, 7
  ASSERT_EQ(e.shape(), (Shape{2, 3, 4}));
  const std::vector<double> wv = w.to_vector(), ev = e.to_vector();
  const int64_t id_list[] = {3, 9, 6, 0, 5, 6};
  for (int64_t n = 0; n < 6; ++n)
    for (int64_t c = 0; c < 4; ++c)
      EXPECT_EQ(ev[n * 4 + c], id_list[n] >= 5 && id_list[n] < 8 ? wv[id_list[n] * 4 + c] : 0.0) << n << ", " << c;
  // Converted as it is copied: f32 rows looked up as bf16 are the rows rounded.
  Tensor b = embedding_rows(narrow(w, 0, 5, 3), ids, 5, 10, DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.to_vector(), e.to(DType::bf16).to_vector());
}

TEST(EmbeddingRows, SlicesCoveringTheTableSumToEmbeddingAndSplitItsGradient) {
  manual_seed(22);
  const int64_t vocab = 12, d = 5;
  Tensor w = randn({vocab, d});
  Tensor ids = from_vector({11, 0, 4, 4, 7, 3, 8, 11, 2}, {3, 3}, DType::i32);
  Tensor g = randn({3, 3, d});
  Tensor whole = leaf(w.clone_raw());
  embedding(whole, ids).backward(g);
  Tensor sum;
  for (int64_t r = 0; r < 3; ++r) {  // three "ranks" of 4 rows each
    Tensor rows = leaf(narrow(w, 0, 4 * r, 4).contiguous_raw());
    Tensor part = embedding_rows(rows, ids, 4 * r, vocab);
    sum = sum.defined() ? add(sum, part) : part;
    part.backward(g);
    EXPECT_EQ(rows.grad().to_vector(), narrow(whole.grad(), 0, 4 * r, 4).contiguous_raw().to_vector()) << "rank " << r;
    EXPECT_EQ(embedding_rows_grad(g, ids, 4 * r, 4, DType::f32).to_vector(), rows.grad().to_vector()) << "rank " << r;
  }
  EXPECT_EQ(sum.to_vector(), embedding(w, ids).to_vector());
}

TEST(EmbeddingRows, GradientMatchesFiniteDifferences) {
  manual_seed(23);
  Tensor rows = leaf(randn_noncontig({4, 3}));
  Tensor ids = from_vector_i64({5, 1, 5, 0, 9, 6, 5, 2}, {2, 4});  // rows 3..6: 5 three times, 6 once, others not
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& x) { return std::vector<Tensor>{embedding_rows(x[0], ids, 3, 10)}; },
                   {rows});
}

// bf16 gradients of many tokens summed into f32 rows lose nothing a bf16 sum would (256 + 1 is 256 in bf16).
TEST(EmbeddingRows, GradientOfBf16OutputsAccumulatesInF32) {
  const int64_t n = 1000;
  std::vector<int64_t> ids(n, 7);
  Tensor g = ones({n, 2}, DType::bf16);
  Tensor grad = embedding_rows_grad(g, from_vector_i64(ids, {n}), 6, 2, DType::f32);
  EXPECT_EQ(grad.to_vector(), (std::vector<double>{0, 0, static_cast<double>(n), static_cast<double>(n)}));
}

TEST(EmbeddingRows, OutOfVocabularyIdsAndRowsOutsideItNameTheOp) {
  Tensor rows = zeros({4, 2});
  EXPECT_NE(error_of([&] { embedding_rows(rows, from_vector_i64({5, 70000}, {2}), 0, 50257); })
                .find("embedding: id 70000 out of range [0, 50257)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { embedding_rows(rows, from_vector_i64({1}, {1}), 8, 10); })
                .find("embedding_rows: rows [8, 12) are not inside the vocabulary [0, 10)"),
            std::string::npos);
}

TEST(Gather, PicksAlongTheDimAndGradientMatchesFiniteDifferences) {
  Tensor a = from_vector({0, 1, 2, 10, 11, 12}, {2, 3});
  Tensor g = gather(a, 1, from_vector_i64({2, 2, 0, 1}, {2, 2}));
  EXPECT_EQ(g.to_vector(), (std::vector<double>{2, 2, 10, 11}));
  Tensor g0 = gather(a, 0, from_vector({1, 0, 1}, {1, 3}, DType::i32));
  EXPECT_EQ(g0.to_vector(), (std::vector<double>{10, 1, 12}));

  manual_seed(14);
  for (int64_t dim = 0; dim < 3; ++dim) {
    SCOPED_TRACE(dim);
    Shape idx_shape{3, 4, 5};
    idx_shape[dim] = 6;
    Tensor idx = randint(0, Shape{3, 4, 5}[dim], idx_shape);  // 6 draws from <= 5 values: duplicates
    Tensor x = leaf(randn_noncontig({3, 4, 5}));
    EXPECT_GRADCHECK([&](const std::vector<Tensor>& v) { return std::vector<Tensor>{gather(v[0], dim, idx)}; }, {x});
  }
}

TEST(Gather, MismatchedIndexShapeNamesTheOp) {
  EXPECT_NE(error_of([] { gather(zeros({2, 3}), 1, from_vector_i64({0, 0, 0}, {3, 1})); })
                .find("gather: index shape [3, 1] must match input shape [2, 3] in every dim except 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { gather(zeros({2, 3}), 1, from_vector_i64({0, 3}, {2, 1})); })
                .find("gather: index 3 out of range [0, 3)"),
            std::string::npos);
}

TEST(ScatterAdd, AccumulatesDuplicatesIntoACopyOfTheInput) {
  Tensor a = from_vector({1, 1, 1, 1, 1, 1}, {2, 3});
  Tensor idx = from_vector_i64({0, 0, 2, 1, 1, 1}, {2, 3});
  Tensor src = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor r = scatter_add(a, 1, idx, src);
  EXPECT_EQ(r.to_vector(), (std::vector<double>{4, 1, 4, 1, 16, 1}));
  EXPECT_EQ(a.to_vector(), (std::vector<double>(6, 1.0)));  // out-of-place
}

TEST(ScatterAdd, GradientsOfInputAndSourceMatchFiniteDifferences) {
  manual_seed(15);
  for (int64_t dim = 0; dim < 2; ++dim) {
    SCOPED_TRACE(dim);
    Shape src_shape{4, 3};
    src_shape[dim] = 7;
    Tensor idx = randint(0, Shape{4, 3}[dim], src_shape);
    Tensor a = leaf(randn_noncontig({4, 3}));
    Tensor src = leaf(randn_noncontig(src_shape));
    EXPECT_GRADCHECK(
        [&](const std::vector<Tensor>& v) { return std::vector<Tensor>{scatter_add(v[0], dim, idx, v[1])}; },
        {a, src});
  }
}

TEST(ScatterAdd, ManyDuplicatesOnAllThreadsSumExactly) {
  const int64_t R = 64, C = 2048, N = 8;
  std::vector<int64_t> idx(R * C);
  for (int64_t i = 0; i < R * C; ++i) idx[i] = (i * 7 + i / C) % N;
  Tensor r = scatter_add(zeros({N, C}), 0, from_vector_i64(idx, {R, C}), ones({R, C}));
  std::vector<double> got = r.to_vector();
  std::vector<double> want(N * C, 0.0);
  for (int64_t i = 0; i < R * C; ++i) want[idx[i] * C + i % C] += 1;
  EXPECT_EQ(got, want);
}

TEST(IndexKernels, IndexAddAccumulatesBf16InFloat) {
  Tensor out = zeros({3, 2}, DType::bf16);
  Tensor src = full({4, 2}, 0.5, DType::bf16);
  kernels::cpu::index_add(out, src, from_vector_i64({1, 1, 1, 0}, {4}), 0);
  EXPECT_EQ(out.to_vector(), (std::vector<double>{0.5, 0.5, 1.5, 1.5, 0, 0}));
}

}  // namespace
}  // namespace ingot
