// Primitive: the one definition of an op (MLX-style). A primitive knows its name and attributes, its output
// metadata rule (infer), how to compute its outputs eagerly on any device (eval, which calls the kernels of
// runtime/kernels), and its vector-Jacobian product written with differentiable ops (vjp), so the same
// backward works eagerly and, later, inside a traced graph.
//
// Users never see primitives: free functions in autograd/ops.h build them and call apply().
#pragma once

#include <memory>
#include <ostream>
#include <source_location>
#include <string_view>
#include <vector>

#include "runtime/tensor.h"

namespace ingot {

// How the compiler may fuse an op (declared by the op, never decided by a list inside the fuser).
enum class FusionKind { Pointwise, Reduction, View, Opaque };

struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};
inline TensorMeta meta_of(const Tensor& t) { return {t.shape(), t.dtype(), t.device()}; }

// What the backward of one application sees. Inputs/outputs are detached aliases (no history), present only
// where the primitive asked to save them (see Primitive::saves_*); metadata is always there.
struct VjpContext {
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<TensorMeta> input_meta;
  std::vector<bool> needs_grad;  // per input
};

class Primitive {
 public:
  virtual ~Primitive() = default;
  virtual std::string_view name() const = 0;
  // Output metadata from input metadata; throws naming the op on invalid inputs.
  virtual std::vector<TensorMeta> infer(const std::vector<TensorMeta>& inputs) const = 0;
  // Computes the outputs eagerly. View primitives return aliases of their input.
  virtual std::vector<Tensor> eval(const std::vector<Tensor>& inputs) const = 0;
  // Gradients w.r.t. each input (an undefined Tensor where !needs_grad or not differentiable). `cotangents`
  // has one entry per output; undefined entries mean zero. Runs with grad mode off.
  virtual std::vector<Tensor> vjp(const VjpContext& ctx, const std::vector<Tensor>& cotangents) const;
  virtual bool differentiable() const { return true; }
  // Which inputs / outputs the backward needs (default: all inputs, no outputs).
  virtual bool saves_input(size_t) const { return true; }
  virtual bool saves_output(size_t) const { return false; }
  virtual FusionKind fusion_kind() const { return FusionKind::Opaque; }
  // Attributes, printed after the name in graphs and errors ("dim=1, keepdim=true").
  virtual void print_attrs(std::ostream&) const {}
  // Same op with the same attributes (what CSE and kernel dedup need). Default compares name and attrs text.
  virtual bool equivalent(const Primitive& other) const;
};

// Runs `p` on `inputs`: evaluates eagerly and, when grad mode is on and an input requires grad, records a
// tape node so backward() can reach the inputs. `loc` is the user's call site (for error messages).
std::vector<Tensor> apply(std::shared_ptr<Primitive> p, const std::vector<Tensor>& inputs,
                          std::source_location loc = std::source_location::current());
inline Tensor apply1(std::shared_ptr<Primitive> p, const std::vector<Tensor>& inputs,
                     std::source_location loc = std::source_location::current()) {
  return apply(std::move(p), inputs, loc)[0];
}

// Allocates outputs on the inputs' device from an infer() result.
std::vector<Tensor> alloc_outputs(const std::vector<TensorMeta>& metas);
std::vector<TensorMeta> metas_of(const std::vector<Tensor>& ts);

// Grad mode: on by default; NoGradGuard turns recording off in a scope (thread-local).
bool grad_enabled();
void set_grad_enabled(bool on);
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace ingot
