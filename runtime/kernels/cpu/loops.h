// Shared machinery of the CPU kernels: dtype dispatch, typed loads/stores into a float/double scratch
// buffer, and an elementwise driver that walks any strided operands in chunks.
//
// Approach: an elementwise op over operands of mixed dtypes and strides is split into chunks of at most
// kChunk elements along the (collapsed) innermost dim. Each chunk is loaded into contiguous Acc buffers with
// one typed loop per operand, the op runs as a tight loop over those buffers (vectorizable), and the result is
// stored with one typed loop. Rows are spread over OpenMP threads.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/tensor.h"

namespace ingot::kernels::cpu {

constexpr int64_t kChunk = 512;
// Below this many elements a kernel runs single-threaded (thread start-up costs more than the work).
constexpr int64_t kParallelGrain = 1 << 15;

// Calls f(T{}) with T the storage type of `t`: float, double, bf16_t, f16_t, int32_t, int64_t, bool.
template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(bf16_t{});
    case DType::f16: return f(f16_t{});
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    case DType::b8: return f(bool{});
  }
  return f(float{});
}

template <typename Acc, typename T>
inline Acc load_one(const T* p) {
  if constexpr (std::is_same_v<T, bf16_t>) return static_cast<Acc>(bf16_to_float(p->bits));
  else if constexpr (std::is_same_v<T, f16_t>) return static_cast<Acc>(f16_to_float(p->bits));
  else if constexpr (std::is_same_v<T, bool>) return *reinterpret_cast<const uint8_t*>(p) ? Acc(1) : Acc(0);
  else return static_cast<Acc>(*p);
}

template <typename T, typename Acc>
inline void store_one(T* p, Acc v) {
  if constexpr (std::is_same_v<T, bf16_t>) p->bits = float_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, f16_t>) p->bits = float_to_f16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) *reinterpret_cast<uint8_t*>(p) = v != Acc(0);
  else return void(*p = static_cast<T>(v));
}

// Loads n elements starting at `base` (already offset) with element stride `stride` into dst.
template <typename Acc>
void load_strided(DType dt, const void* base, int64_t stride, int64_t n, Acc* dst) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(base);
    if (stride == 1) {
      for (int64_t i = 0; i < n; ++i) dst[i] = load_one<Acc>(p + i);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = load_one<Acc>(p + i * stride);
    }
  });
}

template <typename Acc>
void store_strided(DType dt, void* base, int64_t stride, int64_t n, const Acc* src) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(base);
    if (stride == 1) {
      for (int64_t i = 0; i < n; ++i) store_one(p + i, src[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) store_one(p + i * stride, src[i]);
    }
  });
}

// A contiguous tensor's elements as Acc values (copying unless the type already matches).
template <typename Acc>
std::vector<Acc> load_all(const Tensor& t) {
  std::vector<Acc> v(static_cast<size_t>(t.numel()));
  load_strided<Acc>(t.dtype(), t.data_ptr(), 1, t.numel(), v.data());
  return v;
}

// Whether an op over these dtypes must compute in double (f64 or 64-bit integers anywhere).
inline bool needs_double(std::initializer_list<DType> ts) {
  for (DType t : ts)
    if (t == DType::f64 || t == DType::i64 || t == DType::i32) return true;
  return false;
}

// Collapsed iteration space shared by all operands (out first). Operands have out's shape.
struct StridedSpace {
  std::vector<int64_t> shape;                 // collapsed
  std::vector<std::vector<int64_t>> strides;  // per operand, collapsed
};
StridedSpace collapse(const std::vector<const Tensor*>& ops);

// Runs fn(Acc* out, const Acc* const* in, int64_t n) over every element of `out` in chunks, where in[k] holds
// the chunk of ins[k]. ins must have out's shape (broadcast views allowed).
template <typename Acc, size_t N, typename Fn>
void elementwise(const Tensor& out, const std::array<const Tensor*, N>& ins, Fn fn) {
  std::vector<const Tensor*> ops{&out};
  for (const Tensor* t : ins) ops.push_back(t);
  StridedSpace sp = collapse(ops);
  const int64_t inner = sp.shape.empty() ? 1 : sp.shape.back();
  const int64_t rows = inner == 0 ? 0 : out.numel() / std::max<int64_t>(inner, 1);
  const int64_t nd = static_cast<int64_t>(sp.shape.size());
  const int64_t chunks_per_row = (inner + kChunk - 1) / kChunk;
  const int64_t total = rows * chunks_per_row;
  const size_t esz_out = itemsize(out.dtype());
  char* out_base = static_cast<char*>(out.data_ptr());
  std::array<const char*, N> in_base{};
  std::array<size_t, N> in_esz{};
  for (size_t k = 0; k < N; ++k) {
    in_base[k] = static_cast<const char*>(ins[k]->data_ptr());
    in_esz[k] = itemsize(ins[k]->dtype());
  }
#pragma omp parallel if (out.numel() >= kParallelGrain)
  {
    alignas(64) Acc obuf[kChunk];
    alignas(64) Acc ibuf[N == 0 ? 1 : N][kChunk];
    const Acc* iptr[N == 0 ? 1 : N];
    for (size_t k = 0; k < N; ++k) iptr[k] = ibuf[k];
#pragma omp for schedule(static)
    for (int64_t c = 0; c < total; ++c) {
      int64_t row = c / chunks_per_row, start = (c % chunks_per_row) * kChunk;
      int64_t n = std::min(kChunk, inner - start);
      // Offsets (in elements) of this row for every operand.
      std::array<int64_t, N + 1> off{};
      int64_t rem = row;
      for (int64_t d = nd - 2; d >= 0; --d) {
        int64_t idx = rem % sp.shape[static_cast<size_t>(d)];
        rem /= sp.shape[static_cast<size_t>(d)];
        for (size_t k = 0; k <= N; ++k) off[k] += idx * sp.strides[k][static_cast<size_t>(d)];
      }
      int64_t last = nd - 1;
      for (size_t k = 0; k < N; ++k) {
        int64_t st = nd ? sp.strides[k + 1][static_cast<size_t>(last)] : 0;
        load_strided<Acc>(ins[k]->dtype(), in_base[k] + (off[k + 1] + start * st) * static_cast<int64_t>(in_esz[k]),
                          st, n, ibuf[k]);
      }
      fn(obuf, iptr, n);
      int64_t so = nd ? sp.strides[0][static_cast<size_t>(last)] : 0;
      store_strided<Acc>(out.dtype(), out_base + (off[0] + start * so) * static_cast<int64_t>(esz_out), so, n, obuf);
    }
  }
}

// Number of rows and the row length of a contiguous tensor treated as [rows, last_dim].
inline std::pair<int64_t, int64_t> rows_cols(const Tensor& t) {
  int64_t cols = t.dim() == 0 ? 1 : t.shape().back();
  return {cols == 0 ? 0 : t.numel() / cols, cols};
}

}  // namespace ingot::kernels::cpu
