// reduce-overhead on GPUs: the compiled step captured into CUDA graphs once per signature and replayed, so a
// step costs a few graph launches instead of hundreds of kernel launches.
//
// Note [What is captured]
//   Steps run in the executable's order on a private stream. Maximal runs of steps that read no host value
//   become one CUDA graph each; a step that reads a host input runs normally between the graphs, every call,
//   except the optimizer update, whose hyper-parameter row (learning rate and step count change every call, and
//   kernel arguments are frozen into a graph) its kernel reads from device memory (Note [Scalars read from the
//   device]). The first call after the warm-up captures (and computes: each graph is launched as
//   soon as it is captured); later calls copy the args into the static input buffers, re-produce the host
//   inputs and launch. Values the normally-run steps read or write, the graph's results and its inputs stay
//   allocated for the life of the capture, at the addresses the graphs were captured with; a normal step that
//   returns a value in a new buffer has it copied back into the captured one.
//
// Note [Why a private stream is a private pool]
//   The caching allocator hands a block only to allocations on the stream it was made on
//   (runtime/cuda/allocator.cpp). Intermediates freed during capture go back to the private stream's pool, so
//   nothing outside the graphs (eager work runs on the device's current stream) can be given memory a later
//   replay writes. Results are cloned on the caller's stream after the replay, so what the caller keeps never
//   lives in the private pool either. The pool is held (Allocator::hold_pool) from the start of a capture until the
//   graphs are dropped: its free bytes, which every replay writes, count as in use in the allocator's stats and peak
//   (so a replayed step's printed peak is the memory it holds, not only what the allocator has handed out), and its
//   segments are not given back to the system (Note [Pools held for CUDA graphs], runtime/pool_accounting.h).
//
// Note [Scalars read from the device]
//   The fused AdamW update's scalars (learning rate, bias corrections, grad scale) change every call, and a
//   kernel's arguments are frozen into a graph. Its kernel can instead read them from device memory
//   (ExecStep::host_scalars, compile/exec/kernel_step.cpp): the capture launches it pointed at a slot of one
//   device buffer, and every call, before the graphs launch, computes the scalars on the host exactly as the
//   uncaptured step would (same doubles), stages them in pinned memory and copies them into that buffer on the
//   private stream. So the update is inside the graph: a step of forward, backward and update is one graph, and
//   a data-parallel step can update each bucket as soon as its reduction is done (CompileOptions::bucket_updates),
//   which between graphs it could not (a graph cannot end with a collective of the next one in flight). The
//   pinned buffers are a ring whose slot is rewritten only once the copy that read it has run.
//
// A capture that fails (an op that cannot be captured) ends the capture, finishes the call step by step and
// leaves this runner disabled with the reason: later calls run the executable normally.
#pragma once

#include <array>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "compile/exec/executor.h"
#include "runtime/cuda_runtime.h"

namespace ingot::compiler {

class GraphReplay {
 public:
  explicit GraphReplay(std::shared_ptr<const Executable> exe);
  ~GraphReplay();
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;

  // "" when the executable can be captured; else why not (then callers run it normally).
  static std::string unsupported_reason(const Executable& exe);

  std::vector<Tensor> run(const std::vector<Tensor>& args);
  const std::string& disabled_reason() const { return disabled_; }
  size_t graphs() const;     // CUDA graphs in the current capture
  size_t host_steps() const;  // steps run normally between them

 private:
  struct Segment {
    void* exec = nullptr;  // a CUDA graph of steps [begin, end), or null: step `begin` runs normally
    size_t begin = 0, end = 0;
  };
  std::vector<Tensor> capture(const std::vector<Tensor>& args);
  std::vector<Tensor> replay(const std::vector<Tensor>& args);
  std::vector<Tensor> results(const std::vector<Tensor>& env);
  bool still_valid(const std::vector<Tensor>& args) const;
  void drop_capture();
  // Computes the device-scalar steps' scalars from env's host inputs and copies them to scalars_dev_ (stream_).
  void upload_scalars(const std::vector<Tensor>& env);
  // Step k inside a capture: a device-scalar step reads its slot of scalars_dev_; any other step runs as usual.
  void capture_step(size_t k, std::vector<Tensor>& env);

  static constexpr size_t kNoScalars = static_cast<size_t>(-1);
  struct ScalarStaging {
    double* host = nullptr;                // pinned, scalar_count_ doubles
    std::unique_ptr<cuda::Event> copied;  // recorded after the copy that read it
  };

  std::shared_ptr<const Executable> exe_;
  Device device_;
  std::vector<bool> host_step_;     // per exec step: reads a host value, runs normally
  std::vector<bool> keep_;          // per value: stays in env_ after the capture
  std::vector<std::vector<int32_t>> step_outputs_;
  int calls_ = 0;
  std::string disabled_;
  cuda::Stream stream_;
  std::vector<Segment> segments_;
  std::vector<Tensor> statics_;     // the args' static buffers
  std::vector<Tensor> env_;         // kept values at their captured addresses
  std::set<const Storage*> captured_;
  std::vector<const void*> captured_ptrs_;  // captured inputs' data pointers at capture time
  bool pool_held_ = false;                  // the private stream's pool, from a capture until drop_capture
  std::vector<size_t> scalar_offset_;       // per exec step: its slot in scalars_dev_, or kNoScalars
  size_t scalar_count_ = 0;                 // doubles in scalars_dev_
  Tensor scalars_dev_;                      // the device-scalar steps' scalars, refreshed before every launch
  std::array<ScalarStaging, 4> staging_;
  size_t next_staging_ = 0;
};

}  // namespace ingot::compiler
