#include "optim/fused_update.h"

#include "runtime/kernels/kernels.h"

namespace ingot::optim {
namespace {

const double* hyper_row(const Tensor& hyper, int64_t row, const char* op) {
  INGOT_CHECK(hyper.defined() && hyper.device().is_cpu() && hyper.dtype() == DType::f64 && hyper.dim() == 2 &&
                  hyper.size(1) == 3 && row < hyper.size(0) && hyper.is_contiguous(),
              op, ": expected a contiguous f64 CPU hyper-parameter tensor [G, 3] with row ", row);
  return hyper.data<double>() + row * 3;
}

std::vector<Tensor> fresh_copies(const std::vector<Tensor>& in, size_t from, size_t n) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < n; ++k) out.push_back(in[from + k].defined() ? in[from + k].clone_raw() : Tensor());
  return out;
}

class AdamWUpdatePrim final : public Primitive {
 public:
  AdamWUpdatePrim(size_t n, int64_t row, const kernels::AdamWArgs& a) : n_(n), row_(row), a_(a) {}
  std::string_view name() const override { return "adamw_update"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 1 + 4 * n_, "adamw_update: expected ", 1 + 4 * n_, " inputs, got ", in.size());
    std::vector<TensorMeta> out;
    for (size_t k = 0; k < n_; ++k) out.push_back(in[1 + k]);
    for (size_t k = 0; k < n_; ++k) out.push_back(in[1 + 2 * n_ + k]);
    for (size_t k = 0; k < n_; ++k) out.push_back(in[1 + 3 * n_ + k]);
    return out;
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const double* h = hyper_row(in[0], row_, "adamw_update");
    std::vector<Tensor> p = fresh_copies(in, 1, n_), m = fresh_copies(in, 1 + 2 * n_, n_),
                        v = fresh_copies(in, 1 + 3 * n_, n_);
    std::vector<Tensor> g(in.begin() + 1 + static_cast<std::ptrdiff_t>(n_),
                          in.begin() + 1 + 2 * static_cast<std::ptrdiff_t>(n_));
    kernels::AdamWArgs a = a_;
    a.lr = h[0];
    a.step = static_cast<int64_t>(h[1]);
    a.grad_scale = h[2];
    INGOT_KERNEL_CALL(p[0].device(), adamw_multi, p, g, m, v, a);
    std::vector<Tensor> out = p;
    out.insert(out.end(), m.begin(), m.end());
    out.insert(out.end(), v.begin(), v.end());
    return out;
  }
  bool differentiable() const override { return false; }
  bool host_input(size_t i) const override { return i == 0; }
  size_t n() const { return n_; }
  int64_t row() const { return row_; }
  const kernels::AdamWArgs& fixed() const { return a_; }
  void print_attrs(std::ostream& os) const override {
    os << "n=" << n_ << ", row=" << row_ << ", beta1=" << a_.beta1 << ", beta2=" << a_.beta2 << ", eps=" << a_.eps
       << ", weight_decay=" << a_.weight_decay;
  }

 private:
  size_t n_;
  int64_t row_;
  kernels::AdamWArgs a_;
};

class SgdUpdatePrim final : public Primitive {
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
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const double* h = hyper_row(in[0], row_, "sgd_update");
    std::vector<Tensor> p = fresh_copies(in, 1, n_), buf = fresh_copies(in, 1 + 2 * n_, n_);
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
  bool differentiable() const override { return false; }
  bool host_input(size_t i) const override { return i == 0; }
  void print_attrs(std::ostream& os) const override {
    os << "n=" << n_ << ", row=" << row_ << ", momentum=" << a_.momentum << ", dampening=" << a_.dampening
       << ", weight_decay=" << a_.weight_decay << ", nesterov=" << a_.nesterov;
  }

 private:
  size_t n_;
  int64_t row_;
  kernels::SgdArgs a_;
};

}  // namespace

std::shared_ptr<Primitive> make_adamw_update(size_t n, int64_t row, const kernels::AdamWArgs& fixed) {
  return std::make_shared<AdamWUpdatePrim>(n, row, fixed);
}
bool adamw_update_args(const Primitive& p, kernels::AdamWArgs* fixed, size_t* n, int64_t* row) {
  const auto* a = dynamic_cast<const AdamWUpdatePrim*>(&p);
  if (!a) return false;
  *fixed = a->fixed();
  *n = a->n();
  *row = a->row();
  return true;
}

std::shared_ptr<Primitive> make_sgd_update(size_t n, int64_t row, const kernels::SgdArgs& fixed) {
  return std::make_shared<SgdUpdatePrim>(n, row, fixed);
}

}  // namespace ingot::optim
