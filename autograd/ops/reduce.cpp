// Reduction family: sum, mean, amax, amin, logsumexp, argmax, argmin over a set of dims (empty = all).
// Forward brings the reduced dims together as one contiguous [outer, n, inner] block and runs the `reduce`
// kernel: a dense input (contiguous or permuted) is read in place when its reduced dims are adjacent in memory
// order; otherwise the kept dims are copied first and the reduced ones last. The kernel accumulates floating
// inputs in double. Backward broadcasts the cotangent back over the reduced dims. sum, mean, amax and amin of
// floating inputs lower to a row reduction over the reduced dims (Note [Ops lower themselves]).
#include <algorithm>

#include "autograd/kernel_lowering.h"
#include "autograd/ops.h"
#include "autograd/ops/attrs.h"
#include "autograd/ops/reduce_fused.h"
#include "autograd/ops/sum_pieces.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

using kernels::ReduceOp;

// Wraps, sorts and checks `dims` against a tensor of rank `ndim`; empty means every dim. A 0-d tensor
// accepts dim 0 / -1 (as PyTorch does) and reduces nothing.
std::vector<int64_t> normalize_dims(std::vector<int64_t> dims, int64_t ndim, const char* op) {
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
    return dims;
  }
  for (int64_t& d : dims) d = wrap_dim(d, ndim, op);
  std::sort(dims.begin(), dims.end());
  INGOT_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), op, ": dim ",
              *std::adjacent_find(dims.begin(), dims.end()), " appears more than once in the reduced dims");
  if (ndim == 0) dims.clear();
  return dims;
}

bool contains(const std::vector<int64_t>& dims, int64_t d) {
  return std::binary_search(dims.begin(), dims.end(), d);
}

// The output shape with reduced dims kept as 1.
Shape keepdim_shape(const Shape& in, const std::vector<int64_t>& dims) {
  Shape s = in;
  for (int64_t d : dims) s[static_cast<size_t>(d)] = 1;
  return s;
}

Shape reduced_shape(const Shape& in, const std::vector<int64_t>& dims, bool keepdim) {
  if (keepdim) return keepdim_shape(in, dims);
  Shape s;
  for (size_t d = 0; d < in.size(); ++d)
    if (!contains(dims, static_cast<int64_t>(d))) s.push_back(in[d]);
  return s;
}

DType reduce_out_dtype(ReduceOp op, DType in) {
  switch (op) {
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin: return DType::i64;
    case ReduceOp::Sum:
    case ReduceOp::Prod: return is_floating(in) ? in : DType::i64;
    case ReduceOp::LogSumExp: return is_floating(in) ? in : DType::f32;
    default: return in;
  }
}

class ReducePrim final : public Primitive, public WithAttrs<ReduceAttrs>, public KernelLowering {
 public:
  // widened: an f32 sum of bf16 / f16 input never rounded to the input's dtype (reduce_fused.h); only compiled
  // graphs build it.
  ReducePrim(ReduceOp op, std::vector<int64_t> dims, bool keepdim, bool widened = false)
      : WithAttrs({op, std::move(dims), keepdim, widened}) {}
  std::string_view name() const override { return kernels::reduce_name(attrs_.op); }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const Shape& s = in[0].shape;
    INGOT_CHECK(attrs_.op != ReduceOp::Mean || is_floating(in[0].dtype), "mean: expected a floating tensor, got ",
                dtype_name(in[0].dtype), " (cast it first)");
    const ReduceOp op = attrs_.op;
    if (op == ReduceOp::Max || op == ReduceOp::Min || op == ReduceOp::ArgMax || op == ReduceOp::ArgMin)
      for (int64_t d : attrs_.dims)
        INGOT_CHECK(s[static_cast<size_t>(d)] > 0, name(), ": cannot reduce over dim ", d, " of size 0 in shape ",
                    shape_str(s), " (no identity)");
    return {{reduced_shape(s, attrs_.dims, attrs_.keepdim),
             attrs_.widened ? DType::f32 : reduce_out_dtype(op, in[0].dtype), in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const Tensor& x = in[0];
    Tensor out = alloc_outputs(infer(metas_of(in)))[0];
    if (out.numel() == 0) return {out};
    const Shape& s = x.shape();
    const Strides& st = x.strides();
    // Dims of size 1 do not affect the layout; order the others so the reduced ones form one block.
    std::vector<int64_t> order;
    for (int64_t d = 0; d < x.dim(); ++d)
      if (s[static_cast<size_t>(d)] != 1) order.push_back(d);
    auto view_in = [&](const std::vector<int64_t>& dims) {
      Shape vs;
      Strides vst;
      for (int64_t d : dims) {
        vs.push_back(s[static_cast<size_t>(d)]);
        vst.push_back(st[static_cast<size_t>(d)]);
      }
      return x.as_strided(vs, vst, x.offset());
    };
    // A permuted but dense input is read in memory order when its reduced dims are adjacent there (no copy).
    std::vector<int64_t> mem = order;
    std::stable_sort(mem.begin(), mem.end(),
                     [&](int64_t a, int64_t b) { return st[static_cast<size_t>(a)] > st[static_cast<size_t>(b)]; });
    if (!view_in(mem).is_contiguous() || !reduced_adjacent(mem)) {
      // Otherwise: kept dims in order, reduced dims last, copied into that layout.
      std::stable_partition(order.begin(), order.end(), [&](int64_t d) { return !contains(attrs_.dims, d); });
      mem = order;
    }
    int64_t outer = 1, n = 1, inner = 1;
    bool seen_reduced = false;
    std::vector<int64_t> kept;
    for (int64_t d : mem) {
      const int64_t sz = s[static_cast<size_t>(d)];
      if (contains(attrs_.dims, d)) {
        n *= sz;
        seen_reduced = true;
      } else {
        (seen_reduced ? inner : outer) *= sz;
        kept.push_back(d);
      }
    }
    // The output seen with its dims in the order the kernel writes them.
    Shape ks;
    Strides kst;
    for (int64_t d : kept) {
      int64_t od = d;
      if (!attrs_.keepdim) od -= std::lower_bound(attrs_.dims.begin(), attrs_.dims.end(), d) - attrs_.dims.begin();
      ks.push_back(s[static_cast<size_t>(d)]);
      kst.push_back(out.strides()[static_cast<size_t>(od)]);
    }
    Tensor dst = out.as_strided(ks, kst, out.offset());
    Tensor tmp = dst.is_contiguous() ? dst : empty(ks, out.dtype(), out.device());
    INGOT_KERNEL_CALL(x.device(), reduce, attrs_.op, tmp, view_in(mem).contiguous_raw(), outer, n, inner);
    if (!tmp.same(dst)) INGOT_KERNEL_CALL(x.device(), copy, dst, tmp);
    return {out};
  }
  bool differentiable() const override {
    return attrs_.op != ReduceOp::ArgMax && attrs_.op != ReduceOp::ArgMin && !attrs_.widened;
  }
  bool saves_input(size_t) const override {
    return attrs_.op == ReduceOp::Max || attrs_.op == ReduceOp::Min || attrs_.op == ReduceOp::LogSumExp;
  }
  bool saves_output(size_t) const override { return saves_input(0); }
  FusionKind fusion_kind() const override { return FusionKind::Reduction; }
  void print_attrs(std::ostream& os) const override {
    os << "dims=" << shape_str(attrs_.dims) << ", keepdim=" << (attrs_.keepdim ? "true" : "false");
    if (attrs_.widened) os << ", out=f32";
  }
  std::shared_ptr<Primitive> widened() const {
    if (attrs_.op != ReduceOp::Sum || attrs_.widened) return nullptr;
    return std::make_shared<ReducePrim>(attrs_.op, attrs_.dims, attrs_.keepdim, true);
  }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    const TensorMeta& m = c.input_meta[0];
    // The cotangent with reduced dims restored as size 1, so it broadcasts against the input.
    const Shape ks = keepdim_shape(m.shape, attrs_.dims);
    Tensor gk = reshape(g[0], ks);
    Tensor r;
    switch (attrs_.op) {
      case ReduceOp::Sum: r = expand(gk, m.shape); break;
      case ReduceOp::Mean: {
        const double count = static_cast<double>(numel(m.shape) / std::max<int64_t>(numel(ks), 1));
        r = expand(mul(gk, 1.0 / count), m.shape);
        break;
      }
      case ReduceOp::Max:
      case ReduceOp::Min: {
        // Ties share the gradient evenly, as PyTorch's amax/amin do.
        Tensor hit = cast(eq(c.inputs[0], reshape(c.outputs[0], ks)), gk.dtype());
        r = mul(hit, div(gk, sum(hit, attrs_.dims, /*keepdim=*/true)));
        break;
      }
      case ReduceOp::LogSumExp:
        r = mul(gk, exp(sub(c.inputs[0], reshape(c.outputs[0], ks))));
        break;
      default: INGOT_FAIL(name(), ": not differentiable");
    }
    return {cast(r, m.dtype)};
  }
  std::optional<std::vector<int64_t>> reduced_axes(const Shape&, std::string*) const override { return attrs_.dims; }
  std::vector<int> lower(LowerContext& cx) const override {
    using codegen::Op;
    const ReduceOp op = attrs_.op;
    if (op != ReduceOp::Sum && op != ReduceOp::Mean && op != ReduceOp::Max && op != ReduceOp::Min)
      cx.unsupported("op '" + std::string(name()) + "' has no kernel lowering");
    cx.require_row_reduction();
    const int x = cx.input(0);
    if (!is_floating(cx.node_dtype(x))) cx.unsupported("an integer reduction");
    codegen::KernelSpec& k = cx.spec();
    int r = k.reduce(op == ReduceOp::Max ? Op::ReduceMax : op == ReduceOp::Min ? Op::ReduceMin : Op::ReduceSum, x);
    if (op == ReduceOp::Mean) r = k.binary(Op::Div, r, cx.constant_like(static_cast<double>(cx.reduced_size()), r));
    return {r};
  }

 private:
  // Whether the reduced dims among `order` sit next to each other.
  bool reduced_adjacent(const std::vector<int64_t>& order) const {
    int64_t first = -1, last = -1, count = 0;
    for (size_t i = 0; i < order.size(); ++i)
      if (contains(attrs_.dims, order[i])) {
        if (first < 0) first = static_cast<int64_t>(i);
        last = static_cast<int64_t>(i);
        ++count;
      }
    return count == 0 || last - first + 1 == count;
  }

};

Tensor reduce(ReduceOp op, const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  dims = normalize_dims(std::move(dims), a.dim(), kernels::reduce_name(op));
  return apply1(std::make_shared<ReducePrim>(op, std::move(dims), keepdim), {a});
}

}  // namespace

std::shared_ptr<Primitive> widened_sum(const Primitive& sum) {
  const auto* p = dynamic_cast<const ReducePrim*>(&sum);
  return p ? p->widened() : nullptr;
}

Tensor sum(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return reduce(ReduceOp::Sum, a, std::move(dims), keepdim);
}
Tensor mean(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return reduce(ReduceOp::Mean, a, std::move(dims), keepdim);
}
Tensor amax(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return reduce(ReduceOp::Max, a, std::move(dims), keepdim);
}
Tensor amin(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return reduce(ReduceOp::Min, a, std::move(dims), keepdim);
}
Tensor logsumexp(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return reduce(ReduceOp::LogSumExp, a, std::move(dims), keepdim);
}
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) { return reduce(ReduceOp::ArgMax, a, {dim}, keepdim); }
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim) { return reduce(ReduceOp::ArgMin, a, {dim}, keepdim); }

}  // namespace ingot

// sum_pieces (autograd/ops/sum_pieces.h).
namespace ingot {
namespace {

// Pointwise over its pieces, and lowers itself (Note [Ops lower themselves]) with the eager kernels' arithmetic: a
// sum the update does not read alone (a clipping norm reads it too) fuses into its readers' generated kernels.
class SumPiecesPrim final : public Primitive, public KernelLowering {
 public:
  explicit SumPiecesPrim(SumPiecesInfo info) : info_(info) {}
  FusionKind fusion_kind() const override { return FusionKind::Pointwise; }
  std::vector<int> lower(LowerContext& cx) const override {
    std::vector<int> pieces;
    for (size_t i = 0; i < info_.pieces; ++i) pieces.push_back(cx.input(i));
    return {sum_pieces_expr(cx.spec(), pieces, info_.scale, info_.into)};
  }
  std::string_view name() const override { return "sum_pieces"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in.size() == info_.pieces && !in.empty(), "sum_pieces: expected ", info_.pieces, " pieces, got ",
                in.size());
    for (const TensorMeta& m : in)
      INGOT_CHECK(m.shape.size() == 1 && m.shape == in[0].shape && m.dtype == in[0].dtype && is_floating(m.dtype) &&
                      m.device == in[0].device,
                  "sum_pieces: pieces must be 1-d floating tensors of one length, dtype and device, got ",
                  shape_str(m.shape), " ", dtype_name(m.dtype), " beside ", shape_str(in[0].shape), " ",
                  dtype_name(in[0].dtype));
    TensorMeta out = in[0];
    out.dtype = info_.into;
    return {out};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    std::vector<Tensor> pieces;
    for (const Tensor& t : in) pieces.push_back(t.contiguous_raw());
    Tensor out = empty(in[0].shape(), info_.into, in[0].device());
    INGOT_KERNEL_CALL(out.device(), sum_pieces, out, pieces, info_.scale, 0);
    return {out};
  }
  bool differentiable() const override { return false; }
  bool saves_input(size_t) const override { return false; }
  bool equivalent(const Primitive& other) const override {
    const auto* o = dynamic_cast<const SumPiecesPrim*>(&other);
    return o && o->info_.pieces == info_.pieces && o->info_.scale == info_.scale && o->info_.into == info_.into;
  }
  void print_attrs(std::ostream& os) const override {
    os << "pieces=" << info_.pieces << ", scale=" << info_.scale << ", in " << dtype_name(info_.into);
  }
  const SumPiecesInfo& info() const { return info_; }

 private:
  SumPiecesInfo info_;
};

}  // namespace

Tensor sum_pieces(const std::vector<Tensor>& pieces, double scale, DType into) {
  INGOT_CHECK(!pieces.empty(), "sum_pieces: no pieces");
  INGOT_CHECK(into == DType::f32 || into == DType::f64, "sum_pieces: sums in f32 or f64, got ", dtype_name(into));
  return ingot::apply(std::make_shared<SumPiecesPrim>(SumPiecesInfo{pieces.size(), scale, into}), pieces)[0];
}

int sum_pieces_expr(codegen::KernelSpec& k, const std::vector<int>& pieces, double scale, DType into) {
  INGOT_CHECK(!pieces.empty(), "sum_pieces_expr: no pieces");
  int acc = k.cast(pieces[0], into);
  for (size_t i = 1; i < pieces.size(); ++i) acc = k.binary(codegen::Op::Add, acc, k.cast(pieces[i], into));
  const double rounded = into == DType::f32 ? static_cast<double>(static_cast<float>(scale)) : scale;
  return k.binary(codegen::Op::Mul, acc, k.constant(rounded, into));
}

std::optional<SumPiecesInfo> as_sum_pieces(const Primitive& p) {
  const auto* s = dynamic_cast<const SumPiecesPrim*>(&p);
  if (!s) return std::nullopt;
  return s->info();
}

}  // namespace ingot
