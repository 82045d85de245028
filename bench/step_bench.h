// What bench_gpt2_step and bench_llama_step share: the timed step loop (CUDA events around each step after
// warm-up on GPUs, wall clock on CPUs; the median is reported), the compile-statistics line, and flag parsing.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/cli.h"
#include "compile/api.h"
#include "compile/exec/executor.h"
#include "distributed/bootstrap.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/process_group.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "recipes/profile.h"
#include "runtime/device.h"
#include "runtime/allocator.h"
#include "runtime/cuda_runtime.h"
#include "runtime/sm_budget.h"
#include "runtime/tensor.h"

namespace ingot::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct StepTimes {
  std::vector<double> ms;       // the measured steps (after warm-up)
  std::vector<double> host_ms;  // host time of each measured step's call (launching, not waiting)
  double pipelined_ms = 0;      // GPU: per step over `steps` steps queued back to back, loss read only at the end
  std::vector<double> queued_ms;  // GPU: each step queued whole behind a held stream before the GPU starts it
  double first_loss = 0, last_loss = 0;
  std::vector<double> losses;  // every step of the main loop, warm-up included
  double first_call_s = 0;  // compiled: trace + compile + the first step (cold or warm cache)
  int64_t first_peak_bytes = 0;  // GPU: the allocator's peak from the caller's last reset through the first step
  double median_ms() const { return median(ms); }
};

// Runs `step` warmup + steps times; `step` returns the loss. Every step's loss is read on the host (as a
// training loop's logging would), after the stop event, so the read is not timed. `before` runs right after
// each step's start event is recorded, `after(s)` once its stop event completed (a step timeline's marks).
inline StepTimes time_steps(Device dev, int64_t warmup, int64_t steps, const std::function<Tensor()>& step,
                            const std::function<void()>& before = {},
                            const std::function<void(int64_t)>& after = {}) {
  StepTimes r;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<cuda::Event> e0, e1;
    if (dev.is_cuda()) {
      e0 = std::make_unique<cuda::Event>();
      e1 = std::make_unique<cuda::Event>();
      e0->record(cuda::current_stream(dev.index));
    }
    if (before) before();
    Tensor loss = step();
    const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s == 0) {
      if (dev.is_cuda()) cuda::synchronize_device(dev.index);
      r.first_call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    double step_ms;
    if (dev.is_cuda()) {
      e1->record(cuda::current_stream(dev.index));
      e1->synchronize();
      step_ms = e0->elapsed_ms(*e1);
    } else {
      step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    if (after) after(s);
    r.last_loss = loss.item();
    r.losses.push_back(r.last_loss);
    // Peak memory is that of the steady-state steps: a compiled function's first call traces the step eagerly
    // (and holds what eager holds), which no later step repeats.
    if (s == 0) {
      r.first_loss = r.last_loss;
      if (dev.is_cuda()) r.first_peak_bytes = allocator_for(dev).stats().peak_allocated_bytes;
      allocator_for(dev).reset_peak();
    }
    if (s >= warmup) {
      r.ms.push_back(step_ms);
      r.host_ms.push_back(host_ms);
    }
  }
  // Two more views of the same steps on a GPU: queued back to back (no host read between them, as in a loop
  // that logs every N steps), and each queued whole behind a 5 ms hold of the stream, so the GPU never waits
  // for the host and starts rested. A GPU at its power cap (an H200 running this step draws ~650-690 W of 700)
  // lowers its clocks with sustained load, so the three differ even with no host gaps: rested is fastest, back
  // to back slowest (bench/RESULTS.md, 2026-11-24, third session).
  if (dev.is_cuda() && steps > 0) {
    cuda::Event e0, e1;
    e0.record(cuda::current_stream(dev.index));
    Tensor loss;
    for (int64_t s = 0; s < steps; ++s) loss = step();
    e1.record(cuda::current_stream(dev.index));
    e1.synchronize();
    r.pipelined_ms = e0.elapsed_ms(e1) / static_cast<double>(steps);
    loss.item();
    for (int64_t s = 0; s < steps; ++s) {
      cuda::hold_stream(cuda::current_stream(dev.index), 5.0);
      e0.record(cuda::current_stream(dev.index));
      loss = step();
      e1.record(cuda::current_stream(dev.index));
      e1.synchronize();
      r.queued_ms.push_back(e0.elapsed_ms(e1));
      loss.item();
    }
  }
  return r;
}

// The host's time per call (guards, input copies, launches) and the step under the three ways of queueing.
inline void print_step_timing(const StepTimes& t) {
  if (t.pipelined_ms <= 0) return;
  std::printf("timing: host call %.3f ms/step (median); %.2f ms/step with a loss read after each step, %.2f ms "
              "back to back, %.2f ms (median) queued whole before the GPU starts it\n",
              median(t.host_ms), t.median_ms(), t.pipelined_ms, median(t.queued_ms));
}

// ---- data parallel (both benchmarks under `ingot launch`) -----------------------------------------------------

// The data-parallel world this process joins: one when started by a launcher with WORLD_SIZE > 1 (or, with
// `alone`, a world of one), none otherwise. A rank that sees several GPUs runs on cuda:LOCAL_RANK.
struct BenchWorld {
  std::optional<distributed::DistributedContext> dist;
  Device dev;
  int world = 1, rank = 0;
};
inline BenchWorld join_world(const std::string& device, bool alone = false) {
  BenchWorld w;
  const auto env = distributed::world_from_env();
  if (env && (env->world_size > 1 || alone)) w.dist = distributed::init_distributed();
  if (w.dist) {
    w.world = w.dist->info.world_size;
    w.rank = w.dist->info.rank;
  }
  w.dev = parse_device(device);
  if (w.dist && w.dev.is_cuda() && cuda_device_count() > 1) w.dev = Device::cuda(w.dist->info.local_rank);
  // The benchmark's GPU is the current device (timing events are made on the current device, and a legacy stream's
  // null handle names it: Note [Null streams name the current device]), as a recipe run makes it.
  if (w.dev.is_cuda()) cuda::set_device(w.dev.index);
  return w;
}

// The DDP flags both benchmarks take (--bucket-cap-mb MB, --reduce-dtype f32|bf16): checked when parsed, and
// turned into the DDP's options.
inline void check_ddp_flags(const char* program, double bucket_cap_mb, const std::string& reduce_dtype) {
  INGOT_CHECK(bucket_cap_mb > 0, program, ": --bucket-cap-mb must be positive, got ", bucket_cap_mb);
  INGOT_CHECK(reduce_dtype == "f32" || reduce_dtype == "bf16", program, ": --reduce-dtype must be f32 or bf16, got ",
              reduce_dtype);
}
inline distributed::DdpOptions ddp_options(double bucket_cap_mb, const std::string& reduce_dtype, int zero_stage = 0) {
  distributed::DdpOptions o;
  o.bucket_cap_mb = bucket_cap_mb;
  o.zero_stage = zero_stage;
  if (reduce_dtype == "bf16") o.reduce_dtype = DType::bf16;
  return o;
}

// The data parallelism of a benchmark step: DistributedDataParallel (DDP, ZeRO-1, ZeRO-2) or, at zero_stage 3,
// FullyShardedDataParallel (eager or traced into a compiled step), optionally with f32 master copies of 16-bit
// parameters (or shards) that the optimizer updates (what `ingot run` does with dtype bf16).
struct DataParallelStep {
  std::unique_ptr<distributed::DistributedDataParallel> ddp;
  std::unique_ptr<distributed::FullyShardedDataParallel> fsdp;
  std::unique_ptr<optim::MasterWeights> masters;
  std::string reduce_wire_dtype;  // ZeRO-3: "" or "bf16" / "f32" (FsdpOptions::reduce_wire_dtype)

  // Wraps `model` (nothing without a world). zero_stage 3: FSDP with `reshard_after_forward`, reduced in
  // `reduce_dtype` ("f32" or "bf16"; FSDP2's MixedPrecisionPolicy reduces in f32), `broadcast` false when each
  // rank loads its shards next (load_shards), `prefetch` for the eager step's prefetched gathers,
  // `keep_last_blocks` (Note [The last blocks kept], distributed/fsdp.h), `gather_embeddings` (Note
  // [Vocabulary-parallel embeddings] off).
  void wrap(nn::Module& model, const BenchWorld& w, int zero_stage, double bucket_cap_mb,
            const std::string& reduce_dtype, bool reshard_after_forward = true, bool broadcast = true,
            bool prefetch = false, int keep_last_blocks = 0, bool gather_embeddings = false) {
    if (!w.dist) return;
    if (zero_stage == 3) {
      distributed::FsdpOptions o;
      o.reshard_after_forward = reshard_after_forward;
      o.keep_last_blocks = keep_last_blocks;
      o.vocab_parallel_embeddings = !gather_embeddings;
      o.prefetch = prefetch;
      o.broadcast_parameters = broadcast;
      o.reduce_dtype = reduce_dtype == "bf16" ? DType::bf16 : DType::f32;
      if (!reduce_wire_dtype.empty()) o.reduce_wire_dtype = reduce_wire_dtype == "bf16" ? DType::bf16 : DType::f32;
      fsdp = std::make_unique<distributed::FullyShardedDataParallel>(model, w.dist->group, o);
      return;
    }
    ddp = std::make_unique<distributed::DistributedDataParallel>(
        model, w.dist->group, ddp_options(bucket_cap_mb, reduce_dtype, zero_stage));
    const char* sym = std::getenv("INGOT_SYMMETRIC_BUCKETS");
    if (sym && std::string(sym) == "1" && zero_stage == 0) {
      symmetric_buckets(w.dist->group);
      owns_bucket_allocator = true;
    }
  }
  bool owns_bucket_allocator = false;
  DataParallelStep() = default;
  DataParallelStep(const DataParallelStep&) = delete;
  DataParallelStep& operator=(const DataParallelStep&) = delete;
  ~DataParallelStep() {
    if (owns_bucket_allocator) compiler::set_bucket_allocator(nullptr);  // the windows go while the group lives
  }
  // INGOT_SYMMETRIC_BUCKETS=1 (measuring, compiled DDP): every bucket's buffer in an NCCL symmetric window of its own
  // (ProcessGroup::symmetric_empty), the same buffer every step (Note [Buckets from an allocator],
  // compile/exec/executor.h), so the in-place all-reduce runs NCCL's symmetric kernels, which slowed an isolated
  // product beside them ~40% less but made the DDP step slower at 2 and 4 GPUs (bench/RESULTS.md twenty-third and
  // twenty-fourth sessions): a switch for measuring, off by default. The buffers are made in the order the ranks
  // first run their buckets (the same on every rank) and handed out as views, so that nothing frees a window.
  static void symmetric_buckets(std::shared_ptr<distributed::ProcessGroup> group) {
    auto slots = std::make_shared<std::map<std::pair<const void*, int32_t>, Tensor>>();
    compiler::set_bucket_allocator([group, slots](const compiler::Graph* g, int32_t value, const Shape& shape,
                                                  DType dtype, Device device) {
      Tensor& slot = (*slots)[{g, value}];
      if (!slot.defined() || slot.shape() != shape || slot.dtype() != dtype)
        slot = group->symmetric_empty(shape, dtype, device);
      return from_blob(std::make_shared<Tensor>(slot), slot.data_ptr(), shape, dtype, device);
    });
  }
  // What the optimizer updates: `params` alone, DDP's shards or FSDP's; with `f32_masters`, f32 copies of them.
  std::vector<Tensor> optimizer_params(const std::vector<Tensor>& params, bool f32_masters) {
    std::vector<Tensor> p = fsdp ? fsdp->optimizer_params() : ddp ? ddp->optimizer_params() : params;
    if (!f32_masters) return p;
    masters = std::make_unique<optim::MasterWeights>(p);
    // ZeRO-3: no bf16 shards beside the masters (Note [Shards cast from their masters], distributed/fsdp.h).
    if (fsdp) fsdp->gather_from_masters(masters->master());
    return masters->master();
  }
  // After the backward: the reduction, the update (through the masters) and zero_grad.
  void step(optim::Optimizer& opt, nn::Module& model) {
    if (fsdp) fsdp->synchronize();
    if (masters) {
      if (ddp) ddp->synchronize();
      masters->copy_grads_to_master();
      opt.step();
      opt.zero_grad();
      masters->copy_to_model();
      if (ddp) ddp->after_step();
      model.zero_grad();
    } else if (ddp) {
      ddp->step(opt);
    } else {
      opt.step();
      opt.zero_grad();
    }
    if (ddp) ddp->zero_grad();
    if (fsdp) fsdp->zero_grad();
  }
};

// --sm-carveout N (Note [SM carve-out], runtime/sm_budget.h), both benchmarks: the SMs the compute kernels leave
// to NCCL's. Set process-wide before any kernel runs when the flag is given (otherwise INGOT_SM_CARVEOUT or none),
// and checked against the GPU at once, so a carve-out that leaves no SMs fails before the model is built.
inline CLI::Option* add_sm_carveout_flag(CLI::App& app, int& sms, const std::string& group) {
  return app.add_option("--sm-carveout", sms, "SMs left to communication kernels (0: none; default INGOT_SM_CARVEOUT)")
      ->group(group);
}
inline void apply_sm_carveout(const CLI::Option* flag, int sms, Device dev) {
  if (flag->count() > 0) set_sm_carveout(sms, "--sm-carveout");
  sm_carveout();  // a bad INGOT_SM_CARVEOUT fails here
  if (dev.is_cuda()) usable_sms(dev.index);
}
// The row label's carve-out part (" carveout 8"); "" without one.
inline std::string carveout_label() {
  return sm_carveout() > 0 ? " carveout " + std::to_string(sm_carveout()) : std::string();
}

// The row label's data-parallel part (" DDP x4 reduce bf16 cap 100 MB", " ZeRO-3 x4"); "" without a world.
inline std::string ddp_label(const BenchWorld& w, int zero_stage, const std::string& reduce_dtype,
                             double bucket_cap_mb, bool one_update = false, bool reshard_after_forward = true,
                             int keep_last_blocks = 0, bool gather_embeddings = false,
                             const std::string& reduce_wire_dtype = "") {
  if (!w.dist) return "";
  std::string label = (zero_stage > 0 ? " ZeRO-" + std::to_string(zero_stage) : std::string(" DDP")) + " x" +
                      std::to_string(w.world);
  if (reduce_dtype != "f32") label += " reduce " + reduce_dtype;
  if (zero_stage == 3 && !reduce_wire_dtype.empty() && reduce_wire_dtype != reduce_dtype)
    label += " wire " + reduce_wire_dtype;
  if (one_update) label += " one-update";
  if (zero_stage == 3 && !reshard_after_forward) label += " kept from forward to backward";
  if (zero_stage == 3 && reshard_after_forward && keep_last_blocks > 0)
    label += " last " + std::to_string(keep_last_blocks) + " kept";
  if (zero_stage == 3 && gather_embeddings) label += " embeddings gathered";
  if (zero_stage < 3 && bucket_cap_mb != distributed::DdpOptions{}.bucket_cap_mb) label += detail::str_cat(" cap ", bucket_cap_mb, " MB");
  return label;
}

// time_steps with rank 0's communication timeline of every timed step in `marks` (Note [Step timeline] in
// distributed/nccl_process_group.cpp) when `group` is given and the device is a GPU; plain time_steps otherwise.
inline StepTimes time_steps_with_timeline(Device dev, int64_t warmup, int64_t steps, const std::function<Tensor()>& step,
                                          distributed::ProcessGroup* group,
                                          std::vector<distributed::ProcessGroup::StepTimeline>* marks) {
  if (!group || !dev.is_cuda()) return time_steps(dev, warmup, steps, step);
  return time_steps(
      dev, warmup, steps, step, [&] { group->timeline_begin_step(cuda::current_stream(dev.index)); },
      [&](int64_t s) {
        auto m = group->timeline_end_step(cuda::current_stream(dev.index));
        if (m && s >= warmup) marks->push_back(*m);
      });
}

// The 'timeline:' line of a data-parallel step (rank 0, medians over the timed steps; Note [Step timeline] in
// distributed/nccl_process_group.cpp). Nothing when there are no marks (one process, or a CPU group). With
// `all_slots`, every collective of the last timed step follows, one 'timeline slot' line each, in issue order.
inline void print_timeline(const std::vector<distributed::ProcessGroup::StepTimeline>& marks, bool all_slots = false) {
  if (marks.empty()) return;
  auto med = [&](double distributed::ProcessGroup::StepTimeline::*field) {
    std::vector<double> v;
    for (const auto& m : marks) v.push_back(m.*field);
    return median(v);
  };
  using T = distributed::ProcessGroup::StepTimeline;
  const double step_ms = med(&T::step_ms), exposed = med(&T::exposed_ms);
  std::printf("timeline: rank 0, median of %zu steps: step %.2f ms, communication busy %.2f ms in %d collectives "
              "(%.0f MB), exposed %.2f ms, compute %.2f ms\n",
              marks.size(), step_ms, med(&T::comm_ms), marks.back().collectives, marks.back().bytes / 1e6, exposed,
              step_ms - exposed);
  // Where the exposed time is: the collectives whose waits stood longest (median over the steps), at most five.
  const size_t n_slots = marks.back().slots.size();
  std::vector<std::pair<double, size_t>> by_slot;
  for (size_t k = 0; k < n_slots; ++k) {
    std::vector<double> v;
    for (const auto& m : marks)
      if (k < m.slots.size()) v.push_back(m.slots[k].exposed_ms);
    if (const double e = median(v); e >= 0.05) by_slot.emplace_back(e, k);
  }
  std::sort(by_slot.rbegin(), by_slot.rend());
  if (by_slot.size() > 5) by_slot.resize(5);
  for (const auto& [e, k] : by_slot) {
    const T::Slot& sl = marks.back().slots[k];
    std::printf("timeline: exposed %.2f ms at collective %zu of %zu (%s, %.0f MB, ran %.2f-%.2f ms into the step)\n", e,
                k, n_slots, sl.op.c_str(), sl.bytes / 1e6, sl.start_ms, sl.end_ms);
  }
  if (!all_slots) return;
  for (size_t k = 0; k < n_slots; ++k) {
    const T::Slot& sl = marks.back().slots[k];
    std::printf("timeline slot %zu: %s %.0f MB, ran %.2f-%.2f ms, exposed %.2f ms\n", k, sl.op.c_str(), sl.bytes / 1e6,
                sl.start_ms, sl.end_ms, sl.exposed_ms);
  }
}

inline void print_compile_stats(const CompileStats& cs) {
  std::printf("compile: %lld graph(s), %lld break(s), %lld eager ops -> %lld launches (%lld generated kernels: %lld "
              "compiled, %lld reused, %lld from disk); trace %.0f ms, passes %.0f ms, codegen %.0f ms\n",
              static_cast<long long>(cs.compiles), static_cast<long long>(cs.graph_breaks.size()),
              static_cast<long long>(cs.compute_ops), static_cast<long long>(cs.launches),
              static_cast<long long>(cs.kernels), static_cast<long long>(cs.kernels_generated),
              static_cast<long long>(cs.kernels_reused), static_cast<long long>(cs.kernels_disk_hits),
              cs.time.trace_ms, cs.time.passes_ms, cs.time.codegen_ms);
  for (const std::string& b : cs.graph_breaks) std::printf("compile: graph break: %s\n", b.c_str());
  if (cs.cuda_graphs > 0)
    std::printf("compile: reduce-overhead: %lld CUDA graph(s) per call, %lld step(s) run between them\n",
                static_cast<long long>(cs.cuda_graphs), static_cast<long long>(cs.cuda_graph_host_steps));
  if (!cs.cuda_graph_fallback.empty())
    std::printf("compile: reduce-overhead without CUDA graphs: %s\n", cs.cuda_graph_fallback.c_str());
}

// --profile K: one more step under the op profiler (recipes/profile.h), its K most expensive ops as a table;
// `events`: timed by CUDA events on the stream with nothing synchronized (Note [Ops timed on the device]). Every
// rank runs the step (a data-parallel step's collectives need them all); the caller prints rank 0's table.
inline std::string profile_one_step(Device dev, int64_t k, bool events, const std::function<void()>& step) {
  if (k <= 0) return {};
  recipes::OpProfiler prof(events && dev.is_cuda() ? dev.index : -1);
  prof.start(0);
  step();
  prof.stop();
  return prof.top_ops_table(static_cast<int>(k));
}

}  // namespace ingot::bench
