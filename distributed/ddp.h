// DistributedDataParallel (eager): every rank holds the whole model; gradients are averaged across ranks.
//
//   DistributedDataParallel ddp(model.parameters(), ctx.group);   // broadcasts rank 0's parameters
//   optim::AdamW opt(ddp.optimizer_params(), ...);                // plain: the parameters; ZeRO-1: shards
//   for (...) {
//     { auto guard = ddp.no_sync(); loss(micro0).backward(); }    // accumulate locally, no communication
//     loss(micro1).backward();                                    // buckets are all-reduced as they fill
//     ddp.step(opt);                                              // wait, (ZeRO-1: update shard, all-gather)
//     ddp.zero_grad();
//   }
//
// Buckets: parameters in reverse registration order (roughly the order backward produces their gradients)
// are packed into contiguous flat buffers of about bucket_cap_mb. A post-accumulate hook (autograd engine)
// copies each gradient into its bucket; when a bucket is full it is all-reduced (averaged) asynchronously
// while backward goes on. Buckets are issued strictly in bucket order, so every rank issues the same
// collectives in the same order even when they finish filling in different orders.
//
// The layout and the per-bucket reduction live in buckets.h, shared with the compiled step.
//
// ZeRO-1 (options.zero_stage 1): each bucket is padded to a multiple of the world size and reduce-scattered
// instead; rank r owns chunk r of every bucket: a flat f32-or-param-dtype "shard" tensor that the optimizer
// updates (so optimizer state is 1/world of the model), after which the shards are all-gathered into the
// parameters. The parameters' .grad and the bucket buffers stay whole from step to step.
// ZeRO-2 (zero_stage 2): the same shards, and no whole gradient outlives its bucket: each parameter's .grad is
// dropped as soon as it is copied into its bucket, and a bucket's buffer as soon as its reduce-scatter is done,
// so between steps a rank holds 1/world of the gradients (Note [ZeRO-2 frees gradients per bucket]). Under
// no_sync the .grad tensors accumulate whole, as in every stage. Stage 3 (weights sharded too) is
// FullyShardedDataParallel (fsdp.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "optim/optimizer.h"
#include "runtime/tensor.h"

namespace ingot::nn {
class Module;
}

namespace ingot::distributed {

struct DdpOptions {
  // 100 MiB, not PyTorch's 25: fewer, larger reductions slowed the compute beside them less in every DDP step
  // measured (GPT-2 124M and a ~1B Llama, compiled and eager, 2x H200: bench/RESULTS.md, seventeenth session).
  double bucket_cap_mb = 100.0;
  bool broadcast_parameters = true;  // copy rank `root`'s parameters to every rank at construction
  int root = 0;
  int zero_stage = 0;  // 0 (plain), 1 or 2; see above
  // The dtype gradients are averaged in (nullopt: the gradients' own). bf16 halves the bytes on the wire, as
  // PyTorch's bf16_compress_hook: each gradient is rounded to bf16 before the reduction and the average is
  // widened back to the parameter's dtype before the optimizer reads it. ZeRO-1/2: a reduction wider than the
  // parameters (f32 for bf16 weights) leaves the shards' .grad in that dtype, so f32 masters of the shards update
  // from the f32 average, as ZeRO-3 (Note [Reduced gradients keep their precision], fsdp.h).
  std::optional<DType> reduce_dtype;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::vector<Tensor> params, std::shared_ptr<ProcessGroup> group, DdpOptions options = {});
  // Uses the module's parameters; errors name them by their dotted path.
  DistributedDataParallel(const nn::Module& module, std::shared_ptr<ProcessGroup> group, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // While the returned guard lives, backward passes only accumulate into .grad (gradient accumulation: the
  // micro-steps before the last one).
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel* d);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel* d_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(this); }

  // Waits for the buckets of the last backward (issuing those that never filled: parameters without a
  // gradient on this rank count as zeros) and publishes the result: plain mode writes the averaged gradient
  // into every parameter's .grad; ZeRO-1/2 set each shard's .grad to this rank's averaged chunk.
  void synchronize();
  // What the optimizer must update: the parameters (plain) or this rank's shards (ZeRO-1/2).
  std::vector<Tensor> optimizer_params() const;
  // ZeRO-1/2: all-gathers the updated shards into the parameters. Plain: nothing to do.
  void after_step();
  // synchronize(); opt.step(); after_step().
  void step(optim::Optimizer& opt);
  // Drops the gradients of the parameters (and of the shards in ZeRO-1/2).
  void zero_grad();

  // Parameter indices (registration order) of each bucket, in issue order; for tests and logs.
  std::vector<std::vector<size_t>> bucket_layout() const;
  ProcessGroup& group() { return *group_; }

  struct State;

 private:
  void init(std::vector<Tensor> params, std::vector<std::string> names);
  void synchronize_traced();  // Note [DDP in a traced step] (ddp.cpp)
  void after_step_traced();
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  std::shared_ptr<State> state_;  // shared with the hooks, which hold it weakly
};

// The end of a step in a loop whose model may or may not be wrapped: DDP's step (reduction, update) and zero_grad
// when `ddp` is set, else the optimizer's own step and zero_grad.
void step_and_zero_grad(DistributedDataParallel* ddp, optim::Optimizer& opt);

}  // namespace ingot::distributed
