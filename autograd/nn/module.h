// Module: a tree of named parameters, buffers and child modules (PyTorch nn.Module, with forward hooks only).
// Names are dotted paths from the module the call is made on ("transformer.h.0.attn.c_attn.weight"), in
// registration order. A registered tensor is held by handle: to(device/dtype) rewrites the tensor in place
// (same TensorImpl), so handles kept by layers and optimizers stay valid and leaves keep requires_grad.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"

namespace ingot::nn {

class Module {
 public:
  Module() = default;
  // Copying would share children and parameters between two trees: build a new module and load_state_dict.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  std::vector<std::pair<std::string, Tensor>> named_parameters() const;  // recursive, registration order
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // Every descendant (not this module), depth first, with dotted names.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;
  int64_t num_parameters() const;  // elements, not tensors

  // Training mode (recursive): dropout is active only in training mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves / casts every parameter and buffer in place. to(DType) touches floating tensors only.
  void to(Device d);
  void to(DType t);

  // Autocast-style compute dtype (recursive): Linear and attention cast their inputs and weights to it (see
  // maybe_cast); norms, softmax statistics and the loss stay in f32. nullopt computes in the parameters' dtype.
  void set_compute_dtype(std::optional<DType> t);
  std::optional<DType> compute_dtype() const { return compute_dtype_; }

  std::map<std::string, Tensor> state_dict() const;  // parameters + buffers (handles, not copies)
  // Copies values into the registered tensors. Shape or dtype mismatches are errors naming the tensor;
  // with strict, so are missing and unexpected names (all of them are listed in one message).
  void load_state_dict(const std::map<std::string, Tensor>& sd, bool strict = true);
  void save(const std::string& safetensors_path) const;
  void load(const std::string& safetensors_path, bool strict = true);

  void zero_grad();  // drops every parameter's .grad

  // Forward hooks (PyTorch's register_forward_pre_hook / register_forward_hook): a forward written through
  // with_forward_hooks runs every pre hook before its body and every post hook on its output, which a post
  // hook may replace (an undefined result keeps it). FullyShardedDataParallel (distributed/fsdp.h) gathers a
  // unit's weights with them. The returned id removes the hook.
  using ForwardPreHook = std::function<void()>;
  using ForwardHook = std::function<Tensor(const Tensor& output)>;
  size_t register_forward_pre_hook(ForwardPreHook h);
  size_t register_forward_hook(ForwardHook h);
  void remove_forward_hook(size_t id);
  // Names every parameter and buffer tensor with its dotted path from this module, so errors raised far from
  // the model (optimizer, checkpoint code) say "transformer.h.0.attn.c_attn.weight" rather than "weight".
  void set_tensor_names();

 protected:
  // Registers a leaf with requires_grad (floating tensors only); returns the same handle.
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  // body() between the forward hooks (see register_forward_pre_hook).
  template <class F>
  Tensor with_forward_hooks(F&& body) {
    for (auto& [id, h] : pre_hooks_) h();
    Tensor out = body();
    for (auto& [id, h] : post_hooks_) {
      Tensor replaced = h(out);
      if (replaced.defined()) out = replaced;
    }
    return out;
  }
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool params, std::vector<std::pair<std::string, Tensor>>& out) const;

  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  std::optional<DType> compute_dtype_;
  std::vector<std::pair<size_t, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<size_t, ForwardHook>> post_hooks_;
  size_t next_hook_id_ = 0;
};

// Children named "0", "1", ... (HF's "h.0", "layers.3").
class ModuleList : public Module {
 public:
  template <class M>
  std::shared_ptr<M> append(std::shared_ptr<M> m) {
    return register_module(std::to_string(size_++), std::move(m));
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

// `x` cast (differentiably) to `compute` when x is floating and compute is set; otherwise x itself.
Tensor maybe_cast(const Tensor& x, std::optional<DType> compute);

}  // namespace ingot::nn
