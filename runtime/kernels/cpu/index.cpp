// CPU indexing kernels: index_select, index_add, gather, scatter_add.
//
// Every tensor is contiguous and read as [outer, n, inner] around the indexed dim: src/out have their own n
// (the size of the indexed dim), and for index_select/index_add the index is flat (its numel is the n of the
// index-side operand). Copies move whole elements of any dtype; the accumulating kernels add in float (double
// for f64 and integers) and store back in the tensor's dtype.
//
// Bounds are checked in a serial pass before any work, because an exception cannot leave an OpenMP region;
// the message names the kernel, which is also the op's name.
//
// Note [Race-free accumulation]: index_add and scatter_add may hit one output element from many source
// elements (duplicate indices). Instead of atomics, each thread owns a slice of the non-indexed dims
// (outer x inner column blocks) and walks the indexed dim serially, so no two threads write one element and
// the sum order is fixed (deterministic results).
#include <algorithm>
#include <cstring>

#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cpu {
namespace {

struct IndexedView {
  int64_t outer = 1, n = 1, inner = 1;
};

// [outer, shape[dim], inner] of a contiguous tensor; a 0-d tensor is [1, 1, 1].
IndexedView view_around(const Tensor& t, int64_t dim) {
  IndexedView v;
  if (t.dim() == 0) return v;
  for (int64_t d = 0; d < dim; ++d) v.outer *= t.shape()[d];
  v.n = t.shape()[dim];
  for (int64_t d = dim + 1; d < t.dim(); ++d) v.inner *= t.shape()[d];
  return v;
}

// Calls f(I{}) with I the index element type (int32_t or int64_t).
template <typename F>
void dispatch_index(const Tensor& index, const char* op, F&& f) {
  INGOT_CHECK(index.dtype() == DType::i64 || index.dtype() == DType::i32, op, ": index must be i64 or i32, got ",
              dtype_name(index.dtype()));
  if (index.dtype() == DType::i64) f(int64_t{});
  else f(int32_t{});
}

template <typename I>
void check_bounds(const I* idx, int64_t count, int64_t bound, const char* op) {
  for (int64_t i = 0; i < count; ++i)
    INGOT_CHECK(idx[i] >= 0 && idx[i] < bound, op, ": index ", static_cast<int64_t>(idx[i]), " out of range [0, ",
                bound, ")");
}

void check_layout(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) INGOT_INTERNAL_CHECK(t->is_contiguous(), op, ": operands must be contiguous");
}

// dst[k] += src[k] for k < n, in the accumulation type of T.
template <typename T>
inline void add_into(T* dst, const T* src, int64_t n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    for (int64_t k = 0; k < n; ++k) dst[k] += src[k];
  } else {
    using Acc = std::conditional_t<std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>, float, double>;
    for (int64_t k = 0; k < n; ++k) store_one(dst + k, load_one<Acc>(dst + k) + load_one<Acc>(src + k));
  }
}

// Columns per task of the accumulating kernels: small enough to give every thread work when outer is 1
// (embedding backward), large enough to keep rows streaming.
constexpr int64_t kColumnBlock = 64;

}  // namespace

void index_select(const Tensor& out, const Tensor& src, const Tensor& index, int64_t dim) {
  check_layout("index_select", {&out, &src, &index});
  const IndexedView s = view_around(src, dim);
  const int64_t count = index.numel();
  const size_t row_bytes = static_cast<size_t>(s.inner) * itemsize(src.dtype());
  const char* sp = static_cast<const char*>(src.data_ptr());
  char* op = static_cast<char*>(out.data_ptr());
  dispatch_index(index, "index_select", [&](auto tag) {
    using I = decltype(tag);
    const I* idx = index.data<I>();
    check_bounds(idx, count, s.n, "index_select");
    const int64_t tasks = s.outer * count;
#pragma omp parallel for schedule(static) if (tasks * s.inner >= kParallelGrain)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t o = t / count, i = t % count;
      std::memcpy(op + static_cast<size_t>(t) * row_bytes,
                  sp + static_cast<size_t>(o * s.n + static_cast<int64_t>(idx[i])) * row_bytes, row_bytes);
    }
  });
}

void index_add(const Tensor& out, const Tensor& src, const Tensor& index, int64_t dim) {
  check_layout("index_add", {&out, &src, &index});
  INGOT_INTERNAL_CHECK(out.dtype() == src.dtype(), "index_add: dtypes differ");
  const IndexedView o = view_around(out, dim);
  const int64_t count = index.numel();
  const int64_t blocks = (o.inner + kColumnBlock - 1) / kColumnBlock;
  dispatch_index(index, "index_add", [&](auto itag) {
    using I = decltype(itag);
    const I* idx = index.data<I>();
    check_bounds(idx, count, o.n, "index_add");
    dispatch_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* dst = out.data<T>();
      const T* s = src.data<T>();
      const int64_t tasks = o.outer * blocks;
      // See Note [Race-free accumulation]: a task owns columns [c0, c1) of one outer slice.
#pragma omp parallel for schedule(static) if (o.outer * count * o.inner >= kParallelGrain)
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t oi = t / blocks, c0 = (t % blocks) * kColumnBlock;
        const int64_t w = std::min(kColumnBlock, o.inner - c0);
        for (int64_t i = 0; i < count; ++i)
          add_into(dst + (oi * o.n + static_cast<int64_t>(idx[i])) * o.inner + c0,
                   s + (oi * count + i) * o.inner + c0, w);
      }
    });
  });
}

// Vocabulary-parallel embeddings: rows [base, base + R) of a table, other ids give zeros / are skipped.
void embedding_rows(const Tensor& out, const Tensor& rows, const Tensor& index, int64_t base) {
  check_layout("embedding_rows", {&out, &rows, &index});
  INGOT_CHECK(rows.dim() == 2 && out.dim() == 2 && out.shape()[1] == rows.shape()[1] &&
                  out.shape()[0] == index.numel(),
              "embedding_rows: expected rows [R, D] and out [n, D] for n ids, got ", shape_str(rows.shape()), ", ",
              shape_str(out.shape()), " and ", index.numel(), " ids");
  const int64_t r = rows.shape()[0], d = rows.shape()[1], n = index.numel();
  dispatch_index(index, "embedding_rows", [&](auto itag) {
    using I = decltype(itag);
    const I* idx = index.data<I>();
    dispatch_dtype(rows.dtype(), [&](auto rtag) {
      using T = decltype(rtag);
      dispatch_dtype(out.dtype(), [&](auto otag) {
        using U = decltype(otag);
        const T* src = rows.data<T>();
        U* dst = out.data<U>();
#pragma omp parallel for schedule(static) if (n * d >= kParallelGrain)
        for (int64_t i = 0; i < n; ++i) {
          const int64_t j = static_cast<int64_t>(idx[i]) - base;
          U* o = dst + i * d;
          if (j < 0 || j >= r) {
            std::memset(static_cast<void*>(o), 0, static_cast<size_t>(d) * sizeof(U));
            continue;
          }
          const T* row = src + j * d;
          if constexpr (std::is_same_v<T, U>) std::memcpy(static_cast<void*>(o), row, static_cast<size_t>(d) * sizeof(U));
          else
            for (int64_t k = 0; k < d; ++k) store_one(o + k, load_one<double>(row + k));
        }
      });
    });
  });
}

void embedding_rows_add(const Tensor& out, const Tensor& src, const Tensor& index, int64_t base) {
  check_layout("embedding_rows_add", {&out, &src, &index});
  INGOT_CHECK(out.dim() == 2 && src.dim() == 2 && out.shape()[1] == src.shape()[1] && src.shape()[0] == index.numel(),
              "embedding_rows_add: expected out [R, D] and src [n, D] for n ids, got ", shape_str(out.shape()), ", ",
              shape_str(src.shape()), " and ", index.numel(), " ids");
  const int64_t r = out.shape()[0], d = out.shape()[1], n = index.numel();
  const int64_t blocks = (d + kColumnBlock - 1) / kColumnBlock;
  dispatch_index(index, "embedding_rows_add", [&](auto itag) {
    using I = decltype(itag);
    const I* idx = index.data<I>();
    dispatch_dtype(src.dtype(), [&](auto stag) {
      using T = decltype(stag);
      dispatch_dtype(out.dtype(), [&](auto otag) {
        using U = decltype(otag);
        using Acc = std::conditional_t<std::is_same_v<U, double>, double, float>;
        const T* s = src.data<T>();
        U* dst = out.data<U>();
        // Note [Race-free accumulation]: a task owns a block of columns and walks the ids in order.
#pragma omp parallel for schedule(static) if (n * d >= kParallelGrain)
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t c0 = b * kColumnBlock, w = std::min(kColumnBlock, d - c0);
          for (int64_t i = 0; i < n; ++i) {
            const int64_t j = static_cast<int64_t>(idx[i]) - base;
            if (j < 0 || j >= r) continue;
            U* o = dst + j * d + c0;
            const T* x = s + i * d + c0;
            for (int64_t k = 0; k < w; ++k) store_one(o + k, load_one<Acc>(o + k) + load_one<Acc>(x + k));
          }
        }
      });
    });
  });
}

void gather(const Tensor& out, const Tensor& src, const Tensor& index, int64_t dim) {
  check_layout("gather", {&out, &src, &index});
  const IndexedView s = view_around(src, dim);
  const IndexedView x = view_around(index, dim);  // out has index's shape
  dispatch_index(index, "gather", [&](auto itag) {
    using I = decltype(itag);
    const I* idx = index.data<I>();
    check_bounds(idx, index.numel(), s.n, "gather");
    dispatch_dtype(src.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* sp = src.data<T>();
      T* op = out.data<T>();
      const int64_t rows = x.outer * x.n;
#pragma omp parallel for schedule(static) if (index.numel() >= kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t oi = r / x.n;
        const I* ir = idx + r * x.inner;
        T* orow = op + r * x.inner;
        for (int64_t k = 0; k < x.inner; ++k) orow[k] = sp[(oi * s.n + static_cast<int64_t>(ir[k])) * s.inner + k];
      }
    });
  });
}

void scatter_add(const Tensor& out, const Tensor& src, const Tensor& index, int64_t dim) {
  check_layout("scatter_add", {&out, &src, &index});
  INGOT_INTERNAL_CHECK(out.dtype() == src.dtype(), "scatter_add: dtypes differ");
  const IndexedView o = view_around(out, dim);
  const IndexedView x = view_around(index, dim);  // src has index's shape
  const int64_t blocks = (x.inner + kColumnBlock - 1) / kColumnBlock;
  dispatch_index(index, "scatter_add", [&](auto itag) {
    using I = decltype(itag);
    const I* idx = index.data<I>();
    check_bounds(idx, index.numel(), o.n, "scatter_add");
    dispatch_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* dst = out.data<T>();
      const T* s = src.data<T>();
      const int64_t tasks = x.outer * blocks;
      // See Note [Race-free accumulation]: a task owns columns [c0, c1) of one outer slice.
#pragma omp parallel for schedule(static) if (index.numel() >= kParallelGrain)
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t oi = t / blocks, c0 = (t % blocks) * kColumnBlock;
        const int64_t c1 = std::min(c0 + kColumnBlock, x.inner);
        for (int64_t j = 0; j < x.n; ++j) {
          const int64_t row = (oi * x.n + j) * x.inner;
          for (int64_t k = c0; k < c1; ++k)
            add_into(dst + (oi * o.n + static_cast<int64_t>(idx[row + k])) * o.inner + k, s + row + k, 1);
        }
      }
    });
  });
}

}  // namespace ingot::kernels::cpu
