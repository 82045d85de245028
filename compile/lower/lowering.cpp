#include "compile/lower/lowering.h"

#include "autograd/ops/attrs.h"
#include "autograd/primitive_collective.h"
#include "autograd/primitive_multi_tensor.h"

namespace ingot::compiler {

bool is_multi_tensor_update(const Primitive& p) { return is_horizontal_update(p); }

bool is_layout_glue(const Primitive& p) {
  return p.fusion_kind() == FusionKind::View || match<CatAttrs>(p) || match<CastAttrs>(p);
}

int schedule_class(const Primitive& p) {
  if (is_collective_start(p)) return -1;
  if (is_collective_wait(p)) return 1;
  return 0;
}

}  // namespace ingot::compiler

namespace ingot::compiler {

std::optional<double> scalar_alpha(const Primitive& p) {
  const UnaryAttrs* u = match<UnaryAttrs>(p);
  if (!u || !takes_scalar(u->op)) return std::nullopt;
  return u->alpha;
}

std::optional<size_t> identity_input(const Primitive& p, const std::vector<TensorMeta>& in,
                                     const std::vector<TensorMeta>& out) {
  if (in.empty() || out.size() != 1 || in[0].dtype != out[0].dtype || in[0].shape != out[0].shape) return std::nullopt;
  // The exact alpha (x * 1.0000001 is no identity; its 6-digit text "alpha=1" made it one).
  if (const UnaryAttrs* u = match<UnaryAttrs>(p)) {
    using kernels::UnaryOp;
    if ((u->op == UnaryOp::MulScalar || u->op == UnaryOp::PowScalar) && u->alpha == 1.0) return 0;
    if (u->op == UnaryOp::AddScalar && u->alpha == 0.0) return 0;  // +0 and -0
    return std::nullopt;
  }
  // A copy, or a view to the same shape (a no-op).
  if (match<CopyAttrs>(p) || match<ReshapeAttrs>(p) || match<ExpandAttrs>(p)) return 0;
  return std::nullopt;
}

}  // namespace ingot::compiler
