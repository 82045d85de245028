// FullyShardedDataParallel: units, their flat storages, the forward hooks that gather them, the boundary that
// gathers again before a block's backward, and the per-unit reduce-scatters. See fsdp.h for the protocol.
#include "distributed/fsdp.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "autograd/nn/layers.h"
#include "autograd/nn/module.h"
#include "autograd/ops.h"
#include "autograd/primitive.h"
#include "distributed/fsdp_compiled.h"
#include "distributed/fsdp_state.h"
#include "distributed/fsdp_vocab.h"
#include "runtime/allocator_census.h"

namespace ingot::distributed {

using fsdp_detail::Unit;

namespace {

using State = FullyShardedDataParallel::State;
using StatePtr = std::weak_ptr<State>;

// Note [Parameters without bytes] (fsdp.h): a parameter made by nn::SkipInit without bytes has a shape, a dtype
// and a device but no data yet.
bool has_bytes(const Tensor& p) { return p.numel() == 0 || p.storage()->data != nullptr; }

// Identity on a block's output whose backward gathers the block's weights before any of the block's own
// backward nodes runs (they all receive their gradients through it; the engine runs it first). On the last
// block's output with tied embeddings (`ends_head`) it runs once the head's backward is done: the embeddings
// the head read are freed first (Note [Embeddings and head are units], fsdp.h).
class GatherBeforeBackwardPrim final : public Primitive {
 public:
  GatherBeforeBackwardPrim(StatePtr state, size_t unit, bool ends_head)
      : state_(std::move(state)), unit_(unit), ends_head_(ends_head) {}
  std::string_view name() const override { return "fsdp_gather_before_backward"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[0]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    return {in[0].as_strided(in[0].shape(), in[0].strides(), in[0].offset())};
  }
  std::vector<Tensor> vjp(const VjpContext&, const std::vector<Tensor>& cot) const override {
    auto s = state_.lock();
    if (!s || !s->active) return {cot[0]};
    if (ends_head_ && s->heads_awaiting_backward > 0 && --s->heads_awaiting_backward == 0)
      s->release(s->units[*s->embed]);
    Unit& u = s->units[unit_];
    if (u.boundaries > 0) --u.boundaries;
    s->gather(u);
    // The block whose backward comes next, when its boundary is pending (Note [Eager prefetch]).
    if (unit_ > 0 && s->units[unit_ - 1].boundaries > 0) s->prefetch(unit_ - 1);
    return {cot[0]};
  }
  bool saves_input(size_t) const override { return false; }
  bool equivalent(const Primitive&) const override { return false; }

 private:
  StatePtr state_;
  size_t unit_;
  bool ends_head_;
};

enum class Role { Root, Embed, Block, Head };

// The parameters (model.parameters() indices, first names only) of one unit to be, and what it is.
struct UnitGroup {
  std::string name;
  Role role = Role::Root;
  nn::Module* module = nullptr;  // a block: the module whose forward hooks gather it
  std::vector<size_t> members;
  // The embeddings: their one table's module, when there is exactly one (Note [Vocabulary-parallel embeddings]).
  nn::Embedding* table = nullptr;
};

// Units in forward order (Note [Embeddings and head are units], fsdp.h): the children of every ModuleList not
// inside another one are the blocks; with blocks, the embedding tables outside them are one unit and the rest
// (final norm, output projection) another, else everything outside the blocks is the root unit (first).
std::vector<UnitGroup> unit_groups(nn::Module& model, const std::map<const TensorImpl*, size_t>& index, size_t n) {
  std::vector<UnitGroup> blocks;
  auto inside_block = [&](const std::string& name) {
    for (const UnitGroup& b : blocks)
      if (name.rfind(b.name + ".", 0) == 0) return true;
    return false;
  };
  for (auto& [name, m] : model.named_modules()) {
    if (inside_block(name) || !dynamic_cast<nn::ModuleList*>(m.get())) continue;
    for (auto& [child, c] : m->named_children()) blocks.push_back({name + "." + child, Role::Block, c.get(), {}});
  }
  std::vector<bool> claimed(n, false);
  auto claim = [&](const nn::Module& m, std::vector<size_t>& into) {
    for (auto& [_, p] : m.named_parameters()) {
      const size_t i = index.at(p.impl());
      if (!claimed[i]) into.push_back(i);
      claimed[i] = true;
    }
  };
  for (UnitGroup& b : blocks) claim(*b.module, b.members);
  UnitGroup embed{"embeddings", Role::Embed, nullptr, {}};
  int tables = 0;
  if (!blocks.empty())
    for (auto& [name, m] : model.named_modules())
      if (auto* e = dynamic_cast<nn::Embedding*>(m.get()); e && !inside_block(name)) {
        claim(*m, embed.members);
        embed.table = ++tables == 1 ? e : nullptr;
      }
  const bool split = !embed.members.empty();
  UnitGroup rest{split ? "head" : "root", split ? Role::Head : Role::Root, nullptr, {}};
  for (size_t i = 0; i < n; ++i)
    if (!claimed[i]) rest.members.push_back(i);
  std::vector<UnitGroup> out;
  out.push_back(split ? std::move(embed) : std::move(rest));
  for (UnitGroup& b : blocks) out.push_back(std::move(b));
  if (split) out.push_back(std::move(rest));
  return out;
}

// Tied word embeddings: a head of its own has an output projection shaped like an embedding table ([vocab, dim],
// as GPT-2's and Llama's lm_head); a head without one multiplies by the embedding table itself.
bool reads_embeddings(const State& s, const std::vector<UnitGroup>& groups) {
  for (const UnitGroup& g : groups) {
    if (g.role != Role::Head) continue;
    for (size_t i : g.members)
      for (size_t e : s.units[*s.embed].plan.params)
        if (s.params[i].shape() == s.params[e].shape()) return false;
  }
  return true;
}

// The hooks: eagerly the units' bytes are gathered and freed; while a step is traced the same points record
// graph nodes instead (Note [ZeRO-3 in a traced step], fsdp_compiled.cpp).
void gather_unit(State& s, size_t u, bool regather = false, bool fresh = false) {
  if (trace_observer() != nullptr) fsdp_traced::gather(s, u, regather, fresh);
  else s.gather(s.units[u]);
}

void model_forward_begins(State& s) {
  s.in_forward = true;
  if (trace_observer() == nullptr) s.release_unused_prefetches();
  if (const std::optional<size_t> u = s.root ? s.root : s.embed; u && !s.units[*u].vocab_parallel) gather_unit(s, *u);
}

void block_forward_begins(State& s, size_t u, bool reshard) {
  // A block running outside the model's forward would compute with embeddings that have no bytes.
  INGOT_CHECK(s.in_forward || (!s.root && !s.embed), "FullyShardedDataParallel: block '", s.units[u].name,
              "' ran outside the model's forward, or that forward does not run its forward hooks "
              "(nn::Module::with_forward_hooks, as models::GPT2 and Llama do): the embeddings are not gathered");
  // The embeddings were looked up; their backward reads no weights. A head still to be differentiated reads
  // tied ones.
  if (u == s.first_block && s.embed && s.heads_awaiting_backward == 0 && !s.units[*s.embed].vocab_parallel) {
    if (trace_observer() != nullptr) fsdp_traced::put_back(s, *s.embed);
    else s.release(s.units[*s.embed]);
  }
  gather_unit(s, u, reshard);
  if (trace_observer() == nullptr) s.prefetch(u + 1);  // Note [Eager prefetch]
}

// With reshard_after_forward the block's output gets the identity whose backward gathers it again (a no-op for a
// block kept gathered by keep_last_blocks, whose boundary still prefetches the block before it and, on the last
// block with tied embeddings, frees the embeddings the head read: Note [The last blocks kept], fsdp.h).
Tensor block_forward_ends(const StatePtr& weak, State& s, size_t u, bool reshard, const Tensor& out) {
  const bool boundary = s.options.reshard_after_forward;
  const bool grad = grad_enabled() && out.requires_grad();  // else no backward follows (eval)
  const bool last = u == s.last_block;
  const bool ends_head = last && s.head_reads_embed && grad && boundary;
  Tensor replaced;
  if (trace_observer() != nullptr) {
    replaced = fsdp_traced::forward_done(weak, u, reshard, out, ends_head);
  } else {
    if (!grad || reshard) s.release(s.units[u]);
    if (grad && boundary) {
      replaced = apply(std::make_shared<GatherBeforeBackwardPrim>(weak, u, ends_head), {out})[0];
      ++s.units[u].boundaries;
    }
  }
  if (!last) return replaced;
  // The head begins: kept from its forward until its gradients are reduced (its backward comes right after).
  if (s.head) gather_unit(s, *s.head);
  if (s.head_reads_embed) {
    gather_unit(s, *s.embed, false, /*fresh=*/true);
    if (grad) ++s.heads_awaiting_backward;
  }
  return replaced;
}

void model_forward_ends(const StatePtr& weak, State& s, const Tensor& out) {
  s.in_forward = false;
  const bool grad = grad_enabled() && out.requires_grad();
  // A block prefetched by a forward that did not run it (Note [Eager prefetch]) is not left gathered.
  if (trace_observer() == nullptr) s.release_unused_prefetches();
  for (const std::optional<size_t> u : {s.root, s.head, s.embed}) {
    if (!u || s.units[*u].vocab_parallel) continue;
    if (trace_observer() != nullptr) fsdp_traced::forward_done(weak, *u, false, out);
    else if (!grad) s.release(s.units[*u]);  // no backward follows (eval): nothing needs the weights any more
  }
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(nn::Module& model, std::shared_ptr<ProcessGroup> group,
                                                   FsdpOptions options) {
  INGOT_CHECK(group != nullptr, "FullyShardedDataParallel: a process group is required");
  INGOT_CHECK(options.root >= 0 && options.root < group->size(), "FullyShardedDataParallel: root must be in [0, ",
              group->size(), "), got ", options.root);
  INGOT_CHECK(options.keep_last_blocks >= 0, "FullyShardedDataParallel: keep_last_blocks must be >= 0, got ",
              options.keep_last_blocks);
  INGOT_CHECK(!options.reduce_dtype || is_floating(*options.reduce_dtype),
              "FullyShardedDataParallel: reduce_dtype must be a floating dtype, got ",
              dtype_name(*options.reduce_dtype));
  INGOT_CHECK(!options.reduce_wire_dtype ||
                  (is_floating(*options.reduce_wire_dtype) &&
                   (!options.reduce_dtype || itemsize(*options.reduce_wire_dtype) <= itemsize(*options.reduce_dtype))),
              "FullyShardedDataParallel: reduce_wire_dtype must be a floating dtype no wider than reduce_dtype, got ",
              dtype_name(options.reduce_wire_dtype.value_or(DType::f32)), " with reduce_dtype ",
              options.reduce_dtype ? dtype_name(*options.reduce_dtype) : "unset");
  auto st = std::make_shared<State>();
  st->group = group;
  st->options = options;
  std::map<const TensorImpl*, size_t> index;
  for (auto& [name, p] : model.named_parameters()) {
    INGOT_CHECK(p.requires_grad() && p.is_leaf() && p.is_contiguous() && is_floating(p.dtype()),
                "FullyShardedDataParallel: parameter '", name, "' must be a contiguous floating leaf with requires_grad");
    INGOT_CHECK(st->params.empty() || p.device() == st->params[0].device(),
                "FullyShardedDataParallel: parameter '", name, "' is on ", p.device().str(), " but '", st->names[0],
                "' is on ", st->params[0].device().str());
    if (!index.emplace(p.impl(), st->params.size()).second) continue;  // tied: the first name owns it
    st->params.push_back(p);
    st->names.push_back(name);
  }
  INGOT_CHECK(!st->params.empty(), "FullyShardedDataParallel: the model has no parameters");
  if (options.broadcast_parameters && group->size() > 1) {
    std::vector<std::shared_ptr<Work>> works;
    for (Tensor& p : st->params)
      if (has_bytes(p)) works.push_back(group->broadcast(p, options.root));  // Note [Parameters without bytes]
    for (auto& w : works) w->wait();
  }

  const std::vector<UnitGroup> groups = unit_groups(model, index, st->params.size());
  const int world = group->size(), rank = group->rank();
  st->unit_of.assign(st->params.size(), 0);
  for (const UnitGroup& grp : groups) {
    if (grp.members.empty()) continue;  // a part with no parameters of its own, or a block without weights
    Unit& u = st->units.emplace_back();
    u.name = grp.name;
    const Tensor& first = st->params[grp.members[0]];
    u.dtype = first.dtype();
    u.device = first.device();
    for (size_t i : grp.members) {
      INGOT_CHECK(st->params[i].dtype() == u.dtype, "FullyShardedDataParallel: unit '", u.name, "' mixes dtypes: '",
                  st->names[i], "' is ", dtype_name(st->params[i].dtype()), ", '", st->names[grp.members[0]], "' is ",
                  dtype_name(u.dtype), " (one unit is one flat buffer)");
      u.plan.params.push_back(i);
      u.plan.offsets.push_back(u.plan.numel);
      u.plan.numel += st->params[i].numel();
      st->unit_of[i] = st->units.size() - 1;
    }
    u.plan.padded_numel = (u.plan.numel + world - 1) / world * world;
    u.plan.dtype = u.dtype;
    // One unit's whole weights exist at a time here: a model built without bytes is never whole on this rank.
    u.storage = std::make_shared<Storage>();
    u.storage->nbytes = static_cast<size_t>(u.plan.padded_numel) * itemsize(u.dtype);
    u.storage->device = u.device;
    u.storage->data = allocator_for(u.device).allocate(u.storage->nbytes);
    Tensor full = u.flat();
    full.zero_();
    // The parameters become views of the unit's storage (same TensorImpl: every handle to them stays valid).
    for (size_t k = 0; k < u.plan.params.size(); ++k) {
      Tensor& p = st->params[u.plan.params[k]];
      if (has_bytes(p)) full.as_strided(p.shape(), p.strides(), u.plan.offsets[k]).copy_(p);
      p.impl()->storage = u.storage;
      p.impl()->offset = u.plan.offsets[k];
    }
    const int64_t chunk = u.plan.padded_numel / world;
    {
      const census::Owner owner("ZeRO-3: shards");
      u.shard = full.as_strided({chunk}, {1}, rank * chunk).clone_raw();
    }
    u.shard.set_requires_grad(true);
    st->release(u);
    st->plans.push_back(u.plan);
    const size_t at = st->units.size() - 1;
    if (grp.role == Role::Root) st->root = at;
    else if (grp.role == Role::Embed) st->embed = at;
    else if (grp.role == Role::Head) st->head = at;
    else {
      st->first_block = st->first_block.value_or(at);
      st->last_block = at;
    }
  }
  st->head_reads_embed = st->embed && reads_embeddings(*st, groups);
  st->ready.assign(st->params.size(), false);
  st->reset_round();
  state_ = st;
  for (const UnitGroup& grp : groups)
    if (grp.role == Role::Embed) fsdp_vocab::enable_if_eligible(st, grp.table);

  // Hooks: forward ones on the model and the blocks, post-accumulate ones on every parameter.
  const StatePtr weak = st;
  model.register_forward_pre_hook([weak] {
    if (auto s = weak.lock(); s && s->active) model_forward_begins(*s);
  });
  model.register_forward_hook([weak](const Tensor& out) -> Tensor {
    if (auto s = weak.lock(); s && s->active) model_forward_ends(weak, *s, out);
    return Tensor();
  });
  for (const UnitGroup& grp : groups) {
    if (grp.role != Role::Block || grp.members.empty()) continue;
    const size_t u = st->unit_of[grp.members[0]];
    // Note [The last blocks kept] (fsdp.h).
    const bool reshard = options.reshard_after_forward &&
                         u + static_cast<size_t>(options.keep_last_blocks) <= *st->last_block;
    grp.module->register_forward_pre_hook([weak, u, reshard] {
      if (auto s = weak.lock(); s && s->active) block_forward_begins(*s, u, reshard);
    });
    grp.module->register_forward_hook([weak, u, reshard](const Tensor& out) -> Tensor {
      auto s = weak.lock();
      return s && s->active ? block_forward_ends(weak, *s, u, reshard, out) : Tensor();
    });
  }
  for (size_t i = 0; i < st->params.size(); ++i)
    st->params[i].register_post_accumulate_grad_hook([weak, i](Tensor&) {
      auto s = weak.lock();
      if (!s || !s->active) return;
      if (trace_observer() != nullptr) fsdp_traced::on_grad(*s, i);
      else s->on_grad(i);
    });
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;

std::vector<Tensor> FullyShardedDataParallel::optimizer_params() const {
  std::vector<Tensor> out;
  for (const Unit& u : state_->units) out.push_back(u.shard);
  return out;
}

void FullyShardedDataParallel::gather_from_masters(const std::vector<Tensor>& masters) {
  State& s = *state_;
  INGOT_CHECK(masters.size() == s.units.size(), "FullyShardedDataParallel::gather_from_masters: ", masters.size(),
              " masters given for ", s.units.size(), " units");
  for (size_t k = 0; k < s.units.size(); ++k) {
    Unit& u = s.units[k];
    const Tensor& m = masters[k];
    INGOT_CHECK(m.defined() && m.dtype() == DType::f32 && m.numel() == u.shard.numel() && m.is_contiguous() &&
                    m.device() == u.device,
                "FullyShardedDataParallel::gather_from_masters: unit '", u.name, "' needs a contiguous f32 master of ",
                u.shard.numel(), " elements on ", u.device.str(), " (optimizer_params()'s layout)");
    INGOT_CHECK(!u.gathered, "FullyShardedDataParallel::gather_from_masters: unit '", u.name, "' is gathered");
    u.master = m;
    u.shard.storage()->data.reset();
  }
}

void FullyShardedDataParallel::synchronize() {
  State& s = *state_;
  INGOT_CHECK(s.active, "FullyShardedDataParallel: synchronize() after unshard()");
  if (trace_observer() != nullptr) {
    fsdp_traced::synchronize(s);
    return;
  }
  if (!s.round_active) return;
  // Parameters without a gradient this round (unused in this forward) contribute zeros.
  for (size_t i = 0; i < s.params.size(); ++i)
    if (!s.ready[i] && !s.units[s.unit_of[i]].vocab_parallel) s.on_grad(i);
  INGOT_INTERNAL_CHECK(s.next_issue == s.units.size(), "not every unit was reduced");
  std::exception_ptr first_error;
  for (Unit& u : s.units) {
    if (!u.work) continue;  // vocabulary-parallel: nothing was reduced
    try {
      u.work->wait();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) {
    s.reset_round();
    std::rethrow_exception(first_error);
  }
  s.release_unused_prefetches();  // the backward is over (Note [Eager prefetch])
  NoGradGuard no_grad;
  for (Unit& u : s.units) {
    // to() of the same dtype is the tensor itself.
    Tensor g = u.vocab_parallel ? s.vocab_shard_grad(u) : u.shard_grad.to(s.grad_dtype(u));
    // Gradient accumulation: every backward reduces, its averages add up in the shard's .grad.
    u.shard.set_grad(u.shard.grad().defined() ? add(u.shard.grad(), g) : g);
  }
  s.reset_round();
}

void FullyShardedDataParallel::update_in_backward(std::function<void(size_t unit)> update, int lag) {
  INGOT_CHECK(lag >= 1, "FullyShardedDataParallel::update_in_backward: lag ", lag, " (each unit's reduction is waited for ",
              "at least one unit later)");
  state_->update_unit = std::move(update);
  state_->update_lag = lag;
}

void FullyShardedDataParallel::zero_grad() {
  for (Unit& u : state_->units) u.shard.zero_grad();
}

const std::vector<BucketPlan>& FullyShardedDataParallel::layout() const { return state_->plans; }

std::optional<size_t> FullyShardedDataParallel::vocab_parallel_table() const {
  const State& s = *state_;
  if (!s.embed || !s.units[*s.embed].vocab_parallel) return std::nullopt;
  return s.units[*s.embed].plan.params[0];
}

int64_t FullyShardedDataParallel::peak_gathered_bytes() const { return state_->peak_gathered_bytes; }
int64_t FullyShardedDataParallel::peak_reducing_bytes() const { return state_->peak_reducing_bytes; }
void FullyShardedDataParallel::reset_peaks() {
  state_->peak_gathered_bytes = state_->gathered_bytes;
  state_->peak_reducing_bytes = state_->reducing_bytes;
}

void FullyShardedDataParallel::load_shards(
    const std::function<void(size_t param, int64_t begin, int64_t end, Tensor& dst)>& read) {
  State& s = *state_;
  INGOT_CHECK(s.active, "FullyShardedDataParallel: load_shards() after unshard()");
  INGOT_CHECK(s.units.empty() || !s.units[0].master.defined(),
              "FullyShardedDataParallel: load_shards() after gather_from_masters(): the shards hold no values, load "
              "before making the masters (Note [Shards cast from their masters])");
  const int world = s.group->size(), rank = s.group->rank();
  NoGradGuard no_grad;
  for (Unit& u : s.units) {
    INGOT_CHECK(!u.gathered, "FullyShardedDataParallel: load_shards() while unit '", u.name, "' is gathered");
    const int64_t chunk = u.plan.padded_numel / world, start = rank * chunk;
    for (size_t k = 0; k < u.plan.params.size(); ++k) {
      const size_t i = u.plan.params[k];
      const int64_t lo = std::max(start, u.plan.offsets[k]);
      const int64_t hi = std::min(start + chunk, u.plan.offsets[k] + s.params[i].numel());
      if (lo >= hi) continue;
      Tensor dst = u.shard.as_strided({hi - lo}, {1}, u.shard.offset() + (lo - start));
      read(i, lo - u.plan.offsets[k], hi - u.plan.offsets[k], dst);
    }
  }
}

Tensor FullyShardedDataParallel::gather_param(size_t i, const std::vector<Tensor>& shards, int root) const {
  State& s = *state_;
  const int world = s.group->size(), rank = s.group->rank();
  INGOT_CHECK(i < s.params.size(), "FullyShardedDataParallel::gather_param: parameter ", i, " of ", s.params.size());
  INGOT_CHECK(shards.size() == s.units.size(), "FullyShardedDataParallel::gather_param: ", shards.size(),
              " shards given for ", s.units.size(), " units");
  INGOT_CHECK(0 <= root && root < world, "FullyShardedDataParallel::gather_param: root ", root, " of ", world);
  const Unit& u = s.units[s.unit_of[i]];
  const Tensor& shard = shards[s.unit_of[i]];
  const int64_t chunk = u.plan.padded_numel / world;
  INGOT_CHECK(shard.numel() == chunk && shard.is_contiguous(), "FullyShardedDataParallel::gather_param: unit '",
              u.name, "' needs a contiguous shard of ", chunk, " elements, got ", shard.numel());
  const size_t k = std::find(u.plan.params.begin(), u.plan.params.end(), i) - u.plan.params.begin();
  const Tensor& p = s.params[i];
  const int64_t begin = u.plan.offsets[k], end = begin + p.numel();
  NoGradGuard no_grad;
  Tensor full = rank == root ? empty({p.numel()}, shard.dtype(), shard.device()) : Tensor();
  // Rank r owns [r * chunk, (r + 1) * chunk) of the unit: each owner of a piece sends it straight into `full`.
  for (int r = static_cast<int>(begin / chunk); r < world && r * chunk < end; ++r) {
    const int64_t lo = std::max(begin, r * chunk), hi = std::min(end, (r + 1) * chunk);
    if (lo >= hi) continue;
    Tensor piece;
    if (rank == root) piece = full.as_strided({hi - lo}, {1}, lo - begin);
    else if (rank == r) piece = shard.as_strided({hi - lo}, {1}, shard.offset() + (lo - r * chunk));
    else piece = empty({hi - lo}, shard.dtype(), shard.device());
    if (r == root) {
      if (rank == root) piece.copy_(shard.as_strided({hi - lo}, {1}, shard.offset() + (lo - r * chunk)));
      continue;  // nobody else needs it
    }
    s.group->broadcast(piece, r)->wait();
  }
  return rank == root ? full.as_strided(p.shape(), contiguous_strides(p.shape()), 0) : Tensor();
}

void FullyShardedDataParallel::unshard() {
  State& s = *state_;
  INGOT_CHECK(s.active, "FullyShardedDataParallel: unshard() called twice");
  fsdp_vocab::disable(s);
  for (Unit& u : s.units) {
    s.gather(u);
    for (size_t i : u.plan.params) {
      Tensor own = s.params[i].clone_raw();
      s.params[i].impl()->storage = own.storage();
      s.params[i].impl()->offset = own.offset();
    }
    s.release(u);
  }
  s.active = false;
}

}  // namespace ingot::distributed
