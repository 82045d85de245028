// Indexing family: index_select, embedding, embedding_rows, gather, scatter_add.
//
//   index_select(a, dim, idx)      out = a with dim replaced by idx's dims     VJP: index_add into zeros
//   gather(a, dim, idx)            out[.., j, ..] = a[.., idx[.., j, ..], ..]  VJP: scatter_add into zeros
//   scatter_add(a, dim, idx, src)  out = a; out[.., idx[.., j, ..], ..] += src  VJP: g, gather(g)
//
// IndexSelectPrim accepts an index of any shape (the output takes the index's dims in place of `dim`), so
// embedding is the same primitive on dim 0 with the ids as they come: no flatten/reshape around it. The
// kernels read every index flat.
//
// Bounds: the CPU kernels check indices themselves and name the op. Elsewhere, and for embedding (whose
// message speaks of ids), the op checks on the host, since a device-side failure cannot carry a message.
#include "autograd/ops.h"
#include "autograd/ops/index_fused.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

void check_index_dtype(const TensorMeta& index, const char* op) {
  INGOT_CHECK(index.dtype == DType::i64 || index.dtype == DType::i32, op, ": index must be i64 or i32, got ",
              dtype_name(index.dtype));
}

// Throws "<op>: <what> <v> out of range [0, <bound>)" for the first index outside [0, bound).
void check_index_range(const Tensor& index, int64_t bound, const char* op, const char* what) {
  Tensor host = index.to(Device::cpu()).contiguous_raw();
  auto scan = [&](const auto* p) {
    for (int64_t i = 0; i < host.numel(); ++i)
      INGOT_CHECK(p[i] >= 0 && p[i] < bound, op, ": ", what, " ", static_cast<int64_t>(p[i]), " out of range [0, ",
                  bound, ")");
  };
  if (host.dtype() == DType::i64) scan(host.data<int64_t>());
  else scan(host.data<int32_t>());
}

Shape replace_dim(const Shape& s, int64_t dim, const Shape& with) {
  Shape r(s.begin(), s.begin() + dim);
  r.insert(r.end(), with.begin(), with.end());
  r.insert(r.end(), s.begin() + dim + 1, s.end());
  return r;
}

// Checks idx.shape[d] == a.shape[d] for every d != dim (gather/scatter_add index a like-shaped tensor).
void check_same_except(const Shape& a, const Shape& idx, int64_t dim, const char* op, const char* a_name) {
  bool ok = a.size() == idx.size();
  for (size_t d = 0; ok && d < a.size(); ++d) ok = static_cast<int64_t>(d) == dim || a[d] == idx[d];
  INGOT_CHECK(ok, op, ": index shape ", shape_str(idx), " must match ", a_name, " shape ", shape_str(a),
              " in every dim except ", dim);
}

Tensor index_select_any(const Tensor& a, int64_t dim, const Tensor& index);
Tensor index_add_into_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

class IndexSelectPrim final : public Primitive {
 public:
  explicit IndexSelectPrim(int64_t dim) : dim_(dim) {}
  std::string_view name() const override { return "index_select"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    check_index_dtype(in[1], "index_select");
    return {{replace_dim(in[0].shape, dim_, in[1].shape), in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    if (out[0].numel() > 0)
      INGOT_KERNEL_CALL(in[0].device(), index_select, out[0], in[0].contiguous_raw(), in[1].contiguous_raw(), dim_);
    return out;
  }
  bool saves_input(size_t i) const override { return i == 1; }
  void print_attrs(std::ostream& os) const override { os << "dim=" << dim_; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    return {index_add_into_zeros(c.input_meta[0].shape, dim_, c.inputs[1], g[0]), Tensor()};
  }

 private:
  int64_t dim_;
};

// zeros(shape).index_add_(dim, index, src); only the backward of index_select builds it.
class IndexAddPrim final : public Primitive {
 public:
  IndexAddPrim(Shape shape, int64_t dim) : shape_(std::move(shape)), dim_(dim) {}
  std::string_view name() const override { return "index_add"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{shape_, in[1].dtype, in[1].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor out = empty(shape_, in[1].dtype(), in[1].device());
    eval_to(in, {out});
    return {out};
  }
  // An embedding's gradient, written into its slice of a gradient bucket (Note [Outputs into given buffers]).
  bool writes_given_outputs() const override { return true; }
  void eval_to(const std::vector<Tensor>& in, const std::vector<Tensor>& outs) const override {
    Tensor out = outs[0];
    out.zero_();
    if (in[1].numel() > 0)
      INGOT_KERNEL_CALL(out.device(), index_add, out, in[1].contiguous_raw(), in[0].contiguous_raw(), dim_);
  }
  bool saves_input(size_t i) const override { return i == 0; }
  void print_attrs(std::ostream& os) const override { os << "shape=" << shape_str(shape_) << ", dim=" << dim_; }
  int64_t dim() const { return dim_; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    return {Tensor(), index_select_any(g[0], dim_, c.inputs[0])};
  }

 private:
  Shape shape_;
  int64_t dim_;
};

// See autograd/ops/index_fused.h. Inputs (base, index, src); never differentiated.
class IndexAddAccumulatePrim final : public Primitive {
 public:
  explicit IndexAddAccumulatePrim(int64_t dim) : dim_(dim) {}
  std::string_view name() const override { return "index_add_accumulate"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in[0].dtype == in[2].dtype, "index_add_accumulate: base ", dtype_name(in[0].dtype), " and src ",
                dtype_name(in[2].dtype), " differ");
    return {in[0]};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    return eval_into(in, in[0].clone_raw());
  }
  // The kernel only adds into the rows the index names (Note [Outputs over dead inputs]).
  std::optional<size_t> reusable_input() const override { return 0; }
  std::vector<Tensor> eval_into(const std::vector<Tensor>& in, const Tensor& out) const override {
    if (in[2].numel() > 0)
      INGOT_KERNEL_CALL(out.device(), index_add, out, in[2].contiguous_raw(), in[1].contiguous_raw(), dim_);
    return {out};
  }
  // A tied embedding's gradient in its bucket slice: the base is copied there unless it already is (its
  // producer wrote it into the same slice: compile/passes/bucket_views.cpp follows reusable inputs).
  bool writes_given_outputs() const override { return true; }
  void eval_to(const std::vector<Tensor>& in, const std::vector<Tensor>& outs) const override {
    eval_into_given(in, outs[0]);
  }
  bool differentiable() const override { return false; }
  void print_attrs(std::ostream& os) const override { os << "dim=" << dim_; }

 private:
  int64_t dim_;
};

class GatherPrim final : public Primitive {
 public:
  explicit GatherPrim(int64_t dim) : dim_(dim) {}
  std::string_view name() const override { return "gather"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    check_index_dtype(in[1], "gather");
    check_same_except(in[0].shape, in[1].shape, dim_, "gather", "input");
    return {{in[1].shape, in[0].dtype, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    if (out[0].numel() > 0)
      INGOT_KERNEL_CALL(in[0].device(), gather, out[0], in[0].contiguous_raw(), in[1].contiguous_raw(), dim_);
    return out;
  }
  bool saves_input(size_t i) const override { return i == 1; }
  void print_attrs(std::ostream& os) const override { os << "dim=" << dim_; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    const TensorMeta& a = c.input_meta[0];
    return {scatter_add(zeros(a.shape, g[0].dtype(), a.device), dim_, c.inputs[1], g[0]), Tensor()};
  }

 private:
  int64_t dim_;
};

// Inputs (a, index, src).
class ScatterAddPrim final : public Primitive {
 public:
  explicit ScatterAddPrim(int64_t dim) : dim_(dim) {}
  std::string_view name() const override { return "scatter_add"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    check_index_dtype(in[1], "scatter_add");
    check_same_except(in[0].shape, in[1].shape, dim_, "scatter_add", "input");
    INGOT_CHECK(in[2].shape == in[1].shape, "scatter_add: src shape ", shape_str(in[2].shape),
                " must equal index shape ", shape_str(in[1].shape));
    INGOT_CHECK(in[2].dtype == in[0].dtype, "scatter_add: src dtype ", dtype_name(in[2].dtype),
                " must equal input dtype ", dtype_name(in[0].dtype));
    return {in[0]};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    infer(metas_of(in));
    Tensor out = in[0].clone_raw();
    if (in[1].numel() > 0)
      INGOT_KERNEL_CALL(out.device(), scatter_add, out, in[2].contiguous_raw(), in[1].contiguous_raw(), dim_);
    return {out};
  }
  bool saves_input(size_t i) const override { return i == 1; }
  void print_attrs(std::ostream& os) const override { os << "dim=" << dim_; }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    std::vector<Tensor> r(3);
    if (c.needs_grad[0]) r[0] = g[0];
    if (c.needs_grad[2]) r[2] = gather(g[0], dim_, c.inputs[1]);
    return r;
  }

 private:
  int64_t dim_;
};

// Note [Vocabulary-parallel embeddings] (distributed/fsdp.h): a rank holding rows [base, base + R) of a table
// looks up every rank's ids in its own rows (zeros for the others' rows) and takes the gradient of its rows only.
// `base` differs between ranks and is not printed: every rank traces the same graph text (one compile-cache
// entry); equivalent() still tells two bases apart.
class EmbeddingRowsGradPrim;

class EmbeddingRowsPrim final : public Primitive {
 public:
  EmbeddingRowsPrim(int64_t base, DType as) : base_(base), as_(as) {}
  std::string_view name() const override { return "embedding_rows"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(in[0].shape.size() == 2 && is_floating(in[0].dtype), "embedding_rows: rows must be floating [R, D], got ",
                dtype_name(in[0].dtype), " ", shape_str(in[0].shape));
    check_index_dtype(in[1], "embedding_rows");
    Shape out = in[1].shape;
    out.push_back(in[0].shape[1]);
    return {{out, as_, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    const Tensor ids = in[1].contiguous_raw();
    const Tensor flat = out[0].as_strided({ids.numel(), in[0].shape()[1]}, {in[0].shape()[1], 1}, 0);
    INGOT_KERNEL_CALL(in[0].device(), embedding_rows, flat, in[0].contiguous_raw(), ids, base_);
    return out;
  }
  bool saves_input(size_t i) const override { return i == 1; }
  void print_attrs(std::ostream& os) const override { os << "as " << dtype_name(as_); }
  bool equivalent(const Primitive& other) const override {
    const auto* o = dynamic_cast<const EmbeddingRowsPrim*>(&other);
    return o && o->base_ == base_ && o->as_ == as_;
  }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    return {embedding_rows_grad(g[0], c.inputs[1], base_, c.input_meta[0].shape[0], c.input_meta[0].dtype), Tensor()};
  }

 private:
  int64_t base_;
  DType as_;
};

class EmbeddingRowsGradPrim final : public Primitive {
 public:
  EmbeddingRowsGradPrim(int64_t base, int64_t rows, DType dtype) : base_(base), rows_(rows), dtype_(dtype) {}
  std::string_view name() const override { return "embedding_rows_grad"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    INGOT_CHECK(!in[0].shape.empty() && is_floating(in[0].dtype), "embedding_rows_grad: g must be floating [..., D]");
    check_index_dtype(in[1], "embedding_rows_grad");
    return {{Shape{rows_, in[0].shape.back()}, dtype_, in[0].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    auto out = alloc_outputs(infer(metas_of(in)));
    out[0].zero_();
    const Tensor ids = in[1].contiguous_raw();
    const int64_t d = in[0].shape().back();
    const Tensor g = in[0].contiguous_raw().as_strided({ids.numel(), d}, {d, 1}, 0);
    INGOT_KERNEL_CALL(out[0].device(), embedding_rows_add, out[0], g, ids, base_);
    return out;
  }
  bool saves_input(size_t i) const override { return i == 1; }
  void print_attrs(std::ostream& os) const override {
    os << "rows=" << rows_ << ", dtype=" << dtype_name(dtype_);
  }
  bool equivalent(const Primitive& other) const override {
    const auto* o = dynamic_cast<const EmbeddingRowsGradPrim*>(&other);
    return o && o->base_ == base_ && o->rows_ == rows_ && o->dtype_ == dtype_;
  }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    return {apply1(std::make_shared<EmbeddingRowsPrim>(base_, c.input_meta[0].dtype), {g[0], c.inputs[1]}), Tensor()};
  }

 private:
  int64_t base_, rows_;
  DType dtype_;
};

Tensor index_select_any(const Tensor& a, int64_t dim, const Tensor& index) {
  return apply1(std::make_shared<IndexSelectPrim>(dim), {a, index});
}

Tensor index_add_into_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  return apply1(std::make_shared<IndexAddPrim>(shape, dim), {index, src});
}

int64_t checked_dim(const Tensor& a, int64_t dim, const char* op) {
  INGOT_CHECK(a.dim() > 0, op, ": expected a tensor with at least one dim, got a scalar");
  return wrap_dim(dim, a.dim(), op);
}

}  // namespace

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  const int64_t d = checked_dim(a, dim, "index_select");
  INGOT_CHECK(index.dim() <= 1, "index_select: index must be 0-d or 1-d, got shape ", shape_str(index.shape()));
  check_index_dtype(meta_of(index), "index_select");
  if (!index.device().is_cpu()) check_index_range(index, a.shape()[d], "index_select", "index");
  // A 0-d index keeps the dim (size 1), as in PyTorch.
  Tensor idx = index.dim() == 0 ? index.as_strided({1}, {1}, index.offset()) : index;
  return index_select_any(a, d, idx);
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  INGOT_CHECK(weight.dim() == 2, "embedding: weight must be [V, D], got shape ", shape_str(weight.shape()));
  check_index_dtype(meta_of(ids), "embedding");
  check_index_range(ids, weight.shape()[0], "embedding", "id");
  return index_select_any(weight, 0, ids);
}

Tensor embedding_rows(const Tensor& rows, const Tensor& ids, int64_t base, int64_t vocab, std::optional<DType> as) {
  INGOT_CHECK(rows.dim() == 2, "embedding_rows: rows must be [R, D], got shape ", shape_str(rows.shape()));
  INGOT_CHECK(base >= 0 && base + rows.shape()[0] <= vocab, "embedding_rows: rows [", base, ", ",
              base + rows.shape()[0], ") are not inside the vocabulary [0, ", vocab, ")");
  check_index_dtype(meta_of(ids), "embedding_rows");
  check_index_range(ids, vocab, "embedding", "id");
  return apply1(std::make_shared<EmbeddingRowsPrim>(base, as.value_or(rows.dtype())), {rows, ids});
}

Tensor embedding_rows_grad(const Tensor& g, const Tensor& ids, int64_t base, int64_t num_rows, DType dtype) {
  INGOT_CHECK(num_rows >= 0 && is_floating(dtype), "embedding_rows_grad: needs num_rows >= 0 and a floating dtype");
  check_index_dtype(meta_of(ids), "embedding_rows_grad");
  INGOT_CHECK(g.dim() == ids.dim() + 1 && g.numel() == ids.numel() * (g.dim() ? g.shape().back() : 0),
              "embedding_rows_grad: g ", shape_str(g.shape()), " is not ids ", shape_str(ids.shape()), " + [D]");
  return apply1(std::make_shared<EmbeddingRowsGradPrim>(base, num_rows, dtype), {g, ids});
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  const int64_t d = checked_dim(a, dim, "gather");
  check_index_dtype(meta_of(index), "gather");
  if (!index.device().is_cpu()) check_index_range(index, a.shape()[d], "gather", "index");
  return apply1(std::make_shared<GatherPrim>(d), {a, index});
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  const int64_t d = checked_dim(a, dim, "scatter_add");
  check_index_dtype(meta_of(index), "scatter_add");
  if (!index.device().is_cpu()) check_index_range(index, a.shape()[d], "scatter_add", "index");
  return apply1(std::make_shared<ScatterAddPrim>(d), {a, index, src});
}

std::shared_ptr<Primitive> index_add_accumulate_from(const Primitive& index_add) {
  const auto* p = dynamic_cast<const IndexAddPrim*>(&index_add);
  return p ? std::make_shared<IndexAddAccumulatePrim>(p->dim()) : nullptr;
}

}  // namespace ingot
