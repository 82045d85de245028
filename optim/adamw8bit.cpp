// AdamW with 8-bit moments (optim/optimizer.h; state format in runtime/kernels/quant8.h). Eagerly, step() calls
// adamw_multi for the parameters that keep f32 state and adamw8bit_multi for the others, in place, one launch
// of each per group of parameters at the same step count (as AdamW). Under a trace, the f32 ones record AdamW's
// own primitive (optim/fused_update.h: the compiler fuses and lowers it) and the 8-bit ones adamw8bit_update,
// a primitive that compiled steps run through its eager kernel (it has no kernel lowering), reading lr, step
// and grad scale from the same host row, so an LR schedule never changes the graph.
#include <array>
#include <exception>
#include <map>
#include <string>
#include <tuple>

#include "autograd/primitive.h"
#include "autograd/primitive_multi_tensor.h"
#include "optim/fused_update.h"
#include "optim/optimizer.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/quant8.h"

namespace ingot::optim {
namespace {

constexpr const char* kMCodes = kAdamW8bitMoments[0].codes;
constexpr const char* kMAbsmax = kAdamW8bitMoments[0].absmax;
constexpr const char* kVCodes = kAdamW8bitMoments[1].codes;
constexpr const char* kVAbsmax = kAdamW8bitMoments[1].absmax;

// inputs:  hyper [G, 3] = {lr, step, grad_scale} per launch, p[0..n), g[0..n), m_codes[0..n), m_absmax[0..n),
//          v_codes[0..n), v_absmax[0..n), signed map, unsigned map
// outputs: p'[0..n), m_codes'[0..n), m_absmax'[0..n), v_codes'[0..n), v_absmax'[0..n)
// Splittable (autograd/primitive_multi_tensor.h): under data parallelism the compiler cuts it per gradient
// bucket, so each bucket's (ZeRO-3: unit's) part runs once its reduction is waited for and its gradients die
// there, not all at the step's end (7.5 GB of an 8B model's bf16 gradient shards a rank on two GPUs).
class AdamW8bitUpdatePrim final : public Primitive, public InPlaceUpdate, public SplittableUpdate {
 public:
  AdamW8bitUpdatePrim(size_t n, int64_t row, const kernels::AdamWArgs& a) : n_(n), row_(row), a_(a) {}
  std::string_view name() const override { return "adamw8bit_update"; }
  size_t tensors() const override { return n_; }
  size_t input_slots() const override { return 6; }
  size_t output_slots() const override { return 5; }
  size_t shared_inputs() const override { return 2; }  // the signed and unsigned maps
  std::shared_ptr<Primitive> for_tensors(size_t n) const override {
    return std::make_shared<AdamW8bitUpdatePrim>(n, row_, a_);
  }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 3 + 6 * n_, "adamw8bit_update: expected ", 3 + 6 * n_, " inputs, got ", in.size());
    std::vector<TensorMeta> out;
    for (size_t s : {size_t{0}, size_t{2}, size_t{3}, size_t{4}, size_t{5}})
      for (size_t k = 0; k < n_; ++k) out.push_back(in[1 + s * n_ + k]);
    return out;
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return run(in, false); }
  std::vector<Tensor> written(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> out;
    for (size_t i : written_inputs()) out.push_back(in[i]);
    return out;
  }
  void update_in_place(const std::vector<Tensor>& in) const override { run(in, true); }
  std::vector<size_t> written_inputs() const override {
    std::vector<size_t> out;
    for (size_t s : {size_t{0}, size_t{2}, size_t{3}, size_t{4}, size_t{5}})
      for (size_t k = 0; k < n_; ++k) out.push_back(1 + s * n_ + k);
    return out;
  }
  bool differentiable() const override { return false; }
  bool host_input(size_t i) const override { return i == 0; }
  void print_attrs(std::ostream& os) const override {
    os << "n=" << n_ << ", row=" << row_ << ", beta1=" << a_.beta1 << ", beta2=" << a_.beta2 << ", eps=" << a_.eps
       << ", weight_decay=" << a_.weight_decay;
  }

 private:
  // Over copies of the parameters and moments (the functional eval) or over them (in place).
  std::vector<Tensor> run(const std::vector<Tensor>& in, bool in_place) const {
    const double* h = hyper_row(in[0], row_, "adamw8bit_update");
    std::vector<Tensor> slot[6];
    for (size_t s = 0; s < 6; ++s)  // gradients (slot 1) are read only
      slot[s] = update_operands(in, 1 + s * n_, n_, in_place || s == 1);
    const Tensor& signed_map = in[1 + 6 * n_];
    const Tensor& unsigned_map = in[2 + 6 * n_];
    INGOT_KERNEL_CALL(signed_map.device(), adamw8bit_multi, slot[0], slot[1], slot[2], slot[3], slot[4], slot[5],
                      signed_map, unsigned_map, adamw_args(a_, h));
    std::vector<Tensor> out;
    for (size_t s : {size_t{0}, size_t{2}, size_t{3}, size_t{4}, size_t{5}})
      out.insert(out.end(), slot[s].begin(), slot[s].end());
    return out;
  }

  size_t n_;
  int64_t row_;
  kernels::AdamWArgs a_;
};

}  // namespace

AdamW8bit::AdamW8bit(std::vector<Tensor> params, AdamWOptions opts)
    : Optimizer(std::move(params), opts.lr), opts_(opts) {
  for (size_t i = 0; i < params_.size(); ++i)
    INGOT_CHECK(params_[i].dtype() == DType::f32 || params_[i].dtype() == DType::bf16, "AdamW8bit: parameter ", i,
                " ('", params_[i].name(), "') is ", dtype_name(params_[i].dtype()),
                "; the update runs on f32 parameters (for 16-bit models keep f32 master weights, "
                "optim/mixed_precision.h), or on bf16 ones rounded stochastically (Note [Stochastic rounding], "
                "runtime/kernels/scalar_math.h)");
  const Device device = params_.empty() ? Device::cpu() : params_[0].device();
  signed_map_ = quant8_map_tensor(quant8_signed_map(), device);
  unsigned_map_ = quant8_map_tensor(quant8_unsigned_map(), device);
}

bool AdamW8bit::quantized(size_t index) const { return params_.at(index).numel() >= kQuant8MinElements; }

Tensor& AdamW8bit::state8(size_t index, const std::string& name) {
  auto [it, fresh] = state_[index].try_emplace(name);
  if (fresh) {
    const std::pair<Shape, DType> layout = *state_layout(index, name);
    it->second = zeros(layout.first, layout.second, params_[index].device());
  }
  return it->second;
}

std::optional<std::pair<Shape, DType>> AdamW8bit::state_layout(size_t index, const std::string& name) const {
  const int64_t n = params_.at(index).numel();
  if (name == kMCodes || name == kVCodes) return std::pair<Shape, DType>{{quant8_code_words(n)}, DType::i32};
  if (name == kMAbsmax || name == kVAbsmax) return std::pair<Shape, DType>{{quant8_blocks(n)}, DType::f32};
  return std::nullopt;
}

// Note [8-bit state element by element]
// ZeRO moves optimizer state element by element: ZeRO-1 gathers it per parameter for its checkpoints and
// scatters it back, and a resume under another world size or in one process reads other element ranges than
// were written. 8-bit state is blocks of 256 elements of the tensor it belongs to, and under ZeRO that tensor is
// a rank's flat chunk across several parameters. So the moments travel as f32 tensors shaped like the parameter,
// on the host (element_state_dict: 8 bytes a parameter the device would not have room for), and are quantized
// where they land (load_state_dict). (ZeRO-2/3's sharded checkpoints store the codes as the shards hold them and
// make this form only when read under another layout: Note [Moments in their blocks],
// recipes/sharded_checkpoint.cpp.) The f32 form is
// exact: quantized again in the same blocks it gives the same codes and absmax bit for bit, so a run resumed
// under the same world size and stage continues exactly. Each element is written
// as map[code] * absmax, except the signed map's most negative code (about -0.9935: bitsandbytes' signed map has
// no -1) written as -absmax. A block's largest magnitude normalizes to +-1 and so takes the code 1 or that one;
// written this way the block's largest f32 magnitude is its absmax itself, and every element normalizes back to
// its own code (the maps' neighbours are far apart next to an f32 rounding). Read in other blocks (another world
// size, one process, f32 AdamW) the values are the moments to within that code's step.
const std::array<float, 256>& quant8_element_map(bool signed_map) {
  // The signed map as written element by element: the most negative code stands for -1 (see the Note).
  static const std::array<float, 256> written = [] {
    std::array<float, 256> map = quant8_signed_map();
    map[0] = -1.0f;
    return map;
  }();
  return signed_map ? written : quant8_unsigned_map();
}

namespace {

Tensor dequantized(const Tensor& codes, const Tensor& absmax, const Tensor& param, const std::array<float, 256>& map) {
  const Tensor c = codes.to(Device::cpu()), a = absmax.to(Device::cpu());
  Tensor out = empty(param.shape(), DType::f32);
  quant8_dequantize(reinterpret_cast<const uint8_t*>(c.data_ptr()), a.data<float>(), param.numel(), map.data(),
                    out.data<float>());
  return out;  // on the host: 8 bytes a parameter that the device need not hold while a checkpoint is written
}

}  // namespace

std::map<std::string, Tensor> AdamW8bit::element_state_dict() const {
  std::map<std::string, Tensor> sd = state_dict();
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string k = std::to_string(i) + ".";
    for (const Quant8Moment& q : kAdamW8bitMoments) {
      if (!sd.count(k + q.codes)) continue;
      sd[k + q.name] = dequantized(sd.at(k + q.codes), sd.at(k + q.absmax), params_[i], quant8_element_map(q.signed_map));
      sd.erase(k + q.codes);
      sd.erase(k + q.absmax);
    }
  }
  return sd;
}

void AdamW8bit::quantize_into(size_t i, const Tensor& m, const Tensor& v) {
  const int64_t n = params_[i].numel();
  for (const auto& [moment, codes, absmax, map] : {std::tuple{&m, kMCodes, kMAbsmax, &quant8_signed_map()},
                                                   std::tuple{&v, kVCodes, kVAbsmax, &quant8_unsigned_map()}}) {
    const Tensor x = moment->to(Device::cpu());
    Tensor c = zeros({quant8_code_words(n)}, DType::i32), a = empty({quant8_blocks(n)}, DType::f32);
    quant8_quantize(x.data<float>(), n, map->data(), reinterpret_cast<uint8_t*>(c.data_ptr()), a.data<float>());
    place_state(i, codes, c);  // the parameter's device, or its host buffer when offloaded
    place_state(i, absmax, a);
  }
}

void AdamW8bit::load_state_dict(const std::map<std::string, Tensor>& sd) {
  // A state that the other layout names (one made with other parameter sizes) would leave this optimizer without
  // moments for that parameter: refuse it before anything changes. f32 moments of an 8-bit parameter are taken
  // (Note [8-bit state element by element]) and quantized from where they lie (the host, for a checkpoint): the
  // device never holds them.
  std::map<std::string, Tensor> rest;
  std::map<size_t, std::pair<Tensor, Tensor>> moments;
  for (const auto& [key, t] : sd) {
    const size_t dot = key.find('.');
    size_t index = params_.size();
    if (key != "step" && dot != std::string::npos) {
      try {
        index = std::stoul(key.substr(0, dot));
      } catch (const std::exception&) {
      }
    }
    if (index >= params_.size()) {  // "step", or malformed: the base class names it
      rest[key] = t;
      continue;
    }
    const std::string name = key.substr(dot + 1);
    const bool eight = name == kMCodes || name == kMAbsmax || name == kVCodes || name == kVAbsmax;
    INGOT_CHECK(!(eight && !quantized(index)), "AdamW8bit::load_state_dict: '", key,
                "' is 8-bit state, but parameter ", index, " (", params_[index].numel(),
                " elements) keeps f32 state (8 bits from ", kQuant8MinElements,
                " elements; was the checkpoint made for other parameters?)");
    if (quantized(index) && (name == "exp_avg" || name == "exp_avg_sq")) {
      INGOT_CHECK(t.shape() == params_[index].shape() && t.dtype() == DType::f32, "AdamW8bit::load_state_dict: '",
                  key, "' is ", dtype_name(t.dtype()), shape_str(t.shape()), " but parameter ", index, " needs f32",
                  shape_str(params_[index].shape()));
      (name == "exp_avg" ? moments[index].first : moments[index].second) = t;
    } else {
      rest[key] = t;
    }
  }
  for (const auto& [i, mv] : moments)
    INGOT_CHECK(mv.first.defined() && mv.second.defined(), "AdamW8bit::load_state_dict: parameter ", i, " has '",
                mv.first.defined() ? "exp_avg" : "exp_avg_sq", "' without '",
                mv.first.defined() ? "exp_avg_sq" : "exp_avg", "'");
  Optimizer::load_state_dict(rest);
  for (const auto& [i, mv] : moments) {
    if (hold_) {  // kept as given (a stand-in's), for element_state_dict
      state_[i]["exp_avg"] = mv.first;
      state_[i]["exp_avg_sq"] = mv.second;
    } else {
      quantize_into(i, mv.first, mv.second);
    }
  }
}

void AdamW8bit::step() {
  // A holder's f32 moments were never quantized: it carries state between files and shards, it does not step.
  INGOT_INTERNAL_CHECK(!hold_, "AdamW8bit::step on an optimizer that holds its loaded state (a checkpoint stand-in)");
  if (trace_observer()) return traced_step();
  const double scale = begin_step();
  const std::map<int64_t, std::vector<size_t>> groups = advance_step_groups();
  kernels::AdamWArgs args = adamw_args(opts_);
  args.lr = lr_;
  args.grad_scale = scale;
  for (auto& [t, idx] : groups) {
    args.step = t;
    std::vector<Tensor> p, g, m, v, p8, g8, mq, ma, vq, va;
    for (size_t i : idx) {
      if (quantized(i)) {
        p8.push_back(params_[i]);
        g8.push_back(params_[i].grad());
        mq.push_back(state8(i, kMCodes));
        ma.push_back(state8(i, kMAbsmax));
        vq.push_back(state8(i, kVCodes));
        va.push_back(state8(i, kVAbsmax));
      } else {
        p.push_back(params_[i]);
        g.push_back(params_[i].grad());
        m.push_back(state(i, "exp_avg"));
        v.push_back(state(i, "exp_avg_sq"));
      }
    }
    if (!p.empty()) INGOT_KERNEL_CALL(p[0].device(), adamw_multi, p, g, m, v, args);
    if (!p8.empty())
      INGOT_KERNEL_CALL(p8[0].device(), adamw8bit_multi, p8, g8, mq, ma, vq, va, signed_map_, unsigned_map_, args);
    for (auto* list : {&p, &m, &v, &p8, &mq, &ma, &vq, &va})
      for (Tensor& x : *list) x.bump_version();
  }
}

// AdamW's grouping and host bookkeeping (Optimizer::traced_step_groups: re-run before each replay of the graph).
void AdamW8bit::traced_step() {
  const auto [groups, hyper] = traced_step_groups();
  const kernels::AdamWArgs fixed = adamw_args(opts_);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    std::vector<size_t> f32_idx, q_idx;
    for (size_t i : groups[gi]) (quantized(i) ? q_idx : f32_idx).push_back(i);
    if (!f32_idx.empty()) {
      std::vector<Tensor> in{hyper};
      for (size_t i : f32_idx) in.push_back(params_[i]);
      for (size_t i : f32_idx) in.push_back(params_[i].grad());
      for (size_t i : f32_idx) in.push_back(state(i, "exp_avg"));
      for (size_t i : f32_idx) in.push_back(state(i, "exp_avg_sq"));
      apply_traced_update(make_adamw_update(f32_idx.size(), static_cast<int64_t>(gi), fixed), in);
    }
    if (!q_idx.empty()) {
      std::vector<Tensor> in{hyper};
      for (size_t i : q_idx) in.push_back(params_[i]);
      for (size_t i : q_idx) in.push_back(params_[i].grad());
      for (const char* name : {kMCodes, kMAbsmax, kVCodes, kVAbsmax})
        for (size_t i : q_idx) in.push_back(state8(i, name));
      in.push_back(signed_map_);
      in.push_back(unsigned_map_);
      apply_traced_update(std::make_shared<AdamW8bitUpdatePrim>(q_idx.size(), static_cast<int64_t>(gi), fixed), in);
    }
  }
}

}  // namespace ingot::optim
