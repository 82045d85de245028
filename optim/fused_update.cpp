#include "optim/fused_update.h"

#include "autograd/ops/sum_pieces.h"
#include "autograd/primitive_multi_tensor.h"
#include "runtime/kernels/kernels.h"

namespace ingot::optim {

const double* hyper_row(const Tensor& hyper, int64_t row, const char* op) {
  INGOT_CHECK(hyper.defined() && hyper.device().is_cpu() && hyper.dtype() == DType::f64 && hyper.dim() == 2 &&
                  hyper.size(1) == 3 && row < hyper.size(0) && hyper.is_contiguous(),
              op, ": expected a contiguous f64 CPU hyper-parameter tensor [G, 3] with row ", row);
  return hyper.data<double>() + row * 3;
}

std::vector<Tensor> update_operands(const std::vector<Tensor>& in, size_t from, size_t n, bool in_place) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < n; ++k)
    out.push_back(in_place || !in[from + k].defined() ? in[from + k] : in[from + k].clone_raw());
  return out;
}

kernels::AdamWArgs adamw_args(const kernels::AdamWArgs& fixed, const double* hyper) {
  kernels::AdamWArgs a = fixed;
  a.lr = hyper[0];
  a.step = static_cast<int64_t>(hyper[1]);
  a.grad_scale = hyper[2];
  return a;
}

namespace {

class AdamWUpdatePrim final : public Primitive, public MultiTensorUpdate, public InPlaceUpdate {
 public:
  // pieces > 1: Note [Pieces read by the update] (MultiTensorUpdate::with_gradient_pieces): the gradient slot is
  // `pieces` slots, summed in f32 in their order and scaled by piece_scale.
  AdamWUpdatePrim(size_t n, int64_t row, const kernels::AdamWArgs& a, size_t pieces = 1, double piece_scale = 1.0)
      : n_(n), row_(row), a_(a), pieces_(pieces), piece_scale_(piece_scale) {}
  std::string_view name() const override { return "adamw_update"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 1 + (3 + pieces_) * n_, "adamw_update: expected ", 1 + (3 + pieces_) * n_,
                " inputs, got ", in.size());
    std::vector<TensorMeta> out;
    for (size_t s : state_slots())
      for (size_t k = 0; k < n_; ++k) out.push_back(in[1 + s * n_ + k]);
    return out;
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return run(in, false); }
  std::vector<Tensor> written(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> out;
    for (size_t s : state_slots())
      for (size_t k = 0; k < n_; ++k) out.push_back(in[1 + s * n_ + k]);
    return out;
  }
  void update_in_place(const std::vector<Tensor>& in) const override { run(in, true); }
  bool differentiable() const override { return false; }
  bool host_input(size_t i) const override { return i == 0; }
  size_t tensors() const override { return n_; }
  size_t input_slots() const override { return 3 + pieces_; }
  size_t output_slots() const override { return 3; }
  std::vector<size_t> state_slots() const override { return {0, 1 + pieces_, 2 + pieces_}; }
  // adamw_multi loads each gradient in its own float dtype and lower() casts it to f32 (one slot when not pieces).
  bool widens_gradients() const override { return pieces_ == 1; }
  std::shared_ptr<Primitive> for_tensors(size_t n) const override {
    return std::make_shared<AdamWUpdatePrim>(n, row_, a_, pieces_, piece_scale_);
  }
  std::shared_ptr<Primitive> with_gradient_pieces(size_t pieces, double scale) const override {
    if (pieces_ != 1 || pieces < 1) return nullptr;
    return std::make_shared<AdamWUpdatePrim>(n_, row_, a_, pieces, scale);
  }
  std::optional<MultiTensorKernel> lower(const std::vector<DType>& input_dtypes, std::string* why) const override;
  void print_attrs(std::ostream& os) const override {
    os << "n=" << n_ << ", row=" << row_ << ", beta1=" << a_.beta1 << ", beta2=" << a_.beta2 << ", eps=" << a_.eps
       << ", weight_decay=" << a_.weight_decay;
    if (pieces_ > 1) os << ", gradient pieces=" << pieces_ << " scaled " << piece_scale_;
  }

 private:
  std::vector<Tensor> run(const std::vector<Tensor>& in, bool in_place) const {
    const double* h = hyper_row(in[0], row_, "adamw_update");
    std::vector<Tensor> p = update_operands(in, 1, n_, in_place),
                        m = update_operands(in, 1 + (1 + pieces_) * n_, n_, in_place),
                        v = update_operands(in, 1 + (2 + pieces_) * n_, n_, in_place);
    std::vector<Tensor> g;
    for (size_t k = 0; k < n_; ++k) {
      if (pieces_ == 1) {
        g.push_back(in[1 + n_ + k]);
        continue;
      }
      // The pieces summed first, as sum_pieces does, then the usual update of that f32 gradient.
      std::vector<Tensor> pieces;
      for (size_t r = 0; r < pieces_; ++r) pieces.push_back(in[1 + (1 + r) * n_ + k].contiguous_raw());
      Tensor sum = empty(pieces[0].shape(), DType::f32, pieces[0].device());
      INGOT_KERNEL_CALL(sum.device(), sum_pieces, sum, pieces, piece_scale_, 0);
      g.push_back(sum);
    }
    INGOT_KERNEL_CALL(p[0].device(), adamw_multi, p, g, m, v, adamw_args(a_, h));
    std::vector<Tensor> out = p;
    out.insert(out.end(), m.begin(), m.end());
    out.insert(out.end(), v.begin(), v.end());
    return out;
  }

  size_t n_;
  int64_t row_;
  kernels::AdamWArgs a_;
  size_t pieces_;
  double piece_scale_;
};

class SgdUpdatePrim final : public Primitive, public HorizontalUpdate, public InPlaceUpdate {
 public:
  SgdUpdatePrim(size_t n, int64_t row, const kernels::SgdArgs& a) : n_(n), row_(row), a_(a) {}
  std::string_view name() const override { return "sgd_update"; }
  bool momentum() const { return a_.momentum != 0.0; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 1 + 3 * n_, "sgd_update: expected ", 1 + 3 * n_, " inputs, got ", in.size());
    std::vector<TensorMeta> out;
    for (size_t k = 0; k < n_; ++k) out.push_back(in[1 + k]);
    if (momentum())
      for (size_t k = 0; k < n_; ++k) out.push_back(in[1 + 2 * n_ + k]);
    return out;
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return run(in, false); }
  std::vector<Tensor> written(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> out(in.begin() + 1, in.begin() + 1 + static_cast<std::ptrdiff_t>(n_));
    if (momentum())
      out.insert(out.end(), in.begin() + 1 + 2 * static_cast<std::ptrdiff_t>(n_),
                 in.begin() + 1 + 3 * static_cast<std::ptrdiff_t>(n_));
    return out;
  }
  void update_in_place(const std::vector<Tensor>& in) const override { run(in, true); }
  bool differentiable() const override { return false; }
  bool host_input(size_t i) const override { return i == 0; }
  void print_attrs(std::ostream& os) const override {
    os << "n=" << n_ << ", row=" << row_ << ", momentum=" << a_.momentum << ", dampening=" << a_.dampening
       << ", weight_decay=" << a_.weight_decay << ", nesterov=" << a_.nesterov;
  }

 private:
  std::vector<Tensor> run(const std::vector<Tensor>& in, bool in_place) const {
    const double* h = hyper_row(in[0], row_, "sgd_update");
    std::vector<Tensor> p = update_operands(in, 1, n_, in_place), buf = update_operands(in, 1 + 2 * n_, n_, in_place);
    std::vector<Tensor> g(in.begin() + 1 + static_cast<std::ptrdiff_t>(n_),
                          in.begin() + 1 + 2 * static_cast<std::ptrdiff_t>(n_));
    kernels::SgdArgs a = a_;
    a.lr = h[0];
    a.grad_scale = h[1];
    a.first_step = h[2] != 0.0;
    INGOT_KERNEL_CALL(p[0].device(), sgd_multi, p, g, buf, a);
    if (momentum()) p.insert(p.end(), buf.begin(), buf.end());
    return p;
  }

  size_t n_;
  int64_t row_;
  kernels::SgdArgs a_;
};

// The update of one element in the f32 arithmetic of runtime/kernels/cpu/optim.cpp, in its order. Scalars: 0 lr,
// 1 decay = 1 - lr * weight_decay, 2 grad scale, 3 bias correction 1, 4 bias correction 2, 5 step (Note
// [Multi-tensor updates], autograd/primitive_multi_tensor.h). bf16 parameters (no f32 masters) are rounded
// stochastically as the eager kernels round them (Note [Stochastic rounding], runtime/kernels/scalar_math.h).
std::optional<MultiTensorKernel> AdamWUpdatePrim::lower(const std::vector<DType>& input_dtypes,
                                                        std::string* why) const {
  using codegen::Op;
  const DType gt = input_dtypes.at(1 + n_);
  for (size_t t = 0; t < n_ * pieces_; ++t)
    if (input_dtypes.at(1 + n_ + t) != gt) {
      if (why) *why = "gradients of different dtypes";
      return std::nullopt;
    }
  const DType pt = input_dtypes.at(1);
  for (size_t t = 0; t < n_; ++t)
    if (input_dtypes.at(1 + t) != pt || (pt != DType::f32 && pt != DType::bf16)) {
      if (why) *why = "parameters of different dtypes, or neither f32 nor bf16";
      return std::nullopt;
    }
  MultiTensorKernel mk;
  codegen::KernelSpec& k = mk.spec;
  k.kind = codegen::KernelKind::MultiTensor;
  k.name = pieces_ > 1 ? "adamw_update_pieces" : "adamw_update";
  const int p = k.input(pt, {}, "param");
  std::vector<int> gr;
  for (size_t r = 0; r < pieces_; ++r)
    gr.push_back(k.input(gt, {}, pieces_ > 1 ? "grad_piece" + std::to_string(r) : std::string("grad")));
  const int m = k.input(DType::f32, {}, "exp_avg"), v = k.input(DType::f32, {}, "exp_avg_sq");
  const int po = k.output(pt, {}, "param_out", p), mo = k.output(DType::f32, {}, "exp_avg_out", m),
            vo = k.output(DType::f32, {}, "exp_avg_sq_out", v);
  auto f = [&](double x) { return k.constant(static_cast<double>(static_cast<float>(x)), DType::f32); };
  auto scalar = [&](int slot) { return k.scalar(slot, DType::f32); };
  const float b1 = static_cast<float>(a_.beta1), b2 = static_cast<float>(a_.beta2);
  // The gradient: its one input, or its pieces summed as sum_pieces sums them.
  std::vector<int> loads;
  for (int r : gr) loads.push_back(k.load(r));
  const int grad = pieces_ > 1 ? sum_pieces_expr(k, loads, piece_scale_, DType::f32) : k.cast(loads[0], DType::f32);
  const int gj = k.binary(Op::Mul, grad, scalar(2));
  const int mj = k.binary(Op::Add, k.binary(Op::Mul, f(b1), k.load(m)), k.binary(Op::Mul, f(1.0f - b1), gj));
  const int vj = k.binary(Op::Add, k.binary(Op::Mul, f(b2), k.load(v)),
                          k.binary(Op::Mul, k.binary(Op::Mul, f(1.0f - b2), gj), gj));
  const int step = k.binary(Op::Div, k.binary(Op::Mul, scalar(0), k.binary(Op::Div, mj, scalar(3))),
                            k.binary(Op::Add, k.unary(Op::Sqrt, k.binary(Op::Div, vj, scalar(4))), f(a_.eps)));
  const int p32 = pt == DType::f32 ? k.load(p) : k.cast(k.load(p), DType::f32);
  const int updated = k.binary(Op::Sub, k.binary(Op::Mul, p32, scalar(1)), step);
  if (pt == DType::bf16) {
    // stochastic_salt(element, step): the element's index in its tensor plus the step times 2^40.
    const int salt = k.binary(Op::Add, k.index(0),
                              k.binary(Op::Mul, k.scalar(5, DType::i64), k.constant(1099511627776.0, DType::i64)));
    k.store(po, k.binary(Op::RoundBf16Stochastic, updated, salt));
  } else {
    k.store(po, updated);
  }
  k.store(mo, mj);
  k.store(vo, vj);
  mk.hyper_row = row_;
  mk.beta1 = a_.beta1;
  mk.beta2 = a_.beta2;
  mk.weight_decay = a_.weight_decay;
  return mk;
}

}  // namespace

std::shared_ptr<Primitive> make_adamw_update(size_t n, int64_t row, const kernels::AdamWArgs& fixed) {
  return std::make_shared<AdamWUpdatePrim>(n, row, fixed);
}

void apply_traced_update(const std::shared_ptr<Primitive>& update, const std::vector<Tensor>& in,
                         std::source_location loc) {
  TraceObserver* obs = trace_observer();
  const auto* u = dynamic_cast<const InPlaceUpdate*>(update.get());
  INGOT_INTERNAL_CHECK(obs && u, "apply_traced_update: '", update->name(), "' outside a trace or not an update");
  const std::vector<Tensor> dsts = u->written(in);
  const bool in_place = obs->on_apply_over(update, in, dsts, [&] {
    u->update_in_place(in);
    for (const Tensor& d : dsts) d.bump_version();
  }, loc);
  if (in_place) return;
  const std::vector<Tensor> out = ingot::apply(update, in, loc);
  for (size_t k = 0; k < dsts.size(); ++k) {
    Tensor d = dsts[k];
    d.copy_(out[k]);
    obs->on_assign(d, out[k]);
  }
}

std::shared_ptr<Primitive> make_sgd_update(size_t n, int64_t row, const kernels::SgdArgs& fixed) {
  return std::make_shared<SgdUpdatePrim>(n, row, fixed);
}

}  // namespace ingot::optim
