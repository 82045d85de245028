// Random ops: dropout.
//
// Note [Replayable dropout]: the keep mask is never stored. Each call reserves numel() draws of the device
// generator's Philox stream and records (seed, offset) as attributes; element i is kept iff
// uniform(seed, offset + i) >= p. Given the attributes the mask is a pure function, so
//   - the backward is the same primitive applied to the cotangent (dropout is linear in x for a fixed mask),
//     which saves no tensor and is itself differentiable;
//   - a traced or recompiled graph replays exactly the mask the eager run drew.
#include "autograd/ops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/rng.h"

namespace ingot {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

// y = x * keep / (1 - p) with keep drawn from (seed, offset); see Note [Replayable dropout].
class DropoutPrim final : public Primitive {
 public:
  DropoutPrim(double p, uint64_t seed, uint64_t offset) : p_(p), seed_(seed), offset_(offset) {}
  std::string_view name() const override { return "dropout"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[0]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const Tensor& x = in[0];
    const Device dev = x.device();
    Tensor out = empty(x.shape(), x.dtype(), dev);
    if (out.numel() == 0) return {out};
    Tensor u = empty(x.shape(), DType::f32, dev);
    INGOT_KERNEL_CALL(dev, rand_uniform, u, seed_, offset_, 0.0, 1.0);
    Tensor keep = empty(x.shape(), DType::b8, dev);
    INGOT_KERNEL_CALL(dev, binary, BinaryOp::Ge, keep, u, full({}, p_, DType::f32, dev).expand_raw(x.shape()));
    INGOT_KERNEL_CALL(dev, binary, BinaryOp::Mul, out, x, keep);
    // p == 1 keeps nothing: scale by 0 rather than inf so the result is 0, not NaN.
    const double scale = p_ < 1.0 ? 1.0 / (1.0 - p_) : 0.0;
    INGOT_KERNEL_CALL(dev, unary, UnaryOp::MulScalar, out, out, scale);
    return {out};
  }
  bool saves_input(size_t) const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  void print_attrs(std::ostream& os) const override {
    os << "p=" << p_ << ", seed=" << seed_ << ", offset=" << offset_;
  }
  std::vector<Tensor> vjp(const VjpContext&, const std::vector<Tensor>& g) const override {
    return {apply1(std::make_shared<DropoutPrim>(p_, seed_, offset_), {g[0]})};
  }

 private:
  double p_;
  uint64_t seed_, offset_;
};

}  // namespace

Tensor dropout(const Tensor& a, double p, bool training) {
  INGOT_CHECK(p >= 0.0 && p <= 1.0, "dropout: p must be in [0, 1], got ", p);
  if (p == 0.0 || !training) return a;
  INGOT_CHECK(is_floating(a.dtype()), "dropout: input must be floating, got ", dtype_name(a.dtype()));
  Generator& gen = default_generator(a.device());
  const uint64_t seed = gen.seed();
  const uint64_t offset = gen.reserve(static_cast<uint64_t>(a.numel()));
  return apply1(std::make_shared<DropoutPrim>(p, seed, offset), {a});
}

}  // namespace ingot
