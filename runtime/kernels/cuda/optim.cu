// CUDA multi-tensor optimizer kernels (adamw_multi, sgd_multi; contracts in kernel_list.inc): one launch
// updates every parameter of the list.
//
// Approach: the host cuts each tensor into chunks of kChunk elements and uploads one table of tensor slots
// (pointers, length, grad dtype) and one of chunks (slot, first element); block b updates chunk b.
//
// Note [Optimizer tables in flight]
// The tables go through pinned staging buffers, kStagingRing per device used in turn, each reused once the event
// recorded after its last upload has passed: a pageable-memory copy would wait for the GPU to drain, and so did
// one staging buffer, whose reuse waited for the previous launch's upload to run. A DDP step updates each bucket
// on its own (13 launches for GPT-2 124M, queued behind the buckets' all-reduces), so the host stopped at every
// update until the GPU had reached the previous one and the GPU then idled while the host queued the kernels that
// follow. With the ring the host waits only for the upload of kStagingRing launches ago.
//
// Shapes: params [n] f32 (AdamW: or bf16), grads [n] any float dtype, state [n] f32, contiguous, equal shapes
// per index.
// Numerics: the CPU kernels' f32 operations in the same order, each rounded separately (__fmul_rn and
// friends are never contracted into FMAs), with the same host-side constants: CPU and GPU updates are equal
// bit for bit.
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/kernels/adamw_consts.h"
#include "runtime/kernels/cuda/common.cuh"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/scalar_math.h"

namespace ingot::kernels::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int64_t kChunk = 16384;

struct Slot {
  void* p;  // f32; AdamW: or bf16 (p_dtype), rounded stochastically (Note [Stochastic rounding], scalar_math.h)
  const void* g;
  float* s1;  // AdamW: exp_avg; SGD: momentum buffer (null without momentum)
  float* s2;  // AdamW: exp_avg_sq
  int64_t n;
  DType g_dtype;
  DType p_dtype = DType::f32;
};

struct Chunk {
  int64_t slot;
  int64_t start;
};

struct SgdConsts {
  float lr, mu, damp, wd, scale;
  bool use_momentum, nesterov, first;
};

__global__ void adamw_kernel(const Slot* slots, const Chunk* chunks, AdamWConsts c) {
  const Chunk ch = chunks[blockIdx.x];
  const Slot s = slots[ch.slot];
  const int64_t end = ch.start + kChunk < s.n ? ch.start + kChunk : s.n;
  for (int64_t j = ch.start + threadIdx.x; j < end; j += blockDim.x) {
    const float g = __fmul_rn(load_dyn<float>(s.g, s.g_dtype, j), c.scale);
    const float m = __fadd_rn(__fmul_rn(c.b1, s.s1[j]), __fmul_rn(c.one_minus_b1, g));
    const float v = __fadd_rn(__fmul_rn(c.b2, s.s2[j]), __fmul_rn(__fmul_rn(c.one_minus_b2, g), g));
    s.s1[j] = m;
    s.s2[j] = v;
    const float step = __fdiv_rn(__fmul_rn(c.lr, __fdiv_rn(m, c.bc1)), __fadd_rn(__fsqrt_rn(__fdiv_rn(v, c.bc2)), c.eps));
    const float out = __fsub_rn(__fmul_rn(load_dyn<float>(s.p, s.p_dtype, j), c.decay), step);
    if (s.p_dtype == DType::bf16)
      store_dyn(s.p, DType::bf16, j, ig_math::round_bf16_stochastic(out, ig_math::stochastic_salt(j, c.step)));
    else
      static_cast<float*>(s.p)[j] = out;
  }
}

__global__ void sgd_kernel(const Slot* slots, const Chunk* chunks, SgdConsts c) {
  const Chunk ch = chunks[blockIdx.x];
  const Slot s = slots[ch.slot];
  const int64_t end = ch.start + kChunk < s.n ? ch.start + kChunk : s.n;
  float* p = static_cast<float*>(s.p);
  for (int64_t j = ch.start + threadIdx.x; j < end; j += blockDim.x) {
    float d = __fadd_rn(__fmul_rn(load_dyn<float>(s.g, s.g_dtype, j), c.scale), __fmul_rn(c.wd, p[j]));
    if (c.use_momentum) {
      const float b = c.first ? d : __fadd_rn(__fmul_rn(c.mu, s.s1[j]), __fmul_rn(c.damp, d));
      s.s1[j] = b;
      d = c.nesterov ? __fadd_rn(d, __fmul_rn(c.mu, b)) : b;
    }
    p[j] = __fsub_rn(p[j], __fmul_rn(c.lr, d));
  }
}

// Pinned host memory for the tables of one device: kStagingRing buffers, each reused once its previous upload
// has completed (Note [Optimizer tables in flight]).
constexpr size_t kStagingRing = 32;
struct StagingBuffer {
  void* host = nullptr;
  size_t cap = 0;
  cudaEvent_t uploaded = nullptr;
};
struct Staging {
  std::mutex mu;
  StagingBuffer ring[kStagingRing];
  size_t next = 0;
};

Staging& staging(int device) {
  static std::mutex mu;
  static std::vector<Staging*> all;
  std::lock_guard<std::mutex> g(mu);
  if (all.empty()) all.resize(static_cast<size_t>(cuda_device_count()), nullptr);
  Staging*& s = all.at(static_cast<size_t>(device));
  if (!s) s = new Staging;  // never destroyed, like the allocators
  return *s;
}

void check_slot(const char* op, size_t i, const Tensor& p, const Tensor& g, std::initializer_list<const Tensor*> state,
                bool bf16_params = false) {
  INGOT_CHECK((p.dtype() == DType::f32 || (bf16_params && p.dtype() == DType::bf16)) && p.is_contiguous(), op,
              ": parameter ", i, " must be a contiguous f32", bf16_params ? " or bf16" : "", " tensor, got ",
              dtype_name(p.dtype()), shape_str(p.shape()));
  INGOT_CHECK(is_floating(g.dtype()) && g.is_contiguous() && g.shape() == p.shape(), op, ": grad ", i,
              " must be a contiguous float tensor of shape ", shape_str(p.shape()), ", got ", dtype_name(g.dtype()),
              shape_str(g.shape()));
  for (const Tensor* s : state)
    INGOT_CHECK(s->dtype() == DType::f32 && s->is_contiguous() && s->shape() == p.shape(), op, ": state ", i,
                " must be a contiguous f32 tensor of shape ", shape_str(p.shape()));
  check_same_device(op, {&p, &g});
  for (const Tensor* s : state) check_same_device(op, {&p, s});
}

// Uploads the slot and chunk tables and launches kernel<<<chunks, kBlock>>>(slots, chunks, consts).
template <typename Consts>
void launch(const char* op, const Tensor& first, const std::vector<Slot>& slots,
            void (*kernel)(const Slot*, const Chunk*, Consts), const Consts& consts) {
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < slots.size(); ++i)
    for (int64_t start = 0; start < slots[i].n; start += kChunk) chunks.push_back(Chunk{static_cast<int64_t>(i), start});
  if (chunks.empty()) return;
  INGOT_CHECK(chunks.size() <= INT32_MAX, op, ": too many elements for one launch");
  LaunchContext ctx(first);
  const size_t slot_bytes = slots.size() * sizeof(Slot), bytes = slot_bytes + chunks.size() * sizeof(Chunk);
  std::shared_ptr<void> dev = allocator_for(first.device()).allocate(bytes);
  Staging& st = staging(ctx.device);
  {
    std::lock_guard<std::mutex> g(st.mu);
    StagingBuffer& b = st.ring[st.next];
    st.next = (st.next + 1) % kStagingRing;
    if (!b.uploaded) CUDA_CHECK(cudaEventCreateWithFlags(&b.uploaded, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventSynchronize(b.uploaded));  // this buffer's upload of kStagingRing launches ago is done
    if (b.cap < bytes) {
      if (b.host) CUDA_CHECK(cudaFreeHost(b.host));
      b.host = nullptr;
      b.cap = 0;
      CUDA_CHECK(cudaMallocHost(&b.host, bytes));
      b.cap = bytes;
    }
    std::memcpy(b.host, slots.data(), slot_bytes);
    std::memcpy(static_cast<char*>(b.host) + slot_bytes, chunks.data(), chunks.size() * sizeof(Chunk));
    CUDA_CHECK(cudaMemcpyAsync(dev.get(), b.host, bytes, cudaMemcpyHostToDevice, ctx.stream));
    CUDA_CHECK(cudaEventRecord(b.uploaded, ctx.stream));
  }
  const auto* dslots = static_cast<const Slot*>(dev.get());
  const auto* dchunks = reinterpret_cast<const Chunk*>(static_cast<const char*>(dev.get()) + slot_bytes);
  kernel<<<static_cast<unsigned>(chunks.size()), kBlock, 0, ctx.stream>>>(dslots, dchunks, consts);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_multi(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq, const AdamWArgs& args) {
  INGOT_INTERNAL_CHECK(grads.size() == params.size() && exp_avg.size() == params.size() &&
                       exp_avg_sq.size() == params.size());
  const AdamWConsts c = adamw_consts(args, "adamw_multi");  // the CPU kernel's constants
  if (params.empty()) return;
  std::vector<Slot> slots;
  for (size_t i = 0; i < params.size(); ++i) {
    check_slot("adamw_multi", i, params[i], grads[i], {&exp_avg[i], &exp_avg_sq[i]}, /*bf16_params=*/true);
    check_same_device("adamw_multi", {&params[0], &params[i]});
    slots.push_back(Slot{params[i].data_ptr(), grads[i].data_ptr(), exp_avg[i].data<float>(),
                         exp_avg_sq[i].data<float>(), params[i].numel(), grads[i].dtype(), params[i].dtype()});
  }
  launch("adamw_multi", params[0], slots, adamw_kernel, c);
}

// momentum[i] is unused (and may be undefined) when args.momentum == 0.
void sgd_multi(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& momentum,
               const SgdArgs& args) {
  INGOT_INTERNAL_CHECK(grads.size() == params.size() && momentum.size() == params.size());
  if (params.empty()) return;
  SgdConsts c;
  c.lr = static_cast<float>(args.lr);
  c.mu = static_cast<float>(args.momentum);
  c.damp = static_cast<float>(1.0 - args.dampening);
  c.wd = static_cast<float>(args.weight_decay);
  c.scale = static_cast<float>(args.grad_scale);
  c.use_momentum = args.momentum != 0.0;
  c.nesterov = args.nesterov;
  c.first = args.first_step;
  std::vector<Slot> slots;
  for (size_t i = 0; i < params.size(); ++i) {
    if (c.use_momentum) check_slot("sgd_multi", i, params[i], grads[i], {&momentum[i]});
    else check_slot("sgd_multi", i, params[i], grads[i], {});
    check_same_device("sgd_multi", {&params[0], &params[i]});
    slots.push_back(Slot{params[i].data<float>(), grads[i].data_ptr(),
                         c.use_momentum ? momentum[i].data<float>() : nullptr, nullptr, params[i].numel(),
                         grads[i].dtype()});
  }
  launch("sgd_multi", params[0], slots, sgd_kernel, c);
}

}  // namespace ingot::kernels::cuda
