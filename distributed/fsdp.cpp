// FullyShardedDataParallel: units, their flat storages, the forward hooks that gather them, the boundary that
// gathers again before a block's backward, and the per-unit reduce-scatters. See fsdp.h for the protocol.
#include "distributed/fsdp.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "autograd/nn/module.h"
#include "autograd/ops.h"
#include "autograd/primitive.h"
#include "distributed/fsdp_compiled.h"
#include "distributed/fsdp_state.h"

namespace ingot::distributed {

using fsdp_detail::Unit;

namespace {

using StatePtr = std::weak_ptr<FullyShardedDataParallel::State>;

// Identity on a block's output whose backward gathers the block's weights before any of the block's own
// backward nodes runs (they all receive their gradients through it; the engine runs it first).
class GatherBeforeBackwardPrim final : public Primitive {
 public:
  GatherBeforeBackwardPrim(StatePtr state, size_t unit) : state_(std::move(state)), unit_(unit) {}
  std::string_view name() const override { return "fsdp_gather_before_backward"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[0]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    return {in[0].as_strided(in[0].shape(), in[0].strides(), in[0].offset())};
  }
  std::vector<Tensor> vjp(const VjpContext&, const std::vector<Tensor>& cot) const override {
    if (auto s = state_.lock(); s && s->active) s->gather(s->units[unit_]);
    return {cot[0]};
  }
  bool saves_input(size_t) const override { return false; }
  bool equivalent(const Primitive&) const override { return false; }

 private:
  StatePtr state_;
  size_t unit_;
};

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(nn::Module& model, std::shared_ptr<ProcessGroup> group,
                                                   FsdpOptions options) {
  INGOT_CHECK(group != nullptr, "FullyShardedDataParallel: a process group is required");
  INGOT_CHECK(options.root >= 0 && options.root < group->size(), "FullyShardedDataParallel: root must be in [0, ",
              group->size(), "), got ", options.root);
  INGOT_CHECK(!options.reduce_dtype || is_floating(*options.reduce_dtype),
              "FullyShardedDataParallel: reduce_dtype must be a floating dtype, got ",
              dtype_name(*options.reduce_dtype));
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
    for (Tensor& p : st->params) works.push_back(group->broadcast(p, options.root));
    for (auto& w : works) w->wait();
  }

  // Units: the children of every ModuleList not inside another unit, then the root (what is left).
  std::vector<std::pair<std::string, nn::Module*>> blocks;
  for (auto& [name, m] : model.named_modules()) {
    bool nested = false;
    for (const auto& [unit_name, _] : blocks) nested = nested || name.rfind(unit_name + ".", 0) == 0;
    if (nested || !dynamic_cast<nn::ModuleList*>(m.get())) continue;
    for (auto& [child, c] : m->named_children()) blocks.emplace_back(name + "." + child, c.get());
  }
  std::vector<std::vector<size_t>> members(blocks.size() + 1);
  std::vector<bool> claimed(st->params.size(), false);
  for (size_t b = 0; b < blocks.size(); ++b)
    for (auto& [_, p] : blocks[b].second->named_parameters()) {
      const size_t i = index.at(p.impl());
      if (claimed[i]) continue;
      claimed[i] = true;
      members[b + 1].push_back(i);
    }
  for (size_t i = 0; i < st->params.size(); ++i)
    if (!claimed[i]) members[0].push_back(i);

  const int world = group->size(), rank = group->rank();
  st->unit_of.assign(st->params.size(), 0);
  for (size_t k = 0; k < members.size(); ++k) {
    if (members[k].empty()) continue;  // a root with nothing outside the blocks, or a block without weights
    Unit& u = st->units.emplace_back();
    u.name = k == 0 ? "root" : blocks[k - 1].first;
    const Tensor& first = st->params[members[k][0]];
    u.dtype = first.dtype();
    u.device = first.device();
    for (size_t i : members[k]) {
      INGOT_CHECK(st->params[i].dtype() == u.dtype, "FullyShardedDataParallel: unit '", u.name, "' mixes dtypes: '",
                  st->names[i], "' is ", dtype_name(st->params[i].dtype()), ", '", st->names[members[k][0]], "' is ",
                  dtype_name(u.dtype), " (one unit is one flat buffer)");
      u.plan.params.push_back(i);
      u.plan.offsets.push_back(u.plan.numel);
      u.plan.numel += st->params[i].numel();
      st->unit_of[i] = st->units.size() - 1;
    }
    u.plan.padded_numel = (u.plan.numel + world - 1) / world * world;
    u.plan.dtype = u.dtype;
    u.storage = std::make_shared<Storage>();
    u.storage->nbytes = static_cast<size_t>(u.plan.padded_numel) * itemsize(u.dtype);
    u.storage->device = u.device;
    u.storage->data = allocator_for(u.device).allocate(u.storage->nbytes);
    Tensor full = u.flat();
    full.zero_();
    // The parameters become views of the unit's storage (same TensorImpl: every handle to them stays valid).
    for (size_t k = 0; k < u.plan.params.size(); ++k) {
      Tensor& p = st->params[u.plan.params[k]];
      full.as_strided(p.shape(), p.strides(), u.plan.offsets[k]).copy_(p);
      p.impl()->storage = u.storage;
      p.impl()->offset = u.plan.offsets[k];
    }
    const int64_t chunk = u.plan.padded_numel / world;
    u.shard = full.as_strided({chunk}, {1}, rank * chunk).clone_raw();
    u.shard.set_requires_grad(true);
    st->release(u);
    st->plans.push_back(u.plan);
  }
  st->ready.assign(st->params.size(), false);
  st->reset_round();
  state_ = st;

  // Hooks: forward ones on the root module and the blocks, post-accumulate ones on every parameter.
  const StatePtr weak = st;
  auto unit_index = [&](const std::string& name) {
    for (size_t u = 0; u < st->units.size(); ++u)
      if (st->units[u].name == name) return std::optional<size_t>(u);
    return std::optional<size_t>();
  };
  const bool reshard = options.reshard_after_forward;
  const std::optional<size_t> root = unit_index("root");
  auto hook_unit = [&](nn::Module& m, size_t u, bool is_root) {
    m.register_forward_pre_hook([weak, u, is_root, root, reshard] {
      auto s = weak.lock();
      if (!s || !s->active) return;
      if (trace_observer() != nullptr) {  // Note [ZeRO-3 in a traced step] (fsdp_compiled.cpp)
        fsdp_traced::gather(*s, u, reshard && !is_root);
        return;
      }
      // A block running before the root was gathered would compute with embeddings that have no bytes.
      INGOT_CHECK(is_root || !root || s->units[*root].gathered, "FullyShardedDataParallel: block '", s->units[u].name,
                  "' ran outside the model's forward, or that forward does not run its forward hooks "
                  "(nn::Module::with_forward_hooks, as models::GPT2 and Llama do): the root unit is not gathered");
      s->gather(s->units[u]);
    });
    m.register_forward_hook([weak, u, is_root, reshard](const Tensor& out) -> Tensor {
      auto s = weak.lock();
      if (!s || !s->active) return Tensor();
      if (trace_observer() != nullptr) return fsdp_traced::forward_done(weak, u, reshard && !is_root, out);
      Unit& unit = s->units[u];
      // No backward follows a forward without gradients (eval): nothing needs the weights any more.
      if (!grad_enabled() || !out.requires_grad()) {
        s->release(unit);
        return Tensor();
      }
      if (is_root || !reshard) return Tensor();  // kept until its gradients are reduced
      s->release(unit);
      return apply(std::make_shared<GatherBeforeBackwardPrim>(weak, u), {out})[0];
    });
  };
  if (root) hook_unit(model, *root, true);
  for (auto& [name, m] : blocks)
    if (auto u = unit_index(name)) hook_unit(*m, *u, false);
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
    if (!s.ready[i]) s.on_grad(i);
  INGOT_INTERNAL_CHECK(s.next_issue == s.units.size(), "not every unit was reduced");
  std::exception_ptr first_error;
  for (Unit& u : s.units) {
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
  NoGradGuard no_grad;
  for (Unit& u : s.units) {
    Tensor g = u.shard_grad.dtype() == u.dtype ? u.shard_grad : u.shard_grad.to(u.dtype);
    // Gradient accumulation: every backward reduces, its averages add up in the shard's .grad.
    u.shard.set_grad(u.shard.grad().defined() ? add(u.shard.grad(), g) : g);
  }
  s.reset_round();
}

void FullyShardedDataParallel::zero_grad() {
  for (Unit& u : state_->units) u.shard.zero_grad();
}

const std::vector<BucketPlan>& FullyShardedDataParallel::layout() const { return state_->plans; }

void FullyShardedDataParallel::load_shards(
    const std::function<void(size_t param, int64_t begin, int64_t end, Tensor& dst)>& read) {
  State& s = *state_;
  INGOT_CHECK(s.active, "FullyShardedDataParallel: load_shards() after unshard()");
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
