// ProcessGroup: collectives over a fixed set of ranks, with asynchronous work handles.
//   new_gloo_group (gloo_process_group.cpp)  CPU tensors, real libgloo over TCP, rendezvous through a Store
//   new_nccl_group (nccl_process_group.cpp)  CUDA tensors, one non-blocking NCCL communicator per group,
//                                            a watchdog thread enforcing the timeout
// Every collective is numbered (its sequence number, the same on every rank) and recorded in a per-rank ring
// buffer (FlightRecorder). A collective that fails or outlives the group's timeout becomes an ingot::Error
// naming the op, the sequence number and the ranks that never joined it; the ring buffer is dumped to a file
// named in the error, and the group is unusable afterwards (every later call fails with the first error).
//
// Contract (as in every collective library): all ranks issue the same collectives in the same order, on
// tensors of the same shape and dtype; tensors must stay alive and untouched until their Work completes
// (the Work holds a reference, so dropping the handle is safe).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/store.h"
#include "runtime/cuda_runtime.h"
#include "runtime/tensor.h"

namespace ingot::distributed {

enum class ReduceOp { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);

// A handle to one issued collective.
class Work {
 public:
  Work(std::string op, int64_t seq) : op_(std::move(op)), seq_(seq) {}
  virtual ~Work() = default;

  bool is_completed() const;
  // Blocks the host until the collective finished (for CUDA: finished on the device) or failed, and throws its
  // error. `timeout` bounds only this wait ("wait timed out"); the group's own timeout still applies.
  void wait(Millis timeout = Millis::max());
  // CUDA collectives: makes `stream` wait for this collective without blocking the host (the compiled-step
  // path: an optimizer kernel waits only on its own bucket). CPU collectives: same as wait().
  virtual void block_stream(cuda::Stream stream);

  const std::string& op() const { return op_; }
  int64_t seq() const { return seq_; }

  // Backends: completes the work, with an error if it failed. Wakes waiters.
  void finish(std::exception_ptr error = nullptr);

 private:
  std::string op_;
  int64_t seq_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Per-rank ring buffer of the most recent collectives: what was issued and how far each got.
class FlightRecorder {
 public:
  enum class State { Scheduled, Started, Completed, Failed };
  struct Entry {
    int64_t seq = 0;
    std::string op;
    std::string dtype;
    int64_t numel = 0;
    State state = State::Scheduled;
    double t_issue_ms = 0, t_end_ms = 0;  // since the recorder was created
  };
  explicit FlightRecorder(size_t capacity) : capacity_(capacity ? capacity : 1) {}
  void record(int64_t seq, const std::string& op, const Tensor& t);
  void update(int64_t seq, State s);
  std::vector<Entry> entries() const;
  // Writes the entries as JSON (atomically) with the group's identity; returns the path.
  std::string dump(const std::string& path, const std::string& group, int rank, int size,
                   const std::string& reason) const;

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  std::deque<Entry> entries_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

struct ProcessGroupOptions {
  std::string name = "world";       // key namespace in the store, shown in errors
  Millis timeout{600000};           // every collective must finish within this
  Millis rendezvous_timeout{300000};  // creating the group: peers may still be starting
  std::string trace_dir;            // where the ring buffer is dumped on failure ("" = $INGOT_TRACE_DIR or /tmp)
  size_t trace_entries = 512;       // ring buffer capacity
  Millis report_grace{2000};        // on failure, how long to wait for peers to report their progress
  int device = -1;                  // NCCL: the CUDA device (-1 = the current device)
  // NCCL: how rank 0's unique id reaches the others. Empty = through the store; the MPI bootstrap sets it to
  // an MPI broadcast. Called collectively with (bytes on root, root), returns root's bytes on every rank.
  std::function<std::string(const std::string&, int)> broadcast_bytes;
  // Gloo: the address this rank listens on ("" = $INGOT_GLOO_HOSTNAME, else this host's name).
  std::string hostname;
};

class ProcessGroup {
 public:
  ProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options);
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const ProcessGroupOptions& options() const { return options_; }
  virtual std::string backend() const = 0;

  // In place on every rank: t = op over ranks of t.
  virtual std::shared_ptr<Work> all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // `in` holds size() equal chunks (in.numel() == size() * out.numel()); out = op over ranks of chunk rank().
  virtual std::shared_ptr<Work> reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::Sum) = 0;
  // out (out.numel() == size() * in.numel()) = concatenation of every rank's `in`, in rank order.
  virtual std::shared_ptr<Work> all_gather(Tensor& out, const Tensor& in) = 0;
  // in holds size() equal chunks, chunk q for rank q; out (same numel and dtype) gets rank p's chunk rank() as its
  // chunk p (an all-to-all: the exchange of Note [Narrow wire, wide sum]'s reduce-scatter, timed alone by
  // bench_allreduce --op all_to_all).
  virtual std::shared_ptr<Work> all_to_all(Tensor& out, const Tensor& in) = 0;
  // all_to_all without this rank's own chunk: in holds size() equal chunks, out (size() - 1 chunks) gets rank p's
  // chunk rank() for every other rank p, in rank order. Compiled ZeRO-3's narrow wire (Note [Narrow wire, wide
  // sum]) sends its gradients this way and sums the pieces as a graph op, which the optimizer update can read
  // directly (Note [Pieces read by the update], compile/passes/pieces_into_update.h). Gloo and NCCL have it; the
  // default refuses by name.
  virtual std::shared_ptr<Work> exchange_chunks(Tensor& out, const Tensor& in);
  // A tensor on `device` that NCCL may address from every rank: allocated by ncclMemAlloc and registered in a window
  // of its own with NCCL_WIN_COLL_SYMMETRIC (NCCL 2.27+), so a collective whose buffers all lie in such windows at the
  // same offsets on every rank runs NCCL's symmetric kernels (direct loads over NVLink, sums in f32 accumulators).
  // Collective: every rank allocates (and frees) the same sizes in the same order. A tensor outliving its group keeps
  // its memory unregistered. Here (Gloo, and NCCL builds without windows): empty(). Measured by bench_allreduce
  // --symmetric.
  virtual Tensor symmetric_empty(const Shape& shape, DType dtype, Device device);
  // all_gather of `in` cast to out's dtype (ZeRO-3 gathers bf16 weights from f32 masters). Here: the cast on the
  // current stream, then all_gather; NCCL casts on its communication stream instead (Note [Gathers cast on the
  // comm stream], nccl_process_group.cpp). The cast copy is kept until the collective read it.
  virtual std::shared_ptr<Work> all_gather_cast(Tensor& out, const Tensor& in);
  // Note [Narrow wire, wide sum]: reduce_scatter of `in` (a narrow floating dtype: bf16) into `out` of a wider
  // one (f32), op Sum or Avg: every rank's values as they are in `in`, summed in out's dtype. The same numbers as
  // widening `in` first and reducing in out's dtype (what this base class does, and what FSDP2 does with bf16
  // gradients and reduce_dtype f32), but NCCL sends only the narrow bytes: an all-to-all of the chunks in in's
  // dtype, then each rank adds the world's pieces of its chunk in out's dtype, in rank order, on a stream of its
  // own (kernels' sum_pieces): half of an f32 reduce-scatter's bytes for bf16. The pieces are not rounded on the
  // way (a bf16 ring reduce-scatter rounds every partial sum to bf16). Measured on the 8B ZeRO-3 step (4x H200):
  // ~1% faster than f32 on the wire, where NCCL's own bf16 reduce-scatter is ~3.5% faster (bench/RESULTS.md
  // 2026-11-27, twenty-second session): the sum's own pass over the pieces was the difference, so the compiled step
  // exchanges alone (exchange_chunks) and lets the optimizer update sum the pieces it reads (Note [Pieces read by
  // the update]: 2.5% faster than f32 on the wire, twenty-third session). Eager ZeRO-3 uses this call.
  // INGOT_NARROW_WIRE=0 makes NCCL widen first, as here, for measuring.
  virtual std::shared_ptr<Work> reduce_scatter_widen(Tensor& out, const Tensor& in, ReduceOp op);
  // t = root's t.
  virtual std::shared_ptr<Work> broadcast(Tensor& t, int root = 0) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // The stream collectives run on (CUDA backends; a null handle for CPU backends). Compiled steps order their
  // kernels against it with events, and pass the stream that produced a bucket via set_input_stream.
  virtual cuda::Stream comm_stream() const { return {}; }
  // CUDA backends: collectives issued after this call first wait for the work queued so far on `s` (default:
  // the device's current stream at issue time).
  virtual void set_input_stream(cuda::Stream) {}

  // One step of this rank's communication, from CUDA events (Note [Step timeline], nccl_process_group.cpp):
  // the step's time on the compute stream, the time the comm stream was busy, and the exposed part: the time
  // the compute stream stood at a collective_wait whose collective had not finished.
  struct StepTimeline {
    double step_ms = 0, comm_ms = 0, exposed_ms = 0, bytes = 0;
    int collectives = 0;
    // Per collective of the step, in issue order (the k-th collective of every step shares a slot): what it was,
    // when the comm stream ran it (ms from the step's start; -1 when not recorded this step) and how long the
    // waiting stream stood at its wait.
    struct Slot {
      std::string op;
      double bytes = 0, start_ms = -1, end_ms = -1, exposed_ms = 0;
    };
    std::vector<Slot> slots;
  };
  // Benchmarks: begin_step (on the stream the step is queued on) turns the timeline on and marks the step's
  // start; end_step marks its end, waits for it and returns the step's timeline. CPU backends: nullopt.
  virtual void timeline_begin_step(cuda::Stream) {}
  virtual std::optional<StepTimeline> timeline_end_step(cuda::Stream) { return std::nullopt; }

  FlightRecorder& recorder() { return recorder_; }
  Store& store() { return *store_; }
  // Sequence number the next collective will get (0 for the first).
  int64_t next_seq() const { return next_seq_; }

 protected:
  // Numbers and records a collective, after checking the group is still usable.
  int64_t begin(const std::string& op, const Tensor& t);
  // Builds the error for a collective that failed or timed out: publishes this rank's report, waits up to
  // report_grace for the peers' reports, names the ranks that never reported, dumps the ring buffer. Marks the
  // group broken. Thread-safe; callable from a watchdog thread.
  std::string failure_message(int64_t seq, const std::string& op, const std::string& cause);
  void check_usable() const;
  // reduce_scatter_widen's arguments: op sum or avg, floating dtypes, out at least as wide as in.
  static void check_widen(const Tensor& out, const Tensor& in, ReduceOp op);
  // all_to_all's arguments: in and out of one dtype, size() equal chunks each.
  void check_all_to_all(const Tensor& out, const Tensor& in) const;
  // exchange_chunks' arguments: world >= 2, in = size() chunks, out = size() - 1 of them, one dtype.
  void check_exchange(const Tensor& out, const Tensor& in) const;

  std::shared_ptr<Store> store_;  // a PrefixStore private to this group
  int rank_, size_;
  ProcessGroupOptions options_;
  FlightRecorder recorder_;

 private:
  int64_t next_seq_ = 0;
  mutable std::mutex broken_mu_;
  std::string broken_;  // first failure, "" while usable
};

// Throws naming what is wrong unless `t` is a defined, contiguous tensor on `device_type`'s side.
void check_collective_tensor(const Tensor& t, const char* op, bool want_cuda);

// Factories. `store` is shared by every group; each group namespaces its keys under options.name.
std::shared_ptr<ProcessGroup> new_gloo_group(std::shared_ptr<Store> store, int rank, int size,
                                             ProcessGroupOptions options = {});
std::shared_ptr<ProcessGroup> new_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                                             ProcessGroupOptions options = {});
bool gloo_available();  // built with Gloo
bool nccl_available();  // built with NCCL (a GPU may still be missing)

}  // namespace ingot::distributed
