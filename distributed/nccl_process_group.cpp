// NCCL process group: CUDA collectives on one non-blocking communicator per group, issued on the group's own
// stream after the caller's stream, with a watchdog thread that completes Work handles and enforces timeouts.
//
// Note [Non-blocking communicators]
// The communicator is created with config.blocking = 0, so no NCCL call can block the host forever: a call may
// return ncclInProgress, after which ncclCommGetAsyncError is polled (with the group's timeout) until it
// leaves ncclInProgress before the next NCCL call. A stuck peer therefore shows up as a timeout here or in the
// watchdog, never as a hung host thread, and ncclCommAbort can always be called.
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
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include "distributed/process_group.h"
#include "runtime/cuda/check.h"
#include "runtime/device.h"

namespace ingot::distributed {

bool nccl_available() { return true; }

namespace {

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
    if (is_completed()) {
      wait();  // rethrows a failure
      return;
    }
    CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle), end_, 0));
  }

  cudaEvent_t end_ = nullptr;
  Clock::time_point issued_ = Clock::now();
  std::vector<Tensor> keep_;  // the tensors NCCL reads/writes, alive until the device is done
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
      : ProcessGroup(std::move(store), rank, size, std::move(options)) {
    int n = cuda_device_count();
    INGOT_CHECK(n > 0, "nccl group '", options_.name, "': no CUDA device is visible");
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
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
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
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string backend() const override { return "nccl"; }
  cuda::Stream comm_stream() const override { return {stream_, device_}; }
  void set_input_stream(cuda::Stream s) override {
    std::lock_guard<std::mutex> lock(issue_mu_);
    input_stream_ = s;
    has_input_stream_ = true;
  }

  std::shared_ptr<Work> all_reduce(Tensor& t, ReduceOp op) override {
    check(t, "all_reduce");
    ncclRedOp_t rop = nccl_op(op, t.dtype(), "all_reduce");
    ncclDataType_t dt = nccl_dtype(t.dtype(), "all_reduce");
    return issue("all_reduce", t, {t}, [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), dt, rop, comm_, s);
    });
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

  template <typename Call>
  std::shared_ptr<Work> issue(const char* op, const Tensor& t, std::vector<Tensor> keep, Call&& call) {
    std::lock_guard<std::mutex> lock(issue_mu_);
    int64_t seq = begin(op, t);
    // The watchdog may have aborted the communicator while its failure report is still being written.
    INGOT_CHECK(comm_ != nullptr, op, " #", seq, ": nccl group '", options_.name,
                "' was aborted after a failed collective");
    cuda::DeviceGuard guard(device_);
    auto work = std::make_shared<NcclWork>(op, seq, std::move(keep));
    // The comm stream starts after the work already queued on the producer stream.
    cudaStream_t producer = has_input_stream_ ? static_cast<cudaStream_t>(input_stream_.handle)
                                              : cuda::raw_stream(device_);
    CUDA_CHECK(cudaEventRecord(ready_, producer));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    recorder_.update(seq, FlightRecorder::State::Started);
    ncclResult_t r = call(stream_);
    std::string err;
    if (r != ncclSuccess && r != ncclInProgress)
      err = std::string(op) + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(comm_) + ")";
    else if (r == ncclInProgress)
      err = settle(op);
    if (!err.empty()) {
      // Issuing failed or never settled: same treatment as a watchdog timeout.
      ncclCommAbort(comm_);
      comm_ = nullptr;
      std::string msg = failure_message(seq, op, err);
      work->finish(std::make_exception_ptr(Error(msg)));
      fail_in_flight(msg);
      return work;
    }
    CUDA_CHECK(cudaEventRecord(work->end_, stream_));
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
        head->keep_.clear();
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
        if (comm_) ncclCommAbort(comm_);
        comm_ = nullptr;
      }
      fail_in_flight(failure_message(head->seq(), head->op(), cause));
    }
  }

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::mutex issue_mu_;  // serializes NCCL calls (issue, async-error polls, abort)
  cuda::Stream input_stream_;
  bool has_input_stream_ = false;
  std::mutex mu_;  // guards in_flight_ and stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<NcclWork>> in_flight_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<ProcessGroup> new_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                                             ProcessGroupOptions options) {
  return std::make_shared<NcclProcessGroup>(std::move(store), rank, size, std::move(options));
}

}  // namespace ingot::distributed
