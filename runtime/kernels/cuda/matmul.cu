// CUDA matrix product: out[i] = alpha * op(a[i]) @ op(b[i]) + beta * out[i], through cuBLASLt (f32, bf16, f16)
// and cublasDgemmStridedBatched (f64, which cuBLASLt does not cover for every shape).
//
// Shapes (all contiguous, row-major): a [batch_a, M, K] ([batch_a, K, M] when trans_a), b [batch_b, K, N]
// ([batch_b, N, K] when trans_b), out [batch, M, N]; batch_a, batch_b are `batch` or 1 (batch stride 0).
//
// cuBLAS is column-major, and a row-major [R, C] buffer is a column-major [C, R] matrix. So out, read
// column-major, is out^T (N x M) = op(b)^T @ op(a)^T: cuBLAS's "A" is b's buffer and its "B" is a's, each
// keeping its own transpose flag; no data moves.
//
// Numerics: accumulation in f32 for f32/bf16/f16 (CUBLAS_COMPUTE_32F: no TF32, so f32 matches the CPU's sgemm
// to f32 rounding), f64 for f64. One cuBLASLt handle per device and one 32 MiB workspace per (device, stream);
// the first heuristic result is used, except under a MatmulTuner (max-autotune, matmul_tuning.h), which times
// the top heuristics per signature once and keeps the fastest. Where cuBLASLt offers no algorithm (odd pointer
// alignment of a view, say) the product falls back to cublasGemmStridedBatchedEx with the same compute type.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kernels/cuda/common.cuh"
#include "runtime/kernels/cuda/gemm_sm90.h"
#include "runtime/kernels/cuda/matmul_tuning.h"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kTimedRuns = 5;  // per candidate algorithm, after one warm-up; the median counts

thread_local MatmulTuner* t_tuner = nullptr;

struct DeviceBlas {
  int device = 0;
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  std::map<cudaStream_t, void*> workspaces;
  std::mutex mu;  // guards workspaces and the stream bound to `blas`
};

// Created on first use, never destroyed (matmuls may run during static destruction).
DeviceBlas& device_blas(int device) {
  static std::mutex mu;
  static std::map<int, DeviceBlas*> all;
  std::lock_guard<std::mutex> g(mu);
  DeviceBlas*& d = all[device];
  if (!d) {
    auto* fresh = new DeviceBlas;
    fresh->device = device;
    CUBLAS_CHECK(cublasLtCreate(&fresh->lt));
    CUBLAS_CHECK(cublasCreate(&fresh->blas));
    d = fresh;
  }
  return *d;
}

void* workspace(DeviceBlas& d, cudaStream_t s) {
  void*& w = d.workspaces[s];
  if (!w) CUDA_CHECK(cudaMalloc(&w, kWorkspaceBytes));  // outside the caching allocator: held for the process
  return w;
}

struct Gemm {
  int64_t batch, step_a, step_b, m, n, k;
  bool trans_a, trans_b;
  bool widened = false;  // c is f32 for bf16 / f16 operands (a weight gradient kept in f32)
  // Column-major view (see the header comment): C(n x m) = op(b) @ op(a).
  int64_t lda() const { return trans_b ? k : n; }  // of b
  int64_t ldb() const { return trans_a ? m : k; }  // of a
  DType out_dtype(DType operands) const { return widened ? DType::f32 : operands; }
};

uint32_t alignment(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a) a /= 2;
  return a;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: break;
  }
  INGOT_FAIL("matmul: unsupported dtype ", dtype_name(t), " on CUDA");
}

// RAII for the cuBLASLt descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void set_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t step) {
  const int32_t count = static_cast<int32_t>(batch);
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &step, sizeof(step)));
}

std::string algo_hex(const cublasLtMatmulAlgo_t& algo) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint64_t word : algo.data)
    for (int shift = 60; shift >= 0; shift -= 4) out += digits[(word >> shift) & 0xf];
  return out;
}

bool algo_from_hex(const std::string& hex, cublasLtMatmulAlgo_t& algo) {
  constexpr size_t kWords = sizeof(algo.data) / sizeof(algo.data[0]);
  if (hex.size() != kWords * 16) return false;
  for (size_t w = 0; w < kWords; ++w) {
    uint64_t v = 0;
    for (size_t i = 0; i < 16; ++i) {
      const char ch = hex[w * 16 + i];
      const int digit = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
      if (digit < 0) return false;
      v = v << 4 | static_cast<uint64_t>(digit);
    }
    algo.data[w] = v;
  }
  return true;
}

// RAII for a pair of timing events.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(stop);
    cudaEventDestroy(start);
  }
};

// Max-autotune's choice for one call (see matmul_tuning.h), or nullopt for the first heuristic. The
// candidates run on a scratch copy of c, so the caller's product is computed once, by the winner.
std::optional<cublasLtMatmulAlgo_t> tuned_algo(MatmulTuner& tuner, const std::string& sig, DeviceBlas& d, LtDescs& x,
                                               cudaStream_t stream, void* w, const Gemm& g, DType dt, float alpha,
                                               float beta, const void* a, const void* b, const void* c) {
  if (std::optional<std::string> known = tuner.find(sig)) {
    cublasLtMatmulAlgo_t algo{};
    cublasLtMatmulHeuristicResult_t check{};
    if (known->empty() || !algo_from_hex(*known, algo) ||
        cublasLtMatmulAlgoCheck(d.lt, x.op, x.a, x.b, x.c, x.c, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > kWorkspaceBytes)
      return std::nullopt;
    return algo;
  }
  // Never time inside a CUDA graph capture (reduce-overhead): synchronizing would invalidate it.
  if (ingot::cuda::is_capturing(ingot::cuda::Stream{stream})) return std::nullopt;
  if (!tuner.may_time()) {
    tuner.chose(sig, "", 0, 0, 0);
    return std::nullopt;
  }
  const auto t0 = std::chrono::steady_clock::now();
  cublasLtMatmulHeuristicResult_t results[kTopAlgos] = {};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(d.lt, x.op, x.a, x.b, x.c, x.c, x.pref, kTopAlgos, results, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    tuner.chose(sig, "", 0, 0, 0);
    return std::nullopt;
  }
  const size_t c_bytes = static_cast<size_t>(g.batch * g.m * g.n) * itemsize(g.out_dtype(dt));
  void* scratch = nullptr;
  if (cudaMallocAsync(&scratch, c_bytes, stream) != cudaSuccess) {  // out of memory: not worth failing the step
    cudaGetLastError();
    tuner.chose(sig, "", 0, 0, 0);
    return std::nullopt;
  }
  if (beta != 0.0f) CUDA_CHECK(cudaMemcpyAsync(scratch, c, c_bytes, cudaMemcpyDeviceToDevice, stream));
  EventPair ev;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(d.lt, x.op, &alpha, b, x.a, a, x.b, &beta, scratch, x.c, scratch, x.c, &algo, w,
                          kWorkspaceBytes, stream);
  };
  int best = -1, timed = 0;
  float best_ms = 0;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > kWorkspaceBytes) continue;
    if (run(results[i].algo) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; an algorithm that fails is skipped
    std::vector<float> ms;
    for (int r = 0; r < kTimedRuns; ++r) {
      CUDA_CHECK(cudaEventRecord(ev.start, stream));
      const cublasStatus_t rs = run(results[i].algo);
      CUDA_CHECK(cudaEventRecord(ev.stop, stream));
      CUDA_CHECK(cudaEventSynchronize(ev.stop));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, ev.start, ev.stop));
      if (rs == CUBLAS_STATUS_SUCCESS) ms.push_back(t);
    }
    if (ms.empty()) continue;
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    const float median = ms[ms.size() / 2];
    ++timed;
    if (best < 0 || median < best_ms) {
      best = i;
      best_ms = median;
    }
  }
  CUDA_CHECK(cudaFreeAsync(scratch, stream));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (best < 0) {
    tuner.chose(sig, "", 0, seconds, timed);
    return std::nullopt;
  }
  tuner.chose(sig, algo_hex(results[best].algo), best_ms, seconds, timed);
  return results[best].algo;
}

// A fused epilogue (cuBLAS's column-major view: one bias value per row of C, i.e. per column of out): BIAS reads
// `bias` (n values); GELU_AUX_BIAS adds it, writes the sum to aux and its GELU to c; DGELU multiplies by
// GELU'(aux), aux being the forward's pre-activation laid out like c (leading dimension aux_ld).
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
};

// Note [SM carve-out] (runtime/sm_budget.h): with a carve-out, cuBLASLt's heuristic picks, and its kernel runs
// on, the SMs left beside communication kernels; without one the attribute stays unset (the device's count).
void set_sm_target(cublasLtMatmulDesc_t op, int32_t target) {
  if (target > 0)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof(target)));
}

// Returns false when cuBLASLt has no algorithm for this problem.
bool lt_matmul(DeviceBlas& d, cudaStream_t stream, const Gemm& g, DType dt, float alpha, float beta, const void* a,
               const void* b, void* c, const Epilogue& e = {}) {
  const cudaDataType_t t = cuda_type(dt);
  LtDescs x;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int total_sms = sm_count(d.device);
  set_sm_target(x.op, sm_count_target(total_sms));
  if (e.kind != CUBLASLT_EPILOGUE_DEFAULT) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e.kind, sizeof(e.kind)));
    if (e.bias)
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof(e.bias)));
    if (e.aux) {
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof(e.aux)));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &e.aux_ld, sizeof(e.aux_ld)));
    }
  }
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)));
  // Stored shapes (rows x cols, column-major) before the transposes.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.a, t, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.lda()));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.b, t, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.ldb()));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x.c, cuda_type(g.out_dtype(dt)), g.n, g.m, g.n));
  if (g.batch > 1) {
    set_batch(x.a, g.batch, g.step_b);
    set_batch(x.b, g.batch, g.step_a);
    set_batch(x.c, g.batch, g.m * g.n);
  }
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&x.pref));
  const uint64_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al_a = alignment(b), al_b = alignment(a), al_c = alignment(c);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  void* w = nullptr;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    w = workspace(d, stream);
  }
  std::optional<cublasLtMatmulAlgo_t> tuned;
  if (t_tuner) {
    const std::string sig = detail::str_cat(dtype_name(dt), " m=", g.m, " n=", g.n, " k=", g.k, " batch=", g.batch,
                                            " bcast=", g.step_a == 0, g.step_b == 0, " t=", g.trans_a, g.trans_b,
                                            " beta0=", beta == 0.0f, " align=", al_a, ",", al_b, ",", al_c,
                                            " epilogue=", static_cast<int>(e.kind),
                                            g.widened ? " out=f32" : "", sm_budget_key(total_sms));
    tuned = tuned_algo(*t_tuner, sig, d, x, stream, w, g, dt, alpha, beta, a, b, c);
  }
  cublasLtMatmulHeuristicResult_t result{};
  if (!tuned) {
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(d.lt, x.op, x.a, x.b, x.c, x.c, x.pref, 1, &result, &found);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) return false;
    CUBLAS_CHECK(st);
  }
  CUBLAS_CHECK(cublasLtMatmul(d.lt, x.op, &alpha, b, x.a, a, x.b, &beta, c, x.c, c, x.c,
                              tuned ? &*tuned : &result.algo, w, kWorkspaceBytes, stream));
  return true;
}

void blas_matmul(DeviceBlas& d, cudaStream_t stream, const Gemm& g, DType dt, double alpha, double beta,
                 const void* a, const void* b, void* c) {
  std::lock_guard<std::mutex> lk(d.mu);
  CUBLAS_CHECK(cublasSetStream(d.blas, stream));
  CUBLAS_CHECK(cublasSetSmCountTarget(d.blas, sm_count_target(sm_count(d.device))));  // Note [SM carve-out]
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int n = static_cast<int>(g.n), m = static_cast<int>(g.m), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.lda()), ldb = static_cast<int>(g.ldb());
  if (dt == DType::f64) {
    CUBLAS_CHECK(cublasDgemmStridedBatched(d.blas, op_b, op_a, n, m, k, &alpha, static_cast<const double*>(b), lda,
                                           g.step_b, static_cast<const double*>(a), ldb, g.step_a, &beta,
                                           static_cast<double*>(c), n, g.m * g.n, static_cast<int>(g.batch)));
    return;
  }
  const float fa = static_cast<float>(alpha), fb = static_cast<float>(beta);
  const cudaDataType_t t = cuda_type(dt);
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(d.blas, op_b, op_a, n, m, k, &fa, b, t, lda, g.step_b, a, t, ldb, g.step_a,
                                          &fb, c, cuda_type(g.out_dtype(dt)), n, g.m * g.n, static_cast<int>(g.batch), CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
            double beta) {
  check_same_device("matmul", {&out, &a, &b});
  INGOT_INTERNAL_CHECK(out.dim() == 3 && a.dim() == 3 && b.dim() == 3, "matmul kernel: expected 3-D operands, got ",
                       shape_str(a.shape()), " @ ", shape_str(b.shape()), " -> ", shape_str(out.shape()));
  const bool widened = out.dtype() == DType::f32 && (a.dtype() == DType::bf16 || a.dtype() == DType::f16);
  INGOT_INTERNAL_CHECK((a.dtype() == out.dtype() || widened) && b.dtype() == a.dtype() && is_floating(out.dtype()),
                       "matmul kernel: dtypes ", dtype_name(a.dtype()), ", ", dtype_name(b.dtype()), " -> ",
                       dtype_name(out.dtype()));
  INGOT_INTERNAL_CHECK(out.is_contiguous() && a.is_contiguous() && b.is_contiguous(),
                       "matmul kernel: operands must be contiguous");
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = trans_a ? a.size(1) : a.size(2);
  INGOT_INTERNAL_CHECK((trans_a ? a.size(2) : a.size(1)) == m && (trans_b ? b.size(2) : b.size(1)) == k &&
                           (trans_b ? b.size(1) : b.size(2)) == n && (a.size(0) == batch || a.size(0) == 1) &&
                           (b.size(0) == batch || b.size(0) == 1),
                       "matmul kernel: shapes ", shape_str(a.shape()), (trans_a ? "^T" : ""), " @ ",
                       shape_str(b.shape()), (trans_b ? "^T" : ""), " -> ", shape_str(out.shape()));
  INGOT_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && batch <= INT32_MAX, "matmul: dims M=", m,
              ", N=", n, ", K=", k, ", batch=", batch, " exceed cuBLAS's limit of ", INT32_MAX);
  if (out.numel() == 0) return;
  if (k == 0) {  // an empty sum: cuBLAS rejects the zero leading dimension
    if (beta == 0.0) fill(out, 0.0);
    else unary(UnaryOp::MulScalar, out, out, beta);
    return;
  }
  Gemm g{batch, a.size(0) == 1 ? 0 : m * k, b.size(0) == 1 ? 0 : k * n, m, n, k, trans_a, trans_b};
  g.widened = widened;
  LaunchContext ctx(out);
  DeviceBlas& d = device_blas(ctx.device);
  if (a.dtype() != DType::f64 &&
      lt_matmul(d, ctx.stream, g, a.dtype(), static_cast<float>(alpha), static_cast<float>(beta), a.data_ptr(),
                b.data_ptr(), out.data_ptr()))
    return;
  blas_matmul(d, ctx.stream, g, a.dtype(), alpha, beta, a.data_ptr(), b.data_ptr(), out.data_ptr());
}

namespace {

// Runs out = op(a) @ op(b) with epilogue `e` when the product is one dense 2-D cuBLASLt problem with an
// algorithm for it; false means the caller computes it the unfused way.
bool epilogue_matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                     const Epilogue& e) {
  const int64_t m = out.size(1), n = out.size(2), k = trans_a ? a.size(1) : a.size(2);
  if (out.dtype() == DType::f64 || out.size(0) != 1 || a.size(0) != 1 || b.size(0) != 1 || m == 0 || n == 0 ||
      k == 0 || !out.is_contiguous() || !a.is_contiguous() || !b.is_contiguous() || m > INT32_MAX || n > INT32_MAX ||
      k > INT32_MAX)
    return false;
  const Gemm g{1, 0, 0, m, n, k, trans_a, trans_b};
  LaunchContext ctx(out);
  return lt_matmul(device_blas(ctx.device), ctx.stream, g, out.dtype(), 1.0f, 0.0f, a.data_ptr(), b.data_ptr(),
                   out.data_ptr(), e);
}

// The own Hopper kernel for a GELU product (Note [Own GELU products on Hopper], gemm_sm90.cu): bf16, one dense
// 2-D product with a untransposed; false where it does not apply and cuBLASLt runs instead.
// `dbias` (DGelu): the column sums of out too, their partial sums in the stream's cuBLASLt workspace (the
// launches on one stream run in order, so no product is using it meanwhile).
bool sm90_gelu_matmul(sm90::GeluEpilogue epilogue, const Tensor& out, const Tensor& aux, const Tensor& a,
                      const Tensor& b, bool trans_a, bool trans_b, const Tensor* bias, const Tensor* dbias = nullptr) {
  if (out.dtype() != DType::bf16 || a.dtype() != DType::bf16 || trans_a || out.size(0) != 1 || a.size(0) != 1 ||
      b.size(0) != 1 || !out.is_contiguous() || !aux.is_contiguous() || !a.is_contiguous() || !b.is_contiguous() ||
      (dbias && (dbias->dtype() != DType::bf16 || !dbias->is_contiguous())))
    return false;
  const int64_t m = out.size(1), n = out.size(2), k = a.size(2);
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return false;
  sm90::GeluGemm g{epilogue,      static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                   a.data_ptr(),  b.data_ptr(),        trans_b,             out.data_ptr(),
                   aux.data_ptr(), bias ? bias->data_ptr() : nullptr};
  LaunchContext ctx(out);
  if (dbias) {
    DeviceBlas& d = device_blas(ctx.device);
    std::lock_guard<std::mutex> lk(d.mu);
    g.dbias = dbias->data_ptr();
    g.workspace = workspace(d, ctx.stream);
    g.workspace_bytes = kWorkspaceBytes;
  }
  return sm90::gelu_gemm(g, ctx.stream);
}

}  // namespace

void matmul_bias(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const Tensor& bias) {
  check_same_device("matmul_bias", {&out, &a, &b, &bias});
  INGOT_INTERNAL_CHECK(out.dim() == 3 && bias.dim() == 1 && bias.size(0) == out.size(2) &&
                           bias.dtype() == out.dtype() && bias.is_contiguous(),
                       "matmul_bias kernel: bias ", shape_str(bias.shape()), " ", dtype_name(bias.dtype()), " for out ",
                       shape_str(out.shape()), " ", dtype_name(out.dtype()));
  // The epilogue path needs a 16-byte-aligned bias (cuBLASLt's vector loads). Anything else adds the bias the
  // general way (broadcast it into out, then beta = 1).
  if (alignment(bias.data_ptr()) >= 16) {
    Epilogue e;
    e.kind = CUBLASLT_EPILOGUE_BIAS;
    e.bias = bias.data_ptr();
    if (epilogue_matmul(out, a, b, trans_a, trans_b, e)) return;
  }
  copy(out, bias.expand_raw(out.shape()));
  matmul(out, a, b, trans_a, trans_b, 1.0, 1.0);
}

void matmul_bias_gelu(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b, bool trans_a,
                      bool trans_b, const Tensor& bias) {
  check_same_device("matmul_bias_gelu", {&out, &pre, &a, &b, &bias});
  INGOT_INTERNAL_CHECK(out.dim() == 3 && pre.shape() == out.shape() && pre.dtype() == out.dtype() &&
                           pre.is_contiguous() && bias.dim() == 1 && bias.size(0) == out.size(2) &&
                           bias.dtype() == out.dtype() && bias.is_contiguous(),
                       "matmul_bias_gelu kernel: out ", shape_str(out.shape()), ", pre ", shape_str(pre.shape()),
                       ", bias ", shape_str(bias.shape()));
  if (out.numel() == 0) return;
  if (sm90_gelu_matmul(sm90::GeluEpilogue::kGeluAuxBias, out, pre, a, b, trans_a, trans_b, &bias)) return;
  // As for DGELU: the aux leading dimension a multiple of 8, 16-byte aux and bias pointers.
  if (out.size(2) % 8 == 0 && alignment(pre.data_ptr()) >= 16 && alignment(bias.data_ptr()) >= 16) {
    Epilogue e;
    e.kind = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    e.bias = bias.data_ptr();
    e.aux = pre.data_ptr();
    e.aux_ld = out.size(2);
    if (epilogue_matmul(out, a, b, trans_a, trans_b, e)) return;
  }
  matmul_bias(pre, a, b, trans_a, trans_b, bias);
  unary(UnaryOp::GeluTanh, out, pre, 0.0);
}

void matmul_dgelu(const Tensor& out, const Tensor& dbias, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                  const Tensor& pre) {
  check_same_device("matmul_dgelu", {&out, &a, &b, &pre});
  const int64_t m = out.size(1), n = out.size(2);
  INGOT_INTERNAL_CHECK(out.dim() == 3 && out.size(0) == 1 && pre.numel() == m * n && pre.is_contiguous() &&
                           pre.dtype() == out.dtype() && (!dbias.defined() || (dbias.numel() == n &&
                                                                               dbias.dtype() == out.dtype())),
                       "matmul_dgelu kernel: out ", shape_str(out.shape()), ", pre ", shape_str(pre.shape()));
  if (out.numel() == 0) return;
  if (sm90_gelu_matmul(sm90::GeluEpilogue::kDGelu, out, pre, a, b, trans_a, trans_b, nullptr,
                       dbias.defined() ? &dbias : nullptr))
    return;
  // cuBLASLt wants the aux leading dimension (n, in its column-major view) a multiple of 8 and 16-byte pointers.
  // Not its DGELU_BGRAD: that runs the product and then a separate generic epilogue kernel, slower than DGELU and
  // a column sum (Note [cuBLASLt GELU backward epilogue], compile/passes/matmul_epilogue.cpp).
  bool fused = false;
  if (n % 8 == 0 && alignment(pre.data_ptr()) >= 16) {
    Epilogue e;
    e.kind = CUBLASLT_EPILOGUE_DGELU;
    e.aux = pre.data_ptr();
    e.aux_ld = n;
    fused = epilogue_matmul(out, a, b, trans_a, trans_b, e);
  }
  if (!fused) {  // the unfused path: the product, then the GELU derivative in place
    matmul(out, a, b, trans_a, trans_b, 1.0, 0.0);
    const Tensor pre3 = pre.as_strided(out.shape(), out.strides(), pre.offset());
    binary(BinaryOp::GeluTanhGrad, out, pre3, out);
  }
  if (dbias.defined()) reduce(ReduceOp::Sum, dbias, out, 1, m, n);  // either way, the bias gradient's column sums
}

MatmulTuningScope::MatmulTuningScope(MatmulTuner* tuner) : previous_(t_tuner) { t_tuner = tuner; }
MatmulTuningScope::~MatmulTuningScope() { t_tuner = previous_; }

std::string blas_version() { return "cublasLt " + std::to_string(cublasLtGetVersion()); }

int matmul_desc_sm_count_target(int total_sms) {
  cublasLtMatmulDesc_t op = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  int32_t target = -1;
  size_t written = 0;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  try {
    set_sm_target(op, sm_count_target(total_sms));
    st = cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof(target), &written);
  } catch (...) {
    cublasLtMatmulDescDestroy(op);
    throw;
  }
  cublasLtMatmulDescDestroy(op);
  CUBLAS_CHECK(st);
  return target;
}

}  // namespace ingot::kernels::cuda
