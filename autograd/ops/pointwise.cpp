// Pointwise family: unary math and activations, binary arithmetic with broadcasting, comparisons, where,
// dtype casts and device moves. Forward runs the elementwise kernels on broadcast views (no copies);
// backward reduces broadcast gradients with sum_to_shape; each op's kernel expression is its lower()
// (Note [Ops lower themselves], autograd/kernel_lowering.h).
#include <cmath>
#include <optional>

#include "autograd/kernel_lowering.h"
#include "autograd/ops.h"
#include "autograd/ops/attrs.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;
using KOp = codegen::Op;

// The eager elementwise ops that are one kernel-IR op. The scalar ops (pow_scalar ...) lower to a binary op
// with a constant; logical_not has no kernel lowering.
constexpr std::pair<UnaryOp, KOp> kUnaryKernelOps[] = {
    {UnaryOp::Neg, KOp::Neg},          {UnaryOp::Exp, KOp::Exp},           {UnaryOp::Log, KOp::Log},
    {UnaryOp::Sqrt, KOp::Sqrt},        {UnaryOp::Rsqrt, KOp::Rsqrt},       {UnaryOp::Abs, KOp::Abs},
    {UnaryOp::Tanh, KOp::Tanh},        {UnaryOp::Sigmoid, KOp::Sigmoid},   {UnaryOp::Relu, KOp::Relu},
    {UnaryOp::GeluTanh, KOp::GeluTanh}, {UnaryOp::GeluErf, KOp::GeluErf},  {UnaryOp::Silu, KOp::Silu},
    {UnaryOp::Sin, KOp::Sin},          {UnaryOp::Cos, KOp::Cos},           {UnaryOp::Reciprocal, KOp::Reciprocal},
    {UnaryOp::Square, KOp::Square},    {UnaryOp::Sign, KOp::Sign},         {UnaryOp::Log1p, KOp::Log1p},
    {UnaryOp::Expm1, KOp::Expm1},      {UnaryOp::Floor, KOp::Floor}};
// Every binary op, the activation gradients (x or y, dy) included: their math is runtime/kernels/scalar_math.h's
// in eager and generated kernels alike.
constexpr std::pair<BinaryOp, KOp> kBinaryKernelOps[] = {
    {BinaryOp::Add, KOp::Add},          {BinaryOp::Sub, KOp::Sub},           {BinaryOp::Mul, KOp::Mul},
    {BinaryOp::Div, KOp::Div},          {BinaryOp::Pow, KOp::Pow},           {BinaryOp::Maximum, KOp::Max},
    {BinaryOp::Minimum, KOp::Min},      {BinaryOp::Eq, KOp::Eq},             {BinaryOp::Ne, KOp::Ne},
    {BinaryOp::Lt, KOp::Lt},            {BinaryOp::Le, KOp::Le},             {BinaryOp::Gt, KOp::Gt},
    {BinaryOp::Ge, KOp::Ge},            {BinaryOp::LogicalAnd, KOp::And},    {BinaryOp::LogicalOr, KOp::Or},
    {BinaryOp::ReluGrad, KOp::ReluGrad}, {BinaryOp::SigmoidGradFromOutput, KOp::SigmoidGrad},
    {BinaryOp::TanhGradFromOutput, KOp::TanhGrad}, {BinaryOp::SiluGrad, KOp::SiluGrad},
    {BinaryOp::GeluTanhGrad, KOp::GeluTanhGrad}, {BinaryOp::GeluErfGrad, KOp::GeluErfGrad}};

template <class E, size_t N>
std::optional<KOp> kernel_op(const std::pair<E, KOp> (&table)[N], E op) {
  for (const auto& [e, k] : table)
    if (e == op) return k;
  return std::nullopt;
}

DType unary_out_dtype(UnaryOp op, DType in) {
  if (op == UnaryOp::LogicalNot) return DType::b8;
  return is_floating(in) ? in : DType::f32;
}

Tensor unary_raw(UnaryOp op, const Tensor& x, double alpha = 0.0);
Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b);

class UnaryPrim final : public Primitive, public WithAttrs<UnaryAttrs>, public KernelLowering {
 public:
  UnaryPrim(UnaryOp op, double alpha) : WithAttrs({op, alpha}) {}
  std::string_view name() const override { return kernels::unary_name(attrs_.op); }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{in[0].shape, unary_out_dtype(attrs_.op, in[0].dtype), in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    if (out[0].numel() > 0) INGOT_KERNEL_CALL(in[0].device(), unary, attrs_.op, out[0], in[0], attrs_.alpha);
    return out;
  }
  bool differentiable() const override {
    return attrs_.op != UnaryOp::LogicalNot && attrs_.op != UnaryOp::Floor && attrs_.op != UnaryOp::Sign;
  }
  bool saves_input(size_t) const override { return !uses_output(); }
  bool saves_output(size_t) const override { return uses_output(); }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  void print_attrs(std::ostream& os) const override {
    if (takes_scalar(attrs_.op)) os << "alpha=" << attrs_.alpha;
  }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    const Tensor& x = c.inputs[0];
    const Tensor& y = c.outputs[0];
    const Tensor& d = g[0];
    switch (attrs_.op) {
      case UnaryOp::Neg: return {neg(d)};
      case UnaryOp::Exp: return {mul(d, y)};
      case UnaryOp::Log: return {div(d, x)};
      case UnaryOp::Sqrt: return {div(mul(d, 0.5), y)};
      case UnaryOp::Rsqrt: return {mul(mul(d, pow(y, 3.0)), -0.5)};
      case UnaryOp::Abs: return {mul(d, unary_raw(UnaryOp::Sign, x))};
      case UnaryOp::Tanh: return {binary_raw(BinaryOp::TanhGradFromOutput, y, d)};
      case UnaryOp::Sigmoid: return {binary_raw(BinaryOp::SigmoidGradFromOutput, y, d)};
      case UnaryOp::Relu: return {binary_raw(BinaryOp::ReluGrad, x, d)};
      case UnaryOp::GeluTanh: return {binary_raw(BinaryOp::GeluTanhGrad, x, d)};
      case UnaryOp::GeluErf: return {binary_raw(BinaryOp::GeluErfGrad, x, d)};
      case UnaryOp::Silu: return {binary_raw(BinaryOp::SiluGrad, x, d)};
      case UnaryOp::Sin: return {mul(d, cos(x))};
      case UnaryOp::Cos: return {neg(mul(d, sin(x)))};
      case UnaryOp::Reciprocal: return {neg(mul(d, square(y)))};
      case UnaryOp::Square: return {mul(mul(d, x), 2.0)};
      case UnaryOp::PowScalar: return {mul(mul(d, pow(x, attrs_.alpha - 1.0)), attrs_.alpha)};
      case UnaryOp::AddScalar: return {d};
      case UnaryOp::MulScalar: return {mul(d, attrs_.alpha)};
      case UnaryOp::RSubScalar: return {neg(d)};
      case UnaryOp::RDivScalar: return {neg(div(mul(d, attrs_.alpha), square(x)))};
      case UnaryOp::Log1p: return {div(d, add(x, 1.0))};
      case UnaryOp::Expm1: return {mul(d, add(y, 1.0))};
      default: INGOT_FAIL(name(), ": not differentiable");
    }
  }
  std::vector<int> lower(LowerContext& cx) const override {
    codegen::KernelSpec& k = cx.spec();
    if (attrs_.op == UnaryOp::LogicalNot) cx.unsupported("op 'logical_not' has no kernel lowering");
    const int x = cx.floating(cx.input(0));
    auto a = [&] { return cx.constant_like(attrs_.alpha, x); };
    switch (attrs_.op) {
      case UnaryOp::PowScalar: return {k.binary(KOp::Pow, x, a())};
      case UnaryOp::AddScalar: return {k.binary(KOp::Add, x, a())};
      case UnaryOp::MulScalar: return {k.binary(KOp::Mul, x, a())};
      case UnaryOp::RSubScalar: return {k.binary(KOp::Sub, a(), x)};
      case UnaryOp::RDivScalar: return {k.binary(KOp::Div, a(), x)};
      default: return {k.unary(*kernel_op(kUnaryKernelOps, attrs_.op), x)};
    }
  }

 private:
  bool uses_output() const {
    const UnaryOp op = attrs_.op;
    return op == UnaryOp::Exp || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt || op == UnaryOp::Tanh ||
           op == UnaryOp::Sigmoid || op == UnaryOp::Reciprocal || op == UnaryOp::Expm1;
  }
};

class BinaryPrim final : public Primitive, public WithAttrs<BinaryAttrs>, public KernelLowering {
 public:
  explicit BinaryPrim(BinaryOp op) : WithAttrs({op}) {}
  std::string_view name() const override { return kernels::binary_name(attrs_.op); }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    Shape s = broadcast_shapes(in[0].shape, in[1].shape, kernels::binary_name(attrs_.op));
    DType t = kernels::is_comparison(attrs_.op) ? DType::b8 : promote(in[0].dtype, in[1].dtype);
    return {{s, t, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    if (out[0].numel() > 0)
      INGOT_KERNEL_CALL(in[0].device(), binary, attrs_.op, out[0], in[0].expand_raw(out[0].shape()),
                        in[1].expand_raw(out[0].shape()));
    return out;
  }
  bool differentiable() const override {
    const BinaryOp op = attrs_.op;
    return op == BinaryOp::Add || op == BinaryOp::Sub || op == BinaryOp::Mul || op == BinaryOp::Div ||
           op == BinaryOp::Pow || op == BinaryOp::Maximum || op == BinaryOp::Minimum;
  }
  bool saves_input(size_t) const override { return attrs_.op != BinaryOp::Add && attrs_.op != BinaryOp::Sub; }
  bool saves_output(size_t) const override { return attrs_.op == BinaryOp::Pow; }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    const Tensor &a = c.inputs[0], &b = c.inputs[1], &d = g[0];
    const Shape &sa = c.input_meta[0].shape, &sb = c.input_meta[1].shape;
    Tensor ga, gb;
    switch (attrs_.op) {
      case BinaryOp::Add: ga = d; gb = d; break;
      case BinaryOp::Sub: ga = d; gb = neg(d); break;
      case BinaryOp::Mul:
        if (c.needs_grad[0]) ga = mul(d, b);
        if (c.needs_grad[1]) gb = mul(d, a);
        break;
      case BinaryOp::Div:
        if (c.needs_grad[0]) ga = div(d, b);
        if (c.needs_grad[1]) gb = neg(div(mul(d, a), square(b)));
        break;
      case BinaryOp::Pow:
        if (c.needs_grad[0]) ga = mul(d, mul(b, pow(a, sub(b, ones({}, b.dtype(), b.device())))));
        if (c.needs_grad[1]) gb = mul(d, mul(c.outputs[0], log(a)));
        break;
      case BinaryOp::Maximum:
      case BinaryOp::Minimum: {
        // Ties split the gradient evenly, as PyTorch does.
        Tensor pick_a = cast(attrs_.op == BinaryOp::Maximum ? gt(a, b) : lt(a, b), d.dtype());
        Tensor tie = mul(cast(eq(a, b), d.dtype()), 0.5);
        ga = mul(d, add(pick_a, tie));
        gb = mul(d, rsub(add(pick_a, tie), 1.0));
        break;
      }
      default: INGOT_FAIL(name(), ": not differentiable");
    }
    std::vector<Tensor> r(2);
    if (c.needs_grad[0] && ga.defined()) r[0] = cast(sum_to_shape(ga, sa), c.input_meta[0].dtype);
    if (c.needs_grad[1] && gb.defined()) r[1] = cast(sum_to_shape(gb, sb), c.input_meta[1].dtype);
    return r;
  }
  std::vector<int> lower(LowerContext& cx) const override {
    return {cx.spec().binary(*kernel_op(kBinaryKernelOps, attrs_.op), cx.input(0), cx.input(1))};
  }
};

class WherePrim final : public Primitive, public KernelLowering {
 public:
  std::string_view name() const override { return "where"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in[0].dtype == DType::b8, "where: condition must be bool, got ", dtype_name(in[0].dtype));
    Shape s = broadcast_shapes(broadcast_shapes(in[0].shape, in[1].shape, "where"), in[2].shape, "where");
    return {{s, promote(in[1].dtype, in[2].dtype), in[1].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    const Shape& s = out[0].shape();
    if (out[0].numel() > 0)
      INGOT_KERNEL_CALL(in[0].device(), where, out[0], in[0].expand_raw(s), in[1].expand_raw(s), in[2].expand_raw(s));
    return out;
  }
  bool saves_input(size_t i) const override { return i == 0; }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    Tensor zero = zeros({}, g[0].dtype(), g[0].device());
    std::vector<Tensor> r(3);
    if (c.needs_grad[1]) r[1] = cast(sum_to_shape(where(c.inputs[0], g[0], zero), c.input_meta[1].shape), c.input_meta[1].dtype);
    if (c.needs_grad[2]) r[2] = cast(sum_to_shape(where(c.inputs[0], zero, g[0]), c.input_meta[2].shape), c.input_meta[2].dtype);
    return r;
  }
  std::vector<int> lower(LowerContext& cx) const override {
    return {cx.spec().where(cx.input(0), cx.input(1), cx.input(2))};
  }
};

class CastPrim final : public Primitive, public WithAttrs<CastAttrs>, public KernelLowering {
 public:
  explicit CastPrim(DType t) : WithAttrs({t}) {}
  std::string_view name() const override { return "cast"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{in[0].shape, attrs_.to, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    return {in[0].to(attrs_.to).contiguous_raw()};
  }
  bool differentiable() const override { return is_floating(attrs_.to); }
  bool saves_input(size_t) const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  void print_attrs(std::ostream& os) const override { os << "dtype=" << dtype_name(attrs_.to); }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    return {cast(g[0], c.input_meta[0].dtype)};
  }
  std::vector<int> lower(LowerContext& cx) const override { return {cx.spec().cast(cx.input(0), attrs_.to)}; }
};

class ToDevicePrim final : public Primitive {
 public:
  explicit ToDevicePrim(Device d) : to_(d) {}
  std::string_view name() const override { return "to_device"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{in[0].shape, in[0].dtype, to_}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return {in[0].to(to_)}; }
  bool saves_input(size_t) const override { return false; }
  void print_attrs(std::ostream& os) const override { os << "device=" << to_.str(); }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    return {to_device(g[0], c.input_meta[0].device)};
  }

 private:
  Device to_;
};

class ClonePrim final : public Primitive, public WithAttrs<CopyAttrs>, public KernelLowering {
 public:
  ClonePrim() : WithAttrs({}) {}
  std::string_view name() const override { return "clone"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[0]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return {in[0].clone_raw()}; }
  bool saves_input(size_t) const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  std::vector<Tensor> vjp(const VjpContext&, const std::vector<Tensor>& g) const override { return {g[0]}; }
  std::vector<int> lower(LowerContext& cx) const override { return {cx.input(0)}; }
};

// Note [Pointwise formulas]: an op whose math is a few kernel-IR ops is defined once, by its lower(). Generated
// kernels inline that expression; eager evaluation interprets the same expression with the elementwise kernels
// above (one launch per kernel-IR op, on the CPU or CUDA alike), holding bf16 / f16 values in f32 and rounding
// once into the output, as a generated kernel does. So adding such an op (a FormulaPrim) touches this file and
// autograd/ops.h.
class EagerFormula final : public LowerContext {
 public:
  EagerFormula(const std::vector<Tensor>& in, const TensorMeta& out) : in_(in), out_(out) {}
  codegen::KernelSpec& spec() override { return spec_; }
  int input(size_t i) override {
    if (loads_.size() <= i) loads_.resize(i + 1, -1);
    if (loads_[i] < 0) {
      buffer_.push_back(i);
      loads_[i] = spec_.load(spec_.input(in_.at(i).dtype(), {}));
    }
    return loads_[i];
  }
  bool has_input(size_t i) const override { return i < in_.size() && in_[i].defined(); }
  int row_input(size_t) override { unsupported("a per-row input"); }
  DType output_dtype(size_t) const override { return out_.dtype; }
  bool row_reduction() const override { return false; }
  int64_t reduced_size() const override { return 0; }
  [[noreturn]] void unsupported(const std::string& why) override {
    detail::throw_error(__FILE__, __LINE__,
                        "eager formula of a pointwise op: " + why + " (please report this ingot bug)", true);
  }

  // The value of node `id` over the output's shape (a broadcast constant for constants).
  Tensor eval(int id) {
    if (values_.size() < spec_.nodes.size()) values_.resize(spec_.nodes.size());
    Tensor& v = values_[static_cast<size_t>(id)];
    if (v.defined()) return v;
    const codegen::Node& n = spec_.nodes[static_cast<size_t>(id)];
    const DType held = n.dtype == DType::bf16 || n.dtype == DType::f16 ? DType::f32 : n.dtype;
    const Device dev = out_.device;
    if (n.op == KOp::Load) return v = in_[buffer_.at(static_cast<size_t>(n.arg))].expand_raw(out_.shape);
    if (n.op == KOp::Const) return v = full({}, n.value, held, dev).expand_raw(out_.shape);
    if (n.op == KOp::Cast) return v = eval(n.a).to(n.dtype);  // an explicit cast to bf16 rounds
    Tensor r = empty(out_.shape, held, dev);
    if (n.op == KOp::Where) {
      INGOT_KERNEL_CALL(dev, where, r, eval(n.a), eval(n.b), eval(n.c));
    } else if (std::optional<UnaryOp> u = eager_op(kUnaryKernelOps, n.op); u && codegen::is_unary(n.op)) {
      INGOT_KERNEL_CALL(dev, unary, *u, r, eval(n.a), 0.0);
    } else if (std::optional<BinaryOp> b = eager_op(kBinaryKernelOps, n.op)) {
      INGOT_KERNEL_CALL(dev, binary, *b, r, eval(n.a), eval(n.b));
    } else {
      unsupported(std::string("kernel op ") + codegen::op_name(n.op));
    }
    return v = r;
  }

 private:
  template <class E, size_t N>
  static std::optional<E> eager_op(const std::pair<E, KOp> (&table)[N], KOp op) {
    for (const auto& [e, k] : table)
      if (k == op) return e;
    return std::nullopt;
  }

  const std::vector<Tensor>& in_;
  TensorMeta out_;
  codegen::KernelSpec spec_;
  std::vector<int> loads_;        // per input: its load node, or -1
  std::vector<size_t> buffer_;    // per buffer: the input it holds
  std::vector<Tensor> values_;    // per node, once evaluated
};

// A unary op defined by its formula (Note [Pointwise formulas]): floating output of the input's shape.
class FormulaPrim : public Primitive, public KernelLowering {
 public:
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{in[0].shape, is_floating(in[0].dtype) ? in[0].dtype : DType::f32, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor out = alloc_outputs(infer(metas_of(in)))[0];
    if (out.numel() == 0) return {out};
    EagerFormula f(in, meta_of(out));
    INGOT_KERNEL_CALL(out.device(), copy, out, f.eval(lower(f).at(0)));
    return {out};
  }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
};

// relu2(x) = relu(x)^2, the squared ReLU of Primer (So et al. 2021) and modded-nanogpt's MLP.
class Relu2Prim final : public FormulaPrim {
 public:
  std::string_view name() const override { return "relu2"; }
  std::vector<int> lower(LowerContext& cx) const override {
    codegen::KernelSpec& k = cx.spec();
    return {k.unary(KOp::Square, k.unary(KOp::Relu, cx.floating(cx.input(0))))};
  }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    return {mul(mul(relu(c.inputs[0]), 2.0), g[0])};
  }
};

// silu_mul(a, b) = silu(a) * b, SwiGLU's product (the Llama MLP's) as one op: one eager kernel where silu and mul
// launch two, and a backward that keeps a and b (silu_mul_bwd computes silu(a) again) where the pair keeps a,
// silu(a) and b. Its backward is one op with both gradients.
TensorMeta silu_mul_meta(const std::vector<TensorMeta>& in, const char* op) {
  for (size_t i = 1; i < in.size(); ++i)
    INGOT_CHECK(in[i].shape == in[0].shape && in[i].dtype == in[0].dtype, op, ": expected operands of one shape and ",
                "dtype, got ", dtype_name(in[0].dtype), shape_str(in[0].shape), " and ", dtype_name(in[i].dtype),
                shape_str(in[i].shape));
  INGOT_CHECK(is_floating(in[0].dtype), op, ": expected floating operands, got ", dtype_name(in[0].dtype));
  return in[0];
}

class SiluMulBwdPrim final : public Primitive, public KernelLowering {
 public:
  std::string_view name() const override { return "silu_mul_bwd"; }
  // dy, a, b -> da, db
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const TensorMeta m = silu_mul_meta(in, "silu_mul_bwd");
    return {m, m};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    if (out[0].numel() > 0)
      INGOT_KERNEL_CALL(in[0].device(), silu_mul_bwd, out[0], out[1], in[0].contiguous_raw(), in[1].contiguous_raw(),
                        in[2].contiguous_raw());
    return out;
  }
  bool differentiable() const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  std::vector<int> lower(LowerContext& cx) const override {
    codegen::KernelSpec& k = cx.spec();
    const int dy = cx.input(0), a = cx.input(1), b = cx.input(2);
    return {k.binary(KOp::SiluGrad, a, k.binary(KOp::Mul, dy, b)), k.binary(KOp::Mul, k.unary(KOp::Silu, a), dy)};
  }
};

class SiluMulPrim final : public Primitive, public KernelLowering {
 public:
  std::string_view name() const override { return "silu_mul"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {silu_mul_meta(in, "silu_mul")};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    if (out[0].numel() > 0) INGOT_KERNEL_CALL(in[0].device(), silu_mul_fwd, out[0], in[0], in[1]);
    return out;
  }
  // da reads a and b; db reads a only.
  bool saves_input_given(size_t i, const std::vector<bool>& needs_grad) const override {
    return needs_grad[0] || (i == 0 && needs_grad[1]);
  }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    if (!c.needs_grad[0]) return {Tensor(), mul(silu(c.inputs[0]), g[0])};
    std::vector<Tensor> d =
        apply(std::make_shared<SiluMulBwdPrim>(), {cast(g[0], c.input_meta[0].dtype), c.inputs[0], c.inputs[1]});
    if (!c.needs_grad[1]) d[1] = Tensor();
    return d;
  }
  std::vector<int> lower(LowerContext& cx) const override {
    codegen::KernelSpec& k = cx.spec();
    return {k.binary(KOp::Mul, k.unary(KOp::Silu, cx.input(0)), cx.input(1))};
  }
};

// Note [SwiGLU of sums]
// A LoRA MLP's gate and up projections each give base + delta (Note [Rope of a sum], autograd/ops/attention.cpp). In
// bf16, summed and rounded before the activation, an adapter's early updates (below half an ulp of the base, itself a
// bf16 value) vanish: with LoRA on every linear projection the 8B's loss fell 0.468 over its first five updates against
// peft + torch.compile's 0.529, whose fused kernel adds and activates in f32 (bench/RESULTS.md, thirty-first session).
// silu_mul_sums(a, da, b, db) = silu(a + da) * (b + db), both sums in f32 and the product rounded once. Its backward is
// silu_mul's at the rounded sums round(a + da), round(b + db), which it writes as two more outputs and keeps (the same
// two tensors the rounded path kept), so it holds no more memory than silu_mul of the sums; the gradients of a and da
// are one tensor, as are b's and db's.
class SiluMulSumsPrim final : public Primitive, public KernelLowering {
 public:
  std::string_view name() const override { return "silu_mul_sums"; }
  // a, da, b, db -> out, round(a + da), round(b + db)
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const TensorMeta m = silu_mul_meta(in, "silu_mul_sums");
    return {m, m, m};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    if (out[0].numel() == 0) return out;
    const Device d = in[0].device();
    INGOT_KERNEL_CALL(d, silu_mul_sums_fwd, out[0], in[0], in[1], in[2], in[3]);
    INGOT_KERNEL_CALL(d, binary, BinaryOp::Add, out[1], in[0], in[1]);
    INGOT_KERNEL_CALL(d, binary, BinaryOp::Add, out[2], in[2], in[3]);
    return out;
  }
  bool saves_input(size_t) const override { return false; }
  bool saves_output(size_t i) const override { return i > 0; }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    if (!g[0].defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
    const std::vector<Tensor> d =
        apply(std::make_shared<SiluMulBwdPrim>(), {cast(g[0], c.input_meta[0].dtype), c.outputs[1], c.outputs[2]});
    auto pick = [&](size_t i, const Tensor& t) { return c.needs_grad[i] ? t : Tensor(); };
    return {pick(0, d[0]), pick(1, d[0]), pick(2, d[1]), pick(3, d[1])};
  }
  std::vector<int> lower(LowerContext& cx) const override {
    codegen::KernelSpec& k = cx.spec();
    const int a = k.binary(KOp::Add, cx.input(0), cx.input(1)), b = k.binary(KOp::Add, cx.input(2), cx.input(3));
    return {k.binary(KOp::Mul, k.unary(KOp::Silu, a), b), a, b};
  }
};

// GPT-2's MLP the same way: gelu_tanh_sum(a, da) = gelu_tanh(a + da), the sum in f32 and one rounding (c_fc's base
// and adapter update); its backward runs at round(a + da), which it writes as a second output and keeps (as gelu of
// the rounded sum kept it).
class GeluTanhSumPrim final : public Primitive, public KernelLowering {
 public:
  std::string_view name() const override { return "gelu_tanh_sum"; }
  // a, da -> out, round(a + da)
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const TensorMeta m = silu_mul_meta(in, "gelu_tanh_sum");
    return {m, m};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    if (out[0].numel() == 0) return out;
    const Device d = in[0].device();
    // The sum in f32 (f64 stays f64), then the activation rounded once into out[0].
    const DType wide = in[0].dtype() == DType::f64 ? DType::f64 : DType::f32;
    const Tensor sum = empty(in[0].shape(), wide, d);
    INGOT_KERNEL_CALL(d, binary, BinaryOp::Add, sum, in[0].contiguous_raw(), in[1].contiguous_raw());
    INGOT_KERNEL_CALL(d, unary, UnaryOp::GeluTanh, out[0], sum, 0.0);
    INGOT_KERNEL_CALL(d, binary, BinaryOp::Add, out[1], in[0].contiguous_raw(), in[1].contiguous_raw());
    return out;
  }
  bool saves_input(size_t) const override { return false; }
  bool saves_output(size_t i) const override { return i == 1; }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    if (!g[0].defined()) return {Tensor(), Tensor()};
    const Tensor d = binary_raw(BinaryOp::GeluTanhGrad, c.outputs[1], cast(g[0], c.input_meta[0].dtype));
    return {c.needs_grad[0] ? d : Tensor(), c.needs_grad[1] ? d : Tensor()};
  }
  std::vector<int> lower(LowerContext& cx) const override {
    codegen::KernelSpec& k = cx.spec();
    const int s = k.binary(KOp::Add, cx.input(0), cx.input(1));
    return {k.unary(KOp::GeluTanh, s), s};
  }
};

Tensor unary(UnaryOp op, const Tensor& x, double alpha = 0.0) {
  return apply1(std::make_shared<UnaryPrim>(op, alpha), {x});
}
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  return apply1(std::make_shared<BinaryPrim>(op), {a, b});
}
// Backward helpers: recorded like any op (so a traced backward sees them) but never differentiated.
Tensor unary_raw(UnaryOp op, const Tensor& x, double alpha) { return unary(op, x, alpha); }
Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b) { return binary(op, a, b); }

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Div, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Pow, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Minimum, a, b); }
Tensor add(const Tensor& a, double s) { return unary(UnaryOp::AddScalar, a, s); }
Tensor mul(const Tensor& a, double s) { return unary(UnaryOp::MulScalar, a, s); }
Tensor pow(const Tensor& a, double e) { return unary(UnaryOp::PowScalar, a, e); }
Tensor rsub(const Tensor& a, double s) { return unary(UnaryOp::RSubScalar, a, s); }
Tensor rdiv(const Tensor& a, double s) { return unary(UnaryOp::RDivScalar, a, s); }
Tensor neg(const Tensor& a) { return unary(UnaryOp::Neg, a); }
Tensor exp(const Tensor& a) { return unary(UnaryOp::Exp, a); }
Tensor log(const Tensor& a) { return unary(UnaryOp::Log, a); }
Tensor sqrt(const Tensor& a) { return unary(UnaryOp::Sqrt, a); }
Tensor rsqrt(const Tensor& a) { return unary(UnaryOp::Rsqrt, a); }
Tensor abs(const Tensor& a) { return unary(UnaryOp::Abs, a); }
Tensor tanh(const Tensor& a) { return unary(UnaryOp::Tanh, a); }
Tensor sigmoid(const Tensor& a) { return unary(UnaryOp::Sigmoid, a); }
Tensor relu(const Tensor& a) { return unary(UnaryOp::Relu, a); }
Tensor gelu(const Tensor& a, bool approximate_tanh) {
  return unary(approximate_tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf, a);
}
Tensor silu(const Tensor& a) { return unary(UnaryOp::Silu, a); }
Tensor relu2(const Tensor& a) { return apply1(std::make_shared<Relu2Prim>(), {a}); }
Tensor silu_mul(const Tensor& a, const Tensor& b) { return apply1(std::make_shared<SiluMulPrim>(), {a, b}); }
Tensor gelu_tanh_sum(const Tensor& a, const Tensor& da) {
  return apply(std::make_shared<GeluTanhSumPrim>(), {a, da})[0];
}
Tensor silu_mul_sums(const Tensor& a, const Tensor& da, const Tensor& b, const Tensor& db) {
  return apply(std::make_shared<SiluMulSumsPrim>(), {a, da, b, db})[0];
}
Tensor sin(const Tensor& a) { return unary(UnaryOp::Sin, a); }
Tensor cos(const Tensor& a) { return unary(UnaryOp::Cos, a); }
Tensor square(const Tensor& a) { return unary(UnaryOp::Square, a); }
Tensor reciprocal(const Tensor& a) { return unary(UnaryOp::Reciprocal, a); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Ge, a, b); }
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return apply1(std::make_shared<WherePrim>(), {cond, a, b});
}
Tensor cast(const Tensor& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  return apply1(std::make_shared<CastPrim>(dtype), {a});
}
Tensor to_device(const Tensor& a, Device d) {
  if (a.device() == d) return a;
  return apply1(std::make_shared<ToDevicePrim>(d), {a});
}
Tensor clone(const Tensor& a) { return apply1(std::make_shared<ClonePrim>(), {a}); }

Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  INGOT_INTERNAL_CHECK(lead >= 0, "sum_to_shape: ", shape_str(grad.shape()), " -> ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < grad.dim(); ++i)
    if (i < lead || (shape[static_cast<size_t>(i - lead)] == 1 && grad.shape()[static_cast<size_t>(i)] != 1))
      dims.push_back(i);
  Tensor r = dims.empty() ? grad : sum(grad, dims, /*keepdim=*/true);
  return reshape(r, shape);
}

}  // namespace ingot
