// Data parallelism for the training loop: what `ingot launch --nproc-per-node N -- ingot run CONFIG` (or
// mpirun/srun) turns on, as torchrun + a torchtune recipe would.
//
//   every rank     holds the whole model, reads rows [r*B/W, (r+1)*B/W) of every global micro-batch of B rows
//                  (train.batch_size is the global batch), averages its gradients with the others through
//                  DistributedDataParallel (buckets reduced during the last micro-step's backward; earlier
//                  micro-steps of gradient accumulation run under no_sync), and logs the global mean loss
//   ZeRO-1/2       (distributed.zero_stage: 1, 2) the optimizer updates this rank's shards of the buckets only;
//                  stage 2 also drops every whole gradient once its bucket is reduced (distributed/ddp.h)
//   ZeRO-3         (distributed.zero_stage: 3) FullyShardedDataParallel (distributed/fsdp.h): the weights too
//                  are sharded, per transformer block, and gathered when used; every micro-step's backward
//                  reduce-scatters, so gradient accumulation sums shards, not whole gradients
//   rank 0 alone   prints progress and writes metrics, plots, checkpoints, final weights and the summary
//
// Checkpoints (Note [ZeRO-1 checkpoints hold the full optimizer state]): under DDP and ZeRO-1 rank 0 writes the
// same files a single process writes, the ZeRO-1 shards' optimizer state (and f32 masters) all-gathered first and
// stored per parameter under the plain optimizer's names. Under ZeRO-2/3 every rank writes its own slices of the
// weights, optimizer state and masters (recipes/sharded_checkpoint.h: no rank gathers anything; a bf16 ZeRO-3
// run holds no bf16 shards, so its weights are written as its f32 masters rounded, the bytes those shards held)
// and rank 0 commits them with one index; resuming ZeRO-2/3 from such a checkpoint reads only this rank's
// slices, under any world size. Either kind resumes under any world size and any stage (whole checkpoints are
// cut into shards, sharded ones assembled for DDP or one process). Every rank waits on a barrier after a
// save, so a restarted job always finds the newest checkpoint complete. The data position is the global batch
// index and the RNG streams advance identically on every rank, so rank 0's state.json is every rank's state.
#pragma once

#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "recipes/run_settings.h"
#include "runtime/tensor.h"

namespace ingot::nn {
class Module;
}

namespace ingot::recipes {

struct TrainOptions;  // recipes/train_loop.h

class ShardedCheckpoint;

class DataParallel {
 public:
  // Joins the job's default process group (gloo on CPU, nccl on CUDA for distributed.backend auto); blocks
  // until every rank arrived. Returns null when this process is not part of a multi-process job.
  static std::unique_ptr<DataParallel> join(const RunSettings& run, std::ostream& log);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const;
  int world_size() const;
  int zero_stage() const;
  bool sharded() const { return zero_stage() >= 1; }  // the optimizer updates per-rank shards
  const std::string& backend() const;

  // Wraps the trained parameters in DistributedDataParallel, or the whole model in FullyShardedDataParallel
  // (ZeRO-3: `params` must be all of the model's); rank 0's values are broadcast to every rank unless
  // `broadcast` is false (ZeRO-3 whose shards are loaded next: load_weight_shards or load_shards).
  void wrap(nn::Module& model, const std::vector<Tensor>& params, bool broadcast = true);
  // ZeRO-3: fills this rank's weight shards from a reader of parameter slices (FullyShardedDataParallel::
  // load_shards: this rank reads only its slices). Local; before gather_from_masters.
  void load_weight_shards(const std::function<void(size_t, int64_t, int64_t, Tensor&)>& read);
  // ZeRO-3 with f32 masters of the shards (optim::MasterWeights over optimizer_params()): the shards drop their
  // bytes and each unit's gathers read its master cast to the weights' dtype (Note [Shards cast from their
  // masters], distributed/fsdp.h). Sharded checkpoints then save the masters rounded as the weights (the bytes the
  // shards would hold) and resuming fills the masters only. Local; after the shards were filled.
  void gather_from_masters(const std::vector<Tensor>& masters);
  bool weights_from_masters() const;  // gather_from_masters was called
  // ZeRO-3: the parameter index whose token table is looked up where its rows lie (Note [Vocabulary-parallel
  // embeddings], distributed/fsdp.h); nullopt otherwise.
  std::optional<size_t> vocab_parallel_table() const;
  // What the optimizer updates: the parameters, or this rank's flat shards under ZeRO-1/2/3.
  std::vector<Tensor> optimizer_params() const;
  // One micro-step's backward: `sync` false accumulates locally (no_sync), true reduces the buckets as they
  // fill (or, with distributed.overlap false, leaves every reduction to synchronize()). ZeRO-3 reduces every
  // micro-step, sync or not.
  void backward(const Tensor& loss, bool sync);
  // Waits for the averaged gradients (DDP synchronize).
  void synchronize();
  // ZeRO-3, compiled steps: FullyShardedDataParallel::update_in_backward (Note [Updates in the backward]).
  void update_in_backward(std::function<void(size_t unit)> update, int lag);
  // ZeRO-1/2: all-gathers the updated shards into the parameters; nothing in plain DDP and ZeRO-3.
  void after_step();
  void zero_grad();

  double mean(double v);  // average over ranks
  double sum(double v);   // sum over ranks
  std::vector<double> sum(const std::vector<double>& v);  // elementwise sum over ranks
  // The sum over ranks as tensor ops (an all-reduce's start and wait nodes, times the world size): usable
  // inside a traced step, where the doubles above would read the value on the host and break the graph.
  Tensor sum_tensor(const Tensor& t);
  void barrier();

  // ZeRO-3: the whole weights in the model's parameters on every rank for good (the end of training);
  // collective. Nothing to do in the other stages, whose model is always whole.
  void unshard_model();
  // ZeRO-3: parameter i's whole value (params order) assembled on rank 0 from `shards` (optimizer_params() or
  // same-layout copies such as f32 masters), undefined on the other ranks; collective (FullyShardedDataParallel::
  // gather_param: rank 0 holds one whole tensor beyond its shards).
  Tensor gather_param(size_t i, const std::vector<Tensor>& shards) const;

  // ZeRO-1/2/3 checkpoints. Per-shard optimizer state ("<bucket>.<state>") -> per-parameter state
  // ("<param>.<state>", what a plain optimizer over the parameters holds); collective.
  std::map<std::string, Tensor> gather_optimizer_state(const std::map<std::string, Tensor>& shard_state);
  // The reverse: this rank's chunks of a per-parameter state.
  std::map<std::string, Tensor> scatter_optimizer_state(const std::map<std::string, Tensor>& param_state) const;
  // Per-bucket flat chunks (e.g. f32 masters of the shards) -> per-parameter tensors; collective.
  std::vector<Tensor> gather_to_params(const std::vector<Tensor>& chunks);
  // Per-parameter tensors -> this rank's chunk of each bucket.
  std::vector<Tensor> scatter_to_chunks(const std::vector<Tensor>& per_param) const;

  // ZeRO-2/3 sharded checkpoints (recipes/sharded_checkpoint.h); collective. Every rank writes its slices of
  // the weights (the shards, or after gather_from_masters `master_chunks` rounded to the weights' dtype: the
  // same bytes), of `shard_state` (the shards' optimizer state) and of `master_chunks` (f32 masters of the
  // shards, or none); rank 0 also writes the model's other entries, index.json and `state_json`, then commits
  // once every rank's files are written and synced. Returns the checkpoint's path.
  std::string save_sharded_checkpoint(const std::string& output_dir, int64_t step, const nn::Module& model,
                                      const std::map<std::string, Tensor>& shard_state,
                                      const std::vector<Tensor>& master_chunks, const std::string& state_json);
  // Resuming ZeRO-2/3 from a sharded checkpoint of any world size: this rank's chunks of the optimizer state
  // and masters (and, ZeRO-3 unless the weights come from the masters, of the weights, into the shards) read
  // from `c`, nothing else. Returns how many of the optimizer's 8-bit buckets took the checkpoint's codes as
  // written and how many were decoded and requantized (another layout: Note [Moments in their blocks]).
  struct EightBitLoad {
    int as_written = 0, requantized = 0;
  };
  EightBitLoad load_shards(const ShardedCheckpoint& c, const nn::Module& model, optim::Optimizer& opt,
                           const std::vector<Tensor>& master_chunks);

 private:
  struct Impl;
  explicit DataParallel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// train.batch_size is the global micro-batch: it must divide by the world size (an error naming the key).
void check_global_batch(const Config& cfg, const RunSettings& run, int64_t batch_size, ConfigErrors& errors);
// train.optimizer_in_backward under data parallelism: compiled ZeRO-3 only (errors naming the key). What it needs
// in any world is resolve_train_options' check (recipes/train_loop.cpp).
void check_optimizer_in_backward(const Config& cfg, const RunSettings& run, const TrainOptions& o,
                                 ConfigErrors& errors);

// Test hook: INGOT_TEST_KEEP_BF16_SHARDS=1 keeps ZeRO-3's 16-bit shards beside the f32 masters (the recipes
// before they called gather_from_masters), so tests can compare the two. False when unset.
bool keep_shards_for_test();

// Test hook: INGOT_TEST_KILL_AT_STEP=RANK:STEP SIGKILLs that rank right after it completed STEP (and saved any
// checkpoint of that step), on the launcher's first attempt only (INGOT_RESTART_COUNT 0 or unset).
void maybe_kill_for_test(int rank, int64_t step);

}  // namespace ingot::recipes
