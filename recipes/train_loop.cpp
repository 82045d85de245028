#include "recipes/train_loop.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <system_error>

#include "recipes/checkpoint.h"
#include "recipes/checkpoint_io.h"
#include "recipes/data_parallel.h"
#include "recipes/export_streamed.h"
#include "recipes/metrics.h"
#include "recipes/progress_meter.h"
#include "recipes/run_outputs.h"
#include "recipes/trainer.h"
#include "runtime/allocator.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

void add_train_keys(ConfigSchema& s, const TrainDefaults& d) {
  using T = ConfigType;
  using K = ConfigKey;
  s.add(K::of(T::Int, "train.batch_size", d.batch_size,
              "sequences per micro-batch over all ranks (the global batch; each of N ranks reads batch_size / N)")
            .at_least(1));
  s.add(K::of(T::Int, "train.gradient_accumulation_steps", "1", "micro-batches summed into one optimizer step")
            .at_least(1));
  s.add(K::of(T::Float, "train.lr", d.lr, "peak learning rate").at_least(0));
  s.add(K::of(T::Float, "train.min_lr", d.min_lr, "learning rate at the end of the decay").at_least(0));
  s.add(K::of(T::Int, "train.warmup_steps", d.warmup_steps, "linear warm-up steps").at_least(0));
  s.add(K::of(T::String, "train.lr_schedule", d.lr_schedule, "decay after warm-up")
            .one_of({"cosine", "linear", "constant"}));
  s.add(K::of(T::Float, "train.weight_decay", d.weight_decay,
              "weight decay: decoupled for adamw, adamw8bit and lion, added to the gradient for sgd")
            .at_least(0));
  s.add(K::of(T::Float, "train.beta1", "0.9",
              "adamw, adamw8bit: beta1; lion: the interpolation that gives the update's sign")
            .at_least(0)
            .at_most(0.999999));
  s.add(K::of(T::Float, "train.beta2", d.beta2, "adamw, adamw8bit: beta2; lion: the momentum's decay")
            .at_least(0)
            .at_most(0.999999));
  s.add(K::of(T::String, "optimizer.name", "adamw",
              "the update rule: adamw, adamw8bit (AdamW with its moments in 8 bits, block-wise quantized as "
              "bitsandbytes' AdamW8bit: ~2 bytes of state a parameter instead of 8), sgd (torch.optim.SGD, "
              "optimizer.momentum) or lion (Chen et al. 2023; try a train.lr 3-10x below AdamW's)")
            .one_of({"adamw", "adamw8bit", "sgd", "lion"}));
  s.add(K::of(T::Float, "optimizer.momentum", "0.9", "sgd: momentum (0: plain SGD)").at_least(0).at_most(0.999999));
  s.add(K::of(T::Bool, "optimizer.nesterov", "false", "sgd: Nesterov momentum"));
  s.add(K::of(T::Bool, "train.master_weights", "true",
              "dtype bf16: the optimizer updates f32 master copies of the weights (true), or the bf16 weights "
              "themselves, each update rounded stochastically so that steps below half a bf16 ulp still move a weight "
              "on average (false: no f32 copy, 4 bytes a parameter less: 32 GB for an 8B model; adamw or adamw8bit; "
              "under distributed.zero_stage >= 1 each rank updates its bf16 shard in place)"));
  s.add(K::of(T::Float, "train.init_loss_scale", "65536",
              "dtype f16: the first loss scale (halved on each step whose gradients overflow, which is skipped; "
              "doubled after 2000 good steps)")
            .at_least(1));
  s.add(K::of(T::Float, "train.grad_clip", d.grad_clip, "max global gradient norm (0: no clipping)").at_least(0));
  s.add(K::of(T::Bool, "train.optimizer_in_backward", "false",
              "update each parameter inside the backward as soon as its gradient is complete (one process, eager or "
              "compiled) or, under data parallelism, each ZeRO-3 unit's shard as soon as its gradient is reduced "
              "(distributed.zero_stage 3 and compile.enabled only), so no gradient waits for the whole backward, not "
              "even in the first (traced) step: an 8B full fine-tune's 16 GB of bf16 gradients on one GPU "
              "(torchtune's optimizer_in_bwd); the same updates. Needs train.grad_clip 0, "
              "train.gradient_accumulation_steps 1, no f32 masters, no f16, a compile.mode without CUDA graphs and, "
              "for ZeRO-3, compile.unit_reduction_lag >= 1"));
  s.add(K::of(T::Bool, "train.optimizer_offload", "false",
              "one process on a GPU: keep the optimizer's state in page-locked host memory and pass each parameter's "
              "through the GPU for its update in the backward (train.optimizer_in_backward), so the GPU holds the "
              "weights and activations but not the ~2 bytes a parameter of AdamW8bit's moments (an 8B full fine-tune "
              "in under 24 GB), at the price of two PCIe copies of the state a step; the same updates. Compiled steps "
              "bind each parameter's state just in time for its update (their first step runs eagerly); ignored on "
              "the CPU"));
  s.add(K::of(T::String, "train.activation_checkpointing", "none",
              "blocks: each decoder block keeps only its input for the backward, which runs the block's forward "
              "again (less activation memory for about one more forward; eager and compiled steps); mlp: only each "
              "MLP's norm, up-projections and activation are run again (most of a block's activation memory for about a "
              "third of the recomputation)")
            .one_of({"none", "blocks", "mlp"})
            .not_in_config_hash());
  s.add(K::of(T::Int, "train.loss_chunks", "0",
              "when the output head gets no gradient (LoRA, QLoRA, evaluation) the loss never holds all the logits: "
              "it makes them this many chunks of the batch's rows at a time (0: chunks of at most 256 MiB of "
              "logits; 1: all at once, with the most memory: 0.76 GB more for an 8B Llama at 2 x 2048 and no faster on an "
              "H200)")
            .at_least(0)
            .not_in_config_hash());
  s.add(K::of(T::Bool, "train.trained_head_in_chunks", "false",
              "a trained output head (full fine-tunes, pretraining) makes its logits train.loss_chunks at a time too, "
              "its weight's gradient computed with them in the forward and summed over the chunks (Note [Logits in "
              "chunks]): the logits are never whole, for no product more (on an H200: an 8B Llama's full fine-tune at "
              "2 x 2048 0.74-0.75 GB less at its peak, compiled or offloaded, at the same speed; GPT-2 124M at 16 x "
              "1024 1.39 GB less, 1.9% slower); the head's bf16 gradient is rounded once a chunk"));
  s.add(K::of(T::Int, "train.activation_checkpointing_layers", "0",
              "how many decoder blocks, from the first, train.activation_checkpointing covers (0: every block); "
              "each block left out keeps its activations (faster, more memory)")
            .at_least(0)
            .not_in_config_hash());
  s.add(K::of(T::Int, "train.log_every", d.log_every, "steps between progress lines").at_least(1).not_in_config_hash());
  s.add(K::of(T::Int, "train.eval_every", "0", "steps between validation evals (0: only at the end)")
            .at_least(0)
            .not_in_config_hash());
  s.add(K::of(T::Int, "train.eval_batches", d.eval_batches, "validation batches per eval (0: skip eval)")
            .at_least(0)
            .not_in_config_hash());
}

TrainOptions resolve_train_options(const Config& cfg, ConfigErrors& errors) {
  const ConfigReader rd(cfg, errors);
  TrainOptions o;
  o.batch_size = rd.i64("train.batch_size");
  o.grad_accum = rd.i64("train.gradient_accumulation_steps");
  o.lr = rd.f64("train.lr");
  o.min_lr = rd.f64("train.min_lr");
  if (o.min_lr > o.lr && !errors.has_error_for("train.lr") && !errors.has_error_for("train.min_lr"))
    errors.fail(cfg, "train.min_lr",
                cfg.value("train.min_lr").text + " must not exceed train.lr (" + cfg.value("train.lr").text + ")");
  o.warmup_steps = rd.i64("train.warmup_steps");
  o.lr_schedule = rd.str("train.lr_schedule");
  o.weight_decay = rd.f64("train.weight_decay");
  o.beta1 = rd.f64("train.beta1");
  o.beta2 = rd.f64("train.beta2");
  o.grad_clip = rd.f64("train.grad_clip");
  const std::string ckpt = rd.str("train.activation_checkpointing");
  o.checkpointing = ckpt == "blocks" ? models::Checkpointing::blocks
                    : ckpt == "mlp"  ? models::Checkpointing::mlp
                                     : models::Checkpointing::none;
  o.checkpointing_layers = rd.i64("train.activation_checkpointing_layers");
  o.loss_chunks = rd.i64("train.loss_chunks");
  o.trained_head_in_chunks = rd.flag("train.trained_head_in_chunks");
  if (o.checkpointing_layers > 0 && o.checkpointing == models::Checkpointing::none &&
      !errors.has_error_for("train.activation_checkpointing_layers"))
    errors.fail(cfg, "train.activation_checkpointing_layers",
                "is set but train.activation_checkpointing is none, so no block would be checkpointed");
  o.log_every = rd.i64("train.log_every");
  o.eval_every = rd.i64("train.eval_every");
  o.eval_batches = rd.i64("train.eval_batches");
  if (o.eval_every > 0 && o.eval_batches == 0)
    errors.fail(cfg, "train.eval_every", "is set but train.eval_batches is 0, so each eval would use no data");
  o.optimizer = rd.str("optimizer.name");
  o.momentum = rd.f64("optimizer.momentum");
  o.nesterov = rd.flag("optimizer.nesterov");
  // A key the chosen optimizer does not read is a mistake worth naming, not a silent no-op.
  auto set_by_user = [&](std::string_view key) {
    const ConfigOrigin& at = cfg.value(key).origin;
    return !at.file.empty() || !at.override_text.empty();
  };
  if (!errors.has_error_for("optimizer.name") && o.optimizer != "sgd")
    for (const char* key : {"optimizer.momentum", "optimizer.nesterov"})
      if (set_by_user(key))
        errors.fail(cfg, key, "is read by optimizer.name: sgd only, and optimizer.name is " + o.optimizer);
  if (o.optimizer == "sgd" && o.nesterov && o.momentum == 0 && !errors.has_error_for("optimizer.momentum"))
    errors.fail(cfg, "optimizer.nesterov", "true needs optimizer.momentum > 0 (it is 0)");
  if (o.optimizer != "sgd") o.momentum = 0, o.nesterov = false;
  // Note [Stochastic rounding] (runtime/kernels/scalar_math.h): the kernels that round bf16 weights are AdamW's.
  o.master_weights = rd.flag("train.master_weights");
  if (!o.master_weights && !errors.has_error_for("train.master_weights")) {
    const std::string dtype = cfg.value("dtype").text;
    if (dtype != "bf16")
      errors.fail(cfg, "train.master_weights",
                  "false updates bf16 weights without f32 masters, and dtype is " + dtype + ": set dtype=bf16");
    else if (o.optimizer != "adamw" && o.optimizer != "adamw8bit" && !errors.has_error_for("optimizer.name"))
      errors.fail(cfg, "train.master_weights",
                  "false rounds AdamW's updates into bf16 weights stochastically, and optimizer.name is " +
                      o.optimizer + ": use adamw or adamw8bit, or train.master_weights=true");
  }
  // What an update in the backward needs in any world: Note [Each parameter updated in its backward]
  // (recipes/train_step.cpp) for one process, Note [Updates in the backward] (distributed/fsdp_compiled.cpp) for
  // ZeRO-3 units; what only data parallelism needs is check_optimizer_in_backward's (recipes/data_parallel.cpp).
  o.optimizer_in_backward = rd.flag("train.optimizer_in_backward");
  if (o.optimizer_in_backward && !errors.has_error_for("train.optimizer_in_backward")) {
    auto need = [&](bool ok, const std::string& why) {
      if (!ok) errors.fail(cfg, "train.optimizer_in_backward", "true " + why);
    };
    need(o.grad_clip == 0, "updates a parameter before the others' gradients exist, so it cannot clip by the global "
                           "norm: set train.grad_clip=0");
    need(o.grad_accum == 1, "updates after each backward, and train.gradient_accumulation_steps is " +
                                std::to_string(o.grad_accum) + ": set it to 1");
    need(cfg.value("dtype").text != "bf16" || !o.master_weights,
         "updates the weights themselves, and dtype bf16 keeps f32 masters: set train.master_weights=false");
    need(cfg.value("dtype").text != "f16",
         "updates before the whole gradient is known to be finite, and dtype f16 skips the steps whose gradients "
         "overflow: use dtype bf16 or f32");
    // Under CUDA graphs an update that reads its step from the host splits the graphs, and a unit's reduction
    // would start in one graph and be waited for in another (compile/pipeline.cpp keeps one update there).
    const std::string mode = cfg.value("compile.mode").text;
    need(cfg.value("compile.enabled").text != "true" || mode == "default" || mode == "max-autotune-no-cudagraphs",
         "puts an update after each parameter's or unit's gradient, which CUDA graphs cannot hold, and compile.mode "
         "is " + mode + ": use default or max-autotune-no-cudagraphs");
  }
  // Note [Optimizer state offloaded] (optim/optimizer.cpp): the hooks of the update in the backward move the state.
  o.optimizer_offload = rd.flag("train.optimizer_offload");
  if (o.optimizer_offload && !errors.has_error_for("train.optimizer_offload")) {
    if (!o.optimizer_in_backward && !errors.has_error_for("train.optimizer_in_backward"))
      errors.fail(cfg, "train.optimizer_offload",
                  "true passes each parameter's state through the GPU for its update in the backward, and "
                  "train.optimizer_in_backward is false: set it true");
  }
  o.init_loss_scale = rd.f64("train.init_loss_scale");
  if (set_by_user("train.init_loss_scale") && cfg.value("dtype").text != "f16")
    errors.fail(cfg, "train.init_loss_scale", "is read with dtype: f16 only, and dtype is " + cfg.value("dtype").text);
  return o;
}

void save_module_streamed(const nn::Module& model, const std::vector<Tensor>& params, const std::string& path,
                          const ShardedWeights& w) {
  const std::map<std::string, Tensor> sd = model.state_dict();  // by name, as Module::save writes it
  std::vector<SafetensorsEntry> entries;
  std::vector<std::optional<size_t>> param_of;
  std::vector<Tensor> values;
  for (const auto& [name, t] : sd) {
    std::optional<size_t> p;
    for (size_t i = 0; i < params.size() && !p; ++i)
      if (params[i].same(t)) p = i;
    const DType dtype = w.dtype && is_floating(t.dtype()) ? *w.dtype : t.dtype();
    entries.push_back({name, dtype, t.shape()});
    param_of.push_back(p);
    values.push_back(t);
  }
  auto produce = [&](size_t k) { return param_of[k] ? w.fetch(*param_of[k]) : values[k]; };
  if (w.writer) {
    write_safetensors_streamed(path, entries, {{"format", "pt"}}, produce);
    return;
  }
  for (size_t k : safetensors_data_order(entries))  // the writer's order: every rank takes part in each gather
    if (param_of[k]) w.fetch(*param_of[k]);
}

namespace {

// What writing a run's final artifacts needs from run_training.
struct FinalExport {
  const RunSettings& run;
  TrainTask& task;
  DataParallel* dp;                  // null without data parallelism
  optim::MasterWeights* masters;     // bf16/f16: the f32 masters, else null
  CheckpointIO& checkpoints;
  int64_t start_step;
  std::ostream& log;
};

// Rank 0 (or the only process) before writing the final artifacts. Throws when output_dir cannot be made.
void prepare_output_dir(const FinalExport& e) {
  // A fresh run with overwrite_output_dir that saved no checkpoint.
  if (e.start_step == 0) e.checkpoints.remove_stale("");
  std::error_code ec;
  fs::create_directories(e.run.output_dir, ec);
  INGOT_CHECK(!ec, "cannot create output_dir '", e.run.output_dir, "': ", ec.message());
}

// ZeRO-3 with a streamed save: the weights stay sharded; every rank helps gather them onto rank 0 one
// parameter at a time (from the f32 master shards in bf16 mode) while rank 0 writes each and drops it.
// Returns whether this rank is the writer (rank 0), which goes on to the summary.
bool export_streamed(const FinalExport& e, TrainSummary& r) {
  DataParallel& dp = *e.dp;
  const bool is_main = dp.rank() == 0;
  Allocator& alloc = allocator_for(e.run.device);
  std::string error;
  if (is_main) {
    try {
      prepare_output_dir(e);
    } catch (const std::exception& x) {
      error = x.what();
    }
  }
  if (dp.sum(error.empty() ? 0.0 : 1.0) > 0) {  // the others would wait in the first gather
    INGOT_CHECK(error.empty(), error);
    INGOT_FAIL("rank 0 could not prepare output_dir '", e.run.output_dir, "' for the final weights (see its error)");
  }
  // With masters the shards hold no bytes (DataParallel::gather_from_masters): the masters are the weights,
  // f32 (an export in a narrower dtype rounds them as the shards were rounded).
  INGOT_INTERNAL_CHECK(e.masters || !dp.weights_from_masters(), "export_streamed: shards without bytes, no masters");
  const std::vector<Tensor> shards = e.masters ? e.masters->master() : dp.optimizer_params();
  ShardedWeights w;
  w.writer = is_main;
  if (e.masters) w.dtype = DType::f32;
  w.fetch = [&](size_t i) { return dp.gather_param(i, shards); };
  int64_t largest = 0, whole = 0;
  for (const Tensor& p : e.task.params) {
    const int64_t bytes = p.numel() * static_cast<int64_t>(itemsize(w.dtype.value_or(p.dtype())));
    largest = std::max(largest, bytes);
    whole += bytes;
  }
  const int64_t before = alloc.stats().in_use_bytes();
  alloc.reset_peak();
  // Note [A failed export stops every rank] (export_streamed.h).
  std::vector<std::string> saved = save_streamed_with_status(
      w, [&](const std::vector<double>& v) { return dp.sum(v); }, e.run.output_dir, e.task.save_final_sharded);
  const int64_t held = alloc.stats().peak_allocated_bytes - before;
  if (!is_main) return false;
  r.checkpoints = std::move(saved);
  e.log << "export | ZeRO-3: the final weights were gathered one tensor at a time; rank 0 held at most "
        << format_bytes(static_cast<double>(held)) << " (" << held << " B) beyond its shards (largest tensor "
        << format_bytes(static_cast<double>(largest)) << " (" << largest << " B), whole model "
        << format_bytes(static_cast<double>(whole)) << ")\n";
  return true;
}

// Everything else: the model is made whole (ZeRO-3 without a streamed save unshards it on every rank, a
// collective), given the f32 masters' values, and rank 0 calls task.save_final. Returns whether this rank wrote.
bool export_whole(const FinalExport& e, TrainSummary& r) {
  DataParallel* dp = e.dp;
  if (dp) dp->unshard_model();
  if (e.masters) {
    NoGradGuard no_grad;
    e.task.model->to(DType::f32);
    // ZeRO-1/2/3: the masters are per-shard; gathered (on every rank: a collective) into per-parameter values.
    const bool sharded = dp && dp->sharded();
    std::vector<Tensor> precise = sharded ? dp->gather_to_params(e.masters->master()) : e.masters->master();
    for (size_t i = 0; i < e.task.params.size(); ++i) e.task.params[i].copy_(precise[i]);
  }
  if (dp && dp->rank() != 0) return false;
  prepare_output_dir(e);
  r.checkpoints = e.task.save_final();
  return true;
}

}  // namespace

TrainSummary run_training(const RunSettings& run, const TrainOptions& o, TrainTask& task, std::ostream& log) {
  Trainer trainer(run, o, task, log);
  if (!trainer.train()) return trainer.summary();
  trainer.finish();
  TrainSummary& r = trainer.summary();

  // Final artifacts hold f32 weights: in bf16 mode the masters hold the precise values.
  DataParallel* dp = trainer.dp();
  const FinalExport final_export{run,    task, dp, trainer.masters(), trainer.checkpoints(), trainer.start_step(),
                                 trainer.log()};
  const bool writer = dp && dp->zero_stage() == 3 && task.save_final_sharded ? export_streamed(final_export, r)
                                                                              : export_whole(final_export, r);
  if (!writer) return r;  // rank 0 writes the run's artifacts
  for (const auto& [step, path] : list_checkpoints(run.output_dir)) r.training_checkpoints.push_back(path);
  trainer.outputs()->finish(r);
  write_summary(r, (fs::path(run.output_dir) / "summary.json").string());

  trainer.meter().log_done(r);
  return r;
}

std::string summary_json(const TrainSummary& r) {
  nlohmann::ordered_json j;
  j["steps"] = r.steps;
  j["first_loss"] = r.first_loss;
  j["final_loss"] = r.final_loss;
  j["best_loss"] = std::isfinite(r.best_loss) ? r.best_loss : 0.0;
  auto measured = [](const std::optional<double>& v) { return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(); };
  j["val_loss"] = measured(r.val_loss);
  j["tokens_per_s"] = measured(r.tokens_per_s);
  j["mfu"] = measured(r.mfu);
  j["train_s"] = r.train_s;
  j["compile_s"] = measured(r.compile_s);
  j["graphs"] = r.graphs;
  j["graph_breaks"] = r.graph_breaks;
  j["recompiles"] = r.recompiles;
  if (!r.compile_report.empty()) j["compile_report"] = r.compile_report;
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["num_parameters"] = r.num_parameters;
  j["trainable_parameters"] = r.trainable_parameters;
  j["device"] = r.device;
  j["dtype"] = r.dtype;
  j["output_dir"] = r.output_dir;
  j["config"] = r.config_file;
  j["resumed_from"] = r.resumed_from;
  j["resumed_from_step"] = r.resumed_from_step;
  j["checkpoints"] = r.checkpoints;
  j["training_checkpoints"] = r.training_checkpoints;
  j["metrics_log"] = r.metrics_log;
  j["loss_plot"] = r.loss_plot;
  j["tensorboard_dir"] = r.tensorboard_dir;
  j["profile_trace"] = r.profile_trace;
  return j.dump(2) + "\n";
}

void write_summary(const TrainSummary& r, const std::string& path) {
  std::string text = summary_json(r);
  fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  INGOT_CHECK(!ec, "cannot create the directory of summary file '", path, "': ", ec.message());
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size()); });
}

}  // namespace ingot::recipes
