// Random ops: dropout.
//
// Note [Replayable dropout]: the keep mask is never stored. Each call reserves numel() draws of the device
// generator's Philox stream and passes (seed, offset) as a second input: a [2] i64 host tensor (read on the
// host, whatever the device of x). Element i is kept iff uniform(seed, offset + i) >= p. Given that tensor
// the mask is a pure function, so
//   - the backward is the same primitive applied to the cotangent with the same (seed, offset) (dropout is
//     linear in x for a fixed mask), which saves only that tiny tensor and is itself differentiable;
//   - while a compiled step is traced, the (seed, offset) tensor is a host input of the graph whose producer
//     reserves the same draws again: every replay draws a fresh mask and advances the generator exactly as
//     the eager step would, so compiled and eager runs (and resumed ones) see the same masks.
#include "autograd/checkpoint.h"
#include "autograd/ops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/rng.h"

namespace ingot {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

// y = x * keep / (1 - p) with keep drawn from in[1] = (seed, offset); see Note [Replayable dropout].
class DropoutPrim final : public Primitive {
 public:
  explicit DropoutPrim(double p) : p_(p) {}
  std::string_view name() const override { return "dropout"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == 2 && in[1].dtype == DType::i64 && in[1].shape == Shape{2},
                "dropout: expected x and a [2] i64 (seed, offset) tensor");
    return {in[0]};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const Tensor& x = in[0];
    INGOT_CHECK(in[1].device().is_cpu() && in[1].is_contiguous(), "dropout: (seed, offset) must be a CPU tensor");
    const int64_t* so = in[1].data<int64_t>();
    const uint64_t seed = static_cast<uint64_t>(so[0]), offset = static_cast<uint64_t>(so[1]);
    const Device dev = x.device();
    Tensor out = empty(x.shape(), x.dtype(), dev);
    if (out.numel() == 0) return {out};
    Tensor u = empty(x.shape(), DType::f32, dev);
    INGOT_KERNEL_CALL(dev, rand_uniform, u, seed, offset, 0.0, 1.0);
    Tensor keep = empty(x.shape(), DType::b8, dev);
    INGOT_KERNEL_CALL(dev, binary, BinaryOp::Ge, keep, u, full({}, p_, DType::f32, dev).expand_raw(x.shape()));
    INGOT_KERNEL_CALL(dev, binary, BinaryOp::Mul, out, x, keep);
    // p == 1 keeps nothing: scale by 0 rather than inf so the result is 0, not NaN.
    const double scale = p_ < 1.0 ? 1.0 / (1.0 - p_) : 0.0;
    INGOT_KERNEL_CALL(dev, unary, UnaryOp::MulScalar, out, out, scale);
    return {out};
  }
  bool saves_input(size_t i) const override { return i == 1; }
  bool host_input(size_t i) const override { return i == 1; }
  // Opaque: the generated kernels have no Philox; fused with pointwise neighbours it would keep the whole
  // group from lowering. It runs as its own (eager) step.
  FusionKind fusion_kind() const override { return FusionKind::Opaque; }
  void print_attrs(std::ostream& os) const override { os << "p=" << p_; }
  std::vector<Tensor> vjp(const VjpContext& ctx, const std::vector<Tensor>& g) const override {
    return {apply1(std::make_shared<DropoutPrim>(p_), {g[0], ctx.inputs[1]}), Tensor()};
  }

 private:
  double p_;
};

// The [2] i64 (seed, offset) tensor of a call that reserves `numel` draws of `device`'s generator.
Tensor reserve_draws(Device device, int64_t numel) {
  Generator& gen = default_generator(device);
  const uint64_t seed = gen.seed();
  const uint64_t offset = gen.reserve(static_cast<uint64_t>(numel));
  return from_vector_i64({static_cast<int64_t>(seed), static_cast<int64_t>(offset)}, {2});
}

}  // namespace

Tensor dropout(const Tensor& a, double p, bool training) {
  INGOT_CHECK(p >= 0.0 && p <= 1.0, "dropout: p must be in [0, 1], got ", p);
  if (p == 0.0 || !training) return a;
  INGOT_CHECK(is_floating(a.dtype()), "dropout: input must be floating, got ", dtype_name(a.dtype()));
  const Device dev = a.device();
  const int64_t n = a.numel();
  // A checkpointed region's recomputation reuses its forward's draws (autograd/checkpoint.h): the same mask, and
  // no second host input while tracing.
  Tensor draws = checkpoint_replay([&] {
    Tensor d = reserve_draws(dev, n);
    if (TraceObserver* obs = trace_observer()) obs->on_host_input(d, [dev, n] { return reserve_draws(dev, n); });
    return d;
  });
  return apply1(std::make_shared<DropoutPrim>(p), {a, draws});
}

}  // namespace ingot
