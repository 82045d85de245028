// Shape and view family: reshape/view (and flatten, squeeze, unsqueeze on top), permute/transpose,
// slice/narrow/select, expand, contiguous, cat/stack, split/chunk.
//
// View primitives (FusionKind::View) evaluate to `as_strided` aliases of their input, so writing through a
// view is visible in the base. reshape aliases whenever the input's strides allow it and copies otherwise.
// Backward: reshape back, the inverse permutation, sum_to_shape for expand, and for slices a zero tensor of
// the input's shape with the cotangent written into the slice (slice_backward, itself differentiable).
#include <algorithm>
#include <numeric>
#include <optional>

#include "autograd/kernel_lowering.h"
#include "autograd/ops.h"
#include "autograd/ops/attrs.h"
#include "autograd/ops/bucket_view.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

// Strides that let a tensor of (shape, strides) be seen as `target` without moving data, or nullopt.
// Walks maximal runs of dims that are laid out contiguously with respect to each other ("chunks") and
// requires each run to map onto whole dims of the target (the rule PyTorch's view uses).
std::optional<Strides> view_strides(const Shape& shape, const Strides& strides, const Shape& target) {
  if (numel(shape) == 0 || shape.empty()) return contiguous_strides(target);
  Strides out(target.size());
  int64_t view_d = static_cast<int64_t>(target.size()) - 1;
  int64_t chunk_stride = strides.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[static_cast<size_t>(d)];
    const bool chunk_ends = d == 0 || (shape[static_cast<size_t>(d - 1)] != 1 &&
                                       strides[static_cast<size_t>(d - 1)] != tensor_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || target[static_cast<size_t>(view_d)] == 1)) {
      out[static_cast<size_t>(view_d)] = view_numel * chunk_stride;
      view_numel *= target[static_cast<size_t>(view_d)];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (d > 0) {
      chunk_stride = strides[static_cast<size_t>(d - 1)];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

// Resolves a single -1 and checks the element count.
Shape infer_reshape(const Shape& from, Shape to, const char* op) {
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i] == -1) {
      INGOT_CHECK(infer_at < 0, op, ": only one dim may be -1, got ", shape_str(to));
      infer_at = static_cast<int64_t>(i);
    } else {
      INGOT_CHECK(to[i] >= 0, op, ": invalid size ", to[i], " in shape ", shape_str(to));
      known *= to[i];
    }
  }
  const int64_t n = numel(from);
  if (infer_at >= 0) {
    INGOT_CHECK(known != 0 && n % known == 0, op, ": cannot reshape ", shape_str(from), " (", n,
                " elements) into ", shape_str(to));
    to[static_cast<size_t>(infer_at)] = n / known;
  }
  INGOT_CHECK(numel(to) == n, op, ": cannot reshape ", shape_str(from), " (", n, " elements) into ",
              shape_str(to));
  return to;
}

class ReshapePrim final : public Primitive, public WithAttrs<ReshapeAttrs> {
 public:
  explicit ReshapePrim(Shape shape) : WithAttrs({std::move(shape)}) {}
  std::string_view name() const override { return "reshape"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{attrs_.shape, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const Tensor& x = in[0];
    const Shape& to = attrs_.shape;
    if (auto st = view_strides(x.shape(), x.strides(), to)) return {x.as_strided(to, *st, x.offset())};
    Tensor c = x.clone_raw();
    return {c.as_strided(to, contiguous_strides(to), c.offset())};
  }
  bool saves_input(size_t) const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::View; }
  void print_attrs(std::ostream& os) const override { os << "shape=" << shape_str(attrs_.shape); }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    return {reshape(g[0], c.input_meta[0].shape)};
  }
};

class PermutePrim final : public Primitive, public WithAttrs<PermuteAttrs> {
 public:
  explicit PermutePrim(std::vector<int64_t> perm) : WithAttrs({std::move(perm)}) {}
  std::string_view name() const override { return "permute"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    Shape s;
    for (int64_t p : attrs_.dims) s.push_back(in[0].shape[static_cast<size_t>(p)]);
    return {{s, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const Tensor& x = in[0];
    Shape s;
    Strides st;
    for (int64_t p : attrs_.dims) {
      s.push_back(x.shape()[static_cast<size_t>(p)]);
      st.push_back(x.strides()[static_cast<size_t>(p)]);
    }
    return {x.as_strided(s, st, x.offset())};
  }
  bool saves_input(size_t) const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::View; }
  void print_attrs(std::ostream& os) const override { os << "dims=" << shape_str(attrs_.dims); }
  std::vector<Tensor> vjp(const VjpContext&, const std::vector<Tensor>& g) const override {
    const std::vector<int64_t>& perm = attrs_.dims;
    std::vector<int64_t> inv(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
    return {permute(g[0], inv)};
  }
};

// Elements start, start + step, ... (< end) of `dim`; start/end already clamped to [0, size].
struct SliceSpec {
  int64_t dim, start, end, step;
  int64_t length() const { return end > start ? (end - start + step - 1) / step : 0; }
  Tensor view_of(const Tensor& x) const {
    Shape s = x.shape();
    Strides st = x.strides();
    const auto d = static_cast<size_t>(dim);
    s[d] = length();
    const int64_t off = x.offset() + (s[d] > 0 ? start * st[d] : 0);
    st[d] *= step;
    return x.as_strided(s, st, off);
  }
  void print(std::ostream& os) const {
    os << "dim=" << dim << ", start=" << start << ", end=" << end << ", step=" << step;
  }
};

class SlicePrim final : public Primitive {
 public:
  explicit SlicePrim(SliceSpec spec) : spec_(spec) {}
  std::string_view name() const override { return "slice"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    Shape s = in[0].shape;
    s[static_cast<size_t>(spec_.dim)] = spec_.length();
    return {{s, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return {spec_.view_of(in[0])}; }
  bool saves_input(size_t) const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::View; }
  void print_attrs(std::ostream& os) const override { spec_.print(os); }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override;

 private:
  SliceSpec spec_;
};

// The VJP of a slice: zeros of the sliced tensor's shape with `g` written into the slice. Its own VJP is the
// slice again, so higher-order gradients work.
class SliceBackwardPrim final : public Primitive {
 public:
  SliceBackwardPrim(Shape in_shape, SliceSpec spec) : in_shape_(std::move(in_shape)), spec_(spec) {}
  std::string_view name() const override { return "slice_backward"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{in_shape_, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor out = zeros(in_shape_, in[0].dtype(), in[0].device());
    Tensor dst = spec_.view_of(out);
    if (dst.numel() > 0) INGOT_KERNEL_CALL(out.device(), copy, dst, in[0]);
    return {out};
  }
  bool saves_input(size_t) const override { return false; }
  void print_attrs(std::ostream& os) const override {
    os << "shape=" << shape_str(in_shape_) << ", ";
    spec_.print(os);
  }
  std::vector<Tensor> vjp(const VjpContext&, const std::vector<Tensor>& g) const override {
    return {slice(g[0], spec_.dim, spec_.start, spec_.end, spec_.step)};
  }

 private:
  Shape in_shape_;
  SliceSpec spec_;
};

std::vector<Tensor> SlicePrim::vjp(const VjpContext& c, const std::vector<Tensor>& g) const {
  return {apply1(std::make_shared<SliceBackwardPrim>(c.input_meta[0].shape, spec_), {g[0]})};
}

class ExpandPrim final : public Primitive, public WithAttrs<ExpandAttrs> {
 public:
  explicit ExpandPrim(Shape shape) : WithAttrs({std::move(shape)}) {}
  std::string_view name() const override { return "expand"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{attrs_.shape, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return {in[0].expand_raw(attrs_.shape)}; }
  bool saves_input(size_t) const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::View; }
  void print_attrs(std::ostream& os) const override { os << "shape=" << shape_str(attrs_.shape); }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    return {sum_to_shape(g[0], c.input_meta[0].shape)};
  }
};

class ContiguousPrim final : public Primitive, public WithAttrs<CopyAttrs>, public KernelLowering {
 public:
  ContiguousPrim() : WithAttrs({}) {}
  std::string_view name() const override { return "contiguous"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override { return {in[0]}; }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override { return {in[0].clone_raw()}; }
  bool saves_input(size_t) const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  std::vector<Tensor> vjp(const VjpContext&, const std::vector<Tensor>& g) const override { return {g[0]}; }
  // A kernel's outputs are dense: inside one, the copy is the identity.
  std::vector<int> lower(LowerContext& cx) const override { return {cx.input(0)}; }
};

class CatPrim final : public Primitive, public WithAttrs<CatAttrs> {
 public:
  explicit CatPrim(int64_t dim) : WithAttrs({dim}) {}
  std::string_view name() const override { return "cat"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    Shape s = in[0].shape;
    DType t = in[0].dtype;
    const auto d = static_cast<size_t>(attrs_.dim);
    for (size_t i = 1; i < in.size(); ++i) {
      const Shape& si = in[i].shape;
      bool match = si.size() == s.size();
      for (size_t k = 0; match && k < s.size(); ++k) match = k == d || si[k] == s[k];
      INGOT_CHECK(match, "cat: tensor ", i, " has shape ", shape_str(si), " but tensor 0 has ",
                  shape_str(in[0].shape), "; shapes must match except in dim ", attrs_.dim);
      s[d] += si[d];
      t = promote(t, in[i].dtype);
    }
    return {{s, t, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor out = alloc_outputs(infer(metas_of(in)))[0];
    int64_t at = 0;
    for (const Tensor& t : in) {
      const int64_t len = t.shape()[static_cast<size_t>(attrs_.dim)];
      Tensor dst = SliceSpec{attrs_.dim, at, at + len, 1}.view_of(out);
      if (dst.numel() > 0) INGOT_KERNEL_CALL(out.device(), copy, dst, t);
      at += len;
    }
    return {out};
  }
  bool saves_input(size_t) const override { return false; }
  void print_attrs(std::ostream& os) const override { os << "dim=" << attrs_.dim; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    std::vector<Tensor> r(c.input_meta.size());
    int64_t at = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      const int64_t len = c.input_meta[i].shape[static_cast<size_t>(attrs_.dim)];
      if (c.needs_grad[i]) r[i] = cast(narrow(g[0], attrs_.dim, at, len), c.input_meta[i].dtype);
      at += len;
    }
    return r;
  }
};

// See autograd/ops/bucket_view.h: cat of 1-d pieces that are usually already where the result wants them.
class BucketViewPrim final : public Primitive {
 public:
  std::string_view name() const override { return "bucket_view"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(!in.empty(), "bucket_view: expected at least one piece");
    int64_t n = 0;
    for (const TensorMeta& m : in) {
      INGOT_CHECK(m.shape.size() == 1 && m.dtype == in[0].dtype, "bucket_view: expected 1-d pieces of ",
                  dtype_name(in[0].dtype), ", got ", dtype_name(m.dtype), shape_str(m.shape));
      n += m.shape[0];
    }
    return {{{n}, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const int64_t n = infer(metas_of(in))[0].shape[0];
    if (adjacent(in, n)) return {in[0].as_strided({n}, {1}, in[0].offset())};
    return CatPrim(0).eval(in);
  }
  bool differentiable() const override { return false; }
  bool saves_input(size_t) const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::View; }

 private:
  // The pieces lie one after the other in one storage that holds all n elements.
  static bool adjacent(const std::vector<Tensor>& in, int64_t n) {
    const std::shared_ptr<Storage>& st = in[0].storage();
    if (!st) return false;
    int64_t at = in[0].offset();
    for (const Tensor& t : in) {
      if (t.storage() != st || t.offset() != at || !t.is_contiguous()) return false;
      at += t.numel();
    }
    return (in[0].offset() + n) * static_cast<int64_t>(itemsize(in[0].dtype())) <= static_cast<int64_t>(st->nbytes);
  }
};

// Views of consecutive pieces of `dim` with the given sizes (one output each).
class SplitPrim final : public Primitive {
 public:
  SplitPrim(int64_t dim, std::vector<int64_t> sizes) : dim_(dim), sizes_(std::move(sizes)) {}
  std::string_view name() const override { return "split"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    std::vector<TensorMeta> r;
    for (int64_t sz : sizes_) {
      TensorMeta m = in[0];
      m.shape[static_cast<size_t>(dim_)] = sz;
      r.push_back(m);
    }
    return r;
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> r;
    int64_t at = 0;
    for (int64_t sz : sizes_) {
      r.push_back(SliceSpec{dim_, at, at + sz, 1}.view_of(in[0]));
      at += sz;
    }
    return r;
  }
  bool saves_input(size_t) const override { return false; }
  FusionKind fusion_kind() const override { return FusionKind::View; }
  void print_attrs(std::ostream& os) const override { os << "dim=" << dim_ << ", sizes=" << shape_str(sizes_); }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    const TensorMeta& m = c.input_meta[0];
    std::vector<Tensor> pieces;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      if (g[i].defined()) {
        pieces.push_back(g[i]);
      } else {
        Shape s = m.shape;
        s[static_cast<size_t>(dim_)] = sizes_[i];
        pieces.push_back(zeros(s, m.dtype, m.device));
      }
    }
    return {cat(pieces, dim_)};
  }

 private:
  int64_t dim_;
  std::vector<int64_t> sizes_;
};

Tensor as_reshape(const Tensor& a, Shape shape) {
  if (a.shape() == shape) return a;
  return apply1(std::make_shared<ReshapePrim>(std::move(shape)), {a});
}

}  // namespace

Tensor reshape(const Tensor& a, Shape shape) { return as_reshape(a, infer_reshape(a.shape(), std::move(shape), "reshape")); }

Tensor view(const Tensor& a, Shape shape) {
  shape = infer_reshape(a.shape(), std::move(shape), "view");
  INGOT_CHECK(view_strides(a.shape(), a.strides(), shape).has_value(), "view: cannot view a tensor of shape ",
              shape_str(a.shape()), " with strides ", shape_str(a.strides()), " as ", shape_str(shape),
              " without a copy; use reshape (or contiguous first)");
  return as_reshape(a, std::move(shape));
}

Tensor flatten(const Tensor& a, int64_t start_dim, int64_t end_dim) {
  if (a.dim() == 0) return as_reshape(a, {1});
  const int64_t s = wrap_dim(start_dim, a.dim(), "flatten"), e = wrap_dim(end_dim, a.dim(), "flatten");
  INGOT_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim, " for a tensor with ",
              a.dim(), " dims");
  Shape out(a.shape().begin(), a.shape().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d) n *= a.shape()[static_cast<size_t>(d)];
  out.push_back(n);
  out.insert(out.end(), a.shape().begin() + e + 1, a.shape().end());
  return as_reshape(a, std::move(out));
}

Tensor squeeze(const Tensor& a, int64_t dim) {
  if (a.dim() == 0) return a;
  const int64_t d = wrap_dim(dim, a.dim(), "squeeze");
  if (a.shape()[static_cast<size_t>(d)] != 1) return a;  // PyTorch semantics: squeezing a dim != 1 is a no-op
  Shape s = a.shape();
  s.erase(s.begin() + d);
  return as_reshape(a, std::move(s));
}

Tensor unsqueeze(const Tensor& a, int64_t dim) {
  const int64_t d = wrap_dim(dim, a.dim() + 1, "unsqueeze");
  Shape s = a.shape();
  s.insert(s.begin() + d, 1);
  return as_reshape(a, std::move(s));
}

Tensor permute(const Tensor& a, std::vector<int64_t> dims) {
  INGOT_CHECK(static_cast<int64_t>(dims.size()) == a.dim(), "permute: got ", dims.size(), " dims ",
              shape_str(dims), " for a tensor with ", a.dim(), " dims");
  std::vector<bool> seen(dims.size());
  for (int64_t& d : dims) {
    d = wrap_dim(d, a.dim(), "permute");
    INGOT_CHECK(!seen[static_cast<size_t>(d)], "permute: dims ", shape_str(dims), " repeat dim ", d);
    seen[static_cast<size_t>(d)] = true;
  }
  std::vector<int64_t> identity(dims.size());
  std::iota(identity.begin(), identity.end(), 0);
  if (dims == identity) return a;
  return apply1(std::make_shared<PermutePrim>(std::move(dims)), {a});
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  if (a.dim() == 0) return a;
  std::vector<int64_t> perm(static_cast<size_t>(a.dim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[static_cast<size_t>(wrap_dim(d0, a.dim(), "transpose"))],
            perm[static_cast<size_t>(wrap_dim(d1, a.dim(), "transpose"))]);
  return permute(a, std::move(perm));
}

Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  INGOT_CHECK(a.dim() > 0, "slice: cannot slice a 0-d tensor");
  const int64_t d = wrap_dim(dim, a.dim(), "slice");
  INGOT_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t size = a.shape()[static_cast<size_t>(d)];
  // Python slice rules: negative bounds count from the end, out-of-range bounds clamp.
  auto clamp = [size](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + size : i, 0, size); };
  SliceSpec spec{d, clamp(start), clamp(end), step};
  if (spec.end < spec.start) spec.end = spec.start;
  if (spec.start == 0 && spec.end == size && step == 1) return a;
  return apply1(std::make_shared<SlicePrim>(spec), {a});
}

Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  INGOT_CHECK(a.dim() > 0, "narrow: cannot narrow a 0-d tensor");
  const int64_t d = wrap_dim(dim, a.dim(), "narrow");
  const int64_t size = a.shape()[static_cast<size_t>(d)];
  const int64_t s = start < 0 ? start + size : start;
  INGOT_CHECK(s >= 0 && length >= 0 && s + length <= size, "narrow: start ", start, " and length ", length,
              " are out of range for dim ", dim, " of size ", size, " (shape ", shape_str(a.shape()), ")");
  return slice(a, d, s, s + length);
}

Tensor select(const Tensor& a, int64_t dim, int64_t index) {
  INGOT_CHECK(a.dim() > 0, "select: cannot select from a 0-d tensor");
  const int64_t d = wrap_dim(dim, a.dim(), "select");
  const int64_t size = a.shape()[static_cast<size_t>(d)];
  INGOT_CHECK(index >= -size && index < size, "select: index ", index, " is out of range for dim ", dim,
              " of size ", size, " (shape ", shape_str(a.shape()), ")");
  const int64_t i = index < 0 ? index + size : index;
  Shape s = a.shape();
  s.erase(s.begin() + d);
  return as_reshape(slice(a, d, i, i + 1), std::move(s));
}

Tensor expand(const Tensor& a, Shape shape) {
  INGOT_CHECK(shape.size() >= a.shape().size(), "expand: cannot expand shape ", shape_str(a.shape()), " to ",
              shape_str(shape), " (fewer dims)");
  const size_t lead = shape.size() - a.shape().size();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != -1) continue;
    INGOT_CHECK(i >= lead, "expand: -1 is not allowed for the new leading dim ", i, " in ", shape_str(shape));
    shape[i] = a.shape()[i - lead];
  }
  if (shape == a.shape()) return a;
  a.expand_raw(shape);  // validates, naming both shapes
  return apply1(std::make_shared<ExpandPrim>(std::move(shape)), {a});
}

Tensor contiguous(const Tensor& a) {
  if (a.is_contiguous()) return a;
  return apply1(std::make_shared<ContiguousPrim>(), {a});
}

Tensor cat(const std::vector<Tensor>& ts, int64_t dim) {
  INGOT_CHECK(!ts.empty(), "cat: expected at least one tensor");
  INGOT_CHECK(ts[0].dim() > 0, "cat: cannot concatenate 0-d tensors (use stack)");
  const int64_t d = wrap_dim(dim, ts[0].dim(), "cat");
  return apply1(std::make_shared<CatPrim>(d), ts);
}

std::shared_ptr<Primitive> make_bucket_view() { return std::make_shared<BucketViewPrim>(); }

Tensor stack(const std::vector<Tensor>& ts, int64_t dim) {
  INGOT_CHECK(!ts.empty(), "stack: expected at least one tensor");
  const int64_t d = wrap_dim(dim, ts[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < ts.size(); ++i) {
    INGOT_CHECK(ts[i].shape() == ts[0].shape(), "stack: tensor ", i, " has shape ", shape_str(ts[i].shape()),
                " but tensor 0 has ", shape_str(ts[0].shape()), "; all shapes must be equal");
    parts.push_back(unsqueeze(ts[i], d));
  }
  return cat(parts, d);
}

std::vector<Tensor> split_sizes(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim) {
  INGOT_CHECK(a.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t d = wrap_dim(dim, a.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    INGOT_CHECK(s >= 0, "split: negative size in ", shape_str(sizes));
    total += s;
  }
  INGOT_CHECK(total == a.shape()[static_cast<size_t>(d)], "split: sizes ", shape_str(sizes), " sum to ", total,
              " but dim ", dim, " of shape ", shape_str(a.shape()), " has size ", a.shape()[static_cast<size_t>(d)]);
  return apply(std::make_shared<SplitPrim>(d, sizes), {a});
}

std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim) {
  INGOT_CHECK(a.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t size = a.shape()[static_cast<size_t>(wrap_dim(dim, a.dim(), "split"))];
  INGOT_CHECK(split_size > 0 || size == 0, "split: split_size must be positive, got ", split_size);
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < size; at += split_size) sizes.push_back(std::min(split_size, size - at));
  if (sizes.empty()) sizes.push_back(0);
  return split_sizes(a, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim) {
  INGOT_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  INGOT_CHECK(a.dim() > 0, "chunk: cannot chunk a 0-d tensor");
  const int64_t size = a.shape()[static_cast<size_t>(wrap_dim(dim, a.dim(), "chunk"))];
  // As PyTorch: pieces of ceil(size / chunks), so fewer than `chunks` pieces may come back.
  return split(a, std::max<int64_t>((size + chunks - 1) / chunks, 1), dim);
}

}  // namespace ingot
