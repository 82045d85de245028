// Loss family: cross_entropy (with ignore_index and label smoothing) and mse_loss.
//
// cross_entropy flattens logits [..., C] to [N, C] and runs one fused primitive that returns the per-row loss
// and the row's logsumexp; backward rebuilds the softmax from that logsumexp in one fused kernel. Reductions
// are composed from ordinary ops afterwards, so a traced graph sees them: Mean divides by the number of
// targets that are not ignore_index, counted with tensor ops rather than on the host. Losses are f32 (f64 for
// f64 inputs) whatever the input dtype: bf16 logits still get an f32 loss, and logits get their gradient in
// their own dtype. cross_entropy_fused (loss_fused.h) is both primitives in one, for compiled training steps.
#include "autograd/ops.h"
#include "autograd/ops/loss_fused.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

DType loss_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

// The per-row loss's metadata for logits [N, C] and target [N], checking both; `op` names the primitive.
TensorMeta loss_row_meta(std::string_view op, const TensorMeta& logits, const TensorMeta& target) {
  INGOT_CHECK(is_floating(logits.dtype), op, ": expected floating logits, got ", dtype_name(logits.dtype));
  INGOT_CHECK(target.dtype == DType::i64, op, ": expected target of dtype i64, got ", dtype_name(target.dtype));
  INGOT_CHECK(logits.shape.size() == 2 && target.shape == Shape{logits.shape[0]}, op,
              ": expected logits [N, C] and target [N], got ", shape_str(logits.shape), " and ",
              shape_str(target.shape));
  INGOT_CHECK(logits.shape[1] > 0 || logits.shape[0] == 0, op, ": logits have no classes: ",
              shape_str(logits.shape));
  return {{logits.shape[0]}, loss_dtype(logits.dtype), logits.device};
}

// dlogits from {dloss, logits, lse, target}.
class CrossEntropyBwdPrim final : public Primitive, public WithAttrs<CrossEntropyAttrs> {
 public:
  CrossEntropyBwdPrim(int64_t ignore_index, double label_smoothing)
      : WithAttrs<CrossEntropyAttrs>({ignore_index, label_smoothing, true}),
        ignore_(ignore_index),
        ls_(label_smoothing) {}
  std::string_view name() const override { return "cross_entropy_bwd"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[1]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    return eval_into(in, alloc_outputs(infer(metas_of(in)))[0]);
  }
  // The kernel reads a row's logits and writes its gradient element by element (Note [Outputs over dead
  // inputs], autograd/primitive.h).
  std::optional<size_t> reusable_input() const override { return 1; }
  std::vector<Tensor> eval_into(const std::vector<Tensor>& in, const Tensor& dlogits) const override {
    if (dlogits.numel() > 0)
      INGOT_KERNEL_CALL(dlogits.device(), cross_entropy_bwd, dlogits, in[0].contiguous_raw(), in[1].contiguous_raw(),
                        in[2].contiguous_raw(), in[3].contiguous_raw(), ignore_, ls_);
    return {dlogits};
  }
  void print_attrs(std::ostream& os) const override {
    os << "ignore_index=" << ignore_ << ", label_smoothing=" << ls_;
  }

 private:
  int64_t ignore_;
  double ls_;
};

// {logits [N, C], target [N] i64} -> {loss [N], lse [N]}.
class CrossEntropyPrim final : public Primitive, public WithAttrs<CrossEntropyAttrs> {
 public:
  CrossEntropyPrim(int64_t ignore_index, double label_smoothing)
      : WithAttrs<CrossEntropyAttrs>({ignore_index, label_smoothing, false}),
        ignore_(ignore_index),
        ls_(label_smoothing) {}
  std::string_view name() const override { return "cross_entropy"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const TensorMeta row = loss_row_meta(name(), in[0], in[1]);
    return {row, row};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> out = alloc_outputs(infer(metas_of(in)));
    if (out[0].numel() > 0)
      INGOT_KERNEL_CALL(out[0].device(), cross_entropy_fwd, out[0], out[1], in[0].contiguous_raw(),
                        in[1].contiguous_raw(), ignore_, ls_);
    return out;
  }
  bool saves_output(size_t k) const override { return k == 1; }
  FusionKind fusion_kind() const override { return FusionKind::Reduction; }
  void print_attrs(std::ostream& os) const override {
    os << "ignore_index=" << ignore_ << ", label_smoothing=" << ls_;
  }
  // Only the logits get a gradient; the lse output is internal and its cotangent is ignored.
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    const Tensor& lse = c.outputs[1];
    Tensor dlogits = apply1(std::make_shared<CrossEntropyBwdPrim>(ignore_, ls_),
                            {cast(g[0], lse.dtype()), c.inputs[0], lse, c.inputs[1]});
    return {dlogits, Tensor()};
  }

 private:
  int64_t ignore_;
  double ls_;
};

// {logits [N, C], target [N] i64, dloss [N]} -> {loss [N], lse [N], dlogits [N, C]}: CrossEntropyPrim and
// CrossEntropyBwdPrim in one read of the logits. Only valid where dloss does not depend on the loss, which the
// compiler checks before it builds one (compile/passes/fuse_cross_entropy.cpp).
class CrossEntropyFusedPrim final : public Primitive {
 public:
  CrossEntropyFusedPrim(int64_t ignore_index, double label_smoothing)
      : ignore_(ignore_index), ls_(label_smoothing) {}
  std::string_view name() const override { return "cross_entropy_fused"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const TensorMeta row = loss_row_meta(name(), in[0], in[1]);
    INGOT_CHECK(in[2].shape == row.shape && in[2].dtype == row.dtype, name(), ": expected dloss ",
                dtype_name(row.dtype), shape_str(row.shape), ", got ", dtype_name(in[2].dtype),
                shape_str(in[2].shape));
    return {row, row, in[0]};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    return eval_into(in, alloc_outputs({infer(metas_of(in))[2]})[0]);
  }
  // Note [Outputs over dead inputs]: the kernel reads each row whole before writing its gradient. The buffer
  // serves output 2 (dlogits), not output 0: the executor only hands it to eval_into, which places it.
  std::optional<size_t> reusable_input() const override { return 0; }
  std::vector<Tensor> eval_into(const std::vector<Tensor>& in, const Tensor& dlogits) const override {
    std::vector<TensorMeta> rows = infer(metas_of(in));
    rows.pop_back();
    std::vector<Tensor> out = alloc_outputs(rows);
    if (dlogits.numel() > 0)
      INGOT_KERNEL_CALL(dlogits.device(), cross_entropy_fused, out[0], out[1], dlogits, in[0].contiguous_raw(),
                        in[1].contiguous_raw(), in[2].contiguous_raw(), ignore_, ls_);
    out.push_back(dlogits);
    return out;
  }
  void print_attrs(std::ostream& os) const override {
    os << "ignore_index=" << ignore_ << ", label_smoothing=" << ls_;
  }

 private:
  int64_t ignore_;
  double ls_;
};

}  // namespace

std::shared_ptr<Primitive> make_cross_entropy_fused(int64_t ignore_index, double label_smoothing) {
  return std::make_shared<CrossEntropyFusedPrim>(ignore_index, label_smoothing);
}

std::optional<CrossEntropyAttrs> cross_entropy_attrs(const Primitive& p) {
  if (const CrossEntropyAttrs* a = match<CrossEntropyAttrs>(p)) return *a;
  return std::nullopt;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction) {
  INGOT_CHECK(logits.dim() >= 1, "cross_entropy: expected logits [..., C], got a scalar");
  INGOT_CHECK(target.dtype() == DType::i64, "cross_entropy: expected target of dtype i64, got ",
              dtype_name(target.dtype()));
  const Shape rows(logits.shape().begin(), logits.shape().end() - 1);
  const int64_t n = ingot::numel(rows), classes = logits.size(-1);
  INGOT_CHECK(target.shape() == rows || (target.dim() == 1 && target.numel() == n), "cross_entropy: target ",
              shape_str(target.shape()), " does not match logits ", shape_str(logits.shape()), " (expected ",
              shape_str(rows), ")");
  INGOT_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
              "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  // Made contiguous by ops so the tensors saved for backward are the ones the kernel reads.
  const Tensor l2 = contiguous(logits.dim() == 2 ? logits : reshape(logits, {n, classes}));
  const Tensor t1 = contiguous(target.dim() == 1 ? target : reshape(target, {n}));
  Tensor loss = apply(std::make_shared<CrossEntropyPrim>(ignore_index, label_smoothing), {l2, t1})[0];
  switch (reduction) {
    case Reduction::None: return target.shape() == loss.shape() ? loss : reshape(loss, target.shape());
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: {
      Tensor kept = ne(t1, full({}, static_cast<double>(ignore_index), DType::i64, t1.device()));
      return div(sum(loss), sum(cast(kept, loss.dtype())));
    }
  }
  INGOT_FAIL("cross_entropy: unknown reduction");
}

Tensor mse_loss(const Tensor& a, const Tensor& b) {
  INGOT_CHECK(a.shape() == b.shape(), "mse_loss: shapes differ: ", shape_str(a.shape()), " vs ",
              shape_str(b.shape()));
  INGOT_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()), "mse_loss: expected floating tensors, got ",
              dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  const DType t = loss_dtype(promote(a.dtype(), b.dtype()));
  return mean(square(sub(cast(a, t), cast(b, t))));
}

}  // namespace ingot
