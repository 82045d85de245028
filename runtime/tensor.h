// Tensor: a reference-counted handle to a strided view of a Storage, plus the autograd fields the engine in
// autograd/ reads and writes. Copying a Tensor copies the handle, not the data.
//
// This header holds what needs no op machinery: metadata, raw views (no autograd), factories and copies.
// Differentiable operations (add, matmul, reshape with a gradient...) are free functions in autograd/ops.h.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/shape.h"

namespace ingot {

class Tensor;
struct Node;  // autograd/node.h

using GradHook = std::function<Tensor(const Tensor& grad)>;    // may return an undefined Tensor to keep grad
using PostAccumulateHook = std::function<void(Tensor& param)>;  // runs after .grad was updated (DDP buckets)

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Strides strides;
  DType dtype = DType::f32;

  // autograd (see autograd/engine.cpp). A leaf has requires_grad and no grad_fn.
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;
  int output_nr = 0;
  std::shared_ptr<TensorImpl> grad;
  std::vector<GradHook> hooks;
  std::vector<PostAccumulateHook> post_accumulate_hooks;
  std::string name;      // optional, for error messages (parameter names)
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

  const Shape& shape() const { return checked()->shape; }
  const Strides& strides() const { return checked()->strides; }
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return ingot::numel(shape()); }
  DType dtype() const { return checked()->dtype; }
  Device device() const { return checked()->storage ? checked()->storage->device : Device::cpu(); }
  int64_t offset() const { return checked()->offset; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(dtype()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return checked()->storage; }
  // Bumped by every in-place write to the storage (shared by views); backward checks saved inputs with it.
  uint64_t version() const { return storage() ? storage()->version : 0; }
  void bump_version() const {
    if (storage()) ++storage()->version;
  }

  void* data_ptr() const;
  template <typename T>
  T* data() const { return static_cast<T*>(data_ptr()); }
  // Reads element i (row-major logical index) as double; CPU only; for tests and small host logic.
  double item_at(int64_t i) const;
  // The single value of a one-element tensor, copied to the host if needed.
  double item(std::source_location loc = std::source_location::current()) const;
  // All elements in logical order, as double (any device).
  std::vector<double> to_vector(std::source_location loc = std::source_location::current()) const;

  // autograd
  bool requires_grad() const { return defined() && impl_->requires_grad; }
  Tensor& set_requires_grad(bool r);
  bool is_leaf() const { return !impl_->grad_fn; }
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  void zero_grad() { impl_->grad.reset(); }
  void register_hook(GradHook h);
  void register_post_accumulate_grad_hook(PostAccumulateHook h);
  // Reverse-mode autodiff from this tensor (defined in autograd/engine.cpp). `grad` defaults to ones for a
  // one-element tensor.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  // Same data, no autograd history.
  Tensor detach() const;
  const std::string& name() const { return checked()->name; }
  Tensor& set_name(std::string n) {
    checked()->name = std::move(n);
    return *this;
  }

  // Raw views and copies: no autograd recording. The differentiable versions are in autograd/ops.h.
  Tensor as_strided(Shape shape, Strides strides, int64_t offset) const;
  Tensor contiguous_raw() const;     // self when already contiguous
  // Broadcast view to `shape` (numpy rules; broadcast dims get stride 0). Throws if not broadcastable.
  Tensor expand_raw(const Shape& shape) const;
  Tensor to(Device d) const;         // self when already there; no autograd
  Tensor to(DType t) const;          // self when already that type; no autograd
  Tensor clone_raw() const;          // contiguous copy
  // In-place copy from src (broadcast to self's shape, any device, any dtype). Bumps the version.
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double v);
  Tensor& zero_() { return fill_(0.0); }

  std::string str(int64_t max_elems = 8) const;  // "Tensor(f32, cpu, [2, 3]) [0.1, ...]"

 private:
  TensorImpl* checked() const {
    INGOT_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return impl_.get();
  }
  std::shared_ptr<TensorImpl> impl_;
};

// Host-read seam for the compiler's tracer (compile/trace/trace.cpp): when set (thread-local), item() and
// to_vector() call it first with the caller's source line, so a read of a traced value becomes a graph break
// that names the user's line. Null by default.
using HostReadHook = void (*)(const Tensor& t, const std::source_location& loc);
void set_host_read_hook(HostReadHook hook);
// Raw-access seam for deferred execution (compile/trace/segments.h): when set (thread-local), the raw copies that
// read or write data outside of ops call it first: copy_ (dst and src), fill_ (dst), clone_raw, to() and
// str() (src only). It may run pending work first; for copy_ it may return true to take the write over (copy_
// then only bumps dst's version). Null by default.
using RawAccessHook = bool (*)(const Tensor* dst, const Tensor* src);
void set_raw_access_hook(RawAccessHook hook);

// Factories. Random numbers come from the Philox generator of runtime/rng.h (same values on CPU and CUDA).
Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
Tensor arange(int64_t start, int64_t end, DType dtype = DType::i64, Device device = Device::cpu());
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
// From host values in row-major order; converts to `dtype`.
Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f32,
                   Device device = Device::cpu());
Tensor from_vector_i64(const std::vector<int64_t>& values, const Shape& shape, Device device = Device::cpu());
// Wraps existing memory (not copied); `owner` keeps it alive.
Tensor from_blob(std::shared_ptr<void> owner, void* data, const Shape& shape, DType dtype, Device device);
// Uniform [low, high) and normal(mean, std) from the default generator of `device`.
Tensor rand(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(), double low = 0.0,
            double high = 1.0);
Tensor randn(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(), double mean = 0.0,
             double std = 1.0);
Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device = Device::cpu());

// Largest |a - b| / (atol + rtol * |b|) over all elements (inputs on any device, same shape). <= 1 means close.
double max_rel_error(const Tensor& a, const Tensor& b, double rtol, double atol);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

}  // namespace ingot
