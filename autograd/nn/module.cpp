#include "autograd/nn/module.h"

#include <sstream>
#include <unordered_set>

#include "runtime/safetensors.h"

namespace ingot::nn {
namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Makes `t` (the registered handle) describe `src`'s data: the same TensorImpl keeps its autograd identity
// (leaf, requires_grad, hooks), so every holder of the handle sees the moved or cast tensor.
void rebind(const Tensor& t, const Tensor& src) {
  TensorImpl* impl = t.impl();
  impl->storage = src.storage();
  impl->offset = src.offset();
  impl->shape = src.shape();
  impl->strides = src.strides();
  impl->dtype = src.dtype();
}

std::string meta_str(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

}  // namespace

void Module::check_new_name(const std::string& name) const {
  INGOT_CHECK(!name.empty() && name.find('.') == std::string::npos,
              "Module: a parameter, buffer or child name must be non-empty and contain no '.', got '", name, "'");
  auto taken = [&](const auto& list) {
    for (const auto& [n, _] : list)
      if (n == name) return true;
    return false;
  };
  INGOT_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), "Module: name '", name,
              "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_new_name(name);
  INGOT_CHECK(t.defined(), "register_parameter: '", name, "' is undefined");
  INGOT_CHECK(t.is_leaf(), "register_parameter: '", name, "' must be a leaf (detach it first)");
  t.set_requires_grad(true);
  t.set_name(name);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name);
  INGOT_CHECK(t.defined(), "register_buffer: '", name, "' is undefined");
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name);
  INGOT_CHECK(m != nullptr, "register_module: '", name, "' is null");
  m->train(training_);
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool params,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [n, t] : params ? params_ : buffers_) out.emplace_back(join(prefix, n), t);
  for (const auto& [n, c] : children_) c->collect(join(prefix, n), params, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> all, out;
  collect("", true, all);
  // A parameter shared by two modules (tied weights) is listed once, under its first name.
  std::unordered_set<const TensorImpl*> seen;
  for (auto& p : all)
    if (seen.insert(p.second.impl()).second) out.push_back(std::move(p));
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", false, out);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& [n, c] : children_) {
    out.emplace_back(n, c);
    for (auto& [cn, cc] : c->named_modules()) out.emplace_back(join(n, cn), std::move(cc));
  }
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [_, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [_, c] : children_) c->train(on);
}

void Module::set_compute_dtype(std::optional<DType> t) {
  INGOT_CHECK(!t || is_floating(*t), "set_compute_dtype: expected a floating dtype, got ", dtype_name(*t));
  compute_dtype_ = t;
  for (auto& [_, c] : children_) c->set_compute_dtype(t);
}

void Module::to(Device d) {
  NoGradGuard ng;
  std::unordered_set<const TensorImpl*> done;
  auto move = [&](const Tensor& t) {
    if (!done.insert(t.impl()).second) return;
    if (t.grad().defined()) t.impl()->grad = t.grad().to(d).impl_ptr();
    rebind(t, t.to(d));
  };
  for (const auto& [_, t] : named_parameters()) move(t);
  for (const auto& [_, t] : named_buffers()) move(t);
}

void Module::to(DType dt) {
  INGOT_CHECK(is_floating(dt), "Module::to: expected a floating dtype, got ", dtype_name(dt));
  NoGradGuard ng;
  std::unordered_set<const TensorImpl*> done;
  auto cast = [&](const Tensor& t) {
    if (!is_floating(t.dtype()) || !done.insert(t.impl()).second) return;
    if (t.grad().defined()) t.impl()->grad = t.grad().to(dt).impl_ptr();
    rebind(t, t.to(dt));
  };
  for (const auto& [_, t] : named_parameters()) cast(t);
  for (const auto& [_, t] : named_buffers()) cast(t);
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", true, all);
  collect("", false, all);
  return {all.begin(), all.end()};
}

void Module::load_state_dict(const std::map<std::string, Tensor>& sd, bool strict) {
  std::map<std::string, Tensor> own = state_dict();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [n, t] : own) {
    auto it = sd.find(n);
    if (it == sd.end()) {
      missing.push_back(n);
      continue;
    }
    const Tensor& src = it->second;
    INGOT_CHECK(src.defined(), "load_state_dict: tensor '", n, "' is undefined");
    if (src.shape() != t.shape() || src.dtype() != t.dtype())
      mismatched.push_back(n + " (expected " + meta_str(t) + ", got " + meta_str(src) + ")");
  }
  for (const auto& [n, _] : sd)
    if (!own.count(n)) unexpected.push_back(n);

  std::ostringstream err;
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    err << (err.tellp() > 0 ? "; " : "") << what << " (" << names.size() << "): ";
    for (size_t i = 0; i < names.size(); ++i) err << (i ? ", " : "") << names[i];
  };
  if (strict) {
    list("missing", missing);
    list("unexpected", unexpected);
  }
  list("mismatched shape/dtype", mismatched);
  INGOT_CHECK(err.tellp() == 0, "load_state_dict: ", err.str());

  NoGradGuard ng;
  for (auto& [n, t] : own) {
    auto it = sd.find(n);
    if (it != sd.end()) t.copy_(it->second);
  }
}

void Module::save(const std::string& safetensors_path) const {
  std::map<std::string, Tensor> sd = state_dict();
  save_safetensors(safetensors_path, {sd.begin(), sd.end()}, {{"format", "pt"}});
}

void Module::load(const std::string& safetensors_path, bool strict) {
  SafetensorsFile f = SafetensorsFile::open(safetensors_path);
  std::map<std::string, Tensor> sd;
  for (const std::string& n : f.names()) sd.emplace(n, f.get(n));
  try {
    load_state_dict(sd, strict);
  } catch (const Error& e) {
    INGOT_FAIL(e.what(), " (loading ", safetensors_path, ")");
  }
}

void Module::zero_grad() {
  for (auto& [_, t] : named_parameters()) t.zero_grad();
}

size_t Module::register_forward_pre_hook(ForwardPreHook h) {
  pre_hooks_.emplace_back(next_hook_id_, std::move(h));
  return next_hook_id_++;
}

size_t Module::register_forward_hook(ForwardHook h) {
  post_hooks_.emplace_back(next_hook_id_, std::move(h));
  return next_hook_id_++;
}

void Module::remove_forward_hook(size_t id) {
  std::erase_if(pre_hooks_, [id](const auto& e) { return e.first == id; });
  std::erase_if(post_hooks_, [id](const auto& e) { return e.first == id; });
}

void Module::set_tensor_names() {
  for (auto& [n, t] : state_dict()) t.set_name(n);
}

Tensor maybe_cast(const Tensor& x, std::optional<DType> compute) {
  if (!compute || !x.defined() || !is_floating(x.dtype()) || x.dtype() == *compute) return x;
  return cast(x, *compute);
}

}  // namespace ingot::nn
