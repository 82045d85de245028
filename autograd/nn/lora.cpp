#include "autograd/nn/lora.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

namespace ingot::nn {

void LoRALinear::add_lora(const LoRAConfig& cfg, const std::string& name) {
  INGOT_CHECK(!lora_a_, "lora: ", name, " already has an adapter");
  INGOT_CHECK(!merged_, "lora: ", name, " has a merged adapter; build a new model to adapt it again");
  INGOT_CHECK(cfg.rank >= 1, "lora: rank must be >= 1, got ", cfg.rank);
  INGOT_CHECK(cfg.alpha > 0, "lora: alpha must be > 0, got ", cfg.alpha);
  INGOT_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, "lora: dropout must be in [0, 1), got ", cfg.dropout);
  lora_dropout_ = register_module("lora_dropout", std::make_shared<Dropout>(cfg.dropout));
  lora_a_ = register_module("lora_A", std::make_shared<Linear>(in_features(), cfg.rank, false));
  lora_b_ = register_module("lora_B", std::make_shared<Linear>(cfg.rank, out_features(), false));
  Tensor b_weight = lora_b_->weight();
  b_weight.zero_();
  for (auto* m : std::initializer_list<Module*>{lora_a_.get(), lora_b_.get(), lora_dropout_.get()}) {
    m->to(weight().device());
    m->to(weight().dtype());
    m->set_compute_dtype(compute_dtype());
    m->train(is_training());
  }
  scale_ = cfg.scale();
  Tensor w = weight(), b = bias();
  w.set_requires_grad(false);
  if (b.defined()) b.set_requires_grad(false);
}

Tensor LoRALinear::base_forward(const Tensor& x) {
  if (!frozen_base_) return Linear::forward(x);
  INGOT_CHECK(x.dim() >= 1 && x.size(-1) == in_features(), "LoRALinear: expected input [..., ", in_features(),
              "], got ", shape_str(x.shape()));
  Tensor y = frozen_base_->forward(maybe_cast(x, compute_dtype()));
  if (bias().defined()) y = add(y, maybe_cast(bias(), y.dtype()));
  return y;
}

Tensor LoRAParts::sum() const { return delta.defined() ? add(base, delta) : base; }

Tensor LoRALinear::forward(const Tensor& x) { return forward_parts(x).sum(); }

LoRAParts LoRALinear::forward_parts(const Tensor& x) {
  Tensor y = base_forward(x);
  if (!lora_a_ || merged_) return {y, Tensor()};
  // The scale multiplies the rank-r activation, not the [.., out] update: a scalar product saves its input for
  // the backward, and r columns are what is cheap to keep (a frozen base saves nothing: autograd/ops/matmul.cpp).
  Tensor delta = lora_b_->forward(mul(lora_a_->forward(lora_dropout_->forward(x)), scale_));
  if (delta.dtype() != y.dtype()) delta = cast(delta, y.dtype());
  return {y, delta};
}

std::vector<LoRAParts> LoRALinear::forward_shared_input_parts(const std::vector<LoRALinear*>& projections,
                                                              const Tensor& x) {
  // INGOT_LORA_SHARED_A=0: each projection's own forward (the A/B comparison of bench/RESULTS.md).
  static const bool off = [] {
    const char* v = std::getenv("INGOT_LORA_SHARED_A");
    return v && std::string(v) == "0";
  }();
  bool joint = projections.size() > 1 && !off;
  const LoRALinear* first = projections.empty() ? nullptr : projections[0];
  for (const LoRALinear* p : projections) {
    joint = joint && p->lora_a_ && !p->merged_ && (p->lora_dropout_->p() == 0 || !p->is_training()) &&
            p->scale_ == first->scale_ && p->lora_a_->weight().dtype() == first->lora_a_->weight().dtype() &&
            p->lora_a_->weight().device() == first->lora_a_->weight().device() &&
            p->lora_a_->compute_dtype() == first->lora_a_->compute_dtype() && p->in_features() == first->in_features();
    if (!joint) break;
  }
  std::vector<LoRAParts> out;
  if (!joint) {
    for (LoRALinear* p : projections) out.push_back(p->forward_parts(x));
    return out;
  }
  std::vector<Tensor> a_weights;
  std::vector<int64_t> ranks;
  for (const LoRALinear* p : projections) {
    a_weights.push_back(p->lora_a_->weight());
    ranks.push_back(p->lora_a_->out_features());
  }
  const auto c = first->lora_a_->compute_dtype();
  // As lora_A's forward (Linear::forward) with the weights side by side; the scale on the rank-r activations.
  const Tensor h = mul(linear(maybe_cast(x, c), maybe_cast(cat(a_weights, 0), c), Tensor()), first->scale_);
  const std::vector<Tensor> hs = split_sizes(h, ranks, -1);
  for (size_t i = 0; i < projections.size(); ++i) {
    LoRALinear* p = projections[i];
    Tensor y = p->base_forward(x);
    Tensor delta = p->lora_b_->forward(hs[i]);
    if (delta.dtype() != y.dtype()) delta = cast(delta, y.dtype());
    out.push_back({y, delta});
  }
  return out;
}

Tensor LoRALinear::merged_weight() const {
  NoGradGuard ng;
  const Tensor w = frozen_base_ ? frozen_base_->dense(weight().dtype()) : weight();
  if (!lora_a_ || merged_) return w.detach();
  Tensor ba = matmul(lora_b_->weight(), lora_a_->weight());
  if (ba.dtype() != w.dtype()) ba = cast(ba, w.dtype());
  return add(w, mul(ba, scale_)).detach();
}

void LoRALinear::merge() {
  if (!lora_a_ || merged_) return;
  INGOT_CHECK(!frozen_base_, "lora: cannot merge an adapter into a quantized base weight in place; export "
              "merged_state_dict() (the dequantized base plus the adapter) or reload the dense weights first");
  Tensor m = merged_weight();
  Tensor w = weight();
  w.copy_(m);
  merged_ = true;
}

namespace {

std::string last_component(const std::string& name) {
  auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

std::vector<std::pair<std::string, std::shared_ptr<LoRALinear>>> lora_linears(const Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<LoRALinear>>> out;
  for (auto& [name, m] : model.named_modules())
    if (auto l = std::dynamic_pointer_cast<LoRALinear>(m)) out.emplace_back(name, l);
  return out;
}

}  // namespace

std::vector<std::string> apply_lora(Module& model, const LoRAConfig& cfg) {
  INGOT_CHECK(!cfg.target_modules.empty(), "lora: target_modules is empty; name the projections to adapt");
  auto linears = lora_linears(model);
  std::set<std::string> available;
  for (auto& [name, l] : linears) available.insert(last_component(name));
  for (const std::string& t : cfg.target_modules) {
    if (available.count(t)) continue;
    std::ostringstream os;
    for (auto it = available.begin(); it != available.end(); ++it) os << (it == available.begin() ? "" : ", ") << *it;
    INGOT_CHECK(false, "lora: target module '", t, "' matches no projection of this model (projections: ",
                os.str(), ")");
  }
  for (auto& [name, p] : model.named_parameters()) {
    Tensor t = p;
    t.set_requires_grad(false);
  }
  std::vector<std::string> adapted;
  for (auto& [name, l] : linears) {
    const std::string last = last_component(name);
    if (std::find(cfg.target_modules.begin(), cfg.target_modules.end(), last) == cfg.target_modules.end()) continue;
    l->add_lora(cfg, name);
    adapted.push_back(name);
  }
  // The adapters were registered below modules that were named before they existed.
  model.set_tensor_names();
  return adapted;
}

std::vector<Tensor> trainable_parameters(const Module& model) {
  std::vector<Tensor> out;
  for (auto& [name, p] : model.named_parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Tensor>> lora_state_dict(const Module& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : model.named_parameters())
    if (name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos)
      out.emplace_back(name, p);
  return out;
}

std::map<std::string, Tensor> merged_state_dict(const Module& model) {
  std::map<std::string, Tensor> sd = model.state_dict();
  for (auto it = sd.begin(); it != sd.end();) {
    if (it->first.find(".lora_A.") != std::string::npos || it->first.find(".lora_B.") != std::string::npos)
      it = sd.erase(it);
    else
      ++it;
  }
  for (auto& [name, l] : lora_linears(model))
    if (l->has_lora() || l->frozen_base()) sd[name.empty() ? "weight" : name + ".weight"] = l->merged_weight();
  return sd;
}

}  // namespace ingot::nn
