// nf4_linear: one primitive, Nf4MatmulPrim(trans), over inputs (x, codes, absmax_codes, absmax_scales, map):
//   trans = true:  x [..., in]  -> x @ W^T [..., out]   (the forward)
//   trans = false: g [..., out] -> g @ W   [..., in]    (its backward, whose backward is the forward again)
// The packed tensors are inputs, not captured state, so two layers' products never look equivalent to CSE and
// a traced graph sees what each product reads. Only input 0 is differentiable, and only inputs 1..4 are saved.
#include "autograd/ops/nf4_linear.h"

#include <sstream>

#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

class Nf4MatmulPrim final : public Primitive {
 public:
  Nf4MatmulPrim(bool trans, int64_t out_features, int64_t in_features, float absmax_offset, std::string weight)
      : trans_(trans), out_(out_features), in_(in_features), offset_(absmax_offset), weight_(std::move(weight)) {}
  std::string_view name() const override { return "nf4_matmul"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 5, "nf4_linear: expected 5 inputs, got ", in.size());
    const TensorMeta& x = in[0];
    INGOT_CHECK(x.dtype == DType::f32 || x.dtype == DType::bf16 || x.dtype == DType::f16, "nf4_linear(", weight_,
                "): the input is ", dtype_name(x.dtype), "; an NF4 weight multiplies f32, bf16 or f16 inputs");
    const int64_t k = trans_ ? in_ : out_, n = trans_ ? out_ : in_;
    INGOT_CHECK(!x.shape.empty() && x.shape.back() == k, "nf4_linear(", weight_, " [", out_, ", ", in_,
                "]): expected an input [..., ", k, "], got ", shape_str(x.shape));
    INGOT_CHECK(in[1].dtype == DType::i32 && in[2].dtype == DType::i32 && in[3].dtype == DType::f32 &&
                    in[4].dtype == DType::f32 && ingot::numel(in[1].shape) * 8 == out_ * in_,
                "nf4_linear(", weight_, "): the packed tensors do not describe a [", out_, ", ", in_, "] weight");
    Shape s = x.shape;
    s.back() = n;
    return {{s, x.dtype, x.device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor out = alloc_outputs(infer(metas_of(in)))[0];
    if (out.numel() == 0) return {out};
    const Tensor x = in[0].contiguous_raw();
    const int64_t k = x.shape().back(), rows = x.numel() / k, n = out.shape().back();
    // The scratch weight lives until the product returns (the matmul kernel runs on the caller's stream, and
    // the caching allocator hands the buffer out again only to work ordered after it).
    Tensor w = empty({out_, in_}, x.dtype(), x.device());
    INGOT_KERNEL_CALL(x.device(), nf4_dequantize, w, in[1], in[2], in[3], in[4], static_cast<double>(offset_));
    INGOT_KERNEL_CALL(x.device(), matmul, out.as_strided({1, rows, n}, {rows * n, n, 1}, out.offset()),
                      x.as_strided({1, rows, k}, {rows * k, k, 1}, x.offset()),
                      w.as_strided({1, out_, in_}, {out_ * in_, in_, 1}, 0), false, trans_, 1.0, 0.0);
    return {out};
  }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    std::vector<Tensor> grads(5);
    if (!c.needs_grad[0] || !g[0].defined()) return grads;
    grads[0] = apply1(std::make_shared<Nf4MatmulPrim>(!trans_, out_, in_, offset_, weight_),
                      {g[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4]});
    return grads;
  }
  bool saves_input(size_t i) const override { return i != 0; }
  void print_attrs(std::ostream& os) const override {
    os << "weight=" << weight_ << ", shape=[" << out_ << ", " << in_ << "], trans=" << trans_
       << ", absmax_offset=" << offset_;
  }

 private:
  bool trans_;
  int64_t out_, in_;
  float offset_;
  std::string weight_;
};

}  // namespace

Tensor nf4_linear(const Tensor& x, const Nf4Tensor& w) {
  INGOT_CHECK(w.defined() && w.shape.size() == 2, "nf4_linear: expected a 2-D NF4 weight, got ",
              w.defined() ? shape_str(w.shape) : std::string("an empty one"), " (", w.name, ")");
  INGOT_CHECK(x.device() == w.device(), "nf4_linear(", w.name, "): the input is on ", x.device().str(),
              ", the weight on ", w.device().str());
  return apply1(std::make_shared<Nf4MatmulPrim>(true, w.shape[0], w.shape[1], w.absmax_offset, w.name),
                {x, w.codes, w.absmax_codes, w.absmax_scales, w.absmax_map});
}

}  // namespace ingot
