// The training loop every training recipe shares (pretrain, full_finetune, lora_finetune): AdamW over the
// parameters a recipe chooses, a warm-up + decay LR schedule, gradient accumulation and clipping, optional bf16
// compute with f32 master weights, compile.enabled (the whole step traced into one graph; one step is a TrainStep,
// recipes/train_step.h), the progress line (recipes/progress_meter.h), metrics.jsonl / TensorBoard / profile /
// loss plot (recipes/run_outputs.h), training checkpoints with exact resume (recipes/checkpoint_io.h,
// recipes/train_state.h), periodic and final evaluation, and the summary JSON.
//
// A recipe builds its model and data, describes them as a TrainTask, and calls run_training:
//
//   TrainTask task;
//   task.model = model.get();  task.params = model->parameters();
//   task.loss = [&](const MicroBatch& b) { return model->loss(b.inputs, b.targets); };
//   task.next_batch = [&] { return MicroBatch{ids, targets}; };   // one micro-batch, CPU
//   task.save_final = [&] { model->save(...); return paths; };
//   TrainSummary r = run_training(settings.run, settings.train, task, log);
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/nn/module.h"
#include "models/decoder.h"
#include "recipes/config.h"
#include "recipes/run_settings.h"

namespace ingot::recipes {

// The final weights of a ZeRO-3 run, which no rank holds whole: fetch(i) assembles parameter i (TrainTask::params
// order, which is model.parameters()') on rank 0 from every rank's shard, in `dtype` when set (f32: the masters of
// a bf16 run), else the parameter's dtype, and returns an undefined tensor on the other ranks. It is collective:
// every rank fetches the same parameters in the same order, and rank 0 (`writer`) drops each before the next, so
// it holds one whole tensor beyond its shards.
struct ShardedWeights {
  std::function<Tensor(size_t param)> fetch;
  std::optional<DType> dtype;
  bool writer = false;
};

// Module::save's file (model.state_dict() by name, format=pt), byte for byte, from sharded weights: entries that
// are parameters (`params`) come from w.fetch in the writer's data order, the others (buffers) from the model;
// floating entries are written in w.dtype when set. Every rank calls it; rank 0 writes.
void save_module_streamed(const nn::Module& model, const std::vector<Tensor>& params, const std::string& path,
                          const ShardedWeights& w);

// Defaults of the train.* keys, which differ between pretraining and fine-tuning.
struct TrainDefaults {
  std::string batch_size = "16", lr = "1e-3", min_lr = "1e-4", warmup_steps = "100", lr_schedule = "cosine",
              weight_decay = "0.1", beta2 = "0.95", grad_clip = "1.0", log_every = "10", eval_batches = "20";
};

// Adds train.batch_size, gradient_accumulation_steps, lr, min_lr, warmup_steps, lr_schedule, weight_decay,
// beta1, beta2, grad_clip, log_every, eval_every, eval_batches, init_loss_scale, and optimizer.name, momentum,
// nesterov.
void add_train_keys(ConfigSchema& s, const TrainDefaults& d);

// The train.* section as typed values. Their defaults are the schema's (add_train_keys), which
// resolve_train_options reads; the initializers below are neutral values (no accumulation, no clipping, no
// decay) for code that builds options by hand, such as tests of one step, not a second set of defaults.
struct TrainOptions {
  int64_t batch_size = 1, grad_accum = 1, warmup_steps = 0, log_every = 1, eval_every = 0, eval_batches = 0;
  double lr = 0, min_lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, grad_clip = 0;
  std::string lr_schedule = "constant";
  std::string optimizer;            // optimizer.name: adamw, adamw8bit, sgd or lion
  double momentum = 0;              // optimizer.momentum (sgd)
  bool nesterov = false;            // optimizer.nesterov (sgd)
  double init_loss_scale = 1;       // train.init_loss_scale (dtype f16)
  bool master_weights = true;       // train.master_weights: bf16 weights updated through f32 masters, else in place
  bool optimizer_in_backward = false;  // train.optimizer_in_backward: compiled ZeRO-3 updates each unit in its backward
  bool optimizer_offload = false;  // train.optimizer_offload: the state in host memory (Note [Optimizer state offloaded])
  // train.activation_checkpointing and train.activation_checkpointing_layers (models::set_checkpointing).
  models::Checkpointing checkpointing = models::Checkpointing::none;
  int64_t checkpointing_layers = 0;  // the first N blocks; 0: every block
  int64_t loss_chunks = 0;           // train.loss_chunks (models::CausalLM::set_loss_chunks)
  bool trained_head_in_chunks = false;  // train.trained_head_in_chunks (models::CausalLM::set_trained_head_in_chunks)
};

// Reads the keys add_train_keys adds; problems (min_lr > lr, eval_every without eval_batches, an optimizer.* key
// the chosen optimizer does not read) go to `errors`.
TrainOptions resolve_train_options(const Config& cfg, ConfigErrors& errors);

// Figures that were not measured are empty (null in the summary JSON), never a 0 that reads like a result.
struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0, final_loss = 0, best_loss = 0;  // training loss of step 1, the last step, the lowest
  std::optional<double> val_loss;      // mean over train.eval_batches validation batches (none: no eval)
  std::optional<double> tokens_per_s;  // training steps of this process only (none: it ran no step)
  double train_s = 0;                  // training time of the whole run, earlier processes included
  std::optional<double> mfu;           // model FLOPs utilization (none when no device peak is known)
  // Compiler figures: counts are 0 while every run is eager; compile_s is empty then.
  std::optional<double> compile_s;
  int64_t graphs = 0, graph_breaks = 0, recompiles = 0;
  std::string compile_report;  // compile/explain.h's report of the compiled step ("" when eager)
  int64_t peak_memory_bytes = 0;  // the device allocator's high-water mark during this process's steps and eval
  int64_t num_parameters = 0;
  int64_t trainable_parameters = 0;  // what the optimizer updates (fewer than num_parameters with LoRA)
  int64_t resumed_from_step = 0;     // 0 for a fresh run
  std::string device, dtype, output_dir, config_file, resumed_from;
  std::vector<std::string> checkpoints;           // final files and directories written under output_dir
  std::vector<std::string> training_checkpoints;  // checkpoint directories kept at the end
  std::string metrics_log, loss_plot, tensorboard_dir, profile_trace;
};

// One micro-batch: inputs and targets [B, T] and, for packed documents (TrainTask::positions), each token's
// position within its document [B, T] (models/causal_lm.h).
struct MicroBatch {
  Tensor inputs, targets, positions;
};

// What a recipe trains and how it gets its data. Every callback runs on the calling thread.
struct TrainTask {
  std::string header;                 // the first log line (model, data, batch shape)
  nn::Module* model = nullptr;        // trained in place; checkpointed whole (frozen weights too)
  std::vector<Tensor> params;         // what AdamW updates: every parameter, or only the LoRA adapters
  // Loss of one micro-batch (on the run's device): a scalar the loop differentiates.
  std::function<Tensor(const MicroBatch&)> loss;
  // The next training micro-batch on the CPU; the loop moves it to the device.
  std::function<MicroBatch()> next_batch;
  // Whether every micro-batch carries positions (packed documents); they travel as a third tensor per
  // micro-batch, data of the compiled step like the ids.
  bool positions = false;
  // Targets that count in the loss (CPU targets of a micro-batch), when `loss` is a mean over a varying number
  // of them (fine-tuning masks prompts and padding). Data parallel then weighs each rank's mean by its share
  // of the global count, so the gradient is the global batch's token mean, as in one process. Empty: every
  // rank's micro-batch has as many loss targets.
  std::function<double(const Tensor& targets)> loss_tokens;
  // Where the data is (saved in checkpoints as one integer) and how to go back there on resume.
  std::function<int64_t()> data_position;
  std::function<void(int64_t)> set_data_position;
  // Mean validation loss (the loop switches the model to eval mode and disables gradients); empty: no eval.
  std::function<double()> evaluate;
  // Optional, for data-parallel runs: this rank's share of the evaluation as (summed loss, weight); the loop
  // sums both over the ranks and divides. Empty: every rank runs `evaluate` and the ranks' means are averaged.
  std::function<std::pair<double, double>(int rank, int world)> evaluate_shard;
  std::string eval_description;  // "20 batches", for the final eval line
  double tokens_per_step = 0;   // over all micro-batches of a step
  double flops_per_token = 0;   // for MFU (0: not reported)
  // Writes the recipe's final artifacts (weights are f32 again when the run kept bf16 masters) and returns
  // their paths; they go into the summary's `checkpoints`.
  std::function<std::vector<std::string>()> save_final;
  // ZeRO-3 (the weights stay sharded to the end): the same artifacts as save_final, written without ever holding
  // the model whole. Called on every rank (see ShardedWeights; rank 0 alone writes). Empty: ZeRO-3 runs unshard
  // the model on every rank and call save_final.
  std::function<std::vector<std::string>(const ShardedWeights& w)> save_final_sharded;
  // Shard-wise weight loading (ZeRO-3 fine-tuning, models::HFSliceReader; ZeRO-3 pretraining draws its initial
  // weights this way, build_pretrain_model in recipes/train.h): when set, the recipe built the model
  // without its weights and the loop fills them before the first step of a fresh run (a resume loads the
  // checkpoint instead): each rank only its shards' slices, or every parameter whole without data parallelism.
  // read(i, begin, end, dst) puts elements [begin, end) of parameter i's (task.params order) flattened value
  // into dst; bytes() says how many bytes this process read and how many the whole weights take. `drawn`: the
  // values are a fresh random initialization (ZeRO-3 pretraining: Note [Initial values drawn later],
  // autograd/nn/layers.h), not a checkpoint's, which the log line says.
  struct WeightSlices {
    std::function<void(size_t param, int64_t begin, int64_t end, Tensor& dst)> read;
    std::function<std::pair<uint64_t, uint64_t>()> bytes;
    bool drawn = false;
  };
  std::optional<WeightSlices> weight_slices;
  // Stops after this many completed steps as if the process had died there (no final eval, artifacts or
  // summary; checkpoints already written stay). 0: off. Tests use it to check exact resume.
  int64_t halt_after_steps = 0;
};

// Trains for run.max_steps optimizer steps (continuing from run.resume_checkpoint when set), evaluates, calls
// save_final and writes output_dir/summary.json. Progress line (recipes/progress_meter.h) every log_every steps
// (mem: the allocator's peak since the previous line; gnorm: the gradient norm before clipping, left out when not
// measured):
//   step 20/300 | loss 2.345 | lr 3.0e-04 | gnorm 0.84 | 12.3k tok/s | MFU 1.2% | mem peak 12.0 MiB | ETA 0:41
// Throws ingot::Error on failures (a non-finite loss, unwritable output, a corrupt checkpoint).
TrainSummary run_training(const RunSettings& run, const TrainOptions& opts, TrainTask& task, std::ostream& log);

// The summary as one JSON object, written atomically (an existing file is replaced only when complete).
std::string summary_json(const TrainSummary& r);
void write_summary(const TrainSummary& r, const std::string& path);

}  // namespace ingot::recipes
