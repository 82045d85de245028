// cuDNN fused flash attention (forward and backward) through the graph backend API (cudnnBackend* descriptors).
//
// Note [The SDPA forward graph]
//   cuDNN's backend API has no single attention call that takes a causal mask; its runtime fusion engine
//   recognizes an operation graph of the shape below (the one cudnn-frontend's composite sdpa node lowers to)
//   and runs it as one flash-attention kernel. Tensors are [b, h, s_q, s_kv] unless noted; K enters transposed
//   as KT [b, h_k, d, s_kv] (a stride swap, no copy); h_k < h_q is grouped-query attention.
//     S  = matmul(Q, KT) * scale                 f32 virtual; scale passed by value
//     S  = select(row >= col, S, -inf)           causal only: gen_index(axis 2) >= gen_index(axis 3), top-left
//     M  = max over s_kv (reduction)             [b, h, s_q, 1]
//     E  = exp(S - M),  L = sum over s_kv of E
//     lse = M + log(L)                           the Stats output, f32 [b, h, s_q, 1] == ingot's lse layout
//     P  = E / L                                 in the input type (bf16 / f16), as the engine requires
//     O  = matmul(P, V)
//   The top-left causal diagonal equals ingot's (j <= i + S - T) only when T == S, so other causal shapes take
//   the fallback kernels. Supported: bf16 / f16, D <= 128 and a multiple of 8.
//
// Note [The SDPA backward graph]
//   Likewise (cudnn-frontend's composite sdpa_backward): VT enters transposed like KT, and
//     delta = rowsum(dO * O) * 1                 a real f32 [b, h, s_q, 1] buffer the caller provides
//     P  = exp(select(mask, S * scale - lse, -inf))
//     dV = matmul(P^T, dO)                       P^T a reshape (stride swap) in the io type
//     dS = (matmul(dO, VT) - delta) * P * scale
//     dK = matmul(dS^T, Q)
//     dQ = identity(matmul(dS, K))               through a real f32 accumulator [b, h, s_q, d] the caller provides
//   With h_k < h_q, dK and dV are computed per q head (io type) and summed over each group by a reduction.
//
// Note [Layouts]
//   Every io tensor is described with its own strides (any layout whose last dim is dense, strides a multiple
//   of 8 elements, 16-byte aligned: layout_reason). GPT-style models hand attention q, k, v as permuted views
//   of the projection's [B, T, 3, H, D] output and want out / dq / dk / dv in [B, T, H, D] memory order, so
//   nothing is copied on either side of the kernels.
//
// Plans are built once per (device, dtype, shape, strides, causal, direction) and cached (building one compiles kernels
// and takes milliseconds to seconds); a shape cuDNN rejects is remembered too, so auto mode does not retry it.
//
// Note [Choosing the engine]
//   The heuristic's first engine config is not always the fastest for a shape, so a plan keeps every config
//   that finalizes (up to kMaxCandidates) and the first run outside a CUDA-graph capture times each of them
//   on the real arguments and keeps the fastest: a warm-up run of each, then kRounds rounds over all of them
//   (kTimedRuns runs each between CUDA events), each keeping its best round. Timing one config after the
//   other picked cuDNN's sm80 forward kernel over its sm90 one (1.96 vs 1.01 ms per GPT-2 step) in a run whose
//   first step met a GPU still raising its clocks; interleaved rounds give every config the same clocks.
//   Repeating a run is harmless: the outputs are overwritten, and the backward's dQ accumulator is zeroed
//   before every run. INGOT_CUDNN_VERBOSE=1 prints the timings.
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/cuda/check.h"
#include "runtime/kernels/cuda/attention_cudnn.h"

namespace ingot::kernels::cuda::cudnn_attention {
namespace {

#define INGOT_CUDNN_CHECK(expr)                                                                          \
  do {                                                                                                   \
    cudnnStatus_t _ingot_st = (expr);                                                                    \
    if (_ingot_st != CUDNN_STATUS_SUCCESS) [[unlikely]] {                                                \
      char _ingot_msg[512] = {0};                                                                        \
      cudnnGetLastErrorString(_ingot_msg, sizeof(_ingot_msg));                                           \
      INGOT_FAIL("cuDNN attention: ", #expr, " failed: ", cudnnGetErrorString(_ingot_st), " ", _ingot_msg); \
    }                                                                                                    \
  } while (0)

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) { INGOT_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values) {
    INGOT_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t h = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &h);
  }
  Desc& finalize() {
    INGOT_CUDNN_CHECK(cudnnBackendFinalize(d_));
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::vector<int64_t>;

enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf,           // both graphs
  kdO, kdQ, kdK, kdV, kOne, kDelta, kdQAccum,            // backward
  kFirstVirtual = 100,
};

// Builds an operation graph; owns every descriptor it made, which the execution plan refers to.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  const Desc& tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides, bool is_virtual,
                     bool by_value = false) {
    Desc& t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
        .set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<int64_t>(dims.size()), dims.data())
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<int64_t>(strides.size()), strides.data())
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (is_virtual) t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    return t.finalize();
  }
  const Desc& virt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return tensor(next_uid_++, dt, dims, strides, true);
  }

  // y = mode(x[, b[, t]]) computed in `prec`; axis is for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, const Desc& x, const Desc* b, const Desc* t,
                 const Desc& y, int64_t axis = -1) {
    Desc& pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize();
    Desc& op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.0f;
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    add_op(op.finalize());
  }

  void reduction(cudnnReduceTensorOp_t red, const Desc& x, const Desc& y) {
    Desc& rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32)
        .finalize();
    Desc& op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    add_op(op.finalize());
  }

  // y is x's data seen with another shape / strides (a transpose here); no data moves.
  void reshape(const Desc& x, const Desc& y) {
    Desc& op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add_op(op.finalize());
  }

  void matmul(const Desc& a, const Desc& b, const Desc& c) {
    Desc& mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32).finalize();
    Desc& op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    add_op(op.finalize());
  }

  // The finalized operation graph (owned by this builder).
  const Desc& finish() {
    Desc& g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()), ops_.data())
        .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    return g.finalize();
  }

  Desc& make(cudnnBackendDescriptorType_t type) {
    owned_.push_back(std::make_unique<Desc>(type));
    return *owned_.back();
  }

 private:
  void add_op(const Desc& op) { ops_.push_back(op.get()); }

  cudnnHandle_t handle_;
  std::vector<std::unique_ptr<Desc>> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_uid_ = kFirstVirtual;
};

// A finalized execution plan and everything it was built from.
struct Candidate {
  std::unique_ptr<Desc> engine_config;
  std::unique_ptr<Desc> plan;
  int64_t workspace = 0;
};
constexpr size_t kMaxCandidates = 8;
constexpr int kTimedRuns = 2;  // per round
constexpr int kRounds = 3;     // interleaved over the candidates; each keeps its best round

struct Plan {
  std::unique_ptr<GraphBuilder> graph;
  std::vector<Candidate> candidates;
  int64_t workspace = 0;  // the largest candidate's
  mutable size_t chosen = 0;
  mutable bool timed = false;
};

// The element strides of one [B, H, T, D] operand (Note [Layouts]).
using Strides4 = std::array<int64_t, 4>;
enum Operand { kOpQ, kOpK, kOpV, kOpO, kOpdO, kOpdQ, kOpdK, kOpdV, kNumOperands };

struct Key {
  int device;
  DType dtype;
  int64_t B, Hq, Hkv, T, S, D;
  bool causal;
  bool backward;
  std::array<Strides4, kNumOperands> strides;  // the backward's dO, dQ, dK, dV; the forward leaves them 0
  auto tie() const { return std::tie(device, dtype, B, Hq, Hkv, T, S, D, causal, backward, strides); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

cudnnHandle_t handle_for(int device) {
  static std::mutex mu;
  static std::map<int, cudnnHandle_t> handles;  // live for the process: cuDNN handles are costly to make
  std::lock_guard<std::mutex> g(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  INGOT_CUDNN_CHECK(cudnnCreate(&h));
  handles.emplace(device, h);
  return h;
}

Dims contiguous(const Dims& d) {
  Dims s(d.size(), 1);
  for (size_t i = d.size() - 1; i-- > 0;) s[i] = s[i + 1] * d[i + 1];
  return s;
}

// The tensors both graphs share. K (and, in the backward, V) enter transposed: [B, Hk, D, S] over K's memory.
struct Shapes {
  explicit Shapes(const Key& k)
      : B(k.B), Hq(k.Hq), Hk(k.Hkv), T(k.T), S(k.S), D(k.D), key(k),
        q{B, Hq, T, D}, kv{B, Hk, S, D}, kt{B, Hk, D, S},
        s{B, Hq, T, S}, st{B, Hq, S, T}, st_strides{Hq * T * S, T * S, 1, S}, r{B, Hq, T, 1}, one{1, 1, 1, 1} {}
  Dims strides(Operand o) const { return Dims(key.strides[o].begin(), key.strides[o].end()); }
  // [B, Hk, D, S] over the memory of K or V: the last two strides swapped.
  Dims transposed(Operand o) const {
    const Strides4& st4 = key.strides[o];
    return {st4[0], st4[1], st4[3], st4[2]};
  }
  int64_t B, Hq, Hk, T, S, D;
  const Key& key;
  Dims q, kv, kt, s, st, st_strides, r, one;
};

// S = scale * Q KT, optionally shifted by `stats` (the backward rebuilds P from lse), then causally masked.
const Desc& scores(GraphBuilder& g, const Shapes& sh, const Desc& q, const Desc& kt, const Desc& scale,
                   const Desc* stats, bool causal) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const Dims s_strides = contiguous(sh.s);
  const Desc& raw = g.virt(f32, sh.s, s_strides);
  g.matmul(q, kt, raw);
  const Desc* s = &g.virt(f32, sh.s, s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, f32, raw, &scale, nullptr, *s);
  if (stats) {
    const Desc& shifted = g.virt(f32, sh.s, s_strides);
    g.pointwise(CUDNN_POINTWISE_SUB, f32, *s, stats, nullptr, shifted);
    s = &shifted;
  }
  if (!causal) return *s;
  const Desc& neg_inf = g.tensor(kNegInf, f32, sh.one, sh.one, false, true);
  const Desc& row = g.virt(CUDNN_DATA_INT32, sh.s, s_strides);
  const Desc& col = g.virt(CUDNN_DATA_INT32, sh.s, s_strides);
  const Desc& keep = g.virt(CUDNN_DATA_BOOLEAN, sh.s, s_strides);
  const Desc& masked = g.virt(f32, sh.s, s_strides);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, *s, nullptr, nullptr, row, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, *s, nullptr, nullptr, col, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, &col, nullptr, keep);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, *s, &neg_inf, &keep, masked);
  return masked;
}

// out = a @ b over all q heads; with grouped-query attention the per-q-head result (in the io type) is summed
// over each group into `out`, which has Hk heads.
void matmul_into_kv_heads(GraphBuilder& g, const Shapes& sh, cudnnDataType_t io, const Desc& a, const Desc& b,
                          const Desc& out) {
  if (sh.Hq == sh.Hk) return g.matmul(a, b, out);
  const Dims full{sh.B, sh.Hq, sh.S, sh.D};
  const Desc& per_head = g.virt(io, full, contiguous(full));
  g.matmul(a, b, per_head);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, per_head, out);
}

// See Note [The SDPA forward graph].
void forward_graph(GraphBuilder& g, const Key& key) {
  const Shapes sh(key);
  const cudnnDataType_t io = key.dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const Dims r_strides = contiguous(sh.r);
  const Desc& q = g.tensor(kQ, io, sh.q, sh.strides(kOpQ), false);
  const Desc& kt = g.tensor(kK, io, sh.kt, sh.transposed(kOpK), false);
  const Desc& v = g.tensor(kV, io, sh.kv, sh.strides(kOpV), false);
  const Desc& o = g.tensor(kO, io, sh.q, sh.strides(kOpO), false);
  const Desc& stats = g.tensor(kStats, f32, sh.r, r_strides, false);
  const Desc& scale = g.tensor(kScale, f32, sh.one, sh.one, false, true);
  const Desc& s = scores(g, sh, q, kt, scale, nullptr, key.causal);
  const Dims s_strides = contiguous(sh.s);
  const Desc& m = g.virt(f32, sh.r, r_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, m);
  const Desc& centered = g.virt(f32, sh.s, s_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, f32, s, &m, nullptr, centered);
  const Desc& e = g.virt(f32, sh.s, s_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, f32, centered, nullptr, nullptr, e);
  const Desc& l = g.virt(f32, sh.r, r_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, l);
  const Desc& log_l = g.virt(f32, sh.r, r_strides);
  g.pointwise(CUDNN_POINTWISE_LOG, f32, l, nullptr, nullptr, log_l);
  g.pointwise(CUDNN_POINTWISE_ADD, f32, m, &log_l, nullptr, stats);
  const Desc& p = g.virt(io, sh.s, s_strides);
  g.pointwise(CUDNN_POINTWISE_DIV, f32, e, &l, nullptr, p);
  g.matmul(p, v, o);
}

// See Note [The SDPA backward graph].
void backward_graph(GraphBuilder& g, const Key& key) {
  const Shapes sh(key);
  const cudnnDataType_t io = key.dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const Dims q_strides = contiguous(sh.q), r_strides = contiguous(sh.r);
  const Dims s_strides = contiguous(sh.s);
  const Desc& q = g.tensor(kQ, io, sh.q, sh.strides(kOpQ), false);
  const Desc& kt = g.tensor(kK, io, sh.kt, sh.transposed(kOpK), false);
  const Desc& vt = g.tensor(kV, io, sh.kt, sh.transposed(kOpV), false);
  const Desc& o = g.tensor(kO, io, sh.q, sh.strides(kOpO), false);
  const Desc& d_o = g.tensor(kdO, io, sh.q, sh.strides(kOpdO), false);
  const Desc& stats = g.tensor(kStats, f32, sh.r, r_strides, false);
  const Desc& dq = g.tensor(kdQ, io, sh.q, sh.strides(kOpdQ), false);
  const Desc& dk = g.tensor(kdK, io, sh.kv, sh.strides(kOpdK), false);
  const Desc& dv = g.tensor(kdV, io, sh.kv, sh.strides(kOpdV), false);
  const Desc& scale = g.tensor(kScale, f32, sh.one, sh.one, false, true);
  const Desc& one = g.tensor(kOne, f32, sh.one, sh.one, false, true);
  const Desc& delta = g.tensor(kDelta, f32, sh.r, r_strides, false);
  const Desc& dq_accum = g.tensor(kdQAccum, f32, sh.q, q_strides, false);

  // delta = rowsum(dO * O)
  const Desc& prod = g.virt(f32, sh.q, q_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, f32, d_o, &o, nullptr, prod);
  const Desc& rowsum = g.virt(f32, sh.r, r_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, rowsum);
  g.pointwise(CUDNN_POINTWISE_MUL, f32, rowsum, &one, nullptr, delta);
  // P = exp(scale Q KT - lse), masked; dV = P^T dO
  const Desc& s = scores(g, sh, q, kt, scale, &stats, key.causal);
  const Desc& p = g.virt(f32, sh.s, s_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, f32, s, nullptr, nullptr, p);
  const Desc& pt = g.virt(io, sh.st, sh.st_strides);
  g.reshape(p, pt);
  matmul_into_kv_heads(g, sh, io, pt, d_o, dv);
  // dS = scale * P * (dO VT - delta); dK = dS^T Q
  const Desc& dp = g.virt(f32, sh.s, s_strides);
  g.matmul(d_o, vt, dp);
  const Desc& dp_c = g.virt(f32, sh.s, s_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, f32, dp, &delta, nullptr, dp_c);
  const Desc& ds_raw = g.virt(f32, sh.s, s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, f32, dp_c, &p, nullptr, ds_raw);
  const Desc& ds = g.virt(f32, sh.s, s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, f32, ds_raw, &scale, nullptr, ds);
  const Desc& dst = g.virt(io, sh.st, sh.st_strides);
  g.reshape(ds, dst);
  matmul_into_kv_heads(g, sh, io, dst, q, dk);
  // dQ = dS K, accumulated in f32 and converted
  const Desc& k = g.virt(f32, sh.kv, sh.strides(kOpK));
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, f32, dq_accum, nullptr, nullptr, dq);
}

std::unique_ptr<Plan> build_plan(const Key& key, cudnnHandle_t handle) {
  auto plan = std::make_unique<Plan>();
  plan->graph = std::make_unique<GraphBuilder>(handle);
  GraphBuilder& g = *plan->graph;
  if (key.backward) backward_graph(g, key);
  else forward_graph(g, key);
  const Desc& op_graph = g.finish();

  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode)
      .finalize();
  int64_t count = 0;
  INGOT_CUDNN_CHECK(
      cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  INGOT_CHECK(count > 0, "cuDNN attention: no engine for the SDPA graph");
  std::vector<std::unique_ptr<Desc>> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(configs.back()->get());
  }
  INGOT_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             count, &count, raw.data()));
  std::string errors;
  for (int64_t i = 0; i < count; ++i) {
    auto candidate = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    candidate->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
        .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configs[static_cast<size_t>(i)]);
    const cudnnStatus_t st = cudnnBackendFinalize(candidate->get());
    if (st != CUDNN_STATUS_SUCCESS) {  // this engine config cannot run the graph: try the next one
      errors += std::string(" [") + cudnnGetErrorString(st) + "]";
      continue;
    }
    int64_t n = 0;
    Candidate c;
    INGOT_CUDNN_CHECK(cudnnBackendGetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                               CUDNN_TYPE_INT64, 1, &n, &c.workspace));
    c.engine_config = std::move(configs[static_cast<size_t>(i)]);
    c.plan = std::move(candidate);
    plan->workspace = std::max(plan->workspace, c.workspace);
    plan->candidates.push_back(std::move(c));
    if (plan->candidates.size() == kMaxCandidates) break;
  }
  if (!plan->candidates.empty()) return plan;
  INGOT_FAIL("cuDNN attention: none of ", count, " engine configs finalized:", errors);
}

// The cached plan for `key`, building it on first use; throws (every time) for a key cuDNN rejected.
const Plan& plan_for(const Key& key, cudnnHandle_t handle) {
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<Plan>> plans;
  static std::map<Key, std::string> rejected;
  std::lock_guard<std::mutex> g(mu);
  if (auto it = plans.find(key); it != plans.end()) return *it->second;
  if (auto it = rejected.find(key); it != rejected.end()) INGOT_FAIL(it->second);
  try {
    auto [it, inserted] = plans.emplace(key, build_plan(key, handle));
    return *it->second;
  } catch (const Error& e) {
    rejected.emplace(key, e.what());
    throw;
  }
}

}  // namespace

std::string unsupported_reason(const Tensor& q, const Tensor& k, const Tensor& lse, bool causal) {
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16)
    return ::ingot::detail::str_cat("dtype ", dtype_name(q.dtype()), " (cuDNN's fused attention takes bf16 or f16)");
  const int64_t D = q.size(3);
  if (D > 128 || D % 8 != 0)
    return ::ingot::detail::str_cat("head dim ", D, " (cuDNN needs D <= 128, a multiple of 8)");
  if (causal && q.size(2) != k.size(2))
    return ::ingot::detail::str_cat("causal with T = ", q.size(2), " != S = ", k.size(2),
                                    " (the cuDNN graph masks the top-left diagonal)");
  if (lse.dtype() != DType::f32) return ::ingot::detail::str_cat("lse of dtype ", dtype_name(lse.dtype()));
  return "";
}

std::string layout_reason(std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  for (auto [name, t] : tensors) {
    if (t->stride(3) != 1 && t->size(3) != 1)
      return ::ingot::detail::str_cat(name, " has a strided last dim (stride ", t->stride(3), ")");
    for (int d = 0; d < 3; ++d)
      if (t->stride(d) % 8 != 0 && t->size(d) != 1)
        return ::ingot::detail::str_cat(name, " stride ", t->stride(d), " of dim ", d, " is not a multiple of 8");
    if (reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0)
      return ::ingot::detail::str_cat(name, " is not 16-byte aligned");
  }
  return "";
}

namespace {

Key key_of(const Tensor& q, const Tensor& k, bool causal, bool backward,
           std::initializer_list<std::pair<Operand, const Tensor*>> operands) {
  Key key{q.device().index, q.dtype(), q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3),
          causal, backward, {}};
  for (auto [o, t] : operands)
    for (int d = 0; d < 4; ++d) key.strides[o][d] = t->stride(d);
  return key;
}

// Runs `plan` with the given (uid, pointer) bindings; the workspace comes from the caching allocator, so it is
// reused stream-ordered.
// Runs the chosen candidate (Note [Choosing the engine]); `prepare` runs before every execution on the stream.
template <typename Prepare>
void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
             const Device& device, const char* what, Prepare prepare) {
  Tensor workspace = empty({std::max<int64_t>(plan.workspace, 1)}, DType::b8, device);
  void* ws = workspace.data_ptr();
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)
      .finalize();
  cudaStream_t stream = nullptr;
  INGOT_CUDNN_CHECK(cudnnGetStream(handle, &stream));
  if (!plan.timed && plan.candidates.size() > 1 && !ingot::cuda::is_capturing(ingot::cuda::Stream{stream})) {
    cudaEvent_t start = nullptr, stop = nullptr;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    const bool verbose = std::getenv("INGOT_CUDNN_VERBOSE") != nullptr;
    const size_t n = plan.candidates.size();
    std::vector<float> best(n, INFINITY);
    std::vector<bool> runs(n, false);
    for (size_t c = 0; c < n; ++c) {  // warm-up; a config that fails to execute is skipped
      prepare(stream);
      runs[c] = cudnnBackendExecute(handle, plan.candidates[c].plan->get(), pack.get()) == CUDNN_STATUS_SUCCESS;
    }
    for (int round = 0; round < kRounds; ++round)
      for (size_t c = 0; c < n; ++c) {
        if (!runs[c]) continue;
        CUDA_CHECK(cudaEventRecord(start, stream));
        for (int r = 0; r < kTimedRuns; ++r) {
          prepare(stream);
          INGOT_CUDNN_CHECK(cudnnBackendExecute(handle, plan.candidates[c].plan->get(), pack.get()));
        }
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        best[c] = std::min(best[c], ms);
      }
    for (size_t c = 0; c < n; ++c) {
      if (verbose && runs[c])
        std::fprintf(stderr, "[cudnn] attention %s: engine config %zu: %.1f us\n", what, c, best[c] * 1e3f / kTimedRuns);
      if (best[c] < best[plan.chosen]) plan.chosen = c;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    plan.timed = true;
  }
  prepare(stream);
  INGOT_CUDNN_CHECK(cudnnBackendExecute(handle, plan.candidates[plan.chosen].plan->get(), pack.get()));
}

}  // namespace

void forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
             double scale, cudaStream_t stream) {
  cudnnHandle_t handle = handle_for(q.device().index);
  INGOT_CUDNN_CHECK(cudnnSetStream(handle, stream));
  const Plan& plan = plan_for(key_of(q, k, causal, false, {{kOpQ, &q}, {kOpK, &k}, {kOpV, &v}, {kOpO, &out}}), handle);
  // By-value scalars are read from host memory when the graph is launched.
  float scale_f = static_cast<float>(scale), neg_inf = -INFINITY;
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs{q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), &scale_f};
  if (causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
  }
  execute(handle, plan, uids, ptrs, q.device(), "forward", [](cudaStream_t) {});
}

void backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, bool causal, double scale,
              cudaStream_t stream) {
  cudnnHandle_t handle = handle_for(q.device().index);
  INGOT_CUDNN_CHECK(cudnnSetStream(handle, stream));
  const Plan& plan = plan_for(key_of(q, k, causal, true,
                                     {{kOpQ, &q}, {kOpK, &k}, {kOpV, &v}, {kOpO, &out}, {kOpdO, &dout},
                                      {kOpdQ, &dq}, {kOpdK, &dk}, {kOpdV, &dv}}),
                              handle);
  // The graph's two f32 buffers (see Note [The SDPA backward graph]), 16-byte aligned.
  const int64_t rows = q.size(0) * q.size(1) * q.size(2), rows_padded = (rows + 3) / 4 * 4;
  Tensor scratch = empty({rows_padded + rows * q.size(3)}, DType::f32, q.device());
  float scale_f = static_cast<float>(scale), one = 1.0f, neg_inf = -INFINITY;
  std::vector<int64_t> uids{kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV, kScale, kOne, kDelta, kdQAccum};
  std::vector<void*> ptrs{q.data_ptr(),  k.data_ptr(),  v.data_ptr(),  out.data_ptr(), dout.data_ptr(),
                          lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), &scale_f,
                          &one,           scratch.data<float>(), scratch.data<float>() + rows_padded};
  if (causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
  }
  float* accum = scratch.data<float>() + rows_padded;
  const size_t accum_bytes = static_cast<size_t>(rows * q.size(3)) * sizeof(float);
  execute(handle, plan, uids, ptrs, q.device(), "backward",
          [&](cudaStream_t st) { CUDA_CHECK(cudaMemsetAsync(accum, 0, accum_bytes, st)); });
}

}  // namespace ingot::kernels::cuda::cudnn_attention
