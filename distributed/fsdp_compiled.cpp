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
//   synchronize()      per unit, last first (the order eager ZeRO-3 issues them in): the parameters' .grad that
//                      the trace accumulated, flattened and concatenated in the unit's padded layout, cast to
//                      reduce_dtype, reduce_scatter_unit_start + wait and cast back: this rank's averaged chunk,
//                      added into the shard's .grad; the whole .grad tensors are dropped (grad none: no whole
//                      gradient leaves the step)
// The optimizer then updates the shards (or their f32 masters) exactly as after eager ZeRO-3. No parameter is
// ever read as a graph input: the compiled step's inputs are the shards, never the whole weights, and its only
// whole weights are the gathered values, which the executor frees after their last reader.
// reshard_after_forward: the trace records one gather per unit and forward; the gather is marked regather and
// compile/passes/unit_gathers.cpp gives the backward readers a gather of their own, and orders every unit
// gather after the previous unit's (prefetch one unit ahead). The root unit (embeddings, final norm, head) is
// kept from its forward to its backward, as eagerly. The traced (first) step itself keeps every gathered unit
// until its reduction, as eager ZeRO-3 with reshard_after_forward=false would.
#include "distributed/fsdp_compiled.h"

#include "autograd/ops.h"
#include "distributed/collective_ops.h"
#include "distributed/fsdp_state.h"

namespace ingot::distributed::fsdp_traced {

using State = FullyShardedDataParallel::State;

void gather(State& s, size_t unit, bool regather) {
  State::Unit& u = s.units[unit];
  if (!u.traced.defined()) {
    UnitCollectiveAttrs attrs{static_cast<int32_t>(unit), u.name, regather};
    u.traced = collective_wait(all_gather_unit_start(u.shard, s.group, std::move(attrs)));
  }
  for (size_t k = 0; k < u.plan.params.size(); ++k) {
    Tensor& p = s.params[u.plan.params[k]];
    const Tensor v = reshape(narrow(u.traced, 0, u.plan.offsets[k], p.numel()), p.shape());
    INGOT_INTERNAL_CHECK(v.storage() == u.traced.storage() && v.strides() == p.strides(),
                         "FSDP trace: the view of '", s.names[u.plan.params[k]], "' is not an alias of its unit");
    p.impl()->storage = v.storage();
    p.impl()->offset = v.offset();
  }
}

void forward_done(State& s, size_t unit, bool backward_follows) {
  State::Unit& u = s.units[unit];
  for (size_t k = 0; k < u.plan.params.size(); ++k) {
    Tensor& p = s.params[u.plan.params[k]];
    p.impl()->storage = u.storage;
    p.impl()->offset = u.plan.offsets[k];
  }
  if (!backward_follows) u.traced = Tensor();
}

void synchronize(State& s) {
  for (size_t j = s.units.size(); j-- > 0;) {
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
    flat = cast(flat, s.options.reduce_dtype.value_or(u.dtype));  // the tensor itself when already that dtype
    UnitCollectiveAttrs attrs{static_cast<int32_t>(j), u.name, false};
    const Tensor avg = cast(collective_wait(reduce_scatter_unit_start(flat, s.group, std::move(attrs))), u.dtype);
    // Gradient accumulation: every backward reduces, its averages add up in the shard's .grad (as eagerly).
    u.shard.set_grad(u.shard.grad().defined() ? add(u.shard.grad(), avg) : avg);
    for (size_t i : u.plan.params) s.params[i].zero_grad();
    u.traced = Tensor();
  }
}

}  // namespace ingot::distributed::fsdp_traced
