// The scaled, accumulating matrix product of autograd/ops/matmul_fused.h (make_matmul_scaled): what a LoRA branch's
// `base + scale * (h @ B^T)` becomes in a compiled step (compile/passes/lora_epilogue.cpp).
//
// The kernels already compute out = alpha * op(a) @ op(b) + beta * out (cuBLASLt's D = alpha * A·B + beta * C
// with D = C, OpenBLAS's gemm on the CPU); this primitive only hands them alpha and, when it accumulates, the
// buffer of the value it adds to with beta = 1. Over a buffer the executor knows to be dead (Note [Outputs over
// dead inputs], autograd/primitive.h) the sum is made in place; otherwise that value is copied first.
#include "autograd/ops.h"
#include "autograd/ops/matmul_fused.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

// A 2-D operand as the matmul kernel wants it: a contiguous [1, r, c] view and its trans flag (a transpose of a
// contiguous buffer is passed as that buffer with the flag flipped). The same rule as matmul.cpp's operands.
std::pair<Tensor, bool> operand3(const Tensor& x, bool trans) {
  if (x.is_contiguous()) return {x.as_strided({1, x.size(0), x.size(1)}, {x.numel(), x.size(1), 1}, x.offset()), trans};
  if (x.stride(0) == 1 && x.stride(1) == x.size(0))
    return {x.as_strided({1, x.size(1), x.size(0)}, {x.numel(), x.size(0), 1}, x.offset()), !trans};
  const Tensor c = x.contiguous_raw();
  return {c.as_strided({1, c.size(0), c.size(1)}, {c.numel(), c.size(1), 1}, c.offset()), trans};
}

std::pair<int64_t, int64_t> rows_cols(const Shape& s, bool trans) {
  return trans ? std::pair{s[1], s[0]} : std::pair{s[0], s[1]};
}

// Inputs (a, b) or, accumulating, (a, b, c); output alpha * op(a) @ op(b) [+ c] shaped `shape` (M * N elements).
// Never differentiated: only compiled graphs the pass rewrote hold it.
class MatmulScaledPrim final : public Primitive {
 public:
  MatmulScaledPrim(bool trans_a, bool trans_b, double alpha, bool accumulate, Shape shape)
      : ta_(trans_a), tb_(trans_b), acc_(accumulate), alpha_(alpha), shape_(std::move(shape)) {}
  std::string_view name() const override { return "matmul_scaled"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const Shape &sa = in[0].shape, &sb = in[1].shape;
    INGOT_CHECK(sa.size() == 2 && sb.size() == 2, "matmul_scaled: expected 2-D operands, got ", shape_str(sa),
                " and ", shape_str(sb));
    INGOT_CHECK(is_floating(in[0].dtype) && in[0].dtype == in[1].dtype, "matmul_scaled: expected two floating "
                "tensors of one dtype, got ", dtype_name(in[0].dtype), " and ", dtype_name(in[1].dtype));
    const auto [m, k] = rows_cols(sa, ta_);
    const auto [k2, n] = rows_cols(sb, tb_);
    INGOT_CHECK(k == k2 && ingot::numel(shape_) == m * n, "matmul_scaled: ", shape_str(sa), (ta_ ? "^T" : ""), " @ ",
                shape_str(sb), (tb_ ? "^T" : ""), " does not give ", shape_str(shape_));
    INGOT_CHECK(in.size() == (acc_ ? 3u : 2u), "matmul_scaled: expected ", acc_ ? 3 : 2, " inputs, got ", in.size());
    if (acc_)
      INGOT_CHECK(in[2].shape == shape_ && in[2].dtype == in[0].dtype, "matmul_scaled: the accumulated value ",
                  shape_str(in[2].shape), " ", dtype_name(in[2].dtype), " is not ", shape_str(shape_), " ",
                  dtype_name(in[0].dtype));
    return {{shape_, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    return eval_into(in, acc_ ? in[2].clone_raw() : alloc_outputs(infer(metas_of(in)))[0]);
  }
  // The kernel reads each element of c before it writes it (Note [Outputs over dead inputs]).
  std::optional<size_t> reusable_input() const override {
    return acc_ ? std::optional<size_t>(2) : std::nullopt;
  }
  std::vector<Tensor> eval_into(const std::vector<Tensor>& in, const Tensor& into) const override {
    const Tensor out = into.is_contiguous() ? into : into.clone_raw();
    if (out.numel() == 0) return {out};
    const int64_t m = rows_cols(in[0].shape(), ta_).first, n = out.numel() / m;
    const auto [a, trans_a] = operand3(in[0], ta_);
    const auto [b, trans_b] = operand3(in[1], tb_);
    INGOT_KERNEL_CALL(out.device(), matmul, out.as_strided({1, m, n}, {m * n, n, 1}, out.offset()), a, b, trans_a,
                      trans_b, alpha_, acc_ ? 1.0 : 0.0);
    return {out};
  }
  bool differentiable() const override { return false; }
  void print_attrs(std::ostream& os) const override {
    os << "trans_a=" << ta_ << ", trans_b=" << tb_ << ", alpha=" << alpha_ << ", accumulate=" << acc_
       << ", shape=" << shape_str(shape_);
  }

 private:
  bool ta_, tb_, acc_;
  double alpha_;
  Shape shape_;
};

}  // namespace

std::shared_ptr<Primitive> make_matmul_scaled(bool trans_a, bool trans_b, double alpha, bool accumulate, Shape shape) {
  return std::make_shared<MatmulScaledPrim>(trans_a, trans_b, alpha, accumulate, std::move(shape));
}

}  // namespace ingot
