// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), the update of lucidrains/lion-pytorch:
//   c = beta1 m + (1 - beta1) g;   p <- p (1 - lr wd) - lr sign(c);   m <- beta2 m + (1 - beta2) g
// One state tensor per parameter (exp_avg), so it holds half of AdamW's optimizer memory.
//
// Eager and traced steps share one primitive per step, lion_update, whose evaluation is written with tensor ops
// (so it runs on every device that has them). Its lr and grad scale come from a host tensor that a compiled
// step re-computes before each replay (optim/fused_update.h), so an LR schedule never changes the graph. Eagerly
// and while tracing it runs parameter by parameter over the parameters and moments (Note [Traced updates run in
// place]): only one parameter's temporaries exist at a time, never a second copy of them all.
#include "autograd/ops.h"
#include "autograd/primitive.h"
#include "optim/fused_update.h"
#include "optim/optimizer.h"

namespace ingot::optim {
namespace {

// While the update's own ops run, no tape is recorded and a trace sees the update as the one lion_update node.
class QuietOps {
 public:
  QuietOps() : observer_(trace_observer()) { set_trace_observer(nullptr); }
  ~QuietOps() { set_trace_observer(observer_); }
  QuietOps(const QuietOps&) = delete;
  QuietOps& operator=(const QuietOps&) = delete;

 private:
  TraceObserver* observer_;
  NoGradGuard no_grad_;
};

// inputs: hyper [2] f64 CPU = {lr, grad_scale}, p[0..n), g[0..n), m[0..n)      outputs: p'[0..n), m'[0..n)
class LionUpdatePrim final : public Primitive, public InPlaceUpdate {
 public:
  LionUpdatePrim(size_t n, const LionOptions& o) : n_(n), o_(o) {}
  std::string_view name() const override { return "lion_update"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 1 + 3 * n_, "lion_update: expected ", 1 + 3 * n_, " inputs, got ", in.size());
    std::vector<TensorMeta> out;
    for (size_t k = 0; k < n_; ++k) out.push_back(in[1 + k]);
    for (size_t k = 0; k < n_; ++k) out.push_back(in[1 + 2 * n_ + k]);
    return out;
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> p_out, m_out;
    each_update(in, [&](size_t, Tensor p, Tensor m) {
      p_out.push_back(std::move(p));
      m_out.push_back(std::move(m));
    });
    p_out.insert(p_out.end(), m_out.begin(), m_out.end());
    return p_out;
  }
  std::vector<Tensor> written(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> out(in.begin() + 1, in.begin() + 1 + static_cast<std::ptrdiff_t>(n_));
    out.insert(out.end(), in.begin() + 1 + 2 * static_cast<std::ptrdiff_t>(n_), in.end());
    return out;
  }
  void update_in_place(const std::vector<Tensor>& in) const override {
    each_update(in, [&](size_t k, const Tensor& p, const Tensor& m) {
      Tensor(in[1 + k]).copy_(p);
      Tensor(in[1 + 2 * n_ + k]).copy_(m);
    });
  }
  bool differentiable() const override { return false; }
  bool host_input(size_t i) const override { return i == 0; }
  void print_attrs(std::ostream& os) const override {
    os << "n=" << n_ << ", beta1=" << o_.beta1 << ", beta2=" << o_.beta2 << ", weight_decay=" << o_.weight_decay;
  }

 private:
  // use(k, p', m') with parameter k's updated value and moment, one parameter after the other.
  template <class Use>
  void each_update(const std::vector<Tensor>& in, Use&& use) const {
    const Tensor& hyper = in[0];
    INGOT_CHECK(hyper.device().is_cpu() && hyper.dtype() == DType::f64 && hyper.numel() == 2 && hyper.is_contiguous(),
                "lion_update: expected a contiguous f64 CPU tensor {lr, grad_scale}");
    const double lr = hyper.data<double>()[0], scale = hyper.data<double>()[1];
    QuietOps quiet;
    for (size_t k = 0; k < n_; ++k) {
      const Tensor& p = in[1 + k];
      const Tensor& m = in[1 + 2 * n_ + k];
      Tensor g = cast(in[1 + n_ + k], DType::f32) * scale;
      Tensor c = m * o_.beta1 + g * (1 - o_.beta1);
      Tensor zero = zeros_like(c);
      Tensor sign = cast(gt(c, zero), DType::f32) - cast(lt(c, zero), DType::f32);
      use(k, p * (1 - lr * o_.weight_decay) - sign * lr, m * o_.beta2 + g * (1 - o_.beta2));
    }
  }

  size_t n_;
  LionOptions o_;
};

}  // namespace

Lion::Lion(std::vector<Tensor> params, LionOptions opts) : Optimizer(std::move(params), opts.lr), opts_(opts) {
  for (size_t i = 0; i < params_.size(); ++i)
    INGOT_CHECK(params_[i].dtype() == DType::f32, "Lion: parameter ", i, " ('", params_[i].name(), "') is ",
                dtype_name(params_[i].dtype()), "; the update runs on f32 parameters");
}

void Lion::step() {
  const std::vector<size_t> idx = params_with_grad();
  if (idx.empty()) return;
  auto hyper_values = [this]() {
    Tensor h = empty({2}, DType::f64);
    h.data<double>()[1] = begin_step();
    h.data<double>()[0] = lr_;
    return h;
  };
  Tensor hyper = hyper_values();
  TraceObserver* obs = trace_observer();
  if (obs) obs->on_host_input(hyper, hyper_values);
  std::vector<Tensor> in{hyper};
  for (size_t i : idx) in.push_back(params_[i]);
  for (size_t i : idx) in.push_back(params_[i].grad());
  for (size_t i : idx) in.push_back(state(i, "exp_avg"));
  const auto update = std::make_shared<LionUpdatePrim>(idx.size(), opts_);
  if (obs) apply_traced_update(update, in);
  else update->update_in_place(in);
}

}  // namespace ingot::optim
