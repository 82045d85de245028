// Normalization family over the last dim: softmax, log_softmax, layer_norm, rms_norm.
//
// Each op is one forward primitive over contiguous rows (softmax along another dim transposes that dim last
// and back) and one backward primitive that runs the fused backward kernel. layer_norm and rms_norm return
// their per-row statistics (mean, rstd) as extra outputs that backward reuses; those are f32 for f32 / bf16 /
// f16 inputs (mixed precision depends on it) and f64 for f64 inputs. Outputs keep the input dtype; weight and
// bias gradients are computed in the statistics dtype and cast to the parameter's dtype.
#include "autograd/ops/norm.h"

#include "autograd/ops.h"
#include "autograd/ops/attrs.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

DType stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

Shape row_shape(const Shape& x) { return x.empty() ? Shape{} : Shape(x.begin(), x.end() - 1); }

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? t.contiguous_raw() : t; }

void check_floating(const char* op, const TensorMeta& x) {
  INGOT_CHECK(is_floating(x.dtype), op, ": expected a floating tensor, got ", dtype_name(x.dtype));
}

// dx = softmax_bwd(dy, y): inputs {dy, y}, one output like y.
class SoftmaxBwdPrim final : public Primitive {
 public:
  explicit SoftmaxBwdPrim(bool log) : log_(log) {}
  std::string_view name() const override { return log_ ? "log_softmax_bwd" : "softmax_bwd"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[1]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor dx = alloc_outputs(infer(metas_of(in)))[0];
    if (dx.numel() > 0)
      INGOT_KERNEL_CALL(dx.device(), softmax_bwd, dx, in[0].contiguous_raw(), in[1].contiguous_raw(), log_);
    return {dx};
  }
  FusionKind fusion_kind() const override { return FusionKind::Reduction; }

 private:
  bool log_;
};

class SoftmaxPrim final : public Primitive {
 public:
  explicit SoftmaxPrim(bool log) : log_(log) {}
  std::string_view name() const override { return log_ ? "log_softmax" : "softmax"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    check_floating(log_ ? "log_softmax" : "softmax", in[0]);
    return {in[0]};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor y = alloc_outputs(infer(metas_of(in)))[0];
    if (y.numel() > 0) INGOT_KERNEL_CALL(y.device(), softmax_fwd, y, in[0].contiguous_raw(), log_);
    return {y};
  }
  bool saves_input(size_t) const override { return false; }
  bool saves_output(size_t) const override { return true; }
  FusionKind fusion_kind() const override { return FusionKind::Reduction; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    const Tensor& y = c.outputs[0];
    return {apply1(std::make_shared<SoftmaxBwdPrim>(log_), {cast(g[0], y.dtype()), y})};
  }

 private:
  bool log_;
};

Tensor softmax_along(const Tensor& a, int64_t dim, bool log) {
  auto prim = std::make_shared<SoftmaxPrim>(log);
  const int64_t d = wrap_dim(dim, std::max<int64_t>(a.dim(), 1), log ? "log_softmax" : "softmax");
  if (a.dim() <= 1 || d == a.dim() - 1) return apply1(prim, {a});
  return transpose(apply1(prim, {transpose(a, d, -1)}), d, -1);
}

// Backward of layer_norm (mean defined) and rms_norm (mean undefined): inputs {dy, x, mean, rstd, w}; the
// outputs are the wanted ones among dx, dw, db, in that order. dx alone is a reduction over each row and
// dw/db alone one over the rows, so either fuses as a row reduction; both at once is the eager fused kernel,
// which the compiler splits (Note [Norm backward decomposition], compile/passes/decompose_norm_bwd.cpp).
class NormBwdPrim final : public Primitive {
 public:
  NormBwdPrim(bool centered, bool want_dx, bool want_dw, bool want_db)
      : centered_(centered), dx_(want_dx), dw_(want_dw), db_(want_db) {}
  std::string_view name() const override { return centered_ ? "layer_norm_bwd" : "rms_norm_bwd"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const TensorMeta& x = in[1];
    const TensorMeta param{{x.shape.back()}, stats_dtype(x.dtype), x.device};
    std::vector<TensorMeta> out;
    if (dx_) out.push_back(x);
    if (dw_) out.push_back(param);
    if (db_) out.push_back(param);
    return out;
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> out = alloc_outputs(infer(metas_of(in)));
    size_t k = 0;
    Tensor dx = dx_ ? out[k++] : Tensor(), dw = dw_ ? out[k++] : Tensor(), db = db_ ? out[k++] : Tensor();
    const Tensor dy = in[0].contiguous_raw(), x = in[1].contiguous_raw(), w = contiguous_or_undefined(in[4]);
    if (x.numel() == 0) {
      for (Tensor& t : out) t.zero_();
      return out;
    }
    if (centered_)
      INGOT_KERNEL_CALL(x.device(), layer_norm_bwd, dx, dw, db, dy, x, in[2].contiguous_raw(),
                        in[3].contiguous_raw(), w);
    else INGOT_KERNEL_CALL(x.device(), rms_norm_bwd, dx, dw, dy, x, in[3].contiguous_raw(), w);
    return out;
  }
  FusionKind fusion_kind() const override { return dx_ && (dw_ || db_) ? FusionKind::Opaque : FusionKind::Reduction; }
  void print_attrs(std::ostream& os) const override { os << "dx=" << dx_ << ", dw=" << dw_ << ", db=" << db_; }
  NormBwdFlags flags() const { return {centered_, dx_, dw_, db_}; }

 private:
  bool centered_, dx_, dw_, db_;
};

// Shared forward of layer_norm (centered) and rms_norm: inputs {x, w, b} (w, b possibly undefined, b always
// undefined for rms_norm); outputs {y, mean, rstd} for layer_norm and {y, rstd} for rms_norm.
class NormPrim final : public Primitive, public WithAttrs<NormAttrs> {
 public:
  NormPrim(bool centered, double eps, bool has_w, bool has_b) : WithAttrs({centered, eps, has_w, has_b}) {}
  std::string_view name() const override { return attrs_.centered ? "layer_norm" : "rms_norm"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const char* op = attrs_.centered ? "layer_norm" : "rms_norm";
    const TensorMeta& x = in[0];
    check_floating(op, x);
    INGOT_CHECK(!x.shape.empty() && x.shape.back() > 0, op, ": expected a non-empty last dim to normalize over, got ",
                shape_str(x.shape));
    const Shape param{x.shape.back()};
    for (size_t i : {size_t{1}, size_t{2}}) {
      if (!(i == 1 ? attrs_.weight : attrs_.bias)) continue;
      check_floating(op, in[i]);
      INGOT_CHECK(in[i].shape == param, op, ": ", (i == 1 ? "weight" : "bias"), " has shape ",
                  shape_str(in[i].shape), ", expected ", shape_str(param), " (the last dim of input ",
                  shape_str(x.shape), ")");
    }
    const TensorMeta stat{row_shape(x.shape), stats_dtype(x.dtype), x.device};
    if (attrs_.centered) return {x, stat, stat};
    return {x, stat};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> out = alloc_outputs(infer(metas_of(in)));
    if (out[0].numel() == 0) return out;
    const Tensor x = in[0].contiguous_raw(), w = contiguous_or_undefined(in[1]);
    if (attrs_.centered)
      INGOT_KERNEL_CALL(x.device(), layer_norm_fwd, out[0], out[1], out[2], x, w, contiguous_or_undefined(in[2]),
                        attrs_.eps);
    else INGOT_KERNEL_CALL(x.device(), rms_norm_fwd, out[0], out[1], x, w, attrs_.eps);
    return out;
  }
  bool saves_input(size_t i) const override { return i < 2; }
  bool saves_output(size_t k) const override { return k > 0; }
  FusionKind fusion_kind() const override { return FusionKind::Reduction; }
  void print_attrs(std::ostream& os) const override {
    os << "eps=" << attrs_.eps << ", weight=" << attrs_.weight << ", bias=" << attrs_.bias;
  }
  // Cotangents of the statistics are ignored: they are implementation outputs the public ops never return.
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    const bool want_dx = c.needs_grad[0], want_dw = attrs_.weight && c.needs_grad[1];
    const bool want_db = attrs_.bias && c.needs_grad[2];
    const Tensor& x = c.inputs[0];
    Tensor mean = attrs_.centered ? c.outputs[1] : Tensor(), rstd = c.outputs[attrs_.centered ? 2 : 1];
    std::vector<Tensor> grads =
        apply(std::make_shared<NormBwdPrim>(attrs_.centered, want_dx, want_dw, want_db),
              {cast(g[0], x.dtype()), x, mean, rstd, attrs_.weight ? c.inputs[1] : Tensor()});
    std::vector<Tensor> r(3);
    size_t k = 0;
    if (want_dx) r[0] = grads[k++];
    if (want_dw) r[1] = cast(grads[k++], c.input_meta[1].dtype);
    if (want_db) r[2] = cast(grads[k++], c.input_meta[2].dtype);
    return r;
  }
};

}  // namespace

std::shared_ptr<Primitive> make_norm_bwd(bool centered, bool dx, bool dw, bool db) {
  return std::make_shared<NormBwdPrim>(centered, dx, dw, db);
}

std::optional<NormBwdFlags> norm_bwd_flags(const Primitive& p) {
  const auto* n = dynamic_cast<const NormBwdPrim*>(&p);
  if (!n) return std::nullopt;
  return n->flags();
}

Tensor softmax(const Tensor& a, int64_t dim) { return softmax_along(a, dim, false); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return softmax_along(a, dim, true); }

// x is made contiguous by an op first, so the tensor saved for backward is the one the kernel reads.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  auto prim = std::make_shared<NormPrim>(true, eps, weight.defined(), bias.defined());
  return apply(prim, {contiguous(x), weight, bias})[0];
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  auto prim = std::make_shared<NormPrim>(false, eps, weight.defined(), false);
  return apply(prim, {contiguous(x), weight, Tensor()})[0];
}

}  // namespace ingot
