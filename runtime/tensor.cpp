#include "runtime/tensor.h"

#include <cmath>
#include <sstream>

#include "runtime/cuda_runtime.h"
#include "runtime/kernels/kernels.h"
#include "runtime/rng.h"

namespace ingot {

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to address: any strides describe the same (empty) layout
  const auto& s = shape();
  const auto& st = strides();
  int64_t expect = 1;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != 1 && st[i] != expect) return false;
    expect *= s[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const auto& st = storage();
  if (!st || !st->data) return nullptr;
  return static_cast<char*>(st->data.get()) + offset() * static_cast<int64_t>(itemsize(dtype()));
}

double Tensor::item_at(int64_t i) const {
  INGOT_CHECK(device().is_cpu(), "item_at: tensor is on ", device().str(), ", expected cpu");
  INGOT_CHECK(i >= 0 && i < numel(), "item_at: index ", i, " out of range for ", numel(), " elements");
  int64_t off = 0, rem = i;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    off += (rem % shape()[d]) * strides()[d];
    rem /= shape()[d];
  }
  const char* base = static_cast<const char*>(storage()->data.get()) +
                     (offset() + off) * static_cast<int64_t>(itemsize(dtype()));
  switch (dtype()) {
    case DType::f32: return *reinterpret_cast<const float*>(base);
    case DType::f64: return *reinterpret_cast<const double*>(base);
    case DType::bf16: return bf16_to_float(*reinterpret_cast<const uint16_t*>(base));
    case DType::f16: return f16_to_float(*reinterpret_cast<const uint16_t*>(base));
    case DType::i32: return *reinterpret_cast<const int32_t*>(base);
    case DType::i64: return static_cast<double>(*reinterpret_cast<const int64_t*>(base));
    case DType::b8: return *reinterpret_cast<const uint8_t*>(base) ? 1.0 : 0.0;
  }
  return 0.0;
}

namespace {
thread_local HostReadHook t_host_read_hook = nullptr;
thread_local RawAccessHook t_raw_access_hook = nullptr;
}  // namespace

void set_host_read_hook(HostReadHook hook) { t_host_read_hook = hook; }
void set_raw_access_hook(RawAccessHook hook) { t_raw_access_hook = hook; }

double Tensor::item(std::source_location loc) const {
  if (t_host_read_hook) t_host_read_hook(*this, loc);
  INGOT_CHECK(numel() == 1, "item: expected a one-element tensor, got shape ", shape_str(shape()));
  return to(Device::cpu()).item_at(0);
}

std::vector<double> Tensor::to_vector(std::source_location loc) const {
  if (t_host_read_hook) t_host_read_hook(*this, loc);
  Tensor h = to(Device::cpu());
  std::vector<double> v(static_cast<size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) v[static_cast<size_t>(i)] = h.item_at(i);
  return v;
}

Tensor& Tensor::set_requires_grad(bool r) {
  INGOT_CHECK(!r || is_floating(dtype()), "requires_grad: only floating tensors can require gradients, got ",
              dtype_name(dtype()));
  INGOT_CHECK(is_leaf(), "requires_grad: can only be set on leaf tensors (this one has a grad_fn)");
  checked()->requires_grad = r;
  return *this;
}

void Tensor::register_hook(GradHook h) {
  INGOT_CHECK(requires_grad(), "register_hook: tensor does not require grad");
  checked()->hooks.push_back(std::move(h));
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateHook h) {
  INGOT_CHECK(requires_grad() && is_leaf(), "register_post_accumulate_grad_hook: expected a leaf that requires grad");
  checked()->post_accumulate_hooks.push_back(std::move(h));
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage();
  impl->offset = offset();
  impl->shape = shape();
  impl->strides = strides();
  impl->dtype = dtype();
  impl->name = checked()->name;
  return Tensor(std::move(impl));
}

Tensor Tensor::as_strided(Shape shape, Strides strides, int64_t offset) const {
  INGOT_INTERNAL_CHECK(shape.size() == strides.size(), "as_strided: rank mismatch");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage();
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

Tensor Tensor::contiguous_raw() const { return is_contiguous() ? *this : clone_raw(); }

Tensor Tensor::clone_raw() const {
  if (t_raw_access_hook) t_raw_access_hook(nullptr, this);
  Tensor out = empty(shape(), dtype(), device());
  if (numel() > 0) INGOT_KERNEL_CALL(device(), copy, out, *this);
  return out;
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  if (t_raw_access_hook) t_raw_access_hook(nullptr, this);
  Tensor out = empty(shape(), t, device());
  if (numel() > 0) INGOT_KERNEL_CALL(device(), copy, out, *this);
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  if (t_raw_access_hook) t_raw_access_hook(nullptr, this);
  Tensor src = contiguous_raw();
  Tensor out = empty(shape(), dtype(), d);
  if (numel() == 0) return out;
  if (d.is_cuda() && src.device().is_cpu()) {
    cuda::memcpy(out.data_ptr(), src.data_ptr(), src.nbytes(), cuda::CopyKind::HostToDevice, d.index);
  } else if (d.is_cpu() && src.device().is_cuda()) {
    cuda::memcpy(out.data_ptr(), src.data_ptr(), src.nbytes(), cuda::CopyKind::DeviceToHost, src.device().index);
  } else {  // cuda:i -> cuda:j
    Tensor host = src.to(Device::cpu());
    cuda::memcpy(out.data_ptr(), host.data_ptr(), host.nbytes(), cuda::CopyKind::HostToDevice, d.index);
  }
  return out;
}

Tensor Tensor::expand_raw(const Shape& target) const {
  INGOT_CHECK(target.size() >= shape().size(), "expand: cannot expand shape ", shape_str(shape()), " to ",
              shape_str(target));
  Strides st(target.size(), 0);
  size_t lead = target.size() - shape().size();
  for (size_t i = 0; i < shape().size(); ++i) {
    INGOT_CHECK(shape()[i] == target[lead + i] || shape()[i] == 1, "expand: cannot expand shape ",
                shape_str(shape()), " to ", shape_str(target));
    st[lead + i] = shape()[i] == 1 && target[lead + i] != 1 ? 0 : strides()[i];
  }
  return as_strided(target, st, offset());
}

Tensor& Tensor::copy_(const Tensor& src) {
  if (t_raw_access_hook && t_raw_access_hook(this, &src)) {
    bump_version();
    return *this;
  }
  Tensor s = src.device() == device() ? src : src.to(device());
  Tensor view = s.expand_raw(shape());
  if (numel() > 0) INGOT_KERNEL_CALL(device(), copy, *this, view);
  bump_version();
  return *this;
}

Tensor& Tensor::fill_(double v) {
  if (t_raw_access_hook) t_raw_access_hook(this, nullptr);
  if (numel() > 0) INGOT_KERNEL_CALL(device(), fill, *this, v);
  bump_version();
  return *this;
}

std::string Tensor::str(int64_t max_elems) const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(" << dtype_name(dtype()) << ", " << device().str() << ", " << shape_str(shape()) << ")";
  if (numel() > 0) {
    if (t_raw_access_hook) t_raw_access_hook(nullptr, this);
    Tensor h = to(Device::cpu());
    os << " [";
    int64_t n = std::min<int64_t>(numel(), max_elems);
    for (int64_t i = 0; i < n; ++i) os << (i ? ", " : "") << h.item_at(i);
    if (n < numel()) os << ", ...";
    os << "]";
  }
  return os.str();
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) INGOT_CHECK(d >= 0, "empty: negative dimension in shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  size_t nbytes = static_cast<size_t>(numel(shape)) * itemsize(dtype);
  impl->storage = std::make_shared<Storage>(Storage{allocator_for(device).allocate(nbytes), nbytes, device, 0});
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }

Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
  INGOT_CHECK(static_cast<int64_t>(values.size()) == numel(shape), "from_vector: ", values.size(),
              " values for shape ", shape_str(shape));
  auto owner = std::shared_ptr<void>(new std::vector<double>(values),
                                     [](void* p) { delete static_cast<std::vector<double>*>(p); });
  auto* vec = static_cast<std::vector<double>*>(owner.get());
  Tensor host = from_blob(owner, vec->data(), shape, DType::f64, Device::cpu());
  Tensor out = empty(shape, dtype, Device::cpu());
  if (out.numel() > 0) kernels::cpu::copy(out, host);
  return out.to(device);
}

Tensor from_vector_i64(const std::vector<int64_t>& values, const Shape& shape, Device device) {
  INGOT_CHECK(static_cast<int64_t>(values.size()) == numel(shape), "from_vector_i64: ", values.size(),
              " values for shape ", shape_str(shape));
  Tensor out = empty(shape, DType::i64, Device::cpu());
  std::copy(values.begin(), values.end(), out.data<int64_t>());
  return out.to(device);
}

Tensor from_blob(std::shared_ptr<void> owner, void* data, const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  size_t nbytes = static_cast<size_t>(numel(shape)) * itemsize(dtype);
  // Aliasing constructor: the storage points at `data` but keeps `owner` alive.
  impl->storage = std::make_shared<Storage>(Storage{std::shared_ptr<void>(std::move(owner), data), nbytes, device, 0});
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor arange(int64_t start, int64_t end, DType dtype, Device device) {
  INGOT_CHECK(end >= start, "arange: end ", end, " < start ", start);
  std::vector<double> v;
  v.reserve(static_cast<size_t>(end - start));
  for (int64_t i = start; i < end; ++i) v.push_back(static_cast<double>(i));
  return from_vector(v, {end - start}, dtype, device);
}

Tensor rand(const Shape& shape, DType dtype, Device device, double low, double high) {
  Tensor t = empty(shape, dtype, device);
  Generator& g = default_generator(device);
  uint64_t off = g.reserve(static_cast<uint64_t>(t.numel()));
  if (t.numel() > 0) INGOT_KERNEL_CALL(device, rand_uniform, t, g.seed(), off, low, high);
  return t;
}

Tensor randn(const Shape& shape, DType dtype, Device device, double mean, double std) {
  Tensor t = empty(shape, dtype, device);
  Generator& g = default_generator(device);
  uint64_t off = g.reserve(static_cast<uint64_t>(t.numel()));
  if (t.numel() > 0) INGOT_KERNEL_CALL(device, rand_normal, t, g.seed(), off, mean, std);
  return t;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device) {
  INGOT_CHECK(high > low, "randint: empty range [", low, ", ", high, ")");
  Tensor u = rand(shape, DType::f64, Device::cpu());
  Tensor out = empty(shape, DType::i64, Device::cpu());
  const double* src = u.data<double>();
  int64_t* dst = out.data<int64_t>();
  for (int64_t i = 0; i < out.numel(); ++i)
    dst[i] = std::min(high - 1, low + static_cast<int64_t>(std::floor(src[i] * static_cast<double>(high - low))));
  return out.to(device);
}

double max_rel_error(const Tensor& a, const Tensor& b, double rtol, double atol) {
  INGOT_CHECK(a.shape() == b.shape(), "max_rel_error: shapes differ: ", shape_str(a.shape()), " vs ",
              shape_str(b.shape()));
  std::vector<double> va = a.to_vector(), vb = b.to_vector();
  double worst = 0.0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) != std::isnan(vb[i])) return INFINITY;
    if (std::isnan(va[i])) continue;
    if (std::isinf(va[i]) || std::isinf(vb[i])) {
      if (va[i] != vb[i]) return INFINITY;
      continue;
    }
    worst = std::max(worst, std::abs(va[i] - vb[i]) / (atol + rtol * std::abs(vb[i])));
  }
  return worst;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  return a.shape() == b.shape() && max_rel_error(a, b, rtol, atol) <= 1.0;
}

}  // namespace ingot
