// Issue 24: a document packed into a row with others gets the logits and per-token losses of the document alone
// (positions restart where it starts, attention stays inside it), for GPT-2's learned positions and Llama's
// RoPE, eager and compiled on the CPU; the compiled step takes new document boundaries as data, without
// recompiling.
#include <cmath>
#include <functional>
#include <iterator>

#include "compile/api.h"
#include "testing.h"
#include "tiny_models.h"

namespace ingot {
namespace {

constexpr int64_t kT = 12;
struct Doc {
  int64_t row, start, len;
};
// Row 0: documents of 5, 4 and 3 tokens; row 1: the tail of a document begun in an earlier row (7 tokens,
// positions from the row's start) and one of 5.
const Doc kDocs[] = {{0, 0, 5}, {0, 5, 4}, {0, 9, 3}, {1, 0, 7}, {1, 7, 5}};

int64_t token(int64_t row, int64_t t) { return (row * 37 + t * 11 + t * t) % 64; }

Tensor packed_ids() {
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < kT; ++t) ids.push_back(token(b, t));
  return from_vector_i64(ids, {2, kT});
}

// Each token's position within its document.
Tensor packed_positions(const Doc* docs, size_t n) {
  std::vector<int64_t> pos(2 * kT, -1);
  for (size_t k = 0; k < n; ++k)
    for (int64_t t = 0; t < docs[k].len; ++t) pos[docs[k].row * kT + docs[k].start + t] = t;
  return from_vector_i64(pos, {2, kT});
}

Tensor doc_ids(const Doc& d) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < d.len; ++t) ids.push_back(token(d.row, d.start + t));
  return from_vector_i64(ids, {1, d.len});
}

// Next-token losses inside one document: -log softmax(logits[row, at + t])[token at + t + 1], t < len - 1,
// from logits [B, T, V] whose row `row` holds the document at `at`.
std::vector<double> doc_losses(const Tensor& logits, int64_t row, int64_t at, const Doc& d) {
  const int64_t T = logits.size(1), V = logits.size(2);
  const std::vector<double> l = logits.to_vector();
  std::vector<double> out;
  for (int64_t t = 0; t + 1 < d.len; ++t) {
    const double* z = &l[static_cast<size_t>((row * T + at + t) * V)];
    double m = -INFINITY, s = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, z[v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] - m);
    out.push_back(m + std::log(s) - z[token(d.row, d.start + t + 1)]);
  }
  return out;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Packed logits of every document against the document alone, through `forward` (eager or compiled).
void check_documents(models::CausalLM& model, const std::function<Tensor(const Tensor&, const Tensor&)>& packed,
                     const std::string& what) {
  const Tensor logits = packed(packed_ids(), packed_positions(kDocs, std::size(kDocs)));
  for (const Doc& d : kDocs) {
    SCOPED_TRACE(::testing::Message() << what << ": row " << d.row << " tokens " << d.start << "+" << d.len);
    const Tensor alone = model.forward(doc_ids(d));
    EXPECT_LT(max_diff(doc_losses(logits, d.row, d.start, d), doc_losses(alone, 0, 0, d)), 1e-5);
    const Tensor mine = narrow(narrow(logits, 0, d.row, 1), 1, d.start, d.len).contiguous_raw();
    EXPECT_LT(max_diff(mine.to_vector(), alone.to_vector()), 1e-5);
  }
}

void check_model(models::CausalLM& model, const std::string& name) {
  NoGradGuard no_grad;
  check_documents(model, [&](const Tensor& ids, const Tensor& pos) { return model.forward(ids, pos); },
                  name + " eager");
  // Without positions the later documents attend to the earlier ones: the check above can fail.
  const Tensor unpacked = model.forward(packed_ids());
  const Doc& later = kDocs[1];
  EXPECT_GT(max_diff(doc_losses(unpacked, later.row, later.start, later),
                     doc_losses(model.forward(doc_ids(later)), 0, 0, later)),
            1e-3)
      << name;

  CompiledFunction step =
      compile([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{model.forward(a[0], a[1])}; });
  check_documents(model, [&](const Tensor& ids, const Tensor& pos) { return step({ids, pos})[0]; },
                  name + " compiled");
  // Other boundaries in the same shapes: data, not a new graph.
  const Doc moved[] = {{0, 0, 6}, {0, 6, 6}, {1, 0, 2}, {1, 2, 10}};
  const Tensor logits = step({packed_ids(), packed_positions(moved, std::size(moved))})[0];
  for (const Doc& d : moved)
    EXPECT_LT(max_diff(doc_losses(logits, d.row, d.start, d), doc_losses(model.forward(doc_ids(d)), 0, 0, d)), 1e-5)
        << name << " compiled, moved boundaries: row " << d.row << " tokens " << d.start << "+" << d.len;
  EXPECT_EQ(step.stats().compiles, 1) << name;
  EXPECT_EQ(step.stats().recompiles, 0) << name;
}

TEST(PackedDocuments, Gpt2LossesOfADocumentInAPackedRowEqualTheDocumentAlone) {
  manual_seed(41);
  models::GPT2 model(testing::tiny_gpt2_config());
  check_model(model, "gpt2");
}

TEST(PackedDocuments, LlamaLossesOfADocumentInAPackedRowEqualTheDocumentAlone) {
  manual_seed(42);
  models::Llama model(testing::tiny_llama_config());
  check_model(model, "llama");
}

// The training loss with the loader's targets (none across a boundary) and its gradients equal the sum over
// documents alone, eager and in one compiled training step.
TEST(PackedDocuments, PackedLossAndGradientsEqualTheDocumentsAlone) {
  manual_seed(43);
  models::Llama model(testing::tiny_llama_config());
  std::vector<int64_t> tgt(2 * kT, -100);
  int64_t n_targets = 0;
  for (const Doc& d : kDocs)
    for (int64_t t = 0; t + 1 < d.len; ++t, ++n_targets) tgt[d.row * kT + d.start + t] = token(d.row, d.start + t + 1);
  const Tensor targets = from_vector_i64(tgt, {2, kT}), pos = packed_positions(kDocs, std::size(kDocs));
  auto grads = [&] {
    std::vector<double> g;
    for (const Tensor& p : model.parameters()) {
      std::vector<double> v = p.grad().to_vector();
      g.insert(g.end(), v.begin(), v.end());
    }
    model.zero_grad();
    return g;
  };
  // Sum over documents of their mean losses, weighted back to the packed row's token mean.
  double want = 0;
  for (const Doc& d : kDocs) {
    const Tensor ids = doc_ids(d);
    Tensor loss = model.loss(ids, models::shifted_targets(ids));
    (loss * (static_cast<double>(d.len - 1) / n_targets)).backward();
    want += loss.item() * static_cast<double>(d.len - 1) / n_targets;
  }
  const std::vector<double> want_grads = grads();
  Tensor eager = model.loss(packed_ids(), targets, pos);
  eager.backward();
  EXPECT_NEAR(eager.item(), want, 1e-5);
  EXPECT_LT(max_diff(grads(), want_grads), 1e-5);
  CompiledFunction step = compile([&](const std::vector<Tensor>& a) {
    Tensor loss = model.loss(a[0], a[1], a[2]);
    loss.backward();
    return std::vector<Tensor>{loss};
  });
  EXPECT_NEAR(step({packed_ids(), targets, pos})[0].item(), want, 1e-5);
  EXPECT_LT(max_diff(grads(), want_grads), 1e-5);
}

}  // namespace
}  // namespace ingot
