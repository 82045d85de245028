// NCCL process group: CUDA collectives on one non-blocking communicator per group, issued on the group's own
// stream after the caller's stream, with a watchdog thread that completes Work handles and enforces timeouts.
//
// Note [Non-blocking communicators]
// The communicator is created with config.blocking = 0, so no NCCL call can block the host forever: a call may
// return ncclInProgress, after which ncclCommGetAsyncError is polled (with the group's timeout) until it
// leaves ncclInProgress before the next NCCL call. A stuck peer therefore shows up as a timeout here or in the
// watchdog, never as a hung host thread, and ncclCommAbort can always be called.
//
// Note [Settled before the end event]
// The end event of a collective must follow its kernel on the comm stream, and a non-blocking communicator may
// still be enqueueing that kernel when the call returns. So every issue polls the communicator until it is no
// longer in progress (one ncclCommGetAsyncError call when it already settled) before recording the event, not
// only when the call itself returned ncclInProgress. (It was not the cause of the default-mode compiled DDP drift
// on 2 and 4 H200s: a blocking communicator drifted alike. That was a device-side wait on another device's
// stream: Note [Null streams name the current device], runtime/cuda/check.h.)
//
// Note [Watchdog]
// Every issued collective records an event on the comm stream. The watchdog polls the events of the works in
// flight (oldest first): a completed event completes its Work; an event still pending past the timeout, a
// CUDA error, or an asynchronous NCCL error aborts the communicator (which makes the stuck kernels exit),
// then builds the failure report (op, sequence number, the ranks that never joined, ring buffer dumped to a
// file) and fails every Work in flight with it. The group is unusable afterwards.
//
// Tensors stay referenced by their Work until the watchdog sees the collective finish on the device, so the
// caching allocator cannot hand their memory to someone else while NCCL still uses it.
//
// Note [Released at the wait]
// ...or until a stream waits for the collective on the device (block_stream) when that stream is the one the
// tensors were made on: the caching allocator hands a freed block only to later work of the block's stream
// (Note [Streams], runtime/cuda/allocator.cpp), and that work now runs after the collective. Holding them until
// the watchdog saw the GPU finish kept a compiled step's buckets (and, per-bucket, their copies) allocated while
// the host, a step ahead, allocated the next forward: GPT-2 DDP's peak was 0.2-0.7 GB above the graph's values
// (INGOT_LOGS=memory, 2x H200, bench/RESULTS.md 2026-11-26).
//
// Note [Collectives in CUDA graphs]
// NCCL calls can be captured (reduce-overhead and max-autotune capture the compiled step, collectives
// included). A collective issued while the producer stream captures joins the capture: the comm stream waits
// on an event recorded in the capture, the NCCL kernel and the end event become graph nodes, and the
// collective_wait's stream wait joins the comm stream back. Such a Work is complete on the host at once (its
// kernels run at every replay, not now) and never reaches the watchdog, whose event queries would touch a
// capture; block_stream always adds the stream wait, so the capture's dependency edge exists. The Work keeps its
// tensors until that wait on the producer stream, as outside a capture (Note [Released at the wait]): the
// capture's allocations come from the producer stream's pool, and a block the graph frees while the NCCL node
// still reads it would be handed to a later node of the capture that writes it concurrently at every replay.
// The compiled step frees a reduce-scatter's input right after its start (the start is its last reader in the
// graph): with the tensors dropped at issue, reduce-overhead ZeRO-3 reduced the head unit's gradient from a
// block that the next backward kernels overwrote (2 H200s, losses off by 1e-3 from the fourth step).
//
// Note [Comm stream priority]
// Collectives run on a stream of the highest priority the device offers: when a bucket's reduction is ready,
// its kernels are scheduled before the compute kernels queued behind it, so the communication starts as soon
// as its gradients exist instead of after whichever backward kernels fill the GPU then.
//
// INGOT_COMM_STREAM_PRIORITY=low gives the comm stream the lowest priority instead: an A/B switch for measuring
// whether NCCL's kernels, scheduled ahead of the compute queued behind them, are what slows the compute beside
// them (issue 21); unset or "high", the default above.
//
// Note [Step timeline]
// timeline_begin_step / timeline_end_step (benchmarks) record timing events around every collective on the
// comm stream, and on the waiting stream where a collective_wait is reached, each step. Exposed
// communication is the time the compute stream stood at a wait whose collective had not finished: the sum
// over waits of max(0, collective end - wait reached). In a captured step the events are external event nodes
// (cudaEventRecordExternal), re-recorded at every replay, so a replayed step reports the same way.
#include <nccl.h>

#include <algorithm>
#include <map>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "distributed/process_group.h"
#include "runtime/cuda/check.h"
#include "runtime/device.h"
#include "runtime/kernels/kernels.h"

namespace ingot::distributed {

bool nccl_available() { return true; }

namespace {

// Note [Gathers cast on the comm stream]: set to 1, the cast runs on the producer stream.
bool gather_cast_on_compute() {
  static const bool on = [] {
    const char* v = std::getenv("INGOT_GATHER_CAST_ON_COMPUTE");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

// Note [Narrow wire, wide sum] (process_group.h), for measuring: INGOT_NARROW_WIRE=0 widens before an f32
// reduce-scatter instead (the base class's way: the same numbers, twice the bytes for bf16); =alltoall exchanges the
// chunks with ncclAlltoAll (NCCL 2.28+) instead of grouped sends and receives; unset or "send" the latter.
// The sum's blocks (INGOT_NARROW_WIRE_BLOCKS, default 32; 0 fills the GPU): the sum runs beside the compute as
// NCCL's own kernels do (~16-32 CTAs) rather than taking every SM between two compute kernels.
int64_t narrow_wire_blocks() {
  static const int64_t blocks = [] {
    const char* v = std::getenv("INGOT_NARROW_WIRE_BLOCKS");
    if (v == nullptr || *v == 0) return int64_t{32};
    char* end = nullptr;
    const long long b = std::strtoll(v, &end, 10);
    INGOT_CHECK(end != v && *end == 0 && b >= 0,
                "INGOT_NARROW_WIRE_BLOCKS must be a count >= 0 (0: fill the GPU), got '", v, "'");
    return static_cast<int64_t>(b);
  }();
  return blocks;
}

enum class NarrowWire { Send, AllToAll, Off };
NarrowWire narrow_wire_mode() {
  static const NarrowWire mode = [] {
    const char* v = std::getenv("INGOT_NARROW_WIRE");
    const std::string_view s = v == nullptr ? "" : v;
    if (s.empty() || s == "send") return NarrowWire::Send;
    if (s == "0") return NarrowWire::Off;
    INGOT_CHECK(s == "alltoall", "INGOT_NARROW_WIRE must be 'send', 'alltoall' or '0', got '", s, "'");
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 0)
    INGOT_FAIL("INGOT_NARROW_WIRE=alltoall needs NCCL 2.28 or newer (ncclAlltoAll); this build has NCCL ", NCCL_MAJOR,
               ".", NCCL_MINOR);
#endif
    return NarrowWire::AllToAll;
  }();
  return mode;
}

// NCCL's CTA policy for the communicator (ncclConfig_t::CTAPolicy): INGOT_NCCL_CTA_POLICY=default, efficiency
// (fewest CTAs that keep decent bandwidth: more SMs left to the compute beside a collective) or zero; unset keeps
// NCCL's own choice. Anything else is an error naming the variable. Measured: no change in the 8B ZeRO-3 step at
// 2 GPUs (bench/RESULTS.md 2026-11-27, twentieth session); a knob for other machines.
std::optional<int> cta_policy() {
  const char* v = std::getenv("INGOT_NCCL_CTA_POLICY");
  if (v == nullptr || std::string_view(v).empty()) return std::nullopt;
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
  INGOT_FAIL("INGOT_NCCL_CTA_POLICY needs NCCL 2.27 or newer (ncclConfig_t::CTAPolicy); this build has NCCL ",
             NCCL_MAJOR, ".", NCCL_MINOR);
#else
  const std::string_view s(v);
  if (s == "default") return NCCL_CTA_POLICY_DEFAULT;
  if (s == "efficiency") return NCCL_CTA_POLICY_EFFICIENCY;
  if (s == "zero") return NCCL_CTA_POLICY_ZERO;
  INGOT_FAIL("INGOT_NCCL_CTA_POLICY must be 'default', 'efficiency' or 'zero', got '", v, "'");
#endif
}

// Whether the comm stream gets the lowest priority (Note [Comm stream priority]): INGOT_COMM_STREAM_PRIORITY=low;
// unset, empty or "high" keeps the highest; anything else is an error naming the variable.
bool comm_stream_low_priority() {
  const char* v = std::getenv("INGOT_COMM_STREAM_PRIORITY");
  if (v == nullptr || std::string(v).empty() || std::string(v) == "high") return false;
  INGOT_CHECK(std::string(v) == "low", "INGOT_COMM_STREAM_PRIORITY must be 'high' or 'low', got '", v, "'");
  return true;
}

// For measuring only (issue 21: what slows the compute beside DDP's reductions), the values are then wrong:
// INGOT_ALL_REDUCE_PROBE=one reduces the first element of every all-reduce (the ranks still meet at each bucket, NCCL's
// kernel still runs, no bytes move), =skip issues none (no meeting, no kernel). Unset or empty: the whole tensor.
// Anything else is an error naming the variable.
std::optional<size_t> all_reduce_probe_count() {
  static const std::optional<size_t> count = []() -> std::optional<size_t> {
    const char* v = std::getenv("INGOT_ALL_REDUCE_PROBE");
    if (v == nullptr || std::string_view(v).empty()) return std::nullopt;
    const std::string_view s(v);
    if (s == "one") return size_t{1};
    INGOT_CHECK(s == "skip", "INGOT_ALL_REDUCE_PROBE must be 'one' or 'skip' (measuring only), got '", v, "'");
    return size_t{0};
  }();
  return count;
}

using Clock = std::chrono::steady_clock;

#define NCCL_CHECK(expr, comm)                                                                       \
  do {                                                                                               \
    ncclResult_t _ingot_r = (expr);                                                                  \
    if (_ingot_r != ncclSuccess && _ingot_r != ncclInProgress) [[unlikely]]                           \
      INGOT_FAIL("NCCL call ", #expr, " failed: ", ncclGetErrorString(_ingot_r),                      \
                 (comm) ? std::string(" (") + ncclGetLastError(comm) + ")" : std::string());         \
  } while (0)

ncclDataType_t nccl_dtype(DType d, const char* op) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::b8: return ncclUint8;
  }
  INGOT_FAIL(op, ": unsupported dtype ", dtype_name(d));
}

ncclRedOp_t nccl_op(ReduceOp op, DType d, const char* what) {
  INGOT_CHECK(d != DType::b8, what, ": bool tensors cannot be reduced");
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Avg:
      INGOT_CHECK(is_floating(d), what, ": avg needs a floating tensor, got ", dtype_name(d));
      return ncclAvg;
  }
  return ncclSum;
}

class NcclWork final : public Work {
 public:
  NcclWork(std::string op, int64_t seq, std::vector<Tensor> keep) : Work(std::move(op), seq), keep_(std::move(keep)) {
    CUDA_CHECK(cudaEventCreateWithFlags(&end_, cudaEventDisableTiming));
  }
  ~NcclWork() override { cudaEventDestroy(end_); }

  // Device-side wait: `stream` waits for the collective, the host does not.
  void block_stream(cuda::Stream stream) override {
    cuda::DeviceGuard guard(stream.device);  // Note [Null streams name the current device] (check.h)
    if (on_wait) on_wait(static_cast<cudaStream_t>(stream.handle));
    // A captured Work is complete on the host at once, but its wait is a graph edge (Note [Collectives in CUDA
    // graphs]): only an uncaptured, finished collective needs no stream wait.
    if (!captured && is_completed()) {
      wait();  // rethrows a failure
      return;
    }
    CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle), end_, 0));
    // Note [Released at the wait]
    if (stream.handle == producer_.handle && stream.device == producer_.device) release();
  }

  // Drops the references that kept the collective's tensors from the caching allocator (the watchdog, when the
  // collective finished, or a wait on the stream that made them).
  void release() {
    std::vector<Tensor> dropped;
    std::lock_guard<std::mutex> lock(keep_mu_);
    dropped.swap(keep_);
  }

  cudaEvent_t end_ = nullptr;
  Clock::time_point issued_ = Clock::now();
  cuda::Stream producer_;     // the stream the collective's tensors were made on (its caching-allocator stream)
  std::mutex keep_mu_;
  std::vector<Tensor> keep_;  // the tensors NCCL reads/writes, alive until the device is done
  bool captured = false;      // issued into a CUDA graph capture
  std::function<void(cudaStream_t)> on_wait;  // the step timeline's mark where a stream waits for this
};

// Records `e` on `s`; inside a capture as an external event node, so that the event is re-recorded at every
// replay and can be timed (Note [Step timeline]).
void record_timing(cudaEvent_t e, cudaStream_t s) {
  if (cuda::is_capturing(cuda::Stream{s}))
    CUDA_CHECK(cudaEventRecordWithFlags(e, s, cudaEventRecordExternal));
  else
    CUDA_CHECK(cudaEventRecord(e, s));
}

// Timing events of one step's collectives, reused slot by slot every step (Note [Step timeline]).
struct Timeline {
  bool on = false;
  cudaEvent_t begin = nullptr, end = nullptr;
  std::vector<cudaEvent_t> starts, ends, reached;
  std::vector<int> wait_slot;   // per wait of the step: the collective slot it waits for
  std::vector<double> bytes;    // per collective slot
  std::vector<std::string> ops;  // per collective slot
  int collectives = 0, waits = 0;          // this step so far
  int max_collectives = 0, max_waits = 0;  // the most any step issued (a replayed step issues none on the host)
  static cudaEvent_t make() {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  int next_collective(const char* op, double nbytes) {
    if (collectives == static_cast<int>(starts.size())) {
      starts.push_back(make());
      ends.push_back(make());
      bytes.push_back(0);
      ops.emplace_back();
    }
    bytes[static_cast<size_t>(collectives)] = nbytes;
    ops[static_cast<size_t>(collectives)] = op;
    max_collectives = std::max(max_collectives, collectives + 1);
    return collectives++;
  }
  void mark_wait(int slot, cudaStream_t s) {
    if (waits == static_cast<int>(reached.size())) {
      reached.push_back(make());
      wait_slot.push_back(0);
    }
    wait_slot[static_cast<size_t>(waits)] = slot;
    record_timing(reached[static_cast<size_t>(waits)], s);
    max_waits = std::max(max_waits, waits + 1);
    ++waits;
  }
  ~Timeline() {
    for (auto* v : {&starts, &ends, &reached})
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
    if (begin) cudaEventDestroy(begin);
    if (end) cudaEventDestroy(end);
  }
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
      : ProcessGroup(std::move(store), rank, size, std::move(options)) {
    int n = cuda_device_count();
    INGOT_CHECK(n > 0, "nccl group '", options_.name, "': no CUDA device is visible");
    const bool low_priority = comm_stream_low_priority();  // checked before anything is made
    [[maybe_unused]] const std::optional<int> policy = cta_policy();
    if (options_.device < 0) CUDA_CHECK(cudaGetDevice(&options_.device));
    device_ = options_.device;
    INGOT_CHECK(device_ < n, "nccl group '", options_.name, "': device ", device_, " does not exist (", n, " visible)");
    cuda::DeviceGuard guard(device_);

    // Rank 0's unique id reaches the others over MPI (bootstrap) or the store.
    ncclUniqueId id;
    std::string bytes;
    if (rank_ == 0) {
      NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
      bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
    }
    if (options_.broadcast_bytes) {
      bytes = options_.broadcast_bytes(bytes, 0);
    } else if (rank_ == 0) {
      store_->set("nccl_unique_id", bytes);
    } else {
      bytes = store_->get("nccl_unique_id", options_.rendezvous_timeout);
    }
    INGOT_CHECK(bytes.size() == sizeof id, "nccl group '", options_.name, "': the unique id from rank 0 has ",
                bytes.size(), " bytes, expected ", sizeof id);
    std::memcpy(&id, bytes.data(), sizeof id);

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // Note [Non-blocking communicators]
    config.commName = options_.name.c_str();
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    if (policy) config.CTAPolicy = *policy;
#endif
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      INGOT_FAIL("nccl group '", options_.name, "' rank ", rank_, "/", size_, ": ncclCommInitRankConfig failed: ",
                 ncclGetErrorString(r));
    }
    std::string err = settle("communicator init", true);
    if (!err.empty()) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      INGOT_FAIL(failure_message(-1, "communicator init", err));
    }
    windows_->comm = comm_;
    windows_->device = device_;
    const auto [least, greatest] = cuda::stream_priority_range(device_);  // Note [Comm stream priority]
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, low_priority ? least : greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&cast_ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaStreamCreateWithPriority(&sum_stream_, cudaStreamNonBlocking, low_priority ? least : greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&sum_ready_, cudaEventDisableTiming));
    watchdog_ = std::thread([this] { run_watchdog(); });
  }

  ~NcclProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    cuda::DeviceGuard guard(device_);
    windows_->close();  // symmetric_empty's tensors still alive keep their memory, unregistered
    if (comm_) {
      // Work still in flight means a peer may never come: abort rather than wait on it.
      bool clean = in_flight_.empty();
      if (clean) {
        ncclResult_t r = ncclCommFinalize(comm_);
        clean = (r == ncclSuccess || r == ncclInProgress) && settle("finalize").empty();
      }
      if (clean)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    for (auto& w : in_flight_) w->finish(std::make_exception_ptr(Error("nccl group destroyed with work in flight")));
    if (ready_) cudaEventDestroy(ready_);
    if (cast_ready_) cudaEventDestroy(cast_ready_);
    if (stream_) cudaStreamDestroy(stream_);
    if (sum_ready_) cudaEventDestroy(sum_ready_);
    if (sum_stream_) cudaStreamDestroy(sum_stream_);
  }

  std::string backend() const override { return "nccl"; }
  cuda::Stream comm_stream() const override { return {stream_, device_}; }
  void set_input_stream(cuda::Stream s) override {
    std::lock_guard<std::mutex> lock(issue_mu_);
    input_stream_ = s;
    has_input_stream_ = true;
  }

  void timeline_begin_step(cuda::Stream s) override {
    std::lock_guard<std::mutex> lock(issue_mu_);
    cuda::DeviceGuard guard(device_);
    if (!timeline_.on) {
      timeline_.on = true;
      timeline_.begin = Timeline::make();
      timeline_.end = Timeline::make();
    }
    timeline_.collectives = timeline_.waits = 0;
    CUDA_CHECK(cudaEventRecord(timeline_.begin, static_cast<cudaStream_t>(s.handle)));
  }

  std::optional<StepTimeline> timeline_end_step(cuda::Stream s) override {
    std::lock_guard<std::mutex> lock(issue_mu_);
    if (!timeline_.on) return std::nullopt;
    cuda::DeviceGuard guard(device_);
    CUDA_CHECK(cudaEventRecord(timeline_.end, static_cast<cudaStream_t>(s.handle)));
    CUDA_CHECK(cudaEventSynchronize(timeline_.end));
    auto at = [&](cudaEvent_t e) {
      float ms = 0;
      return cudaEventElapsedTime(&ms, timeline_.begin, e) == cudaSuccess ? static_cast<double>(ms) : -1.0;
    };
    StepTimeline r;
    r.step_ms = at(timeline_.end);
    r.slots.resize(static_cast<size_t>(timeline_.max_collectives));
    std::vector<std::pair<double, double>> spans;
    for (int k = 0; k < timeline_.max_collectives; ++k) {
      StepTimeline::Slot& sl = r.slots[static_cast<size_t>(k)];
      sl.op = timeline_.ops[static_cast<size_t>(k)];
      sl.bytes = timeline_.bytes[static_cast<size_t>(k)];
      const double a = at(timeline_.starts[static_cast<size_t>(k)]), b = at(timeline_.ends[static_cast<size_t>(k)]);
      if (a < 0 || b < a) continue;  // not recorded in this step (a slot of an earlier, longer step keeps -1)
      sl.start_ms = a;
      sl.end_ms = b;
      spans.emplace_back(a, b);
      ++r.collectives;
      r.bytes += sl.bytes;
    }
    std::sort(spans.begin(), spans.end());
    double reach = -1;
    for (auto [a, b] : spans) {  // the union of the spans: time the comm stream was busy
      if (a > reach) r.comm_ms += b - a;
      else if (b > reach) r.comm_ms += b - reach;
      reach = std::max(reach, b);
    }
    for (int j = 0; j < timeline_.max_waits; ++j) {
      const int slot = timeline_.wait_slot[static_cast<size_t>(j)];
      const double w = at(timeline_.reached[static_cast<size_t>(j)]);
      const double e = at(timeline_.ends[static_cast<size_t>(slot)]);
      if (w >= 0 && e > w) {
        r.exposed_ms += e - w;
        StepTimeline::Slot& sl = r.slots[static_cast<size_t>(slot)];
        if (sl.end_ms >= 0) sl.exposed_ms += e - w;
      }
    }
    return r;
  }

  std::shared_ptr<Work> all_reduce(Tensor& t, ReduceOp op) override {
    check(t, "all_reduce");
    // NCCL's symmetric kernels sum only (NCCL 2.27 release notes): an average of a tensor in a symmetric window
    // (symmetric_empty) is their sum, scaled on the comm stream after it (the same kernel and rounding as mul();
    // exact for a world of 2^k).
    const bool windowed = op == ReduceOp::Avg && windows_->holds(t.data_ptr());
    ncclRedOp_t rop = nccl_op(windowed ? ReduceOp::Sum : op, t.dtype(), "all_reduce");
    ncclDataType_t dt = nccl_dtype(t.dtype(), "all_reduce");
    std::function<cudaStream_t(cudaStream_t)> scale;
    if (windowed)
      scale = [&](cudaStream_t s) {
        const cuda::StreamScope on_comm(cuda::Stream{s, device_});
        kernels::cuda::unary(kernels::UnaryOp::MulScalar, t, t, 1.0 / size_);
        return s;
      };
    const std::optional<size_t> probe = all_reduce_probe_count();  // a bad value throws before any NCCL call
    return issue("all_reduce", t, {t}, [&](cudaStream_t s) {
      const size_t n = static_cast<size_t>(t.numel());
      if (probe && *probe == 0) return ncclSuccess;
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), probe ? std::min(n, *probe) : n, dt, rop, comm_, s);
    }, scale);
  }

  std::shared_ptr<Work> reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override {
    check(out, "reduce_scatter");
    check(in, "reduce_scatter");
    INGOT_CHECK(in.numel() == out.numel() * size_ && in.dtype() == out.dtype(),
                "reduce_scatter: input must hold world size (", size_, ") x output elements of the same dtype, got ",
                in.numel(), " ", dtype_name(in.dtype()), " elements in and ", out.numel(), " ",
                dtype_name(out.dtype()), " out");
    ncclRedOp_t rop = nccl_op(op, in.dtype(), "reduce_scatter");
    ncclDataType_t dt = nccl_dtype(in.dtype(), "reduce_scatter");
    return issue("reduce_scatter", in, {out, in}, [&](cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), dt, rop, comm_, s);
    });
  }

  std::shared_ptr<Work> all_gather(Tensor& out, const Tensor& in) override {
    check(out, "all_gather");
    check(in, "all_gather");
    INGOT_CHECK(out.numel() == in.numel() * size_ && in.dtype() == out.dtype(),
                "all_gather: output must hold world size (", size_, ") x input elements of the same dtype, got ",
                in.numel(), " ", dtype_name(in.dtype()), " elements in and ", out.numel(), " ",
                dtype_name(out.dtype()), " out");
    ncclDataType_t dt = nccl_dtype(in.dtype(), "all_gather");
    return issue("all_gather", in, {out, in}, [&](cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()), dt, comm_, s);
    });
  }

  // Note [Gathers cast on the comm stream]
  // Compiled and eager ZeRO-3 gather each unit's bf16 weights from its f32 masters: a memory-bound cast of the
  // shard (6 bytes a parameter; 66 casts, 13 ms of an 8B step's compute stream on 4 GPUs) right before a collective
  // that waits for nothing else. On the comm stream the cast runs in the collective's place in line, beside the
  // compute instead of in front of it (measured: the 8B step is the same within 0.1% either way, bench/RESULTS.md
  // 2026-11-27 twentieth session; kept so the compute stream holds only compute). The comm stream first waits for
  // the work queued on the producer stream (the optimizer's update of the masters), then casts, then the gather is
  // issued as any other (issue() makes it wait for the producer again: nothing more to wait for). The cast runs
  // before issue(), so a failing cast (an error thrown here) has taken no sequence number and left no collective
  // half issued, and the step timeline's busy time counts the gather alone, as before this change. The cast copy
  // comes from the producer stream's pool and is kept with the collective's tensors, so the allocator hands its
  // bytes back only at the producer stream's wait for the gather (Note [Released at the wait]), after the gather
  // read them. INGOT_GATHER_CAST_ON_COMPUTE=1 casts on the producer stream (the base class's way), for measuring.
  std::shared_ptr<Work> all_gather_cast(Tensor& out, const Tensor& in) override {
    if (in.dtype() == out.dtype() || gather_cast_on_compute()) return ProcessGroup::all_gather_cast(out, in);
    check(out, "all_gather_cast");
    check(in, "all_gather_cast");
    INGOT_CHECK(out.numel() == in.numel() * size_ && in.is_contiguous(),
                "all_gather_cast: output must hold world size (", size_, ") x input elements and the input must be "
                "contiguous, got ", in.numel(), " ", dtype_name(in.dtype()), " elements in and ", out.numel(), " ",
                dtype_name(out.dtype()), " out");
    ncclDataType_t dt = nccl_dtype(out.dtype(), "all_gather_cast");
    Tensor cast = empty(in.shape(), out.dtype(), in.device());
    {
      std::lock_guard<std::mutex> lock(cast_mu_);
      cuda::DeviceGuard guard(device_);
      CUDA_CHECK(cudaEventRecord(cast_ready_, static_cast<cudaStream_t>(producer_stream().handle)));
      CUDA_CHECK(cudaStreamWaitEvent(stream_, cast_ready_, 0));
      const cuda::StreamScope on_comm(cuda::Stream{stream_, device_});
      cast.copy_(in);
    }
    return issue("all_gather", cast, {out, in, cast}, [&](cudaStream_t s) {
      return ncclAllGather(cast.data_ptr(), out.data_ptr(), static_cast<size_t>(cast.numel()), dt, comm_, s);
    });
  }

  std::shared_ptr<Work> all_to_all(Tensor& out, const Tensor& in) override {
    check(out, "all_to_all");
    check(in, "all_to_all");
    check_all_to_all(out, in);
    ncclDataType_t dt = nccl_dtype(in.dtype(), "all_to_all");
    const size_t count = static_cast<size_t>(in.numel() / size_), bytes = count * itemsize(in.dtype());
    auto* src = static_cast<const char*>(in.data_ptr());
    auto* dst = static_cast<char*>(out.data_ptr());
    return issue("all_to_all", in, {out, in}, [&](cudaStream_t s) {
      return exchange(s, src, dt, count, bytes, true, [&](int p) { return dst + static_cast<size_t>(p) * bytes; });
    });
  }

  // The grouped send/recv of reduce_scatter_widen below, without its sum: the other ranks' pieces land in `out`.
  std::shared_ptr<Work> exchange_chunks(Tensor& out, const Tensor& in) override {
    check(out, "exchange_chunks");
    check(in, "exchange_chunks");
    check_exchange(out, in);
    const ncclDataType_t dt = nccl_dtype(in.dtype(), "exchange_chunks");
    const size_t count = static_cast<size_t>(in.numel() / size_);
    const size_t bytes = count * itemsize(in.dtype());
    auto* src = static_cast<const char*>(in.data_ptr());
    auto* dst = static_cast<char*>(out.data_ptr());
    return issue("exchange_chunks", in, {out, in}, [&](cudaStream_t s) {
      return exchange(s, src, dt, count, bytes, false,
                      [&](int p) { return dst + static_cast<size_t>(p < rank_ ? p : p - 1) * bytes; });
    });
  }

  // Note [Narrow wire, wide sum] (process_group.h): the chunks cross in in's dtype through one grouped send/recv
  // (rank p's chunk q goes to rank q), then sum_pieces adds the world's pieces of this rank's chunk (its own read
  // from `in`, the others from the receive buffer) in out's dtype, in rank order, on a stream of its own that waits
  // for the exchange (the comm stream goes on with the next collective meanwhile), as part of the collective (its
  // Work ends after the sum; the step timeline counts both). The receive buffer holds world - 1
  // chunks and comes from the producer stream's pool like all_gather_cast's copy, kept until the wait.
  std::shared_ptr<Work> reduce_scatter_widen(Tensor& out, const Tensor& in, ReduceOp op) override {
    const NarrowWire mode = narrow_wire_mode();
    if (in.dtype() == out.dtype() || size_ == 1 || mode == NarrowWire::Off)
      return ProcessGroup::reduce_scatter_widen(out, in, op);
    check(out, "reduce_scatter_widen");
    check(in, "reduce_scatter_widen");
    check_widen(out, in, op);  // out is strictly wider here: the same dtype took the base class's way above
    INGOT_CHECK(in.numel() == out.numel() * size_ && (out.dtype() == DType::f32 || out.dtype() == DType::f64),
                "reduce_scatter_widen: input must hold world size (", size_, ") x output elements, summed into a "
                "wider f32/f64 output, got ", in.numel(), " ", dtype_name(in.dtype()), " elements in and ",
                out.numel(), " ", dtype_name(out.dtype()), " out");
    ncclDataType_t dt = nccl_dtype(in.dtype(), "reduce_scatter_widen");
    const int64_t chunk = out.numel();
    const size_t bytes = static_cast<size_t>(chunk) * itemsize(in.dtype());
    const bool all_to_all = mode == NarrowWire::AllToAll;
    // ncclAlltoAll writes every rank's slot, this rank's own too.
    Tensor recv = empty({chunk * (all_to_all ? size_ : size_ - 1)}, in.dtype(), in.device());
    auto* src = static_cast<const char*>(in.data_ptr());
    auto* dst = static_cast<char*>(recv.data_ptr());
    auto slot = [&](int peer) {
      return static_cast<size_t>(all_to_all || peer < rank_ ? peer : peer - 1) * bytes;
    };
    return issue(
        "reduce_scatter", in, {out, in, recv},
        [&](cudaStream_t s) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
          if (all_to_all) return ncclAlltoAll(src, dst, static_cast<size_t>(chunk), dt, comm_, s);
#endif
          return exchange(s, src, dt, static_cast<size_t>(chunk), bytes, false, [&](int p) { return dst + slot(p); });
        },
        [&](cudaStream_t s) {
          std::vector<Tensor> pieces;
          for (int p = 0; p < size_; ++p) {
            const bool own = p == rank_ && !all_to_all;  // this rank's chunk, never sent
            const int64_t at = static_cast<int64_t>(slot(p) / itemsize(in.dtype()));
            pieces.push_back(own ? in.as_strided({chunk}, {1}, in.offset() + rank_ * chunk)
                                 : recv.as_strided({chunk}, {1}, at));
          }
          CUDA_CHECK(cudaEventRecord(sum_ready_, s));
          CUDA_CHECK(cudaStreamWaitEvent(sum_stream_, sum_ready_, 0));
          const cuda::StreamScope on_sum(cuda::Stream{sum_stream_, device_});
          kernels::cuda::sum_pieces(out, pieces, op == ReduceOp::Avg ? 1.0 / size_ : 1.0, narrow_wire_blocks());
          return sum_stream_;
        });
  }

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  // ProcessGroup::symmetric_empty: ncclMemAlloc, then a window of its own registered with NCCL_WIN_COLL_SYMMETRIC.
  Tensor symmetric_empty(const Shape& shape, DType dtype, Device device) override {
    INGOT_CHECK(device == Device(DeviceType::cuda, device_), "symmetric_empty: this nccl group's device is cuda:",
                device_, ", got ", device.str());
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = std::max<size_t>(1, static_cast<size_t>(n) * itemsize(dtype));
    std::lock_guard<std::mutex> lock(issue_mu_);
    INGOT_CHECK(comm_ != nullptr, "symmetric_empty: nccl group '", options_.name, "' was aborted");
    cuda::DeviceGuard guard(device_);
    void* ptr = nullptr;
    ncclResult_t r = ncclMemAlloc(&ptr, bytes);
    INGOT_CHECK(r == ncclSuccess, "symmetric_empty: ncclMemAlloc of ", bytes, " bytes failed: ", ncclGetErrorString(r));
    ncclWindow_t win = nullptr;
    r = ncclCommWindowRegister(comm_, ptr, bytes, &win, NCCL_WIN_COLL_SYMMETRIC);
    const std::string err = r == ncclSuccess || r == ncclInProgress ? settle("symmetric_empty: window registration")
                                                                    : std::string(ncclGetErrorString(r));
    if (!err.empty()) {
      ncclMemFree(ptr);
      INGOT_FAIL("symmetric_empty: registering a window of ", bytes, " bytes failed: ", err);
    }
    windows_->add(ptr, win);
    std::shared_ptr<Windows> book = windows_;
    return from_blob(std::shared_ptr<void>(ptr, [book](void* p) { book->release(p); }), ptr, shape, dtype, device);
  }
#endif

  std::shared_ptr<Work> broadcast(Tensor& t, int root) override {
    check(t, "broadcast");
    INGOT_CHECK(root >= 0 && root < size_, "broadcast: root must be in [0, ", size_, "), got ", root);
    ncclDataType_t dt = nccl_dtype(t.dtype(), "broadcast");
    return issue("broadcast", t, {t}, [&](cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), dt, root, comm_, s);
    });
  }

  std::shared_ptr<Work> barrier() override {
    // A one-element all-reduce, as NCCL has no barrier; the host waits through Work::wait().
    Tensor token = zeros({1}, DType::f32, Device(DeviceType::cuda, device_));
    return issue("barrier", token, {token}, [&](cudaStream_t s) {
      return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm_, s);
    });
  }

 private:
  void check(const Tensor& t, const char* op) const {
    check_collective_tensor(t, op, true);
    INGOT_CHECK(t.device().index == device_, op, ": the tensor is on ", t.device().str(), " but nccl group '",
                options_.name, "' runs on cuda:", device_);
  }

  // Polls the communicator until it leaves ncclInProgress (Note [Non-blocking communicators]); returns an
  // error text, or "" when it settled successfully.
  std::string settle(const char* what, bool init = false) {
    Millis limit = init ? options_.rendezvous_timeout : options_.timeout;
    auto deadline = Clock::now() + limit;
    while (true) {
      ncclResult_t state = ncclInProgress;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return std::string(what) + ": ncclCommGetAsyncError failed: " + ncclGetErrorString(r);
      if (state == ncclSuccess) return "";
      if (state != ncclInProgress)
        return std::string(what) + ": " + ncclGetErrorString(state) + " (" + ncclGetLastError(comm_) + ")";
      if (Clock::now() > deadline)
        return std::string(what) + ": still in progress after the " + std::to_string(limit.count()) +
               " ms timeout";
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // One grouped send/recv: chunk p of `src` (`bytes` each) to rank p, rank p's chunk for this rank into into(p);
  // with `self`, this rank's own chunk too (NCCL copies it), else it is left where it is.
  template <typename Into>
  ncclResult_t exchange(cudaStream_t s, const char* src, ncclDataType_t dt, size_t count, size_t bytes, bool self,
                        Into&& into) {
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < size_ && (r == ncclSuccess || r == ncclInProgress); ++p) {
      if (p == rank_ && !self) continue;
      r = ncclSend(src + static_cast<size_t>(p) * bytes, count, dt, p, comm_, s);
      if (r == ncclSuccess || r == ncclInProgress) r = ncclRecv(into(p), count, dt, p, comm_, s);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r == ncclSuccess || r == ncclInProgress ? end : r;
  }

  // The stream a collective's inputs were made on: set_input_stream's, else the device's current one.
  cuda::Stream producer_stream() const { return has_input_stream_ ? input_stream_ : cuda::current_stream(device_); }

  // `then`: more work of the collective queued once NCCL's settled (reduce_scatter_widen's sum), given the comm stream
  // and returning the stream it ends on, where the end event is recorded.
  template <typename Call>
  std::shared_ptr<Work> issue(const char* op, const Tensor& t, std::vector<Tensor> keep, Call&& call,
                              const std::function<cudaStream_t(cudaStream_t)>& then = {}) {
    std::lock_guard<std::mutex> lock(issue_mu_);
    int64_t seq = begin(op, t);
    // The watchdog may have aborted the communicator while its failure report is still being written.
    INGOT_CHECK(comm_ != nullptr, op, " #", seq, ": nccl group '", options_.name,
                "' was aborted after a failed collective");
    cuda::DeviceGuard guard(device_);
    auto work = std::make_shared<NcclWork>(op, seq, std::move(keep));
    // The comm stream starts after the work already queued on the producer stream.
    work->producer_ = producer_stream();
    cudaStream_t producer = static_cast<cudaStream_t>(work->producer_.handle);
    work->captured = cuda::is_capturing(work->producer_);
    CUDA_CHECK(cudaEventRecord(ready_, producer));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    int slot = -1;
    if (timeline_.on) {
      slot = timeline_.next_collective(op, static_cast<double>(t.nbytes()));
      record_timing(timeline_.starts[static_cast<size_t>(slot)], stream_);
      work->on_wait = [this, slot](cudaStream_t s) {
        std::lock_guard<std::mutex> lock(issue_mu_);
        if (timeline_.on) timeline_.mark_wait(slot, s);
      };
    }
    recorder_.update(seq, FlightRecorder::State::Started);
    ncclResult_t r = call(stream_);
    std::string err;
    if (r != ncclSuccess && r != ncclInProgress)
      err = std::string(op) + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(comm_) + ")";
    else
      err = settle(op);  // Note [Settled before the end event]
    if (!err.empty()) {
      // Issuing failed or never settled: same treatment as a watchdog timeout.
      windows_->forget();
      ncclCommAbort(comm_);
      comm_ = nullptr;
      std::string msg = failure_message(seq, op, err);
      work->finish(std::make_exception_ptr(Error(msg)));
      fail_in_flight(msg);
      return work;
    }
    const cudaStream_t ends_on = then ? then(stream_) : stream_;
    if (slot >= 0) record_timing(timeline_.ends[static_cast<size_t>(slot)], ends_on);
    CUDA_CHECK(cudaEventRecord(work->end_, ends_on));
    if (work->captured) {  // Note [Collectives in CUDA graphs]: kept until the wait, never watched
      recorder_.update(seq, FlightRecorder::State::Completed);
      work->finish();
      return work;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      in_flight_.push_back(work);
    }
    cv_.notify_all();
    return work;
  }

  void fail_in_flight(const std::string& msg) {
    std::deque<std::shared_ptr<NcclWork>> failed;
    {
      std::lock_guard<std::mutex> l(mu_);
      failed.swap(in_flight_);
    }
    for (auto& w : failed) {
      recorder_.update(w->seq(), FlightRecorder::State::Failed);
      w->finish(std::make_exception_ptr(Error(msg)));
    }
  }

  void run_watchdog() {
    cudaSetDevice(device_);
    while (true) {
      std::shared_ptr<NcclWork> head;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_ || !in_flight_.empty(); });
        if (stop_) return;
        if (in_flight_.empty()) continue;
        head = in_flight_.front();
      }
      cudaError_t q = cudaEventQuery(head->end_);
      if (q == cudaSuccess) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          in_flight_.pop_front();
        }
        recorder_.update(head->seq(), FlightRecorder::State::Completed);
        head->release();
        head->finish();
        continue;
      }
      std::string cause;
      if (q != cudaErrorNotReady) {
        cause = std::string("CUDA error while it ran: ") + cudaGetErrorString(q);
      } else {
        ncclResult_t async = ncclSuccess;
        std::unique_lock<std::mutex> issue_lock(issue_mu_, std::try_to_lock);
        if (issue_lock.owns_lock() && comm_ && ncclCommGetAsyncError(comm_, &async) == ncclSuccess &&
            async != ncclSuccess && async != ncclInProgress) {
          cause = std::string("NCCL reported: ") + ncclGetErrorString(async) + " (" + ncclGetLastError(comm_) + ")";
        } else if (Clock::now() - head->issued_ > options_.timeout) {
          cause = "not finished after the " + std::to_string(options_.timeout.count()) + " ms timeout";
        }
      }
      if (cause.empty()) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      {
        // Abort first so the stuck kernels exit and no stream waits forever; then report.
        std::lock_guard<std::mutex> issue_lock(issue_mu_);
        windows_->forget();
        if (comm_) ncclCommAbort(comm_);
        comm_ = nullptr;
      }
      fail_in_flight(failure_message(head->seq(), head->op(), cause));
    }
  }

  // symmetric_empty's windows, by base address: a tensor's deleter deregisters and frees its own (collective: the
  // ranks free the same tensors in the same order), unless the group closed first.
  struct Windows {
    std::mutex mu;
    ncclComm_t comm = nullptr;
    int device = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    std::map<void*, ncclWindow_t> open;
    void add(void* p, ncclWindow_t w) {
      std::lock_guard<std::mutex> lock(mu);
      open[p] = w;
    }
    // Deregisters `w`, waiting while the non-blocking communicator has it in progress. Under mu.
    void deregister(ncclWindow_t w) {
      ncclResult_t r = ncclCommWindowDeregister(comm, w);
      for (ncclResult_t state = r; state == ncclInProgress;)
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
    }
    void release(void* p) {
      std::lock_guard<std::mutex> lock(mu);
      auto it = open.find(p);
      if (it == open.end() || comm == nullptr) return;  // closed: the memory stays, unregistered
      cuda::DeviceGuard guard(device);
      deregister(it->second);
      ncclMemFree(p);
      open.erase(it);
    }
#endif
    // Whether `p` is the start of one of this group's windows.
    bool holds(const void* p) {
      std::lock_guard<std::mutex> lock(mu);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
      return comm != nullptr && open.count(const_cast<void*>(p)) > 0;
#else
      (void)p;
      return false;
#endif
    }
    // The communicator aborted: nothing can be deregistered any more.
    void forget() {
      std::lock_guard<std::mutex> lock(mu);
      comm = nullptr;
    }
    void close() {
      std::lock_guard<std::mutex> lock(mu);
      if (comm == nullptr) return;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
      for (auto& [p, w] : open) deregister(w);
#endif
      comm = nullptr;
    }
  };
  std::shared_ptr<Windows> windows_ = std::make_shared<Windows>();

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t cast_ready_ = nullptr;  // all_gather_cast: the comm stream waits for the producer before casting
  std::mutex cast_mu_;                // guards cast_ready_'s record-and-wait
  // reduce_scatter_widen: its sum runs here once the exchange is done, so the comm stream goes on with the next
  // collective (a gather the compute waits for) meanwhile. Used under issue_mu_.
  cudaStream_t sum_stream_ = nullptr;
  cudaEvent_t sum_ready_ = nullptr;
  std::mutex issue_mu_;  // serializes NCCL calls (issue, async-error polls, abort)
  cuda::Stream input_stream_;
  bool has_input_stream_ = false;
  std::mutex mu_;  // guards in_flight_ and stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<NcclWork>> in_flight_;
  bool stop_ = false;
  Timeline timeline_;  // guarded by issue_mu_
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<ProcessGroup> new_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                                             ProcessGroupOptions options) {
  return std::make_shared<NcclProcessGroup>(std::move(store), rank, size, std::move(options));
}

}  // namespace ingot::distributed
