// Optimizers over a list of parameter tensors (leaves). step() updates, in place, every parameter that has a
// defined .grad, with one fused multi-tensor kernel launch (runtime/kernels/kernel_list.inc); parameters
// without a gradient are skipped and their state is left alone (PyTorch semantics). All parameters live on
// one device and are contiguous; optimizer state is f32 on that device (AdamW8bit: 8-bit codes and f32 block scales).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace ingot::kernels {
struct AdamWArgs;
}

namespace ingot::optim {

struct OffloadCopies;  // Note [Optimizer state offloaded] (optim/optimizer.cpp)

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer();
  virtual void step() = 0;
  void zero_grad();  // drops every parameter's .grad
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  int64_t step_count() const { return step_count_; }  // completed step() calls
  // Multiplies the gradients by `s` inside the next step() only (gradient clipping, loss-scale unscaling)
  // without touching the .grad tensors.
  void set_grad_scale(double s) { grad_scale_ = s; }
  const std::vector<Tensor>& params() const { return params_; }

  // Everything needed to resume exactly: "step" (i64 scalar) plus per-parameter state named
  // "<index>.<state>" by parameter index (e.g. "3.exp_avg"). Tensors are handles to the live state.
  virtual std::map<std::string, Tensor> state_dict() const;
  // Copies state in; names, shapes and parameter indices must match what state_dict() would give.
  virtual void load_state_dict(const std::map<std::string, Tensor>& sd);
  // state_dict() with every per-parameter buffer shaped like its parameter, so that ZeRO can cut, gather and
  // scatter it element by element (AdamW8bit's codes come in blocks: Note [8-bit state element by element]);
  // load_state_dict() takes it back.
  virtual std::map<std::string, Tensor> element_state_dict() const { return state_dict(); }
  // For an optimizer that only carries state between a checkpoint and the shards (it never steps): later
  // load_state_dict() calls keep what they are given as it is (AdamW8bit: f32 moments stay f32).
  virtual void hold_loaded_state() {}

  // Note [Optimizer state offloaded] (optim/optimizer.cpp): with offloading on, the state of each parameter on a GPU
  // lives in page-locked host memory between its updates: restore_state(i) brings parameter i's to the GPU before
  // its step, offload_state(i) returns it after. Turned on before any state exists or is loaded.
  void set_offload(bool on) { offload_ = on; }
  bool offload() const { return offload_; }
  void restore_state(size_t index);
  void offload_state(size_t index);
  // Parameter `index`'s offloaded state as restore_state() left it on the GPU, by name (empty when not offloaded or
  // not made yet): what a compiled step binds for its update (Note [Inputs bound just in time], compile/ir/graph.h).
  std::vector<Tensor> offloaded_state(size_t index) const;
  // At a step's end: starts copying in the next step's first parameters' state (each after its copy back).
  void finish_offload();
  // Frees the GPU buffers of the copies back still running (a step's last ones, run on into the next forward) once
  // the current stream has waited for them on the GPU: before the backward, whose peak they would add to.
  void release_offload_copies();
  // Waits for every copy back to the host that offload_state() left running: before the host buffers are read
  // (state_dict) or replaced (load_state_dict), which call it. Cheap when nothing is pending.
  void settle_offload() const;

 protected:
  // Where state loaded or re-encoded for parameter `index` goes: page-locked host memory when offloading a GPU
  // parameter's state, else the parameter's device. place_state() puts `t` there under `name`.
  bool state_on_host(size_t index) const { return offload_ && params_[index].device().is_cuda(); }
  void place_state(size_t index, const std::string& name, const Tensor& t);
  // The shape and dtype that load_state_dict() requires of state `name` of parameter `index`, for state that is
  // neither shaped like its parameter nor a scalar (8-bit codes); nullopt: the parameter's shape or a scalar.
  virtual std::optional<std::pair<Shape, DType>> state_layout(size_t index, const std::string& name) const;
  // Indices of the parameters that have a gradient this step.
  std::vector<size_t> params_with_grad() const;
  // Per-parameter state slot (created zero-filled like the parameter, f32) named e.g. "exp_avg".
  Tensor& state(size_t index, const std::string& name);
  bool has_state(size_t index, const std::string& name) const;
  // Consumes the one-shot grad scale and bumps the step counter; call once per step().
  double begin_step();
  // Outside a trace, for optimizers with a per-parameter "step" state (AdamW, AdamW8bit): advances the step count of
  // every parameter with a gradient and groups them by the step each now takes (all equal unless some missed a
  // step), so each group is one kernel launch with its own bias correction.
  std::map<int64_t, std::vector<size_t>> advance_step_groups();
  // Under a trace (optim/fused_update.h), for optimizers with a per-parameter "step" state (AdamW, AdamW8bit):
  // the parameters with a gradient grouped by the step each is about to take, and `hyper`, f64 [groups, 3] of
  // {lr, that step, grad scale} per group, recorded as a host input whose producer redoes this bookkeeping (step
  // counters, one-shot grad scale, current lr) before each replay of the graph. Call once per traced step().
  struct TracedGroups {
    std::vector<std::vector<size_t>> groups;
    Tensor hyper;
  };
  TracedGroups traced_step_groups();

  std::vector<Tensor> params_;
  double lr_;
  int64_t step_count_ = 0;
  double grad_scale_ = 1.0;
  std::vector<std::map<std::string, Tensor>> state_;  // per parameter
  // Offloading: per parameter, its state's host buffers by name (while restored, state_ holds device copies).
  std::vector<std::map<std::string, Tensor>> host_state_;
  bool offload_ = false;
  std::shared_ptr<OffloadCopies> copies_;  // the copies back still running (optim/optimizer.cpp)
};

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};
// The kernel arguments an AdamW update (f32 or 8-bit, eager or traced) takes from its options; lr, step and grad
// scale are left at their defaults for the caller to set (eager) or to come from the host input (traced).
kernels::AdamWArgs adamw_args(const AdamWOptions& o);

// Decoupled weight decay Adam (Loshchilov & Hutter), the math of torch.optim.AdamW. Bias correction uses
// each parameter's own step count (its "step" state), as PyTorch does when a parameter misses a step.
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions opts = {});
  void step() override;
  const AdamWOptions& options() const { return opts_; }
  AdamWOptions& options() { return opts_; }

 private:
  void traced_step();  // under a trace: records optim/fused_update.h primitives
  AdamWOptions opts_;
};

// AdamW with 8-bit moments (Dettmers et al. 2021, "8-bit Optimizers via Block-wise Quantization"; bitsandbytes'
// AdamW8bit with its blockwise state): the update of AdamW above, but each parameter of at least
// kQuant8MinElements (4096) elements keeps exp_avg and exp_avg_sq as one byte an element plus an f32 absmax per
// 256-element block, under the signed and unsigned dynamic maps (runtime/kernels/quant8.h); every step
// dequantizes a block, updates it and the parameter in f32, and requantizes it. Smaller parameters keep AdamW's
// f32 state. State per quantized parameter i: "i.exp_avg_q" / "i.exp_avg_sq_q" (i32 [ceil(n / 4)], the codes),
// "i.exp_avg_absmax" / "i.exp_avg_sq_absmax" (f32 [ceil(n / 256)]) and "i.step"; about 2.03 bytes a parameter.
// How AdamW8bit's state_dict() names a moment kept in 8-bit blocks: the moment's element name (as AdamW and
// element_state_dict() call it), its codes (i32 words, four one-byte codes each, element order) and absmax (f32,
// one a 256-element block), and which map decodes the codes. Sharded checkpoints store these parts as the shards
// hold them (recipes/sharded_checkpoint.h).
struct Quant8Moment {
  const char* name;
  const char* codes;
  const char* absmax;
  bool signed_map;
};
inline constexpr Quant8Moment kAdamW8bitMoments[] = {{"exp_avg", "exp_avg_q", "exp_avg_absmax", true},
                                                      {"exp_avg_sq", "exp_avg_sq_q", "exp_avg_sq_absmax", false}};
// The map that decodes a moment's codes into the f32 values element_state_dict() gives (Note [8-bit state
// element by element], optim/adamw8bit.cpp: the signed map's most negative code stands for -1 there).
const std::array<float, 256>& quant8_element_map(bool signed_map);

class AdamW8bit : public Optimizer {
 public:
  AdamW8bit(std::vector<Tensor> params, AdamWOptions opts = {});
  void step() override;
  // Takes 8-bit codes, or f32 moments ("exp_avg", "exp_avg_sq", e.g. element_state_dict()'s), which it quantizes
  // at once unless hold_loaded_state() was called.
  void load_state_dict(const std::map<std::string, Tensor>& sd) override;
  std::map<std::string, Tensor> element_state_dict() const override;
  void hold_loaded_state() override { hold_ = true; }
  const AdamWOptions& options() const { return opts_; }
  // Whether parameter `index` keeps 8-bit state (it has at least kQuant8MinElements elements).
  bool quantized(size_t index) const;

 protected:
  std::optional<std::pair<Shape, DType>> state_layout(size_t index, const std::string& name) const override;

 private:
  void traced_step();  // under a trace: records AdamW's primitive for the f32 state, adamw8bit_update for the rest
  Tensor& state8(size_t index, const std::string& name);  // the 8-bit state slots, created zero (the zero state)
  void quantize_into(size_t index, const Tensor& m, const Tensor& v);  // parameter `index`'s codes from f32 moments
  AdamWOptions opts_;
  bool hold_ = false;
  Tensor signed_map_, unsigned_map_;  // f32 [256] on the parameters' device
};

struct SGDOptions {
  double lr = 1e-2, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};

// torch.optim.SGD: weight decay added to the gradient, optional (Nesterov) momentum with dampening.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions opts = {});
  void step() override;
  const SGDOptions& options() const { return opts_; }

 private:
  void traced_step();  // under a trace: records optim/fused_update.h primitives
  SGDOptions opts_;
};

struct LionOptions {
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.99, weight_decay = 0;
};

// Lion (Chen et al. 2023): the sign of an interpolated momentum, decoupled weight decay; one state tensor
// (exp_avg) per parameter. See optim/lion.cpp for the update.
class Lion : public Optimizer {
 public:
  Lion(std::vector<Tensor> params, LionOptions opts = {});
  void step() override;
  const LionOptions& options() const { return opts_; }

 private:
  LionOptions opts_;
};

// What a recipe's optimizer.* and train.* keys choose (recipes/train_loop.cpp): name is adamw, adamw8bit, sgd or
// lion; each reads the fields it has (sgd: lr, momentum, nesterov, weight_decay; lion: lr, beta1, beta2,
// weight_decay; adamw and adamw8bit: all but momentum and nesterov).
struct OptimizerSpec {
  std::string name = "adamw";
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0, momentum = 0;
  bool nesterov = false;
};
std::unique_ptr<Optimizer> make_optimizer(std::vector<Tensor> params, const OptimizerSpec& spec);
// The bytes of optimizer state that `spec` keeps for `params` once every one has taken a step (scalar step
// counters not counted): what the run banner reports, and what the state tensors add up to.
int64_t optimizer_state_bytes(const OptimizerSpec& spec, const std::vector<Tensor>& params);

}  // namespace ingot::optim
