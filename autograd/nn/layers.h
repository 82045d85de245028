// Layers built from autograd/ops.h. Parameters are created in f32 on the CPU; move or cast them with
// Module::to. Parameter names follow PyTorch / Hugging Face (weight, bias). The attention, MLP and transformer
// blocks the models use are models/decoder.h's.
//
// Initialization: `init_std` set means normal(0, init_std) weights and zero biases (GPT-2 / Llama style);
// unset means PyTorch's default for the layer (Linear: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias).
#pragma once

#include <functional>
#include <map>
#include <optional>

#include "autograd/nn/module.h"

namespace ingot::nn {

// Note [Initial values drawn later]: what a layer would have put into a parameter that a SkipInit left without
// values: its draw (the CPU generator's seed and the offset the draw reserved) or its fill. Philox is counter-based
// (runtime/rng.h: element i of a draw is a function of seed and offset + i alone), so any slice of the value can be
// drawn later, by itself, bit-identical to the same elements of the whole draw: ZeRO-3 pretraining draws each
// rank's shards only, and the model is never whole on a rank (recipes/train.cpp).
struct DeferredInit {
  enum class Kind { Normal, Uniform, Fill };
  Kind kind = Kind::Fill;
  double a = 0, b = 0;  // Normal: mean, std; Uniform: low, high; Fill: the value in `a`
  uint64_t seed = 0, offset = 0;  // Normal, Uniform: where the layer's draw started
  // Elements [begin, end) of the flattened value, made as the layer makes it (f32 on the CPU) and then moved and
  // cast into `dst` (end - begin elements, any device and dtype) as Module::to moves and casts a whole model.
  void fill(int64_t begin, int64_t end, Tensor& dst) const;
};

// Note [Parameters made to be overwritten]: while a SkipInit is alive on this thread, the layers make their
// parameters uninitialized in `dtype` instead of drawing or filling them: a model built only to have a checkpoint
// loaded into it (which writes every parameter whole, or fails naming the missing tensors) then costs neither an
// f32 copy of the model (32 GB at 8B before a bf16 load) nor the seconds of drawing. The CPU generator still
// advances by what the draws would have taken (Philox is counter-based: reserving is free), so whatever is drawn
// next (LoRA adapters, dropout masks) is the same as without the guard. Guards nest; the innermost wins.
class SkipInit {
 public:
  explicit SkipInit(DType dtype = DType::f32);
  // Parameters without bytes: a shape, `dtype` and device `on` but no data at all, for ZeRO-3, which gives them
  // storage one unit at a time and fills its shards from a checkpoint (Note [Parameters without bytes],
  // distributed/fsdp.h), so the model is never whole on a rank. Nothing may read them before that.
  SkipInit(DType dtype, Device on);
  ~SkipInit();
  SkipInit(const SkipInit&) = delete;
  SkipInit& operator=(const SkipInit&) = delete;
  DType dtype() const { return dtype_; }
  static const SkipInit* active();  // the innermost guard of this thread, or null
  // An uninitialized parameter of `shape` (without bytes when the guard says so); `init` is what the layer would
  // have put into it, kept for deferred() (Note [Initial values drawn later]).
  Tensor make(const Shape& shape, const DeferredInit& init);
  // The initial value a layer skipped for parameter `p`, made while this guard was the innermost one.
  const DeferredInit& deferred(const Tensor& p) const;

 private:
  DType dtype_;
  std::optional<Device> no_bytes_on_;
  SkipInit* outer_;
  std::map<const TensorImpl*, DeferredInit> deferred_;
};

// y = x @ W^T + b; W [out, in], b [out].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, std::optional<double> init_std = std::nullopt);
  Tensor forward(const Tensor& x);
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_;
  Tensor weight_, bias_;
};

// ids [...] (i64/i32) -> [..., dim]; weight [num, dim] ~ normal(0, init_std) (PyTorch default std 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, double init_std = 1.0);
  Tensor forward(const Tensor& ids);
  const Tensor& weight() const { return weight_; }
  // Replaces the lookup (embedding(weight, ids)) until reset with nullptr: FullyShardedDataParallel's
  // vocabulary-parallel lookup from this rank's rows of the table (Note [Vocabulary-parallel embeddings],
  // distributed/fsdp.h). The weight is still the module's parameter; the lookup decides what it reads.
  using Lookup = std::function<Tensor(const Tensor& weight, const Tensor& ids)>;
  void set_lookup(Lookup lookup) { lookup_ = std::move(lookup); }

 private:
  Tensor weight_;
  Lookup lookup_;
};

// Over the last dim; weight = 1, bias = 0 when affine.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x);

 private:
  double eps_;
  Tensor weight_, bias_;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x);

 private:
  double eps_;
  Tensor weight_;
};

// Active only in training mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.0);
  Tensor forward(const Tensor& x);
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace ingot::nn
