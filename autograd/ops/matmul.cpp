// Matrix-product family: matmul (numpy semantics), bmm, linear.
//
// Everything funnels into two primitives over 2-D / 3-D operands that map straight onto the `matmul` kernel:
//   MatmulPrim(trans_a, trans_b): op(a) @ op(b), a [Ba, M, K] or [M, K] (stored [.., K, M] when trans_a),
//                                 b likewise; a batch of 1 (or a 2-D operand) broadcasts over the other's batch.
//   LinearPrim: x [R, in] @ w[out, in]^T + b[out], the bias written first and accumulated into (beta = 1).
// Both take a scale alpha of the product (1 as built here; compile/passes/scale_into_products.cpp folds a scalar
// multiply of an operand into it), and MatmulAccumulatePrim adds a product into a third tensor (matmul_fused.h).
// matmul() promotes 1-D operands, flattens the broadcast batch dims into one, and folds a batched
// `[..., M, K] @ [K, N]` into a single [.. * M, K] @ [K, N] product. Backward is the two transposed products,
// expressed with the trans flags so no transpose is ever materialized, and summed over broadcast batches.
#include "autograd/ops.h"
#include "autograd/ops/matmul_fused.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

// An operand as the kernel wants it: a contiguous 3-D view plus its trans flag. A tensor whose last two dims
// are a transpose of a contiguous buffer (x.transpose(-1, -2), a saved weight seen as w^T) is passed as that
// buffer with the flag flipped; anything else is copied.
struct KernelOperand {
  Tensor t;
  bool trans;
};

KernelOperand kernel_operand(const Tensor& x, bool trans) {
  Tensor t3 = x.dim() == 3 ? x
                           : x.as_strided({1, x.size(0), x.size(1)}, {x.size(0) * x.size(1), x.stride(0), x.stride(1)},
                                          x.offset());
  if (t3.is_contiguous()) return {t3, trans};
  const Shape& s = t3.shape();
  const Strides& st = t3.strides();
  Tensor flipped = t3.as_strided({s[0], s[2], s[1]}, {st[0], st[2], st[1]}, t3.offset());
  if (flipped.is_contiguous()) return {flipped, !trans};
  return {t3.contiguous_raw(), trans};
}

// [.., rows, cols] of a stored operand, as seen after its trans flag.
std::pair<int64_t, int64_t> logical_dims(const Shape& s, bool trans) {
  int64_t r = s[s.size() - 2], c = s[s.size() - 1];
  return trans ? std::pair{c, r} : std::pair{r, c};
}

void check_float_pair(const char* op, const TensorMeta& a, const TensorMeta& b) {
  INGOT_CHECK(is_floating(a.dtype) && a.dtype == b.dtype, op, ": expected two floating tensors of one dtype, got ",
              dtype_name(a.dtype), " and ", dtype_name(b.dtype));
}

// The shape of op(a) @ op(b) for operands a, b of matmul's rules (2-D or 3-D, a batch of 1 broadcasting).
Shape product_shape(const char* op, const TensorMeta& a, const TensorMeta& b, bool ta, bool tb) {
  const Shape &sa = a.shape, &sb = b.shape;
  INGOT_CHECK((sa.size() == 2 || sa.size() == 3) && (sb.size() == 2 || sb.size() == 3), op,
              ": expected 2-D or 3-D operands, got ", shape_str(sa), " and ", shape_str(sb));
  check_float_pair(op, a, b);
  auto [m, k] = logical_dims(sa, ta);
  auto [k2, n] = logical_dims(sb, tb);
  INGOT_CHECK(k == k2, op, ": inner dims differ: ", shape_str(sa), (ta ? "^T" : ""), " @ ", shape_str(sb),
              (tb ? "^T" : ""), " (", k, " vs ", k2, ")");
  const int64_t ba = sa.size() == 3 ? sa[0] : 1, bb = sb.size() == 3 ? sb[0] : 1;
  INGOT_CHECK(ba == bb || ba == 1 || bb == 1, op, ": batch sizes ", ba, " and ", bb, " do not broadcast");
  Shape out = {m, n};
  if (sa.size() == 3 || sb.size() == 3) out.insert(out.begin(), std::max(ba, bb));
  return out;
}

// A product's scale, printed only when it is not 1 so graphs without folded scales print (and hash) as before,
// at full precision through exact_attrs (Note [Exact attributes], autograd/primitive.h).
void print_alpha(std::ostream& os, double alpha, bool first) {
  if (alpha != 1.0) os << (first ? "" : ", ") << "alpha=" << alpha;
}

class MatmulPrim final : public Primitive {
 public:
  // widened: an f32 product of bf16 / f16 operands (matmul_fused.h); alpha: the product's scale
  // (scaled_product); only compiled graphs build either.
  MatmulPrim(bool trans_a, bool trans_b, bool widened = false, double alpha = 1.0)
      : ta_(trans_a), tb_(trans_b), widened_(widened), alpha_(alpha) {}
  std::string_view name() const override { return "matmul"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{product_shape("matmul", in[0], in[1], ta_, tb_), widened_ ? DType::f32 : in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor out = alloc_outputs(infer(metas_of(in)))[0];
    eval_to(in, {out});
    return {out};
  }
  // The product writes any contiguous output, a slice of a gradient bucket included (Note [Outputs into given
  // buffers]).
  bool writes_given_outputs() const override { return true; }
  void eval_to(const std::vector<Tensor>& in, const std::vector<Tensor>& outs) const override {
    const Tensor& out = outs[0];
    if (out.numel() == 0) return;
    KernelOperand a = kernel_operand(in[0], ta_), b = kernel_operand(in[1], tb_);
    INGOT_KERNEL_CALL(out.device(), matmul, kernel_operand(out, false).t, a.t, b.t, a.trans, b.trans, alpha_, 0.0);
  }
  void print_attrs(std::ostream& os) const override {
    os << "trans_a=" << ta_ << ", trans_b=" << tb_;
    if (widened_) os << ", out=f32";
    print_alpha(os, alpha_, false);
  }
  // The compiler's variants have no vjp of their own (they appear only in graphs the passes rewrote).
  bool differentiable() const override { return !widened_ && alpha_ == 1.0; }
  // dA reads b and dB reads a: an operand is kept only for the other's gradient.
  bool saves_input_given(size_t i, const std::vector<bool>& needs) const override { return needs[1 - i]; }
  MatmulFlags flags() const { return {ta_, tb_, widened_, alpha_}; }
  // With A = op(a), B = op(b): dA = dC @ B^T and dB = A^T @ dC; a stored transposed gets the transpose of
  // that, which the flags express without copies.
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override;

 private:
  bool ta_, tb_, widened_;
  double alpha_;
};

// See autograd/ops/matmul_fused.h. Inputs (a, b, c), output alpha * op(a) @ op(b) + c shaped like c: the kernel's
// beta = 1 over a buffer holding c (Note [Outputs over dead inputs]). Never differentiated, like matmul_dgelu.
class MatmulAccumulatePrim final : public Primitive {
 public:
  MatmulAccumulatePrim(bool trans_a, bool trans_b, double alpha) : ta_(trans_a), tb_(trans_b), alpha_(alpha) {}
  std::string_view name() const override { return "matmul_accumulate"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const Shape p = product_shape("matmul_accumulate", in[0], in[1], ta_, tb_);
    INGOT_CHECK(
        ingot::numel(in[2].shape) == ingot::numel(p) && in[2].dtype == in[0].dtype && in[2].device == in[0].device,
        "matmul_accumulate: the product ", shape_str(p), " ", dtype_name(in[0].dtype), " cannot accumulate into ",
        shape_str(in[2].shape), " ", dtype_name(in[2].dtype));
    return {in[2]};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return eval_into(in, in[2].clone_raw()); }
  // The kernel reads each element of c before it writes it (out = alpha * a @ b + 1 * out).
  std::optional<size_t> reusable_input() const override { return 2; }
  std::vector<Tensor> eval_into(const std::vector<Tensor>& in, const Tensor& into) const override {
    if (!into.is_contiguous()) return eval(in);
    const Shape p = product_shape("matmul_accumulate", meta_of(in[0]), meta_of(in[1]), ta_, tb_);
    if (ingot::numel(p) > 0) {
      KernelOperand a = kernel_operand(in[0], ta_), b = kernel_operand(in[1], tb_);
      const Tensor out = kernel_operand(into.as_strided(p, contiguous_strides(p), into.offset()), false).t;
      INGOT_KERNEL_CALL(into.device(), matmul, out, a.t, b.t, a.trans, b.trans, alpha_, 1.0);
    }
    return {into};
  }
  // Into a gradient bucket's slice as well: c is copied there unless its producer already wrote it there
  // (compile/passes/bucket_views.cpp follows reusable inputs).
  bool writes_given_outputs() const override { return true; }
  void eval_to(const std::vector<Tensor>& in, const std::vector<Tensor>& outs) const override {
    eval_into_given(in, outs[0]);
  }
  bool differentiable() const override { return false; }
  void print_attrs(std::ostream& os) const override {
    os << "trans_a=" << ta_ << ", trans_b=" << tb_;
    print_alpha(os, alpha_, false);
  }
  double alpha() const { return alpha_; }
  MatmulFlags flags() const { return {ta_, tb_, false, alpha_}; }

 private:
  bool ta_, tb_;
  double alpha_;
};

// See autograd/ops/matmul_fused.h. Inputs (a, b, pre); never differentiated (it only appears in backward
// graphs the compiler rewrote).
class MatmulDgeluPrim final : public Primitive {
 public:
  MatmulDgeluPrim(bool trans_a, bool trans_b, bool dbias) : ta_(trans_a), tb_(trans_b), dbias_(dbias) {}
  std::string_view name() const override { return "matmul_dgelu"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const Shape &sa = in[0].shape, &sb = in[1].shape;
    INGOT_CHECK(sa.size() == 2 && sb.size() == 2, "matmul_dgelu: expected 2-D operands, got ", shape_str(sa),
                " and ", shape_str(sb));
    check_float_pair("matmul_dgelu", in[0], in[1]);
    auto [m, k] = logical_dims(sa, ta_);
    auto [k2, n] = logical_dims(sb, tb_);
    INGOT_CHECK(k == k2 && ingot::numel(in[2].shape) == m * n && in[2].dtype == in[0].dtype,
                "matmul_dgelu: ", shape_str(sa), (ta_ ? "^T" : ""), " @ ", shape_str(sb), (tb_ ? "^T" : ""),
                " does not match the GELU input ", shape_str(in[2].shape));
    std::vector<TensorMeta> out{{in[2].shape, in[0].dtype, in[0].device}};
    if (dbias_) out.push_back({{n}, in[0].dtype, in[0].device});
    return out;
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> out = alloc_outputs(infer(metas_of(in)));
    const int64_t m = logical_dims(in[0].shape(), ta_).first;
    const int64_t n = ingot::numel(in[2].shape()) / std::max<int64_t>(m, 1);
    const Tensor out3 = out[0].as_strided({1, m, n}, {m * n, n, 1}, out[0].offset());
    if (out[0].numel() == 0) {
      if (dbias_) out[1].zero_();
      return out;
    }
    KernelOperand a = kernel_operand(in[0], ta_), b = kernel_operand(in[1], tb_);
    INGOT_KERNEL_CALL(out[0].device(), matmul_dgelu, out3, dbias_ ? out[1] : Tensor(), a.t, b.t, a.trans, b.trans,
                      in[2].contiguous_raw());
    return out;
  }
  bool differentiable() const override { return false; }
  void print_attrs(std::ostream& os) const override {
    os << "trans_a=" << ta_ << ", trans_b=" << tb_ << ", dbias=" << dbias_;
  }

 private:
  bool ta_, tb_, dbias_;
};

// See autograd/ops/matmul_fused.h. Inputs (x [M, K], w [N, K], b [N]) as for linear; outputs (gelu_tanh of the
// linear shaped `shape`, the linear itself [M, N]). Never differentiated, like matmul_dgelu.
class LinearGeluPrim final : public Primitive {
 public:
  explicit LinearGeluPrim(Shape shape) : shape_(std::move(shape)) {}
  std::string_view name() const override { return "linear_gelu"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const Shape &sx = in[0].shape, &sw = in[1].shape;
    INGOT_CHECK(sx.size() == 2 && sw.size() == 2 && sx[1] == sw[1] && in[2].shape == Shape{sw[0]} &&
                    ingot::numel(shape_) == sx[0] * sw[0],
                "linear_gelu: x ", shape_str(sx), ", w ", shape_str(sw), ", b ", shape_str(in[2].shape),
                " do not give ", shape_str(shape_));
    check_float_pair("linear_gelu", in[0], in[1]);
    return {{shape_, in[0].dtype, in[0].device}, {{sx[0], sw[0]}, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> out = alloc_outputs(infer(metas_of(in)));
    if (out[1].numel() == 0) return out;
    const int64_t m = out[1].size(0), n = out[1].size(1);
    const Tensor y3 = out[0].as_strided({1, m, n}, {m * n, n, 1}, out[0].offset());
    KernelOperand x = kernel_operand(in[0], false), w = kernel_operand(in[1], true);
    INGOT_KERNEL_CALL(out[0].device(), matmul_bias_gelu, y3, kernel_operand(out[1], false).t, x.t, w.t, x.trans,
                      w.trans, in[2].contiguous_raw());
    return out;
  }
  bool differentiable() const override { return false; }
  void print_attrs(std::ostream& os) const override { os << "shape=" << shape_str(shape_); }

 private:
  Shape shape_;
};

Tensor mm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  return apply1(std::make_shared<MatmulPrim>(trans_a, trans_b), {a, b});
}

std::vector<Tensor> MatmulPrim::vjp(const VjpContext& c, const std::vector<Tensor>& g) const {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  const Tensor d = cast(g[0], c.input_meta[0].dtype);
  std::vector<Tensor> r(2);
  if (c.needs_grad[0]) r[0] = sum_to_shape(ta_ ? mm(b, d, tb_, true) : mm(d, b, false, !tb_), c.input_meta[0].shape);
  if (c.needs_grad[1]) r[1] = sum_to_shape(tb_ ? mm(d, a, true, ta_) : mm(a, d, !ta_, false), c.input_meta[1].shape);
  return r;
}

class LinearPrim final : public Primitive {
 public:
  // alpha: the product's scale (scaled_product, compiler-only); the bias is never scaled.
  explicit LinearPrim(double alpha = 1.0) : alpha_(alpha) {}
  std::string_view name() const override { return "linear"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const Shape &sx = in[0].shape, &sw = in[1].shape;
    INGOT_CHECK(sw.size() == 2, "linear: expected weight [out_features, in_features], got ", shape_str(sw));
    INGOT_INTERNAL_CHECK(sx.size() == 2, "linear: input must be flattened to 2-D, got ", shape_str(sx));
    check_float_pair("linear", in[0], in[1]);
    INGOT_CHECK(sx[1] == sw[1], "linear: input has ", sx[1], " features but weight ", shape_str(sw), " expects ",
                sw[1]);
    return {{{sx[0], sw[0]}, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor out = alloc_outputs(infer(metas_of(in)))[0];
    if (out.numel() == 0) return {out};
    KernelOperand x = kernel_operand(in[0], false), w = kernel_operand(in[1], true);
    // The bias kernel (cuBLASLt's bias epilogue) has no alpha, so scale_into_products folds only into bias-free
    // linears.
    INGOT_INTERNAL_CHECK(!in[2].defined() || alpha_ == 1.0, "linear: a scaled product (alpha=", alpha_,
                         ") with a bias, which the bias kernel cannot scale apart from it");
    if (in[2].defined())
      INGOT_KERNEL_CALL(out.device(), matmul_bias, kernel_operand(out, false).t, x.t, w.t, x.trans, w.trans,
                        in[2].contiguous_raw());
    else
      INGOT_KERNEL_CALL(out.device(), matmul, kernel_operand(out, false).t, x.t, w.t, x.trans, w.trans, alpha_, 0.0);
    return {out};
  }
  void print_attrs(std::ostream& os) const override { print_alpha(os, alpha_, true); }
  bool differentiable() const override { return alpha_ == 1.0; }
  double alpha() const { return alpha_; }
  bool saves_input(size_t i) const override { return i < 2; }
  // dx reads w and dw reads x (db neither): a frozen weight's linear keeps no input alive for the backward.
  bool saves_input_given(size_t i, const std::vector<bool>& needs) const override {
    return i < 2 && needs[1 - i];
  }
  // y = x @ w^T + b:  dx = dy @ w,  dw = dy^T @ x,  db = sum over rows of dy.
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    const Tensor d = cast(g[0], c.input_meta[0].dtype);
    std::vector<Tensor> r(3);
    if (c.needs_grad[0]) r[0] = mm(d, c.inputs[1], false, false);
    if (c.needs_grad[1]) r[1] = mm(d, c.inputs[0], true, false);
    if (c.needs_grad[2]) r[2] = sum(d, {0});
    return r;
  }

 private:
  double alpha_;
};

// [..batch, r, c] -> the broadcast batch flattened to one dim; a batch that is all ones stays 2-D, so the
// kernel broadcasts it without a copy. A partially broadcast batch is materialized.
Tensor flatten_batch(const Tensor& t, const Shape& batch) {
  const Shape own(t.shape().begin(), t.shape().end() - 2);
  const int64_t r = t.size(-2), c = t.size(-1);
  if (ingot::numel(own) == 1) return t.dim() == 2 ? t : reshape(t, {r, c});
  Shape full = batch;
  full.push_back(r);
  full.push_back(c);
  return reshape(own == batch ? t : expand(t, full), {ingot::numel(batch), r, c});
}

}  // namespace

std::shared_ptr<Primitive> make_matmul_dgelu(bool trans_a, bool trans_b, bool with_dbias) {
  return std::make_shared<MatmulDgeluPrim>(trans_a, trans_b, with_dbias);
}

std::shared_ptr<Primitive> make_matmul_widened(bool trans_a, bool trans_b) {
  return std::make_shared<MatmulPrim>(trans_a, trans_b, true);
}

std::shared_ptr<Primitive> make_linear_gelu(Shape shape) { return std::make_shared<LinearGeluPrim>(std::move(shape)); }

std::optional<MatmulFlags> matmul_flags(const Primitive& p) {
  const auto* m = dynamic_cast<const MatmulPrim*>(&p);
  if (!m) return std::nullopt;
  return m->flags();
}

bool is_linear(const Primitive& p) { return dynamic_cast<const LinearPrim*>(&p) != nullptr; }

std::shared_ptr<Primitive> make_matmul_accumulate(bool trans_a, bool trans_b, double alpha) {
  return std::make_shared<MatmulAccumulatePrim>(trans_a, trans_b, alpha);
}

std::optional<double> product_alpha(const Primitive& p) {
  if (const auto* m = dynamic_cast<const MatmulPrim*>(&p)) return m->flags().alpha;
  if (const auto* l = dynamic_cast<const LinearPrim*>(&p)) return l->alpha();
  if (const auto* a = dynamic_cast<const MatmulAccumulatePrim*>(&p)) return a->alpha();
  return std::nullopt;
}

std::shared_ptr<Primitive> scaled_product(const Primitive& p, double s) {
  if (const auto* m = dynamic_cast<const MatmulPrim*>(&p)) {
    const MatmulFlags f = m->flags();
    return std::make_shared<MatmulPrim>(f.trans_a, f.trans_b, f.widened, f.alpha * s);
  }
  if (const auto* l = dynamic_cast<const LinearPrim*>(&p)) return std::make_shared<LinearPrim>(l->alpha() * s);
  if (const auto* a = dynamic_cast<const MatmulAccumulatePrim*>(&p)) {
    const MatmulFlags f = a->flags();
    return std::make_shared<MatmulAccumulatePrim>(f.trans_a, f.trans_b, f.alpha * s);
  }
  return nullptr;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  INGOT_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: operands must have at least 1 dim, got ",
              shape_str(a.shape()), " and ", shape_str(b.shape()));
  INGOT_CHECK(a.size(-1) == b.size(b.dim() == 1 ? -1 : -2), "matmul: inner dims differ: ", shape_str(a.shape()),
              " @ ", shape_str(b.shape()));
  DType t = promote(a.dtype(), b.dtype());
  INGOT_CHECK(is_floating(t), "matmul: expected floating operands, got ", dtype_name(a.dtype()), " and ",
              dtype_name(b.dtype()));
  const Tensor a2 = a.dim() == 1 ? unsqueeze(cast(a, t), 0) : cast(a, t);
  const Tensor b2 = b.dim() == 1 ? unsqueeze(cast(b, t), -1) : cast(b, t);
  const Shape ba(a2.shape().begin(), a2.shape().end() - 2), bb(b2.shape().begin(), b2.shape().end() - 2);
  const Shape batch = broadcast_shapes(ba, bb, "matmul");
  const int64_t m = a2.size(-2), n = b2.size(-1);
  Tensor out;
  if (bb.empty() && !ba.empty()) {
    // [..., M, K] @ [K, N]: one tall product instead of a batch of small ones (and one gemm for dB).
    out = mm(reshape(a2, {ingot::numel(ba) * m, a2.size(-1)}), b2, false, false);
  } else {
    out = mm(flatten_batch(a2, batch), flatten_batch(b2, batch), false, false);
  }
  Shape shape = batch;
  if (a.dim() > 1) shape.push_back(m);
  if (b.dim() > 1) shape.push_back(n);
  return out.shape() == shape ? out : reshape(out, shape);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  INGOT_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0),
              "bmm: expected [B, M, K] and [B, K, N] with one batch size, got ", shape_str(a.shape()), " and ",
              shape_str(b.shape()));
  return mm(a, b, false, false);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  INGOT_CHECK(x.dim() >= 1, "linear: input must have at least 1 dim, got a scalar");
  INGOT_CHECK(w.dim() == 2, "linear: expected weight [out_features, in_features], got ", shape_str(w.shape()));
  if (b.defined())
    INGOT_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "linear: bias ", shape_str(b.shape()), " does not match ",
                w.size(0), " out_features of weight ", shape_str(w.shape()));
  DType t = promote(x.dtype(), w.dtype());
  const Tensor x2 = x.dim() == 2 ? cast(x, t) : reshape(cast(x, t), {-1, x.size(-1)});
  Tensor y = apply1(std::make_shared<LinearPrim>(), {x2, cast(w, t), b.defined() ? cast(b, t) : b});
  if (x.dim() == 2) return y;
  Shape shape(x.shape().begin(), x.shape().end() - 1);
  shape.push_back(w.size(0));
  return reshape(y, shape);
}

}  // namespace ingot
