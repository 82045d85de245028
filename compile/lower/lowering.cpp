#include "compile/lower/lowering.h"

#include "autograd/ops/attrs.h"

namespace ingot::compiler {

bool is_multi_tensor_update(const Primitive& p) { return p.name() == "adamw_update" || p.name() == "sgd_update"; }

bool is_layout_glue(const Primitive& p) {
  return p.fusion_kind() == FusionKind::View || p.name() == "cat" || p.name() == "cast";
}

int schedule_class(const Primitive& p) {
  const std::string_view n = p.name();  // distributed/collective_ops.h
  if (n == "all_reduce_start" || n == "reduce_scatter_start" || n == "all_gather_start") return -1;
  if (n == "collective_wait") return 1;
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
  const std::string_view n = p.name();
  if (n == "clone" || n == "contiguous") return 0;
  // The exact alpha (x * 1.0000001 is no identity; its 6-digit text "alpha=1" made it one).
  const std::optional<double> alpha = scalar_alpha(p);
  if ((n == "mul_scalar" || n == "pow_scalar") && alpha == 1.0) return 0;
  if (n == "add_scalar" && alpha == 0.0) return 0;  // +0 and -0
  if (n == "reshape" || n == "expand") return 0;  // same shape in and out: no-op
  return std::nullopt;
}

}  // namespace ingot::compiler
