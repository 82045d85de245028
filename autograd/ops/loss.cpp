// Loss family: cross_entropy (with ignore_index and label smoothing) and mse_loss.
//
// cross_entropy flattens logits [..., C] to [N, C] and runs one fused primitive that returns the per-row loss
// and the row's logsumexp; backward rebuilds the softmax from that logsumexp in one fused kernel. Reductions
// are composed from ordinary ops afterwards, so a traced graph sees them: Mean divides by the number of
// targets that are not ignore_index, counted with tensor ops rather than on the host. Losses are f32 (f64 for
// f64 inputs) whatever the input dtype: bf16 logits still get an f32 loss, and logits get their gradient in
// their own dtype. cross_entropy_fused (loss_fused.h) is both primitives in one, for compiled training steps.
// linear_cross_entropy is the product into the logits and the loss in one primitive that never holds all the
// logits (Note [Logits in chunks]).
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

// dw scaled by the one cotangent s (a [] tensor of dw's dtype) of linear_cross_entropy's reduced rows: x * s, computed
// over x's buffer where x dies at it (Note [Outputs over dead inputs]), which it does in a compiled step: the unscaled
// head gradient is read by nothing else, so the 8B's 1.05 GB head gradient is not held twice at the backward's peak
// (a mul would make the scaled one beside it). Into a data-parallel bucket's slice like index_add_accumulate.
class ScaleByCotangentPrim final : public Primitive {
 public:
  std::string_view name() const override { return "scale_by_cotangent"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 2 && in[1].shape.empty() && in[0].dtype == in[1].dtype,
                "scale_by_cotangent: expected x and a [] scale of x's dtype");
    return {in[0]};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    return eval_into(in, empty(in[0].shape(), in[0].dtype(), in[0].device()));
  }
  std::optional<size_t> reusable_input() const override { return 0; }
  // Elementwise: each element is read before it is written, so `out` may be x's own buffer.
  std::vector<Tensor> eval_into(const std::vector<Tensor>& in, const Tensor& out) const override {
    if (out.numel() > 0)
      INGOT_KERNEL_CALL(out.device(), binary, kernels::BinaryOp::Mul, out, in[0].contiguous_raw(),
                        in[1].expand_raw(out.shape()));
    return {out};
  }
  bool writes_given_outputs() const override { return true; }
  void eval_to(const std::vector<Tensor>& in, const std::vector<Tensor>& outs) const override {
    eval_into(in, outs[0]);  // reads x wherever it is: no copy of it first
  }
  bool differentiable() const override { return false; }
};

// Note [Logits in chunks]: linear_cross_entropy(x [N, H], w [V, H], target [N]) is cross_entropy(x w^T, target)
// with the logits made a chunk of rows at a time into one [chunk, V] buffer, so a step never holds all N x V of
// them: the 8B Llama's 128,256-word head at 2 x 2048 makes 1.05 GB of bf16 logits, and the eager backward (a
// compiled step's first, traced step included) held their gradient beside them, another 1.05 GB. When x needs a
// gradient the forward computes it too (Liger-Kernel's fused linear cross entropy does the same), chunk by chunk
// over the same buffer: dlogits = softmax - onehot over the logits (cross_entropy_fused with a cotangent of 1), then
// dlogits w into dx's rows. That costs no product more than cross_entropy(linear(x, w)), and row i of dx depends on
// row i's loss alone, so the backward is dx scaled row by row by each row's cotangent, whatever the reduction after.
// A weight gradient does not scale that way (it sums over the rows) unless every row's cotangent is the same, which
// holds when the rows are reduced to their mean or sum inside linear_cross_entropy and nothing else reads them: then
// (weight_grad) the forward also sums dlogits^T x over the chunks into dw [V, H] and the backward scales it by that
// one cotangent (Liger-Kernel's fused linear cross entropy does the same), so a trained head's logits are never whole
// either, for no product more (train.trained_head_in_chunks; on an H200 the 8B's full fine-tune peaks 0.74-0.75 GB
// lower, offloaded or compiled, GPT-2 124M at 16 x 1024 1.39 GB lower and 1.9% slower: bench/RESULTS.md,
// thirty-eighth session; in a compiled step the scale is written over the unscaled gradient: ScaleByCotangentPrim).
// The chunks' products add into dw in its dtype (bf16: rounded once a chunk, as autograd sums a chunked head's
// gradients). Outputs: the per-row loss [N]
// (the loss dtype), with input_grad dx [N, H] (x's dtype), with weight_grad dw [V, H] (w's dtype), saved for the
// backward.
class LinearCrossEntropyPrim final : public Primitive {
 public:
  LinearCrossEntropyPrim(int64_t ignore_index, double label_smoothing, int64_t chunk_rows, bool input_grad,
                         bool weight_grad)
      : ignore_(ignore_index), ls_(label_smoothing), chunk_(chunk_rows), input_grad_(input_grad),
        weight_grad_(weight_grad) {}
  std::string_view name() const override { return "linear_cross_entropy"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 3, "linear_cross_entropy: expected x, w, target, got ", in.size(), " inputs");
    const TensorMeta &x = in[0], &w = in[1];
    INGOT_CHECK(x.shape.size() == 2 && w.shape.size() == 2 && x.shape[1] == w.shape[1],
                "linear_cross_entropy: expected x [N, H] and w [V, H], got ", shape_str(x.shape), " and ",
                shape_str(w.shape));
    INGOT_CHECK(x.dtype == w.dtype, "linear_cross_entropy: x is ", dtype_name(x.dtype), ", w ", dtype_name(w.dtype));
    const TensorMeta row = loss_row_meta(name(), {{x.shape[0], w.shape[0]}, x.dtype, x.device}, in[2]);
    std::vector<TensorMeta> out{row};
    if (input_grad_) out.push_back(x);
    if (weight_grad_) out.push_back(w);
    return out;
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> out = alloc_outputs(infer(metas_of(in)));
    const Tensor x = in[0].contiguous_raw(), w = in[1].contiguous_raw(), t = in[2].contiguous_raw();
    const int64_t n = x.size(0), h = x.size(1), v = w.size(0), c = std::min(chunk_, n);
    if (n == 0) {  // no rows: w's gradient is zero
      if (weight_grad_ && out.back().numel() > 0) INGOT_KERNEL_CALL(out.back().device(), fill, out.back(), 0.0);
      return out;
    }
    const DType st = out[0].dtype();
    const Device dev = x.device();
    // One logits buffer for every chunk: the kernels run in order on the device's stream, and the allocator hands
    // the buffer out again only to work ordered after them.
    const Tensor logits = empty({c, v}, x.dtype(), dev), lse = empty({c}, st, dev);
    const bool grads = input_grad_ || weight_grad_;
    const Tensor ones = grads ? full({c}, 1.0, st, dev) : Tensor();
    const Tensor w3 = w.as_strided({1, v, h}, {v * h, h, 1}, w.offset());
    for (int64_t r = 0; r < n; r += c) {
      const int64_t m = std::min(c, n - r);
      const Tensor lg = logits.as_strided({m, v}, {v, 1}, logits.offset());
      const Tensor xs = x.as_strided({1, m, h}, {m * h, h, 1}, x.offset() + r * h);
      const Tensor loss = out[0].as_strided({m}, {1}, out[0].offset() + r);
      const Tensor tr = t.as_strided({m}, {1}, t.offset() + r);
      const Tensor lse_rows = lse.as_strided({m}, {1}, lse.offset());
      INGOT_KERNEL_CALL(dev, matmul, lg.as_strided({1, m, v}, {m * v, v, 1}, lg.offset()), xs, w3, false, true,
                        1.0, 0.0);
      if (!grads) {
        INGOT_KERNEL_CALL(dev, cross_entropy_fwd, loss, lse_rows, lg, tr, ignore_, ls_);
        continue;
      }
      // The gradient over the logits, in place (each row is read whole before it is written).
      INGOT_KERNEL_CALL(dev, cross_entropy_fused, loss, lse_rows, lg, lg, tr, ones.as_strided({m}, {1}, ones.offset()),
                        ignore_, ls_);
      const Tensor lg3 = lg.as_strided({1, m, v}, {m * v, v, 1}, lg.offset());
      if (input_grad_) {
        const Tensor& dx = out[1];
        INGOT_KERNEL_CALL(dev, matmul, dx.as_strided({1, m, h}, {m * h, h, 1}, dx.offset() + r * h), lg3, w3, false,
                          false, 1.0, 0.0);
      }
      if (weight_grad_) {  // dw (+)= dlogits^T x over this chunk's rows
        const Tensor& dw = out[input_grad_ ? 2 : 1];
        INGOT_KERNEL_CALL(dev, matmul, dw.as_strided({1, v, h}, {v * h, h, 1}, dw.offset()), lg3, xs, true, false, 1.0,
                          r == 0 ? 0.0 : 1.0);
      }
    }
    return out;
  }
  bool saves_input(size_t) const override { return false; }
  bool saves_output(size_t k) const override { return k >= 1; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    std::vector<Tensor> grads(3);
    if (!g[0].defined()) return grads;
    INGOT_CHECK(!c.needs_grad[1] || weight_grad_, "linear_cross_entropy: built without the weight's gradient (Note "
                "[Logits in chunks])");
    if (c.needs_grad[1]) {
      // Every row's cotangent is the same (the rows are reduced to their mean or sum: Note [Logits in chunks]); the
      // scale is rounded to dw's dtype so that no f32 copy of dw is made (1.0, the usual one, exactly).
      const Tensor& dw = c.outputs[input_grad_ ? 2 : 1];
      grads[1] = g[0].numel() == 0 ? dw
                                   : apply(std::make_shared<ScaleByCotangentPrim>(),
                                           {dw, cast(reshape(narrow(g[0], 0, 0, 1), {}), dw.dtype())})[0];
    }
    if (!c.needs_grad[0]) return grads;
    INGOT_CHECK(input_grad_, "linear_cross_entropy: built without the input's gradient (no grad mode then)");
    const Tensor& dx = c.outputs[1];
    const Tensor row_scale = reshape(g[0], {dx.size(0), 1});
    grads[0] = cast(mul(cast(dx, row_scale.dtype()), row_scale), dx.dtype());
    return grads;
  }
  void print_attrs(std::ostream& os) const override {
    os << "ignore_index=" << ignore_ << ", label_smoothing=" << ls_ << ", chunk_rows=" << chunk_
       << ", input_grad=" << input_grad_ << ", weight_grad=" << weight_grad_;
  }

 private:
  int64_t ignore_;
  double ls_;
  int64_t chunk_;
  bool input_grad_, weight_grad_;
};

// The per-row losses `loss` [N] of targets `t1` [N] reduced as cross_entropy's `reduction` asks; None gives them
// the targets' shape.
Tensor reduce_rows(const Tensor& loss, const Tensor& t1, const Shape& target_shape, int64_t ignore_index,
                   Reduction reduction) {
  switch (reduction) {
    case Reduction::None: return target_shape == loss.shape() ? loss : reshape(loss, target_shape);
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: {
      Tensor kept = ne(t1, full({}, static_cast<double>(ignore_index), DType::i64, t1.device()));
      return div(sum(loss), sum(cast(kept, loss.dtype())));
    }
  }
  INGOT_FAIL("cross_entropy: unknown reduction");
}

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
  return reduce_rows(loss, t1, target.shape(), ignore_index, reduction);
}

Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& target, int64_t ignore_index,
                            double label_smoothing, Reduction reduction, int64_t chunk_rows) {
  INGOT_CHECK(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(1),
              "linear_cross_entropy: expected x [..., H] and w [V, H], got ", shape_str(x.shape()), " and ",
              shape_str(w.shape()));
  const bool weight_grad = grad_enabled() && w.requires_grad();
  INGOT_CHECK(!weight_grad || reduction != Reduction::None, "linear_cross_entropy: the weight ",
              w.name().empty() ? std::string("w") : w.name(),
              " requires a gradient, which it computes only for a mean or sum over the rows (Note [Logits in "
              "chunks]): use reduction mean or sum, or cross_entropy(linear(x, w), target)");
  INGOT_CHECK(target.dtype() == DType::i64, "linear_cross_entropy: expected target of dtype i64, got ",
              dtype_name(target.dtype()));
  INGOT_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
              "linear_cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  const int64_t h = x.size(-1), n = x.numel() / std::max<int64_t>(h, 1), v = w.size(0);
  INGOT_CHECK(target.numel() == n, "linear_cross_entropy: target ", shape_str(target.shape()), " does not match x ",
              shape_str(x.shape()));
  INGOT_CHECK(chunk_rows >= 0, "linear_cross_entropy: chunk_rows must be >= 0, got ", chunk_rows);
  // At most 256 MiB of logits a chunk by default, in whole 128-row tiles: 1,024 rows of the 8B's 128,256 words in
  // bf16. The input gradient's product of a chunk, [rows, H] over K = V, has few output tiles: 1,046 rows made 9 x 16
  // tiles of 128 x 256 for 132 SMs, a second wave of 12 (the 8B LoRA step took ~6 ms longer on an H200: bench/
  // RESULTS.md, twenty-ninth session); 1,024 rows make 8 x 16, one wave.
  const int64_t row_bytes = std::max<int64_t>(v, 1) * static_cast<int64_t>(itemsize(x.dtype()));
  int64_t chunk = chunk_rows > 0 ? chunk_rows : std::max<int64_t>(1, (int64_t{256} << 20) / row_bytes);
  if (chunk_rows == 0 && chunk >= 256) chunk -= chunk % 128;
  const bool input_grad = grad_enabled() && x.requires_grad();
  const Tensor x2 = contiguous(x.dim() == 2 ? x : reshape(x, {n, h}));
  const Tensor t1 = contiguous(target.dim() == 1 ? target : reshape(target, {n}));
  Tensor loss = apply(std::make_shared<LinearCrossEntropyPrim>(ignore_index, label_smoothing, std::max<int64_t>(chunk, 1),
                                                               input_grad, weight_grad),
                      {x2, w, t1})[0];
  return reduce_rows(loss, t1, target.shape(), ignore_index, reduction);
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
