// Gloo process group: CPU collectives through libgloo's TCP transport. Rendezvous goes through our Store
// (a gloo::rendezvous::Store adapter). Gloo's algorithms are synchronous, so each group runs them in issue
// order on one worker thread; that thread is what makes the returned Work asynchronous (DDP's buckets are
// reduced while the backward pass continues on the caller's thread).
// Gloo enforces the timeout itself (its I/O throws after options.timeout); the error is turned into our
// failure report. bf16/f16 tensors are reduced in f32 (Gloo has no bf16 math); reduce_scatter is an
// all-reduce followed by taking this rank's chunk, as Gloo has no general reduce-scatter.
#include <cstring>
#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <thread>

#include "autograd/ops.h"
#include "distributed/process_group.h"
#include "runtime/allocator_census.h"
#include "runtime/kernels/kernels.h"

namespace ingot::distributed {

bool gloo_available() { return true; }

namespace {

// gloo::rendezvous::Store over an ingot Store.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<distributed::Store> s, Millis timeout) : s_(std::move(s)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = s_->get(key, timeout_);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { s_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    s_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<distributed::Store> s_;
  Millis timeout_;
};

std::string default_hostname() {
  if (const char* h = std::getenv("INGOT_GLOO_HOSTNAME"); h && *h) return h;
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) == 0 && buf[0]) return buf;
  return "127.0.0.1";
}

template <typename T>
gloo::AllreduceOptions::Func reduce_fn(ReduceOp op) {
  if (op == ReduceOp::Max) return [](void* c, const void* a, const void* b, size_t n) { gloo::max<T>(c, a, b, n); };
  return [](void* c, const void* a, const void* b, size_t n) { gloo::sum<T>(c, a, b, n); };
}

class GlooProcessGroup final : public ProcessGroup {
 public:
  GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
      : ProcessGroup(std::move(store), rank, size, std::move(options)) {
    gloo::transport::tcp::attr attr;
    attr.hostname = options_.hostname.empty() ? default_hostname() : options_.hostname;
    auto rdzv = std::make_shared<PrefixStore>("gloo", store_);
    GlooStoreAdapter adapter(rdzv, options_.rendezvous_timeout);
    try {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      context_ = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      context_->setTimeout(options_.rendezvous_timeout);
      context_->connectFullMesh(adapter, device);
      context_->setTimeout(options_.timeout);
    } catch (const Error& e) {
      INGOT_FAIL("gloo group '", options_.name, "' rank ", rank_, "/", size_, ": rendezvous failed: ", e.what());
    } catch (const std::exception& e) {
      INGOT_FAIL("gloo group '", options_.name, "' rank ", rank_, "/", size_, ": connecting to the peers (listening on ",
                 attr.hostname, ") failed: ", e.what());
    }
    worker_ = std::thread([this] { run_worker(); });
  }

  ~GlooProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  std::string backend() const override { return "gloo"; }

  std::shared_ptr<Work> all_reduce(Tensor& t, ReduceOp op) override {
    check_collective_tensor(t, "all_reduce", false);
    check_reducible(t, op, "all_reduce");
    return enqueue("all_reduce", t, [this, t, op](uint32_t tag) mutable { reduce_in_place(t, op, tag); });
  }

  std::shared_ptr<Work> reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override {
    check_collective_tensor(out, "reduce_scatter", false);
    check_collective_tensor(in, "reduce_scatter", false);
    check_reducible(in, op, "reduce_scatter");
    INGOT_CHECK(in.numel() == out.numel() * size_ && in.dtype() == out.dtype(),
                "reduce_scatter: input must hold world size (", size_, ") x output elements of the same dtype, got ",
                in.numel(), " ", dtype_name(in.dtype()), " elements in and ", out.numel(), " ",
                dtype_name(out.dtype()), " out");
    return enqueue("reduce_scatter", in, [this, out, in, op](uint32_t tag) mutable {
      Tensor tmp = in.clone_raw();
      reduce_in_place(tmp, op, tag);
      int64_t n = out.numel();
      out.copy_(tmp.as_strided(out.shape(), contiguous_strides(out.shape()), tmp.offset() + rank_ * n));
    });
  }

  std::shared_ptr<Work> all_gather(Tensor& out, const Tensor& in) override {
    check_collective_tensor(out, "all_gather", false);
    check_collective_tensor(in, "all_gather", false);
    INGOT_CHECK(out.numel() == in.numel() * size_ && in.dtype() == out.dtype(),
                "all_gather: output must hold world size (", size_, ") x input elements of the same dtype, got ",
                in.numel(), " ", dtype_name(in.dtype()), " elements in and ", out.numel(), " ",
                dtype_name(out.dtype()), " out");
    return enqueue("all_gather", in, [this, out, in](uint32_t tag) mutable {
      gloo::AllgatherOptions o(context_);
      o.setInput(static_cast<uint8_t*>(in.data_ptr()), in.nbytes());
      o.setOutput(static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
      o.setTag(tag);
      o.setTimeout(options_.timeout);
      gloo::allgather(o);
      out.bump_version();
    });
  }

  std::shared_ptr<Work> all_to_all(Tensor& out, const Tensor& in) override {
    check_collective_tensor(out, "all_to_all", false);
    check_collective_tensor(in, "all_to_all", false);
    check_all_to_all(out, in);
    return enqueue("all_to_all", in, [this, out, in](uint32_t tag) mutable {
      alltoall(tag, in, out);
      out.bump_version();
    });
  }

  // Gloo's all-to-all into a whole-world buffer, this rank's own chunk then left out.
  std::shared_ptr<Work> exchange_chunks(Tensor& out, const Tensor& in) override {
    check_collective_tensor(out, "exchange_chunks", false);
    check_collective_tensor(in, "exchange_chunks", false);
    check_exchange(out, in);
    return enqueue("exchange_chunks", in, [this, out, in](uint32_t tag) mutable {
      Tensor all = empty({in.numel()}, in.dtype(), in.device());
      alltoall(tag, in, all);
      const size_t bytes = in.nbytes() / static_cast<size_t>(size_);
      auto* dst = static_cast<uint8_t*>(out.data_ptr());
      const auto* src = static_cast<const uint8_t*>(all.data_ptr());
      for (int p = 0, k = 0; p < size_; ++p)
        if (p != rank_) std::memcpy(dst + static_cast<size_t>(k++) * bytes, src + static_cast<size_t>(p) * bytes, bytes);
      out.bump_version();
    });
  }

  std::shared_ptr<Work> broadcast(Tensor& t, int root) override {
    check_collective_tensor(t, "broadcast", false);
    INGOT_CHECK(root >= 0 && root < size_, "broadcast: root must be in [0, ", size_, "), got ", root);
    return enqueue("broadcast", t, [this, t, root](uint32_t tag) mutable {
      gloo::BroadcastOptions o(context_);
      o.setOutput(static_cast<uint8_t*>(t.data_ptr()), t.nbytes());
      o.setRoot(root);
      o.setTag(tag);
      o.setTimeout(options_.timeout);
      gloo::broadcast(o);
      t.bump_version();
    });
  }

  std::shared_ptr<Work> barrier() override {
    return enqueue("barrier", Tensor(), [this](uint32_t tag) {
      gloo::BarrierOptions o(context_);
      o.setTag(tag);
      o.setTimeout(options_.timeout);
      gloo::barrier(o);
    });
  }

 private:
  struct Task {
    std::shared_ptr<Work> work;
    std::function<void(uint32_t)> fn;
  };

  static void check_reducible(const Tensor& t, ReduceOp op, const char* what) {
    DType d = t.dtype();
    INGOT_CHECK(d != DType::b8, what, ": bool tensors cannot be reduced");
    INGOT_CHECK(!(op == ReduceOp::Avg && is_integral(d)), what, ": avg needs a floating tensor, got ",
                dtype_name(d));
  }

  void reduce_in_place(Tensor& t, ReduceOp op, uint32_t tag) {
    // Gloo has no bf16/f16 arithmetic of ours: reduce an f32 copy and round once at the end.
    Tensor buf = (t.dtype() == DType::bf16 || t.dtype() == DType::f16) ? t.to(DType::f32) : t;
    gloo::AllreduceOptions o(context_);
    o.setTag(tag);
    o.setTimeout(options_.timeout);
    switch (buf.dtype()) {
      case DType::f32:
        o.setOutput(buf.data<float>(), buf.numel());
        o.setReduceFunction(reduce_fn<float>(op));
        break;
      case DType::f64:
        o.setOutput(buf.data<double>(), buf.numel());
        o.setReduceFunction(reduce_fn<double>(op));
        break;
      case DType::i32:
        o.setOutput(buf.data<int32_t>(), buf.numel());
        o.setReduceFunction(reduce_fn<int32_t>(op));
        break;
      case DType::i64:
        o.setOutput(buf.data<int64_t>(), buf.numel());
        o.setReduceFunction(reduce_fn<int64_t>(op));
        break;
      default:
        INGOT_FAIL("all_reduce: unsupported dtype ", dtype_name(buf.dtype()));
    }
    gloo::allreduce(o);
    // The average scales the sum where it lies: one pass over the buffer and no second buffer of its size (a
    // bucket: 498 MB for GPT-2 124M), the same kernel and rounding as mul().
    if (op == ReduceOp::Avg) kernels::cpu::unary(kernels::UnaryOp::MulScalar, buf, buf, 1.0 / size_);
    if (!buf.same(t)) t.copy_(buf);
    t.bump_version();
  }

  // Gloo's all-to-all of `in` into `out` (same bytes), on the worker thread with the collective's tag.
  void alltoall(uint32_t tag, const Tensor& in, const Tensor& out) {
    gloo::AlltoallOptions o(context_);
    o.setInput(static_cast<uint8_t*>(in.data_ptr()), in.nbytes());
    o.setOutput(static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
    o.setTag(tag);
    o.setTimeout(options_.timeout);
    gloo::alltoall(o);
  }

  std::shared_ptr<Work> enqueue(const std::string& op, const Tensor& t, std::function<void(uint32_t)> fn) {
    int64_t seq = begin(op, t);
    auto work = std::make_shared<Work>(op, seq);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({work, std::move(fn)});
    }
    cv_.notify_all();
    return work;
  }

  void run_worker() {
    const census::Owner owner("collectives: the Gloo worker's buffers");  // Note [Allocation census]
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      int64_t seq = task.work->seq();
      try {
        check_usable();
      } catch (const Error&) {
        // An earlier collective broke the group: fail at once, without another round of failure reports.
        recorder_.update(seq, FlightRecorder::State::Failed);
        task.work->finish(std::current_exception());
        continue;
      }
      recorder_.update(seq, FlightRecorder::State::Started);
      try {
        // Tags only need to differ between operations in flight at once; ours run one at a time.
        task.fn(static_cast<uint32_t>(seq & 0x7fffffff));
        recorder_.update(seq, FlightRecorder::State::Completed);
        task.work->finish();
      } catch (const std::exception& e) {
        std::string msg;
        try {
          msg = failure_message(seq, task.work->op(), e.what());
        } catch (const std::exception& e2) {
          msg = std::string(e.what()) + " (and building the failure report failed: " + e2.what() + ")";
        }
        task.work->finish(std::make_exception_ptr(Error(msg)));
      }
    }
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace

std::shared_ptr<ProcessGroup> new_gloo_group(std::shared_ptr<Store> store, int rank, int size,
                                             ProcessGroupOptions options) {
  return std::make_shared<GlooProcessGroup>(std::move(store), rank, size, std::move(options));
}

}  // namespace ingot::distributed
