#include "models/qlora.h"

#include <algorithm>
#include <memory>

#include "autograd/ops/nf4_linear.h"

namespace ingot::models {
namespace {

class Nf4Base final : public nn::FrozenBase {
 public:
  explicit Nf4Base(Nf4Tensor w) : w_(std::move(w)) {}
  Tensor forward(const Tensor& x) const override { return nf4_linear(x, w_); }
  Tensor dense(DType dtype) const override { return nf4_dequantize(w_, dtype); }
  const Nf4Tensor& weight() const { return w_; }

 private:
  Nf4Tensor w_;
};

std::string last_component(const std::string& name) {
  auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

std::string weight_name(const std::string& module) { return module.empty() ? "weight" : module + ".weight"; }

// Points the parameter's TensorImpl (the handle the module and any optimizer hold) at new values.
void rebind(const Tensor& param, const Tensor& values) {
  TensorImpl* impl = param.impl();
  impl->storage = values.storage();
  impl->offset = values.offset();
  impl->shape = values.shape();
  impl->strides = values.strides();
}

// f(name, module, its NF4 base) for every quantized LoRALinear (named_modules hands out mutable modules).
template <class F>
void for_each_nf4(const nn::Module& model, F&& f) {
  for (auto& [name, m] : model.named_modules())
    if (auto l = std::dynamic_pointer_cast<nn::LoRALinear>(m))
      if (auto q = std::dynamic_pointer_cast<const Nf4Base>(l->frozen_base())) f(name, *l, *q);
}

}  // namespace

QuantizedBase quantize_base_nf4(nn::Module& model, const std::vector<std::string>& skip) {
  NoGradGuard no_grad;
  // Validate every weight before changing any, so an error leaves the model as it was.
  std::vector<std::pair<std::string, std::shared_ptr<nn::LoRALinear>>> todo;
  for (auto& [name, m] : model.named_modules()) {
    auto l = std::dynamic_pointer_cast<nn::LoRALinear>(m);
    if (!l || std::find(skip.begin(), skip.end(), last_component(name)) != skip.end()) continue;
    const std::string wn = weight_name(name);
    INGOT_CHECK(!l->frozen_base(), "nf4: ", wn, " is already quantized");
    const Tensor& w = l->weight();
    INGOT_CHECK(w.dtype() == DType::f32 || w.dtype() == DType::bf16 || w.dtype() == DType::f16, "nf4: ", wn,
                " is ", dtype_name(w.dtype()), shape_str(w.shape()), "; NF4 quantizes f32, bf16 or f16 weights");
    INGOT_CHECK(w.numel() % kNf4BlockSize == 0, "nf4: ", wn, " ", shape_str(w.shape()), " has ", w.numel(),
                " elements, not a multiple of the block size ", kNf4BlockSize,
                "; NF4 quantizes whole blocks (quantize_base_nf4's `skip` leaves a module dense)");
    todo.emplace_back(name, l);
  }
  QuantizedBase r;
  for (auto& [name, l] : todo) {
    const Tensor& w = l->weight();
    const std::string wn = weight_name(name);
    auto base = std::make_shared<Nf4Base>(nf4_quantize(w, wn));
    r.tensors += 1;
    r.parameters += w.numel();
    r.dense_bytes += static_cast<int64_t>(w.nbytes());
    r.bytes += static_cast<int64_t>(base->weight().nbytes());
    r.names.push_back(wn);
    rebind(w, empty({0}, w.dtype(), w.device()));
    l->set_frozen_base(std::move(base));
  }
  return r;
}

QuantizedBase quantized_base(const nn::Module& model) {
  QuantizedBase r;
  for_each_nf4(model, [&](const std::string& name, nn::LoRALinear& l, const Nf4Base& q) {
    r.tensors += 1;
    r.parameters += q.weight().numel();
    r.bytes += static_cast<int64_t>(q.weight().nbytes());
    r.dense_bytes += q.weight().numel() * static_cast<int64_t>(itemsize(l.weight().dtype()));
    r.names.push_back(weight_name(name));
  });
  return r;
}

void quantized_base_to(nn::Module& model, Device d) {
  std::vector<std::pair<nn::LoRALinear*, Nf4Tensor>> moved;
  for_each_nf4(model, [&](const std::string&, nn::LoRALinear& l, const Nf4Base& q) {
    moved.emplace_back(&l, q.weight().to(d));
  });
  for (auto& [l, w] : moved) l->set_frozen_base(std::make_shared<Nf4Base>(std::move(w)));
}

void restore_dense_base(nn::Module& model, bool dequantize) {
  NoGradGuard no_grad;
  std::vector<std::pair<nn::LoRALinear*, Tensor>> dense;
  for_each_nf4(model, [&](const std::string&, nn::LoRALinear& l, const Nf4Base& q) {
    const Tensor& w = l.weight();
    Tensor values = dequantize ? q.dense(w.dtype()).to(w.device()) : zeros(q.weight().shape, w.dtype(), w.device());
    dense.emplace_back(&l, values);
  });
  for (auto& [l, values] : dense) {
    rebind(l->weight(), values);
    l->set_frozen_base(nullptr);
  }
}

}  // namespace ingot::models
