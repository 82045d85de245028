// Compiled ZeRO-3: the units' collectives as graph nodes of a traced step. See fsdp_compiled.h.
//
// Note [ZeRO-3 in a traced step]
// While ingot::compile traces a training step (it runs once, eagerly, under the tracer), the hooks of
// FullyShardedDataParallel record each unit's collectives as graph nodes instead of running the eager protocol:
//   forward pre-hook   all_gather_unit_start(shard) + collective_wait: the unit's flat weights as one graph
//                      value; every parameter of the unit is re-pointed at a narrow + reshape view of it, so each
//                      read of the parameter in the forward, and each alias autograd saves for the backward, is a
//                      view of the gathered value (Note [Tensor identity while tracing], compile/trace/trace.h)
//   forward post-hook  the parameters point at the unit's eager storage again (eager code after the trace sees
//                      the eager layout); the gathered value stays referenced until the unit's gradients are
//                      reduced, so its storage (the key the saved aliases are matched by) outlives the backward
//   backward           once every parameter of a unit has its gradient (post-accumulate hooks; synchronize()
//                      for the units with parameters that got none): the parameters' .grad that the trace
//                      accumulated, flattened and concatenated in the unit's padded layout, cast to reduce_dtype
//                      reduce_scatter_unit_start + wait (compile/passes/unit_reductions.h: once a later unit's
//                      reduce-scatter started) and cast to the shard's gradient dtype (State::grad_dtype); with
//                      reduce_wire_dtype (Note [Narrow wire, wide sum]) exchange_unit_start + wait and the world's
//                      pieces summed in reduce_dtype by sum_pieces (Note [Pieces read by the update]):
//                      this rank's averaged chunk, added into the shard's .grad; the whole .grad tensors are
//                      dropped (grad none: no whole gradient leaves the step, and the traced run holds no more of
//                      them than eager ZeRO-3)
// The optimizer then updates the shards (or their f32 masters) exactly as after eager ZeRO-3. No parameter is
// ever read as a graph input: the compiled step's inputs are the shards, never the whole weights, and its only
// whole weights are the gathered values, which the executor frees after their last reader.
// reshard_after_forward: the trace records one gather per unit and forward; the gather is marked regather and
// compile/passes/unit_gathers.cpp gives the backward readers a gather of their own, and orders every unit
// gather after the previous unit's (prefetch one unit ahead). The embeddings' gather is read by the lookups only
// and the head's from its forward to its backward (Note [Embeddings and head are units], fsdp.h); tied
// embeddings get a second gather for the head (`fresh`), so the first dies after the lookup. The traced (first) step itself runs eagerly and holds what
// eager ZeRO-3 holds: a resharded unit's gathered bytes are freed after its forward and gathered again (a plain
// collective) by an identity on its output before its backward (fsdp_unit_boundary, which unit_gathers removes
// from the graph).
//
// Note [Checkpointed units read the gathered value]
// Activation checkpointing (train.activation_checkpointing) runs a block's forward again inside its backward,
// and that forward reads the parameters themselves. So from the unit's boundary in the backward (after the traced
// run's bytes are gathered again) until its reduction, the parameters are views of the gathered value once more,
// and a kept unit's (no boundary) stay so from its forward on: the recomputation reads the gathered weights, as
// graph readers of the gather (unit_gathers gives backward readers the backward's gather), never the eager storage,
// which holds no bytes while a traced step runs (it segfaulted before).
#include "distributed/fsdp_compiled.h"

#include <cstdlib>
#include <string>

#include "autograd/ops.h"
#include "autograd/ops/sum_pieces.h"
#include "autograd/primitive.h"
#include "distributed/collective_ops.h"
#include "distributed/fsdp_state.h"

namespace ingot::distributed::fsdp_traced {

using State = FullyShardedDataParallel::State;

namespace {

// The traced run's gathered bytes of `u` again (the same values: the shards change only in the optimizer step),
// in the storage the backward's saved aliases point at, keeping its version (Note [Gathered weights keep their
// version], fsdp_state.h). A plain collective, not a graph node: the graph has its own gather for the backward.
void regather_traced(State& s, State::Unit& u) {
  if (!u.traced.defined() || u.traced.storage()->data) return;
  Storage& st = *u.traced.storage();
  const uint64_t version = st.version;
  st.data = allocator_for(st.device).allocate(st.nbytes);
  Tensor full = u.traced;
  s.gather_into(full, u)->wait();
  st.version = version;
}

}  // namespace

void gather(State& s, size_t unit, bool regather, bool fresh) {
  State::Unit& u = s.units[unit];
  if (fresh && u.traced.defined()) {
    u.traced_earlier.push_back(u.traced);
    u.traced = Tensor();
  }
  // A second forward of the unit before its reduction (two forwards, one backward) reads the same gathered value,
  // whose bytes the first forward's end freed in the traced run.
  if (u.traced.defined()) regather_traced(s, u);
  if (!u.traced.defined()) {
    UnitCollectiveAttrs attrs{static_cast<int32_t>(unit), u.name, regather};
    // Note [Shards cast from their masters] (fsdp.h): the master is the input, cast inside the start.
    u.traced = u.master.defined()
                   ? collective_wait(all_gather_unit_start(u.master, s.group, std::move(attrs), u.dtype))
                   : collective_wait(all_gather_unit_start(u.shard, s.group, std::move(attrs)));
  }
  point_at_traced(s, unit);
}

void point_at_traced(State& s, size_t unit) {
  State::Unit& u = s.units[unit];
  for (size_t k = 0; k < u.plan.params.size(); ++k) {
    Tensor& p = s.params[u.plan.params[k]];
    const Tensor v = reshape(narrow(u.traced, 0, u.plan.offsets[k], p.numel()), p.shape());
    INGOT_INTERNAL_CHECK(v.storage() == u.traced.storage() && v.strides() == p.strides(),
                         "FSDP trace: the view of '", s.names[u.plan.params[k]], "' is not an alias of its unit");
    p.impl()->storage = v.storage();
    p.impl()->offset = v.offset();
  }
}

namespace {

// Eager code after the trace sees the eager layout.
void point_at_eager_storage(State& s, State::Unit& u) {
  for (size_t k = 0; k < u.plan.params.size(); ++k) {
    Tensor& p = s.params[u.plan.params[k]];
    p.impl()->storage = u.storage;
    p.impl()->offset = u.plan.offsets[k];
  }
}

// Frees the traced run's bytes of `u`'s gathered value (the graph frees its own after the last reader).
void free_traced(State::Unit& u) {
  if (u.traced.defined()) u.traced.storage()->data.reset();
}

// Identity on a resharded unit's output in the traced run: its backward gathers the unit's weights again before
// any of the unit's own backward ops runs (they all receive their gradients through it), as eager ZeRO-3's
// boundary does. unit_gathers removes it from the graph, where the backward's gather is a node of its own.
class UnitBoundaryPrim final : public Primitive, public WithAttrs<UnitCollectiveAttrs> {
 public:
  UnitBoundaryPrim(std::weak_ptr<State> state, UnitCollectiveAttrs a, bool ends_head)
      : WithAttrs<UnitCollectiveAttrs>(std::move(a)), state_(std::move(state)), ends_head_(ends_head) {}
  std::string_view name() const override { return "fsdp_unit_boundary"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[0]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    return {in[0].as_strided(in[0].shape(), in[0].strides(), in[0].offset())};
  }
  std::vector<Tensor> vjp(const VjpContext&, const std::vector<Tensor>& cot) const override {
    auto s = state_.lock();
    if (!s || !s->active) return {cot[0]};
    if (ends_head_ && s->heads_awaiting_backward > 0 && --s->heads_awaiting_backward == 0)
      free_traced(s->units[*s->embed]);
    const size_t unit = static_cast<size_t>(attrs_.unit);
    regather_traced(*s, s->units[unit]);
    // Note [Checkpointed units read the gathered value]: a checkpointed block's forward runs again in its backward
    // and reads the parameters themselves, not saved aliases.
    if (s->units[unit].traced.defined()) point_at_traced(*s, unit);
    return {cot[0]};
  }
  bool saves_input(size_t) const override { return false; }
  bool equivalent(const Primitive&) const override { return false; }
  void print_attrs(std::ostream& os) const override { os << "unit=" << attrs_.name; }

 private:
  std::weak_ptr<State> state_;
  bool ends_head_;
};

}  // namespace

void put_back(State& s, size_t unit) {
  State::Unit& u = s.units[unit];
  point_at_eager_storage(s, u);
  free_traced(u);
}

Tensor forward_done(const std::weak_ptr<State>& state, size_t unit, bool regather, const Tensor& out,
                    bool ends_head) {
  const std::shared_ptr<State> s = state.lock();
  State::Unit& u = s->units[unit];
  if (!grad_enabled() || !out.requires_grad()) {  // no backward follows (an evaluation inside the step)
    point_at_eager_storage(*s, u);
    u.traced = Tensor();
    u.traced_earlier.clear();
    return Tensor();
  }
  // A block kept gathered (Note [The last blocks kept], fsdp.h) still needs the boundary when it is the last one
  // with tied embeddings: its backward frees the embeddings the head read (its regather is a no-op). Its
  // parameters stay views of the gathered value until its reduction (Note [Checkpointed units read the gathered
  // value]).
  if (!regather && !ends_head) return Tensor();
  point_at_eager_storage(*s, u);
  if (regather) free_traced(u);  // the traced run holds no more gathered units than eager ZeRO-3
  UnitCollectiveAttrs attrs{static_cast<int32_t>(unit), u.name, regather};
  return apply(std::make_shared<UnitBoundaryPrim>(state, std::move(attrs), ends_head), {out})[0];
}

namespace {

// Starts unit j's reduction: its parameters' .grad (zeros where none) flattened in the unit's padded layout, cast
// to reduce_dtype, reduce-scattered (synchronize() waits and adds this rank's averaged chunk into the shard's
// .grad); the whole .grad tensors are dropped (in the traced run too: no more whole gradients than eagerly).
// Note [Pieces read by the update] (compile/passes/pieces_into_update.h): a narrow wire's sum as a graph op.
// INGOT_NARROW_WIRE_PIECES=0 keeps the sum inside the collective (reduce_scatter_widen), for measuring.
bool pieces_in_graph() {
  const char* v = std::getenv("INGOT_NARROW_WIRE_PIECES");
  return !(v && std::string(v) == "0");
}

// The average of the unit's gradient over the ranks, this rank's chunk: the world's pieces of it (the exchanged
// ones and this rank's own, a slice of the flattened gradient) summed in the reduction's dtype in rank order and
// scaled by 1 / world, as reduce_scatter_widen sums them.
Tensor sum_unit_pieces(State& s, State::Unit& u) {
  const Tensor others = collective_wait(u.traced_reduction);
  const int world = s.group->size(), rank = s.group->rank();
  const int64_t chunk = u.traced_flat.numel() / world;
  std::vector<Tensor> pieces;
  for (int p = 0; p < world; ++p)
    pieces.push_back(p == rank ? narrow(u.traced_flat, 0, rank * chunk, chunk)
                               : narrow(others, 0, (p < rank ? p : p - 1) * chunk, chunk));
  return sum_pieces(pieces, 1.0 / world, s.reduce_dtype(u));
}

// The unit's averaged gradient (its reduction waited for, or the vocabulary-parallel rows' own) added into its
// shard's .grad; the traced reduction is done with.
void finish_unit(State& s, size_t j) {
  State::Unit& u = s.units[j];
  // Note [Vocabulary-parallel embeddings] (fsdp.h): the rows' gradient over every rank's tokens, made by the
  // lookups' backward, is this rank's already.
  const Tensor avg = u.vocab_parallel          ? s.vocab_shard_grad(u)
                     : u.traced_flat.defined() ? cast(sum_unit_pieces(s, u), s.grad_dtype(u))
                                               : cast(collective_wait(u.traced_reduction), s.grad_dtype(u));
  u.traced_reduction = Tensor();
  u.traced_flat = Tensor();
  // Gradient accumulation: every backward reduces, its averages add up in the shard's .grad (as eagerly).
  u.shard.set_grad(u.shard.grad().defined() ? add(u.shard.grad(), avg) : avg);
}

// Note [Updates in the backward]
// A compiled ZeRO-3 step updates every shard after the backward: each rank holds all of its gradient shards at the
// backward's end (7.5 GB of an 8B model's on each of two GPUs). In the compiled graph the scheduler already runs
// each unit's part of the update once its reduction is waited for (compile/passes/schedule.cpp), but the step
// that traces runs eagerly, in trace order, and there the waits and the update come after the whole backward: the
// first step (and a resumed run's, whose 8-bit state exists before it) peaked 3.3-5.4 GB above the later ones,
// above a 24 GB card. With train.optimizer_in_backward the trace itself waits for unit j's reduction once unit
// j + lag's has started (where compile/passes/unit_reductions.cpp would move the wait) and runs the optimizer on
// j's shard right there, its gradient dropped after: the traced step frees each shard's gradient as the compiled
// one does, and the graph holds the same waits and one update per unit (schedule.cpp runs each as early as it
// can). Each parameter's update is the same as after the backward (AdamW's and AdamW8bit's are per element;
// clipping by the global norm and accumulation over micro-batches are refused: recipes/train_loop.cpp).
void update_awaiting(State& s, size_t keep) {
  while (s.awaiting_update.size() > keep) {
    const size_t j = s.awaiting_update.front();
    s.awaiting_update.erase(s.awaiting_update.begin());
    finish_unit(s, j);
    s.update_unit(j);
  }
}

void reduce_unit(State& s, size_t j) {
  State::Unit& u = s.units[j];
  std::vector<Tensor> parts;
  int64_t used = 0;
  for (size_t i : u.plan.params) {
    Tensor& p = s.params[i];
    const Tensor g = p.grad();
    parts.push_back(reshape(g.defined() ? g : zeros(p.shape(), u.dtype, u.device), {p.numel()}));
    used += p.numel();
  }
  if (u.plan.padded_numel > used) parts.push_back(zeros({u.plan.padded_numel - used}, u.dtype, u.device));
  Tensor flat = parts.size() == 1 ? parts[0] : cat(parts, 0);
  parts.clear();
  // The tensor itself when already that dtype. A narrow wire is summed in the reduction's dtype where it arrives
  // (Note [Narrow wire, wide sum], process_group.h).
  flat = cast(flat, s.wire_dtype(u));
  const DType sum = s.reduce_dtype(u);
  UnitCollectiveAttrs attrs{static_cast<int32_t>(j), u.name, false};
  if (sum != flat.dtype() && s.group->size() > 1 && pieces_in_graph()) {
    // Note [Pieces read by the update]: the exchange alone here, the sum in synchronize().
    u.traced_reduction = exchange_unit_start(flat, s.group, std::move(attrs));
    u.traced_flat = flat;
  } else {
    u.traced_reduction = reduce_scatter_unit_start(flat, s.group, std::move(attrs),
                                                   sum != flat.dtype() ? std::optional<DType>(sum) : std::nullopt);
  }
  for (size_t i : u.plan.params) s.params[i].zero_grad();
  point_at_eager_storage(s, u);  // its backward is over (Note [Checkpointed units read the gathered value])
  u.traced = Tensor();
  u.traced_earlier.clear();
  u.pending = -1;  // reduced this round
  if (s.update_unit) {  // Note [Updates in the backward]
    s.awaiting_update.push_back(j);
    update_awaiting(s, static_cast<size_t>(s.update_lag));
  }
}

}  // namespace

void on_grad(State& s, size_t param) {
  if (s.ready[param]) return;  // a second gradient of a tied parameter: accumulated into the same .grad
  s.ready[param] = true;
  State::Unit& u = s.units[s.unit_of[param]];
  if (--u.pending == 0) reduce_unit(s, s.unit_of[param]);
}

void synchronize(State& s) {
  // Units some of whose parameters got no gradient in this backward: reduced now, last first.
  for (size_t j = s.units.size(); j-- > 0;)
    if (s.units[j].pending != -1 && !s.units[j].vocab_parallel) reduce_unit(s, j);
  // The waits, recorded after the whole backward: in trace order after every op of the backward, so the
  // scheduler (which runs ready waits last, in trace order) never lets one block the compute after its start.
  // compile/passes/unit_reductions.cpp then moves each to just after a later unit's start, which releases the
  // unit's flattened gradient there (Note [Unit reductions are waited for a unit later]).
  // Units updated in the backward (Note [Updates in the backward]) were waited for there.
  for (size_t j = s.units.size(); j-- > 0;)
    if (s.units[j].vocab_parallel || s.units[j].traced_reduction.defined()) finish_unit(s, j);
  s.reset_round();
}

}  // namespace ingot::distributed::fsdp_traced
