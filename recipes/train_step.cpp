#include "recipes/train_step.h"

#include <cmath>
#include <functional>
#include <ostream>

#include "optim/clip.h"
#include "recipes/compiled_step.h"
#include "recipes/data_parallel.h"

namespace ingot::recipes {

TrainStep::TrainStep(const TrainStepParts& parts, const CompileSettings& c, std::ostream& log)
    : p_(parts), sharded_(parts.dp && parts.dp->sharded()) {
  // Under DDP the bucket all-reduces (ZeRO-1/2: reduce-scatters and all-gathers) are nodes of the compiled
  // graph (Note [DDP in a traced step], distributed/ddp.cpp).
  if (c.enabled) {
    CompileOptions o = compile_options(c, p_.opts.optimizer_in_backward && !p_.dp);
    // Offloaded state (Note [Optimizer state offloaded]) is bound just in time in a compiled step, which needs it to
    // exist when the step is traced: a fresh run's first step (which makes it) runs eagerly, the second traces.
    if (p_.opts.optimizer_offload && p_.opt.offload()) o.stance = Stance::EagerThenCompile;
    compiled_ = compile([this](const std::vector<Tensor>& b) { return body(b, true); }, o);
    log << "compile | mode " << c.mode << ": the "
        << (o.stance == Stance::EagerThenCompile ? "second step (the first runs eagerly: it makes the offloaded state)"
                                                 : "first step")
        << " traces and compiles the whole training step\n";
  }
  // Note [Updates in the backward] (distributed/fsdp_compiled.cpp): the shard whose gradient was just reduced is
  // the only one with a .grad, so the optimizer's step updates it alone (recipes/train_loop.cpp refuses what this
  // cannot do: clipping, accumulation, f32 masters, f16's skipped steps, an eager ZeRO-3 step).
  if (p_.opts.optimizer_in_backward && !p_.dp) {
    update_each_parameter_in_backward();
    log << "optimizer | updated in the backward: each parameter as soon as its gradient is complete "
           "(train.optimizer_in_backward)\n";
  } else if (p_.opts.optimizer_in_backward) {
    INGOT_INTERNAL_CHECK(c.enabled && p_.dp->zero_stage() == 3 && !p_.masters,
                         "train.optimizer_in_backward without a compiled ZeRO-3 step over the shards themselves");
    // The last units' updates (compile.unit_reduction_lag of them) stay for the step after the backward.
    p_.dp->update_in_backward(
        [this](size_t) {
          p_.opt.step();
          p_.opt.zero_grad();
        },
        static_cast<int>(c.unit_reduction_lag));
    log << "optimizer | updated in the backward: each unit's shard as soon as its gradient is reduced "
           "(train.optimizer_in_backward)\n";
  }
}

TrainStep::~TrainStep() = default;

// Note [Each parameter updated in its backward]
// One process, train.optimizer_in_backward: a post-accumulate hook on every parameter the optimizer updates runs
// its step as soon as the engine has summed all of that parameter's gradient (autograd/engine.cpp counts a leaf's
// uses, so a tied weight's hook runs once, with the total), then drops the gradient. At most the gradients of the
// parameters whose backward is under way are alive, never all of them: an 8B full fine-tune's 16 GB of bf16
// gradients held for an update after the backward. A step traced for compiling records the same order, one update
// per parameter in the backward; the compile options ask for the update split per parameter
// (compile/passes/split_update.cpp) so that horizontal fusion does not merge them back into one update after the
// backward, and one-GPU graphs keep the trace order (compile/passes/schedule.cpp). Each parameter's update is the one
// it would get after the backward (AdamW's and AdamW8bit's are per element, each parameter counts its own steps).
// The hooks hold the step's state weakly: they do nothing once this TrainStep is gone.
void TrainStep::update_each_parameter_in_backward() {
  in_backward_ = true;
  hook_owner_ = std::make_shared<optim::Optimizer*>(&p_.opt);
  std::weak_ptr<optim::Optimizer*> owner = hook_owner_;
  const std::vector<Tensor>& params = p_.opt.params();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor param = params[i];
    param.register_post_accumulate_grad_hook([owner, i](Tensor&) {
      if (const std::shared_ptr<optim::Optimizer*> held = owner.lock()) {
        optim::Optimizer& opt = **held;
        opt.restore_state(i);  // offloaded state (Note [Optimizer state offloaded]): to the GPU and back
        if (TraceObserver* obs = trace_observer(); obs && opt.offload()) {
          // A compiled step binds it just in time for its update, as this does (Note [Inputs bound just in time]).
          const std::vector<Tensor> state = opt.offloaded_state(i);
          if (!state.empty()) {
            auto bind = [owner, i] {
              const std::shared_ptr<optim::Optimizer*> o = owner.lock();
              INGOT_CHECK(o, "the compiled training step outlived its optimizer");
              (*o)->restore_state(i);
              return (*o)->offloaded_state(i);
            };
            auto done = [owner, i] {
              if (const std::shared_ptr<optim::Optimizer*> o = owner.lock()) (*o)->offload_state(i);
            };
            INGOT_CHECK(obs->on_inputs_bound_just_in_time(state, bind, done),
                        "train.optimizer_offload: a compiled step with graph breaks cannot bind the offloaded state "
                        "(compile.fullgraph=true names the break)");
          }
        }
        opt.step();
        opt.zero_grad();
        opt.offload_state(i);
      }
    });
  }
}

TrainStep::Result TrainStep::run(const std::vector<Tensor>& batch) {
  Result r;
  r.loss_scale = p_.scaler ? p_.scaler->scale() : 0;
  const std::vector<Tensor> out = compiled_ ? (*compiled_)(batch) : body(batch, false);
  r.loss = out[0];
  if (out.size() > 1) r.norm = out[1];
  // A compiled step never measures the norm on the host (the trace ran body with traced = true).
  r.host_norm = compiled_ ? -1 : host_norm_;
  r.skipped = skipped_;
  return r;
}

// Under DDP: the micro-steps before the last accumulate locally (no_sync), the last one's backward reduces
// the gradient buckets; ZeRO-1/2 then update this rank's shards and all-gather them into the parameters.
// ZeRO-3 reduce-scatters every micro-step and updates the shards, which the next forward gathers.
// Token weights (data parallel with task.loss_tokens): each micro-batch's rank-local mean is weighed by
// world * local / global loss targets, so DDP's average over ranks is the global token mean. They change
// every step, so they travel as the batch's last tensor, an input of the compiled graph rather than a
// constant baked into it.
std::vector<Tensor> TrainStep::body(const std::vector<Tensor>& batch, bool traced) {
  const TrainOptions& o = p_.opts;
  TrainTask& task = p_.task;
  DataParallel* dp = p_.dp;
  optim::LossScaler* scaler = p_.scaler;
  const double inv_accum = 1.0 / static_cast<double>(o.grad_accum);
  const int64_t per_micro = task.positions ? 3 : 2;
  Tensor total, norm;
  const bool weighted = static_cast<int64_t>(batch.size()) > per_micro * o.grad_accum;
  for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
    const size_t at = static_cast<size_t>(per_micro * micro);
    Tensor loss = task.loss({batch[at], batch[at + 1], task.positions ? batch[at + 2] : Tensor()});
    // Gradients of the mean over micro-batches; with one micro-batch the loss is used as is.
    Tensor scaled = weighted          ? loss * reshape(narrow(batch.back(), 0, micro, 1), {})
                    : o.grad_accum > 1 ? loss * inv_accum
                                       : loss;
    // f16: backward runs on the loss times the loss scale; the update divides it out again.
    Tensor backward_of = scaler ? scaled * scaler->scale() : scaled;
    // Offloaded state: the last step's last copies back ran beside this forward; their buffers go before the backward.
    if (in_backward_) {
      p_.opt.release_offload_copies();
      // A compiled step does the same, and at its end what finish_offload does below (Note [Inputs bound just in
      // time]); one traced micro-step registers both.
      if (TraceObserver* obs = trace_observer(); obs && micro == 0 && p_.opt.offload()) {
        std::weak_ptr<optim::Optimizer*> owner = hook_owner_;
        INGOT_CHECK(obs->on_run_host_work(
                        [owner] {
                          if (auto o = owner.lock()) (*o)->release_offload_copies();
                        },
                        [owner] {
                          if (auto o = owner.lock()) (*o)->finish_offload();
                        }),
                    "train.optimizer_offload: a compiled step with graph breaks cannot move the offloaded state "
                    "(compile.fullgraph=true names the break)");
      }
    }
    if (dp) dp->backward(backward_of, micro + 1 == o.grad_accum);
    else backward_of.backward();
    total = total.defined() ? total + scaled.detach() : scaled.detach();
  }
  if (dp) dp->synchronize();
  // Offloaded state (Note [Optimizer state offloaded]): the next step's first copies in start beside its forward
  // (this step's last copies back may run on; a checkpoint's state_dict waits for them).
  if (in_backward_) p_.opt.finish_offload();
  if (p_.masters) p_.masters->copy_grads_to_master();
  if (traced && o.grad_clip > 0) {
    // ZeRO-1/2: the norm of every rank's shards, summed across ranks inside the graph.
    std::function<Tensor(const Tensor&)> global;
    if (sharded_) global = [dp](const Tensor& sq) { return dp->sum_tensor(sq); };
    norm = optim::clip_grad_norm_tensor(p_.opt_params, o.grad_clip, global);
  } else if (!traced && in_backward_) {
    host_norm_ = -1;  // each gradient was dropped after its update: no norm to measure
  } else if (!traced) {
    const double loss_scale = scaler ? scaler->scale() : 1.0;
    host_norm_ = optim::grad_norm(p_.opt_params) / loss_scale;
    // ZeRO-1/2/3: each rank holds the gradient of its shards only; the global norm sums their squares.
    if (sharded_) host_norm_ = std::sqrt(dp->sum(host_norm_ * host_norm_));
    const double clip = o.grad_clip > 0 ? optim::clip_coefficient(host_norm_, o.grad_clip) : 1.0;
    if (clip != 1.0 || scaler) p_.opt.set_grad_scale(clip / loss_scale);
    // f16: a gradient that overflowed (an inf or NaN norm, the same on every rank) skips the update.
    skipped_ = scaler && !scaler->update(std::isfinite(host_norm_));
  }
  if (!skipped_ && !in_backward_) p_.opt.step();  // in the backward: every parameter was updated there
  p_.opt.zero_grad();
  if (p_.masters) {
    p_.masters->copy_to_model();
    task.model->zero_grad();
  }
  if (dp) {
    dp->after_step();
    dp->zero_grad();
  }
  return norm.defined() ? std::vector<Tensor>{total, norm} : std::vector<Tensor>{total};
}

}  // namespace ingot::recipes
