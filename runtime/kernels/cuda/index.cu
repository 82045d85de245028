// CUDA indexing kernels: index_select, index_add, gather, scatter_add, embedding_rows(_add). src and out contiguous, index contiguous
// i64 or i32; any element dtype for the copies (index_select, gather), any dtype but b8 for the accumulations.
//
// Shapes: index_select / index_add view src and out as [outer, size_along_dim, inner] with a 1-D index;
// gather / scatter_add take an index of out's shape (gather) or src's shape (scatter_add), and the other
// tensor may be larger in every dim (as in PyTorch), so those decompose the flat position into coordinates.
//
// Approach: one thread per element of the iterated tensor, grid-stride. The copies move raw bits (1, 2, 4 or 8
// bytes), so no dtype is converted. The accumulations use atomicAdd in the element type: float and double
// natively; bf16 and f16 through the sm_80 / sm_70 hardware atomics, so each addition rounds to bf16 / f16
// (duplicates accumulate in the storage type; their order, and hence the rounding, is not deterministic);
// i32 and i64 exactly (i64 as two's complement through the unsigned 64-bit atomic).
//
// Indices must lie in [0, size), as for the CPU kernels (which throw otherwise). The device cannot report a bad
// index without a synchronization, so one touches no memory: index_select and gather write zero bits there,
// index_add and scatter_add skip the element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/kernels/cuda/row_common.cuh"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cuda {
namespace {

using namespace rowwise;

constexpr int kMaxDims = 8;
constexpr int kThreads = 256;

// Sizes of the iterated tensor and strides (in elements) of the other one, for gather / scatter_add.
struct Geometry {
  int64_t size[kMaxDims];
  int64_t other_stride[kMaxDims];
  int64_t other_dim_size;  // the other tensor's size along dim: the range an index must fall in
  int ndim;
  int dim;
};

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(__nv_bfloat16* p, __nv_bfloat16 v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(__half* p, __half v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(int32_t* p, int32_t v) { atomicAdd(reinterpret_cast<int*>(p), v); }
__device__ __forceinline__ void atomic_add(int64_t* p, int64_t v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

// kernels -----------------------------------------------------------------------------------------------------

// out[o, i, k] = src[o, index[i], k]; out is [outer, n, inner], src [outer, src_dim, inner].
template <typename E, typename I>
__global__ void index_select_kernel(E* out, const E* src, const I* index, int64_t n, int64_t inner,
                                    int64_t src_dim, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % inner, i = (e / inner) % n, o = e / (inner * n);
    const int64_t j = static_cast<int64_t>(index[i]);
    out[e] = (j >= 0 && j < src_dim) ? src[(o * src_dim + j) * inner + k] : E{};
  }
}

// out[o, index[i], k] += src[o, i, k]; src is [outer, n, inner], out [outer, out_dim, inner].
template <typename E, typename I>
__global__ void index_add_kernel(E* out, const E* src, const I* index, int64_t n, int64_t inner, int64_t out_dim,
                                 int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % inner, i = (e / inner) % n, o = e / (inner * n);
    const int64_t j = static_cast<int64_t>(index[i]);
    if (j >= 0 && j < out_dim) atomic_add(out + (o * out_dim + j) * inner + k, src[e]);
  }
}

// Vocabulary-parallel embeddings: out[i, k] = rows[index[i] - base, k] (converted) for ids in [base, base + r),
// zeros elsewhere; one thread per output element.
template <typename U, typename T, typename I>
__global__ void embedding_rows_kernel(U* out, const T* rows, const I* index, int64_t base, int64_t r, int64_t d,
                                      int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / d, k = e - i * d;
    const int64_t j = static_cast<int64_t>(index[i]) - base;
    out[e] = (j >= 0 && j < r) ? from_acc<U>(to_acc<acc_t<U>>(rows[j * d + k])) : from_acc<U>(acc_t<U>(0));
  }
}

// out[index[i] - base, k] += src[i, k] (converted to out's dtype) for ids in [base, base + r).
template <typename U, typename T, typename I>
__global__ void embedding_rows_add_kernel(U* out, const T* src, const I* index, int64_t base, int64_t r, int64_t d,
                                          int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / d, k = e - i * d;
    const int64_t j = static_cast<int64_t>(index[i]) - base;
    if (j >= 0 && j < r) atomic_add(out + j * d + k, from_acc<U>(to_acc<acc_t<U>>(src[e])));
  }
}

// The offset in the other tensor of the iterated tensor's flat position e, with the coordinate along g.dim
// replaced by `index[e]`; -1 when that index is out of range.
template <typename I>
__device__ __forceinline__ int64_t other_offset(const Geometry& g, const I* index, int64_t e) {
  int64_t off = 0, rem = e;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t c = rem % g.size[d];
    rem /= g.size[d];
    if (d != g.dim) off += c * g.other_stride[d];
  }
  const int64_t j = static_cast<int64_t>(index[e]);
  if (j < 0 || j >= g.other_dim_size) return -1;
  return off + j * g.other_stride[g.dim];
}

template <typename E, typename I>
__global__ void gather_kernel(E* out, const E* src, const I* index, Geometry g, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t off = other_offset(g, index, e);
    out[e] = off >= 0 ? src[off] : E{};
  }
}

template <typename E, typename I>
__global__ void scatter_add_kernel(E* out, const E* src, const I* index, Geometry g, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t off = other_offset(g, index, e);
    if (off >= 0) atomic_add(out + off, src[e]);
  }
}

// launchers ---------------------------------------------------------------------------------------------------

template <typename F>
void dispatch_index(const Tensor& index, const char* op, F&& f) {
  if (index.dtype() == DType::i64) return f(int64_t{});
  if (index.dtype() == DType::i32) return f(int32_t{});
  INGOT_FAIL(op, ": expected index i64 or i32, got ", dtype_name(index.dtype()));
}

// Calls f(E{}) with E an unsigned integer as wide as one element: copies move bits.
template <typename F>
void dispatch_bits(DType t, F&& f) {
  switch (itemsize(t)) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    default: return f(uint64_t{});
  }
}

// Calls f(E{}) with E the element type the accumulating kernels add in.
template <typename F>
void dispatch_add(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    case DType::b8: INGOT_FAIL(op, ": b8 tensors cannot be accumulated");
    default: return dispatch_float(t, op, std::forward<F>(f));
  }
}

void check_operands(const char* op, const Tensor& out, const Tensor& src, const Tensor& index) {
  check_cuda_contig(out, op, "out");
  check_cuda_contig(src, op, "src");
  check_cuda_contig(index, op, "index");
  INGOT_CHECK(out.dtype() == src.dtype(), op, ": expected out and src of one dtype, got ", dtype_name(out.dtype()),
              " and ", dtype_name(src.dtype()));
}

// Elements of a contiguous tensor after dim: the stride of dim.
int64_t inner_size(const Tensor& t, int64_t dim) {
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < t.dim(); ++d) inner *= t.size(d);
  return inner;
}

// Checks the [outer, *, inner] agreement of index_select / index_add, the CPU kernels' contract: `big` is
// [outer, n, inner] around dim and `small` holds outer * index.numel() * inner elements in that order (an
// embedding passes an index of any shape with small = index.shape + big.shape[1:]).
int64_t check_select(const char* op, const Tensor& big, const Tensor& small, const Tensor& index, int64_t dim) {
  dim = wrap_dim(dim, std::max<int64_t>(big.dim(), 1), op);
  int64_t outer = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= big.size(d);
  INGOT_CHECK(small.numel() == outer * index.numel() * inner_size(big, dim), op, ": shapes ", shape_str(big.shape()),
              " and ", shape_str(small.shape()), " disagree for ", index.numel(), " indices along dim ", dim);
  return dim;
}

// Geometry of an iterated tensor `it` (index has its shape) against `other` along dim.
Geometry make_geometry(const char* op, const Tensor& it, const Tensor& other, const Tensor& index, int64_t dim) {
  INGOT_CHECK(it.dim() == other.dim(), op, ": expected operands of one rank, got ", shape_str(it.shape()), " and ",
              shape_str(other.shape()));
  INGOT_CHECK(index.shape() == it.shape(), op, ": expected index of shape ", shape_str(it.shape()), ", got ",
              shape_str(index.shape()));
  INGOT_CHECK(it.dim() <= kMaxDims, op, ": at most ", kMaxDims, " dims are supported, got ", it.dim());
  Geometry g{};
  g.ndim = static_cast<int>(it.dim());
  g.dim = static_cast<int>(dim);
  for (int d = 0; d < g.ndim; ++d) {
    INGOT_CHECK(d == dim || it.size(d) <= other.size(d), op, ": index ", shape_str(it.shape()),
                " is larger than ", shape_str(other.shape()), " in dim ", d);
    g.size[d] = it.size(d);
    g.other_stride[d] = other.stride(d);
  }
  g.other_dim_size = other.dim() == 0 ? 1 : other.size(dim);
  return g;
}

}  // namespace

void index_select(const Tensor& out, const Tensor& src, const Tensor& index, int64_t dim) {
  const char* op = "index_select";
  check_operands(op, out, src, index);
  dim = check_select(op, src, out, index, dim);
  const int64_t total = out.numel();
  if (total == 0) return;
  const int64_t inner = inner_size(src, dim);
  LaunchContext L(out);
  dispatch_bits(out.dtype(), [&](auto etag) {
    using E = decltype(etag);
    dispatch_index(index, op, [&](auto itag) {
      using I = decltype(itag);
      index_select_kernel<E, I><<<grid_for(total, kThreads, L.device), kThreads, 0, L.stream>>>(
          out.data<E>(), src.data<E>(), index.data<I>(), index.numel(), inner, src.dim() ? src.size(dim) : 1, total);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void index_add(const Tensor& out, const Tensor& src, const Tensor& index, int64_t dim) {
  const char* op = "index_add";
  check_operands(op, out, src, index);
  dim = check_select(op, out, src, index, dim);
  const int64_t total = src.numel();
  if (total == 0) return;
  const int64_t inner = inner_size(out, dim);
  LaunchContext L(out);
  dispatch_add(out.dtype(), op, [&](auto etag) {
    using E = decltype(etag);
    dispatch_index(index, op, [&](auto itag) {
      using I = decltype(itag);
      index_add_kernel<E, I><<<grid_for(total, kThreads, L.device), kThreads, 0, L.stream>>>(
          out.data<E>(), src.data<E>(), index.data<I>(), index.numel(), inner, out.dim() ? out.size(dim) : 1, total);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void embedding_rows(const Tensor& out, const Tensor& rows, const Tensor& index, int64_t base) {
  const char* op = "embedding_rows";
  check_cuda_contig(out, op, "out");
  check_cuda_contig(rows, op, "rows");
  check_cuda_contig(index, op, "index");
  INGOT_CHECK(rows.dim() == 2 && out.dim() == 2 && out.size(1) == rows.size(1) && out.size(0) == index.numel(), op,
              ": expected rows [R, D] and out [n, D] for n ids, got ", shape_str(rows.shape()), ", ",
              shape_str(out.shape()), " and ", index.numel(), " ids");
  const int64_t total = out.numel();
  if (total == 0) return;
  LaunchContext L(out);
  dispatch_float(out.dtype(), op, [&](auto otag) {
    using U = decltype(otag);
    dispatch_float(rows.dtype(), op, [&](auto rtag) {
      using T = decltype(rtag);
      dispatch_index(index, op, [&](auto itag) {
        using I = decltype(itag);
        embedding_rows_kernel<U, T, I><<<grid_for(total, kThreads, L.device), kThreads, 0, L.stream>>>(
            out.data<U>(), rows.data<T>(), index.data<I>(), base, rows.size(0), rows.size(1), total);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void embedding_rows_add(const Tensor& out, const Tensor& src, const Tensor& index, int64_t base) {
  const char* op = "embedding_rows_add";
  check_cuda_contig(out, op, "out");
  check_cuda_contig(src, op, "src");
  check_cuda_contig(index, op, "index");
  INGOT_CHECK(out.dim() == 2 && src.dim() == 2 && out.size(1) == src.size(1) && src.size(0) == index.numel(), op,
              ": expected out [R, D] and src [n, D] for n ids, got ", shape_str(out.shape()), ", ",
              shape_str(src.shape()), " and ", index.numel(), " ids");
  const int64_t total = src.numel();
  if (total == 0) return;
  LaunchContext L(out);
  dispatch_float(out.dtype(), op, [&](auto otag) {
    using U = decltype(otag);
    dispatch_float(src.dtype(), op, [&](auto stag) {
      using T = decltype(stag);
      dispatch_index(index, op, [&](auto itag) {
        using I = decltype(itag);
        embedding_rows_add_kernel<U, T, I><<<grid_for(total, kThreads, L.device), kThreads, 0, L.stream>>>(
            out.data<U>(), src.data<T>(), index.data<I>(), base, out.size(0), out.size(1), total);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void gather(const Tensor& out, const Tensor& src, const Tensor& index, int64_t dim) {
  const char* op = "gather";
  check_operands(op, out, src, index);
  dim = wrap_dim(dim, std::max<int64_t>(src.dim(), 1), op);
  Geometry g = make_geometry(op, out, src, index, dim);
  const int64_t total = out.numel();
  if (total == 0) return;
  LaunchContext L(out);
  dispatch_bits(out.dtype(), [&](auto etag) {
    using E = decltype(etag);
    dispatch_index(index, op, [&](auto itag) {
      using I = decltype(itag);
      gather_kernel<E, I><<<grid_for(total, kThreads, L.device), kThreads, 0, L.stream>>>(out.data<E>(), src.data<E>(),
                                                                      index.data<I>(), g, total);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void scatter_add(const Tensor& out, const Tensor& src, const Tensor& index, int64_t dim) {
  const char* op = "scatter_add";
  check_operands(op, out, src, index);
  dim = wrap_dim(dim, std::max<int64_t>(out.dim(), 1), op);
  Geometry g = make_geometry(op, src, out, index, dim);
  const int64_t total = src.numel();
  if (total == 0) return;
  LaunchContext L(out);
  dispatch_add(out.dtype(), op, [&](auto etag) {
    using E = decltype(etag);
    dispatch_index(index, op, [&](auto itag) {
      using I = decltype(itag);
      scatter_add_kernel<E, I><<<grid_for(total, kThreads, L.device), kThreads, 0, L.stream>>>(out.data<E>(), src.data<E>(),
                                                                           index.data<I>(), g, total);
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace ingot::kernels::cuda
