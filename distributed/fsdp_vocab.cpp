// Vocabulary-parallel embeddings: see fsdp_vocab.h and Note [Vocabulary-parallel embeddings] (fsdp.h).
//
// The lookup of a batch on rank r (world N, its ids [B, T], shard = rows [r R, (r + 1) R) of the table, R = V / N):
//   ids_all  = all_gather(ids)                        [N B T]      every rank's ids, rank order
//   partial  = embedding_rows(shard rows, ids_all)    [N B T, D]   own rows, zeros for the others' (in the
//                                                                  weights' dtype, read from the f32 master when
//                                                                  there is one: no cast of the shard first)
//   out      = reduce_scatter(sum, partial)           [B T, D]     chunk r: this rank's tokens, each row from the
//                                                                  one rank that holds it
// and its backward (dY [B, T, D]):
//   dY_all   = all_gather(dY)                         [N B T, D]
//   grad     = embedding_rows_grad(dY_all, ids_all)   [R, D] f32   summed over every rank's tokens
// synchronize() puts grad / N into the shard's .grad: the average over the ranks, as a reduce-scatter of the whole
// table's gradient would give, without it. Eagerly these are the collectives and kernels themselves; while a step
// is traced they are graph nodes like any other (the starts issued early, the waits late: the ids' gather and the
// reduce-scatter at the step's start, dY's gather at the end of the backward).
#include "distributed/fsdp_vocab.h"

#include "autograd/nn/layers.h"
#include "autograd/ops.h"
#include "autograd/ops/attrs.h"
#include "autograd/primitive.h"
#include "distributed/collective_ops.h"
#include "distributed/fsdp_state.h"

namespace ingot::distributed::fsdp_vocab {

using State = FullyShardedDataParallel::State;

namespace {

// This rank's first row of the table: its shard is rows [first_row, first_row + u.rows).
int64_t first_row(const State& s, const State::Unit& u) { return static_cast<int64_t>(s.group->rank()) * u.rows; }

// Identity on the lookup's output whose backward makes the gradient of the rank's rows (the output requires a
// gradient through `anchor`, a leaf whose own gradient is never made) and adds it into the unit's vocab_grad.
// Declares CopyAttrs: in a compiled graph it is a copy whose result is its input (compile/passes/simplify.cpp
// removes it); its backward's ops are graph nodes of their own.
class VocabGradSinkPrim final : public Primitive, public WithAttrs<CopyAttrs> {
 public:
  explicit VocabGradSinkPrim(std::weak_ptr<State> state) : WithAttrs<CopyAttrs>(CopyAttrs{}), state_(std::move(state)) {}
  std::string_view name() const override { return "vocab_parallel_grad"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[0]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return {in[0].clone_raw()}; }
  bool saves_input(size_t i) const override { return i == 1; }  // the gathered ids
  bool equivalent(const Primitive&) const override { return false; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& cot) const override {
    auto s = state_.lock();
    if (!s || !s->active || !s->embed) return {Tensor(), Tensor(), Tensor()};
    State::Unit& u = s->units[*s->embed];
    const Tensor& ids_all = c.inputs[1];
    const Tensor g = reshape(cot[0], {cot[0].numel()});
    const Tensor g_all = reshape(
        collective_wait(all_gather_start(g, s->group, "the embeddings' gradient of every rank")), {ids_all.numel(), u.dim});
    const DType acc = u.dtype == DType::f64 ? DType::f64 : DType::f32;
    const Tensor grad = embedding_rows_grad(g_all, ids_all, first_row(*s, u), u.rows, acc);
    // Two lookups before one backward (or two backwards before synchronize) add up, as gradients do.
    u.vocab_grad = u.vocab_grad.defined() ? add(u.vocab_grad, grad) : grad;
    return {Tensor(), Tensor(), Tensor()};
  }

 private:
  std::weak_ptr<State> state_;
};

Tensor lookup(const std::weak_ptr<State>& weak, const Tensor& weight, const Tensor& ids) {
  const std::shared_ptr<State> s = weak.lock();
  if (!s || !s->active || !s->embed) return embedding(weight, ids);
  State::Unit& u = s->units[*s->embed];
  Tensor ids_all, out;
  {
    // Without autograd: the shard (a leaf) must get no gradient through the lookup, whose gradient the sink below
    // makes. Not detach(): a traced step reads the shard (or master) itself at every run, while a detached handle
    // only the trace holds would become a constant of the graph (Note [Tensor identity while tracing]).
    NoGradGuard no_grad;
    ids_all = collective_wait(all_gather_start(reshape(ids, {ids.numel()}), s->group, "the token ids of every rank"));
    // The shard's rows as they are kept: the f32 master when the shard has none of its own (Note [Shards cast from
    // their masters]); the lookup converts the rows it copies to the weights' dtype.
    const Tensor rows = reshape(u.master.defined() ? u.master : u.shard, {u.rows, u.dim});
    const Tensor partial = embedding_rows(rows, ids_all, first_row(*s, u), u.rows * s->group->size(), u.dtype);
    out = collective_wait(reduce_scatter_sum_start(reshape(partial, {partial.numel()}), s->group,
                                                   "the embedding rows looked up on each rank"));
    Shape shape = ids.shape();
    shape.push_back(u.dim);
    out = reshape(out, shape);
  }
  if (grad_enabled()) out = apply(std::make_shared<VocabGradSinkPrim>(weak), {out, ids_all, s->vocab_anchor})[0];
  return out;
}

}  // namespace

void enable_if_eligible(const std::weak_ptr<State>& state, nn::Embedding* module) {
  const std::shared_ptr<State> s = state.lock();
  const int world = s->group->size();
  if (!s->options.vocab_parallel_embeddings || world < 2 || !s->embed || s->head_reads_embed || module == nullptr)
    return;
  State::Unit& u = s->units[*s->embed];
  if (u.plan.params.size() != 1) return;
  const Tensor& w = s->params[u.plan.params[0]];
  if (w.dim() != 2 || w.shape()[0] % world != 0 || w.impl() != module->weight().impl()) return;
  u.vocab_parallel = true;
  u.dim = w.shape()[1];
  u.rows = w.shape()[0] / world;
  INGOT_INTERNAL_CHECK(u.plan.padded_numel == w.numel() && u.shard.numel() == u.rows * u.dim,
                       "vocabulary-parallel unit '", u.name, "': the shard is not whole rows");
  s->vocab_module = module;
  s->vocab_anchor = zeros({1}, DType::f32, u.device);
  s->vocab_anchor.set_requires_grad(true);
  module->set_lookup([state](const Tensor& weight, const Tensor& ids) { return lookup(state, weight, ids); });
}

void disable(State& s) {
  if (s.vocab_module) s.vocab_module->set_lookup(nullptr);
  s.vocab_module = nullptr;
  if (s.embed) s.units[*s.embed].vocab_parallel = false;
}

}  // namespace ingot::distributed::fsdp_vocab
