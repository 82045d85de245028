#include "autograd/nn/layers.h"

#include <cmath>

#include "autograd/primitive.h"
#include "runtime/kernels/kernels.h"
#include "runtime/rng.h"

namespace ingot::nn {
namespace {

thread_local SkipInit* t_skip_init = nullptr;

// Note [Parameters made to be overwritten]: an uninitialized parameter in place of a drawn one, the generator
// advanced as the draw would have advanced it, and the draw kept (Note [Initial values drawn later]).
Tensor skipped_draw(const Shape& shape, DeferredInit::Kind kind, double a, double b) {
  Generator& g = default_generator(Device::cpu());
  const uint64_t offset = g.reserve(static_cast<uint64_t>(numel(shape)));
  return t_skip_init->make(shape, DeferredInit{kind, a, b, g.seed(), offset});
}

Tensor normal_init(const Shape& shape, double std) {
  if (t_skip_init) return skipped_draw(shape, DeferredInit::Kind::Normal, 0.0, std);
  return randn(shape, DType::f32, Device::cpu(), 0.0, std);
}
Tensor uniform_init(const Shape& shape, double bound) {
  if (t_skip_init) return skipped_draw(shape, DeferredInit::Kind::Uniform, -bound, bound);
  return rand(shape, DType::f32, Device::cpu(), -bound, bound);
}
Tensor filled(const Shape& shape, double value) {
  if (t_skip_init) return t_skip_init->make(shape, DeferredInit{DeferredInit::Kind::Fill, value, 0.0, 0, 0});
  return value == 0.0 ? zeros(shape) : ones(shape);
}

}  // namespace

void DeferredInit::fill(int64_t begin, int64_t end, Tensor& dst) const {
  INGOT_CHECK(begin >= 0 && end >= begin && dst.numel() == end - begin && dst.is_contiguous(),
              "DeferredInit::fill: elements [", begin, ", ", end, ") into a contiguous tensor of as many, got ",
              shape_str(dst.shape()));
  if (begin == end) return;
  NoGradGuard no_grad;
  Tensor v = empty({end - begin}, DType::f32, Device::cpu());
  // The layer's draw started at `offset`; its element begin + i is the counter-based draw at offset + begin + i.
  if (kind == Kind::Normal) kernels::cpu::rand_normal(v, seed, offset + static_cast<uint64_t>(begin), a, b);
  else if (kind == Kind::Uniform) kernels::cpu::rand_uniform(v, seed, offset + static_cast<uint64_t>(begin), a, b);
  else v.fill_(a);
  dst.copy_(v.to(dst.device()).to(dst.dtype()));
}

SkipInit::SkipInit(DType dtype) : dtype_(dtype), outer_(t_skip_init) { t_skip_init = this; }
SkipInit::SkipInit(DType dtype, Device on) : dtype_(dtype), no_bytes_on_(on), outer_(t_skip_init) {
  t_skip_init = this;
}
SkipInit::~SkipInit() { t_skip_init = outer_; }
const SkipInit* SkipInit::active() { return t_skip_init; }

Tensor SkipInit::make(const Shape& shape, const DeferredInit& init) {
  Tensor t;
  if (!no_bytes_on_) {
    t = empty(shape, dtype_);
  } else {
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = std::make_shared<Storage>();
    impl->storage->nbytes = static_cast<size_t>(numel(shape)) * itemsize(dtype_);
    impl->storage->device = *no_bytes_on_;
    impl->shape = shape;
    impl->strides = contiguous_strides(shape);
    impl->dtype = dtype_;
    t = Tensor(impl);
  }
  deferred_[t.impl()] = init;
  return t;
}

const DeferredInit& SkipInit::deferred(const Tensor& p) const {
  const auto it = deferred_.find(p.impl());
  INGOT_CHECK(it != deferred_.end(), "SkipInit::deferred: '", p.name(), "' was not made under this guard");
  return it->second;
}

// Linear ---------------------------------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, std::optional<double> init_std)
    : in_(in_features), out_(out_features) {
  INGOT_CHECK(in_features > 0 && out_features > 0, "Linear: expected positive sizes, got in=", in_features,
              " out=", out_features);
  if (init_std) {
    weight_ = register_parameter("weight", normal_init({out_, in_}, *init_std));
    if (bias) bias_ = register_parameter("bias", filled({out_}, 0.0));
  } else {
    // PyTorch's kaiming_uniform_(a=sqrt(5)) reduces to U(-1/sqrt(in), 1/sqrt(in)); the bias uses the same bound.
    double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    weight_ = register_parameter("weight", uniform_init({out_, in_}, bound));
    if (bias) bias_ = register_parameter("bias", uniform_init({out_}, bound));
  }
}

Tensor Linear::forward(const Tensor& x) {
  INGOT_CHECK(x.dim() >= 1 && x.size(-1) == in_, "Linear: expected input [..., ", in_, "], got ",
              shape_str(x.shape()));
  auto c = compute_dtype();
  return linear(maybe_cast(x, c), maybe_cast(weight_, c), maybe_cast(bias_, c));
}

// Embedding, norms, dropout ------------------------------------------------------------------------------------

Embedding::Embedding(int64_t num_embeddings, int64_t dim, double init_std) {
  INGOT_CHECK(num_embeddings > 0 && dim > 0, "Embedding: expected positive sizes, got ", num_embeddings, " x ", dim);
  weight_ = register_parameter("weight", normal_init({num_embeddings, dim}, init_std));
}

Tensor Embedding::forward(const Tensor& ids) { return lookup_ ? lookup_(weight_, ids) : embedding(weight_, ids); }

LayerNorm::LayerNorm(int64_t dim, double eps, bool affine) : eps_(eps) {
  if (affine) {
    weight_ = register_parameter("weight", filled({dim}, 1.0));
    bias_ = register_parameter("bias", filled({dim}, 0.0));
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, weight_, bias_, eps_); }

RMSNorm::RMSNorm(int64_t dim, double eps) : eps_(eps) { weight_ = register_parameter("weight", filled({dim}, 1.0)); }

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, weight_, eps_); }

Dropout::Dropout(double p) : p_(p) {
  INGOT_CHECK(p >= 0.0 && p < 1.0, "Dropout: expected 0 <= p < 1, got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0) return x;
  return dropout(x, p_, true);
}

}  // namespace ingot::nn
