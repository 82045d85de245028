// Normalization family over the last dim: softmax, log_softmax, layer_norm, rms_norm.
//
// Each op is one forward primitive over contiguous rows (softmax along another dim transposes that dim last
// and back) and one backward primitive that runs the fused backward kernel. layer_norm and rms_norm return
// their per-row statistics (mean, rstd) as extra outputs that backward reuses; those are f32 for f32 / bf16 /
// f16 inputs (mixed precision depends on it) and f64 for f64 inputs. Outputs keep the input dtype; weight and
// bias gradients are computed in the statistics dtype and cast to the parameter's dtype. Each lowers to a row
// reduction with the same math in the same precision (Note [Ops lower themselves]).
#include "autograd/ops/norm.h"

#include "autograd/kernel_lowering.h"
#include "autograd/ops.h"
#include "autograd/ops/attrs.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

DType stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

Shape row_shape(const Shape& x) { return x.empty() ? Shape{} : Shape(x.begin(), x.end() - 1); }

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? t.contiguous_raw() : t; }

using codegen::Op;

// The last axis of a non-scalar shape: what every op of this family reduces in a kernel.
std::optional<std::vector<int64_t>> last_axis(const Shape& s) {
  if (s.empty()) return std::vector<int64_t>{};
  return std::vector<int64_t>{static_cast<int64_t>(s.size()) - 1};
}

void check_floating(const char* op, const TensorMeta& x) {
  INGOT_CHECK(is_floating(x.dtype), op, ": expected a floating tensor, got ", dtype_name(x.dtype));
}

// dx = softmax_bwd(dy, y): inputs {dy, y}, one output like y.
class SoftmaxBwdPrim final : public Primitive, public KernelLowering {
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
  std::optional<std::vector<int64_t>> reduced_axes(const Shape& s, std::string*) const override { return last_axis(s); }
  std::vector<int> lower(LowerContext& cx) const override {
    cx.require_row_reduction();
    codegen::KernelSpec& k = cx.spec();
    const int dy = cx.floating(cx.input(0)), y = cx.floating(cx.input(1));
    int r;
    if (!log_) {
      const int s = k.reduce(Op::ReduceSum, k.binary(Op::Mul, dy, y));
      r = k.binary(Op::Mul, y, k.binary(Op::Sub, dy, s));
    } else {
      const int s = k.reduce(Op::ReduceSum, dy);
      r = k.binary(Op::Sub, dy, k.binary(Op::Mul, k.unary(Op::Exp, y), s));
    }
    return {k.cast(r, cx.output_dtype(0))};
  }

 private:
  bool log_;
};

class SoftmaxPrim final : public Primitive, public KernelLowering {
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
  std::optional<std::vector<int64_t>> reduced_axes(const Shape& s, std::string*) const override { return last_axis(s); }
  std::vector<int> lower(LowerContext& cx) const override {
    cx.require_row_reduction();
    codegen::KernelSpec& k = cx.spec();
    const int x = cx.floating(cx.input(0));
    const int m = k.reduce(Op::ReduceMax, x);
    const int sh = k.binary(Op::Sub, x, m);
    const int e = k.unary(Op::Exp, sh);
    const int s = k.reduce(Op::ReduceSum, e);
    const int r = log_ ? k.binary(Op::Sub, sh, k.unary(Op::Log, s)) : k.binary(Op::Div, e, s);
    return {k.cast(r, cx.output_dtype(0))};
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
class NormBwdPrim final : public Primitive, public KernelLowering {
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
  // dx reduces each row; dw / db alone reduce over every row (the leading axes: the kernel's iteration space
  // is transposed, Note [Norm backward decomposition]).
  std::optional<std::vector<int64_t>> reduced_axes(const Shape& s, std::string* why) const override {
    if (dx_) return last_axis(s);
    std::vector<int64_t> rows;
    for (int64_t a = 0; a + 1 < static_cast<int64_t>(s.size()); ++a) rows.push_back(a);
    if (rows.empty() && why) *why = "a norm weight gradient over a single row";
    return rows;
  }
  // inputs: dy, x, mean (none for rms_norm), rstd, w (or none); the math of norm_bwd_impl
  // (runtime/kernels/cpu/norm.cpp) in its precision, f32 (f64 for f64 x).
  std::vector<int> lower(LowerContext& cx) const override {
    cx.require_row_reduction();
    codegen::KernelSpec& k = cx.spec();
    const DType st = stats_dtype(cx.node_dtype(cx.input(1)));
    auto as = [&](int x) { return cx.node_dtype(x) == st ? x : k.cast(x, st); };
    const int dy = as(cx.input(0)), rstd = as(cx.row_input(3));
    const int centered_x = centered_ ? k.binary(Op::Sub, as(cx.input(1)), as(cx.row_input(2))) : as(cx.input(1));
    const int xhat = k.binary(Op::Mul, centered_x, rstd);
    std::vector<int> rs;
    if (dx_) {
      const int gw = cx.has_input(4) ? k.binary(Op::Mul, dy, as(cx.input(4))) : dy;
      const int inv_c = k.constant(1.0 / static_cast<double>(cx.reduced_size()), st);
      int d = gw;
      if (centered_) d = k.binary(Op::Sub, gw, k.binary(Op::Mul, k.reduce(Op::ReduceSum, gw), inv_c));
      const int mean_gx = k.binary(Op::Mul, k.reduce(Op::ReduceSum, k.binary(Op::Mul, gw, xhat)), inv_c);
      rs.push_back(k.binary(Op::Mul, rstd, k.binary(Op::Sub, d, k.binary(Op::Mul, xhat, mean_gx))));
      // dw, db from the same values (Note [Column sums in row reductions], render_cuda_rows.cpp).
      if (dw_) rs.push_back(k.column_sum(k.binary(Op::Mul, dy, xhat)));
      if (db_) rs.push_back(k.column_sum(dy));
    } else {  // the reduced dim is every row
      if (dw_) rs.push_back(k.reduce(Op::ReduceSum, k.binary(Op::Mul, dy, xhat)));
      if (db_) rs.push_back(k.reduce(Op::ReduceSum, dy));
    }
    return rs;
  }

 private:
  bool centered_, dx_, dw_, db_;
};

// Shared forward of layer_norm (centered) and rms_norm: inputs {x, w, b} (w, b possibly undefined, b always
// undefined for rms_norm); outputs {y, mean, rstd} for layer_norm and {y, rstd} for rms_norm.
class NormPrim final : public Primitive, public WithAttrs<NormAttrs>, public KernelLowering {
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
  // One pass over each row of x: a normalized activation that only weight gradients read (a linear's input) is
  // cheaper to remake from x, which the norm's backward keeps anyway, than to keep.
  bool cheap_to_recompute() const override { return true; }
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
  std::optional<std::vector<int64_t>> reduced_axes(const Shape& s, std::string*) const override { return last_axis(s); }
  std::vector<int> lower(LowerContext& cx) const override {
    cx.require_row_reduction();
    codegen::KernelSpec& k = cx.spec();
    const int x0 = cx.input(0);
    const DType st = stats_dtype(cx.node_dtype(x0));
    const int x = k.cast(x0, st);
    const int cols = k.constant(static_cast<double>(cx.reduced_size()), st);
    int d = x, mu = -1;
    if (attrs_.centered) {
      mu = k.binary(Op::Div, k.reduce(Op::ReduceSum, x), cols);
      d = k.binary(Op::Sub, x, mu);
    }
    const int var = k.binary(Op::Div, k.reduce(Op::ReduceSum, k.binary(Op::Mul, d, d)), cols);
    const int rstd = k.unary(Op::Rsqrt, k.binary(Op::Add, var, k.constant(attrs_.eps, st)));
    int y = k.binary(Op::Mul, d, rstd);
    if (cx.has_input(1)) y = k.binary(Op::Mul, y, k.cast(cx.input(1), st));
    if (attrs_.centered && cx.has_input(2)) y = k.binary(Op::Add, y, k.cast(cx.input(2), st));
    std::vector<int> rs{y};
    if (attrs_.centered) rs.push_back(mu);
    rs.push_back(rstd);
    return rs;
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
