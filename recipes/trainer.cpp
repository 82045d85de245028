#include "recipes/trainer.h"

#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <ostream>

#include "compile/explain.h"
#include "models/qlora.h"
#include "recipes/checkpoint_io.h"
#include "recipes/data_parallel.h"
#include "recipes/memory_advice.h"
#include "recipes/metrics.h"
#include "recipes/prefetch.h"
#include "recipes/progress_meter.h"
#include "recipes/run_outputs.h"
#include "recipes/train_state.h"
#include "recipes/train_step.h"
#include "runtime/allocator.h"
#include "runtime/kernels/quant8.h"
#include "runtime/rng.h"

namespace ingot::recipes {

namespace {

optim::OptimizerSpec optimizer_spec(const TrainOptions& o) {
  optim::OptimizerSpec spec;
  spec.name = o.optimizer;
  spec.lr = o.lr;
  spec.beta1 = o.beta1;
  spec.beta2 = o.beta2;
  spec.weight_decay = o.weight_decay;
  spec.momentum = o.momentum;
  spec.nesterov = o.nesterov;
  return spec;
}

// The banner's optimizer line: the rule and the state it keeps besides the weights, e.g. "optimizer | adamw8bit:
// 8-bit moments for 12 of 26 tensors (1.2M of 1.3M parameters; ...) | state 2.6 MiB (f32 AdamW: 10.0 MiB)".
// `masters`: the f32 master weights' bytes (0 without them); `in_place`: 16-bit weights updated without masters.
std::string optimizer_line(const optim::OptimizerSpec& spec, const std::vector<Tensor>& params, bool sharded,
                           int64_t masters, bool in_place) {
  std::string line = "optimizer | " + spec.name;
  if (spec.name == "adamw8bit") {
    int64_t tensors = 0, elements = 0, all = 0;
    for (const Tensor& p : params) {
      all += p.numel();
      if (p.numel() < kQuant8MinElements) continue;
      ++tensors;
      elements += p.numel();
    }
    line += ": 8-bit moments for " + std::to_string(tensors) + " of " + std::to_string(params.size()) +
            " tensors (" + format_count(static_cast<double>(elements)) + " of " +
            format_count(static_cast<double>(all)) + " parameters; f32 for tensors under " +
            std::to_string(kQuant8MinElements) + " elements)";
  }
  line += " | state " + format_bytes(static_cast<double>(optim::optimizer_state_bytes(spec, params)));
  if (sharded) line += " on this rank";
  if (spec.name == "adamw8bit") {
    optim::OptimizerSpec f32 = spec;
    f32.name = "adamw";
    line += " (f32 AdamW: " + format_bytes(static_cast<double>(optim::optimizer_state_bytes(f32, params))) + ")";
  }
  if (masters > 0) line += " | f32 master weights " + format_bytes(static_cast<double>(masters));
  if (in_place) line += " | no f32 masters: the bf16 weights take each update rounded stochastically";
  return line + "\n";
}

int64_t count_elements(const std::vector<Tensor>& ts) {
  int64_t n = 0;
  for (const Tensor& t : ts) n += t.numel();
  return n;
}

// The validation loss in eval mode without gradients; under data parallel the ranks split it
// (task.evaluate_shard) or each evaluates its own rows and the means are averaged. The model is back in
// training mode afterwards. Under ZeRO-3 every forward is collective (each unit is gathered), so the ranks
// cannot split an evaluation whose share differs between them: each runs the whole of it.
double evaluate(TrainTask& task, DataParallel* dp) {
  NoGradGuard no_grad;
  task.model->eval();
  double v = 0;
  if (dp && task.evaluate_shard && dp->zero_stage() != 3) {
    const auto [total, weight] = task.evaluate_shard(dp->rank(), dp->world_size());
    const std::vector<double> sums = dp->sum(std::vector<double>{total, weight});
    v = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  } else {
    v = task.evaluate();
    if (dp) v = dp->mean(v);
  }
  task.model->train();
  return v;
}

void log_compile_stats(const CompiledFunction& compiled, TrainSummary& r, std::ostream& log) {
  const CompileStats& cs = compiled.stats();
  r.compile_s = cs.time.total_ms / 1e3;
  r.compile_report = explain_report(compiled);
  r.graphs = cs.compiles;
  r.graph_breaks = static_cast<int64_t>(cs.graph_breaks.size());
  r.recompiles = cs.recompiles;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "compile | %lld graph(s), %lld break(s), %lld recompile(s) | %lld launches per step for %lld eager "
                "ops (%lld generated kernels) | compile %.2f s\n",
                static_cast<long long>(r.graphs), static_cast<long long>(r.graph_breaks),
                static_cast<long long>(r.recompiles), static_cast<long long>(cs.launches),
                static_cast<long long>(cs.compute_ops), static_cast<long long>(cs.kernels), *r.compile_s);
  log << buf;
  // How much of what the backward reads it remakes instead of keeping.
  if (recomputation_to_report(compiled.options().memory_budget, cs.recomputed_bytes))
    log << "compile | memory_budget " << compiled.options().memory_budget << ": "
        << format_bytes(static_cast<double>(cs.recomputed_bytes)) << " of the "
        << format_bytes(static_cast<double>(cs.saved_for_backward_bytes))
        << " of forward values the backward reads are recomputed there\n";
  for (const std::string& b : cs.graph_breaks) log << "compile | graph break: " << b << "\n";
}

// Wraps the model for data parallelism (dp null: nothing to wrap) and, on a fresh start with shard-wise weights
// (TrainTask::weight_slices), fills them. Returns the log line saying how much of the weights this process read
// ("" when it read none), which the banner prints after the task's header.
std::string load_weights_and_wrap(const RunSettings& run, TrainTask& task, DataParallel* dp) {
  // Shard-wise weights (TrainTask::weight_slices) on a fresh start: ZeRO-3 ranks read their shards' slices after
  // wrapping (nothing to broadcast); anything else reads every parameter whole before.
  const bool load_slices = task.weight_slices && run.resume_checkpoint.empty();
  const bool slices_into_shards = load_slices && dp && dp->zero_stage() == 3;
  if (load_slices && !slices_into_shards) {
    NoGradGuard no_grad;
    for (size_t i = 0; i < task.params.size(); ++i) {
      Tensor dst = task.params[i].as_strided({task.params[i].numel()}, {1}, task.params[i].offset());
      task.weight_slices->read(i, 0, task.params[i].numel(), dst);
    }
  }
  if (dp) dp->wrap(*task.model, task.params, /*broadcast=*/!slices_into_shards);
  if (slices_into_shards) dp->load_weight_shards(task.weight_slices->read);
  std::string load_note;
  if (load_slices) {
    const auto [got, total] = task.weight_slices->bytes();
    char buf[160];
    const bool drawn = task.weight_slices->drawn;
    std::snprintf(buf, sizeof buf, "%s | %s %s %llu of the weights' %llu bytes (%.1f%%)%s\n",
                  drawn ? "init" : "loading", dp ? "rank 0" : "this process", drawn ? "drew" : "read",
                  static_cast<unsigned long long>(got),
                  static_cast<unsigned long long>(total), total ? 100.0 * static_cast<double>(got) / total : 0.0,
                  slices_into_shards ? ": the slices of its shards only" : "");
    load_note = buf;
  }
  if (dp) {
    if (const std::optional<size_t> t = dp->vocab_parallel_table(); t && *t < task.params.size()) {
      const Tensor& w = task.params[*t];
      load_note += "distributed | ZeRO-3: the token table (" + std::to_string(w.size(0)) + " x " +
                   std::to_string(w.size(1)) + ") is looked up where its rows lie, " +
                   std::to_string(w.size(0) / dp->world_size()) +
                   " rows per rank, never gathered (distributed.vocab_parallel_embeddings)\n";
    }
  }
  return load_note;
}

// One step's micro-batches on the host (inputs, targets per micro-batch) and, under data parallelism with
// a token-weighted loss, each micro-batch's weight (one collective, in the same order on every rank), with
// 1 / grad_accum folded in as TrainStep::run expects.
std::vector<Tensor> draw_batch(const TrainOptions& o, TrainTask& task, DataParallel* dp) {
  const double inv_accum = 1.0 / static_cast<double>(o.grad_accum);
  std::vector<Tensor> host;
  std::vector<double> local_tokens;
  for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
    MicroBatch b = task.next_batch();
    INGOT_INTERNAL_CHECK(b.positions.defined() == task.positions, "TrainTask::positions says ", task.positions,
                         " but a micro-batch ", b.positions.defined() ? "has" : "lacks", " positions");
    if (dp && task.loss_tokens) local_tokens.push_back(task.loss_tokens(b.targets));
    host.push_back(b.inputs);
    host.push_back(b.targets);
    if (task.positions) host.push_back(b.positions);
  }
  if (!local_tokens.empty()) {
    std::vector<double> global_tokens = dp->sum(local_tokens);  // one collective for every micro-batch
    std::vector<double> weights(local_tokens.size(), 0.0);
    for (size_t m = 0; m < local_tokens.size(); ++m)
      if (global_tokens[m] > 0) weights[m] = inv_accum * dp->world_size() * local_tokens[m] / global_tokens[m];
    host.push_back(from_vector(weights, {static_cast<int64_t>(weights.size())}, DType::f32));
  }
  return host;
}

optim::LrSchedule lr_schedule(const RunSettings& run, const TrainOptions& o) {
  optim::LrSchedule sched;
  sched.kind = optim::LrSchedule::parse_kind(o.lr_schedule);
  sched.base_lr = o.lr;
  sched.min_lr = o.min_lr;
  sched.warmup_steps = o.warmup_steps;
  sched.total_steps = run.lr_schedule_steps;
  return sched;
}

// The summary before any step: what the run is, and no loss yet (best_loss starts above every loss).
TrainSummary fresh_summary(const RunSettings& run, const TrainTask& task) {
  TrainSummary r;
  r.device = run.device.str();
  r.dtype = std::string(dtype_name(run.dtype));
  r.output_dir = run.output_dir;
  r.config_file = run.config_file;
  r.num_parameters = task.model->num_parameters();
  r.trainable_parameters = count_elements(task.params);
  r.best_loss = std::numeric_limits<double>::infinity();
  return r;
}

// A resumed run picks up where the checkpoint's process stopped: its RNG, f16 loss scale, data position and
// loss figures (the weights and optimizer state are CheckpointIO::resume's).
void continue_from(const TrainState& st, const RunSettings& run, TrainTask& task, optim::LossScaler* scaler,
                   TrainSummary& r) {
  restore_rng(st.rng);
  if (scaler && st.loss_scale > 0) scaler->restore(st.loss_scale, st.loss_scale_growth_tracker);
  task.set_data_position(st.sampler_position);
  r.first_loss = st.first_loss;
  r.best_loss = st.best_loss;
  r.final_loss = st.last_loss;
  r.steps = st.step;
  r.resumed_from = run.resume_checkpoint;
  r.resumed_from_step = st.step;
}

// What a checkpoint after `step` records besides the weights and optimizer state.
struct StepPoint {
  int64_t step = 0;
  double lr = 0;                // the step's learning rate
  int64_t data_position = 0;    // where the data stands after this step's batches (not the prefetched next one)
  double train_s = 0;           // training time so far, earlier processes included
  double tokens_per_step = 0;   // over all ranks and micro-batches
  const optim::LossScaler* scaler = nullptr;  // f16 only
};

TrainState train_state(const RunSettings& run, const TrainOptions& o, const TrainSummary& r, const StepPoint& at) {
  TrainState t;
  t.step = at.step;
  t.sampler_position = at.data_position;
  t.tokens_seen = static_cast<int64_t>(at.tokens_per_step) * at.step;
  t.lr_schedule = o.lr_schedule;
  t.base_lr = o.lr;
  t.min_lr = o.min_lr;
  t.last_lr = at.lr;
  t.warmup_steps = o.warmup_steps;
  t.total_steps = run.lr_schedule_steps;
  t.rng = capture_rng();
  t.first_loss = r.first_loss;
  t.best_loss = r.best_loss;
  t.last_loss = r.final_loss;
  t.train_s = at.train_s;
  if (at.scaler) {
    t.loss_scale = at.scaler->scale();
    t.loss_scale_growth_tracker = at.scaler->growth_tracker();
  }
  t.config_hash = run.config_hash;
  t.config = run.config_entries;
  return t;
}

// Note [Failed runs leave no metrics past their last checkpoint]: a resume continues from the checkpoint, so
// the steps after it would be logged twice (and a fresh failed run has no model for them at all). When the
// training loop throws, they move aside as it unwinds.
struct SetAsideOnFailure {
  RunOutputs* outputs;
  const int64_t& saved_step;
  ~SetAsideOnFailure() {
    if (!outputs || std::uncaught_exceptions() == 0) return;
    try {
      outputs->abandon(saved_step);
    } catch (const std::exception&) {
      // The run's own error is the one to report; the records simply stay where they are.
    }
  }
};

// A validation eval every train.eval_every steps (the last step's is evaluate_at_end's): logged and recorded.
void evaluate_between_steps(TrainTask& task, DataParallel* dp, int64_t step, RunOutputs* outputs, std::ostream& log) {
  double v = evaluate(task, dp);
  if (outputs) outputs->log_eval(step, v);
  char buf[120];
  std::snprintf(buf, sizeof buf, "eval | step %lld | val_loss %.3f\n", static_cast<long long>(step), v);
  log << buf << std::flush;
}

// The final eval goes into the summary (val_loss) and its line sets it beside the last step's training loss.
void evaluate_at_end(TrainTask& task, DataParallel* dp, RunOutputs* outputs, TrainSummary& r, std::ostream& log) {
  r.val_loss = evaluate(task, dp);
  if (outputs) outputs->log_eval(r.steps, *r.val_loss);
  char buf[200];
  std::snprintf(buf, sizeof buf, "eval | val_loss %.3f over %s | train loss %.3f (last step)\n", *r.val_loss,
                task.eval_description.c_str(), r.final_loss);
  log << buf;
}

// The banner's resume lines: where a resumed run continues from and why, and any note about the resume.
void log_resume(const RunSettings& run, int64_t step, std::ostream& log) {
  if (!run.resume_checkpoint.empty())
    log << "resume | " << run.resume_reason << ": continuing after step " << step << " from "
        << run.resume_checkpoint << "\n";
  if (!run.resume_note.empty()) log << "resume | " << run.resume_note << "\n";
  log.flush();
}

}  // namespace

Trainer::Trainer(const RunSettings& run, const TrainOptions& opts, TrainTask& task, std::ostream& log)
    : run_(run), o_(opts), task_(task) {
  INGOT_INTERNAL_CHECK(task.model && task.loss && task.next_batch && task.data_position && task.set_data_position &&
                           task.save_final,
                       "Trainer: incomplete TrainTask");
  task.model->train();
  // Data parallel (recipes/data_parallel.h): join the job's process group; rank 0 alone logs and writes.
  dp_ = DataParallel::join(run, log);
  const bool is_main = !dp_ || dp_->rank() == 0;
  log_ = is_main ? &log : &quiet_;
  const std::string load_note = set_up_parameters();
  const TrainState st = resume(load_note);

  // One optimizer step, eager or compiled (recipes/train_step.h).
  step_ = std::make_unique<TrainStep>(TrainStepParts{.opts = o_,
                                                     .task = task_,
                                                     .dp = dp_.get(),
                                                     .opt = *opt_,
                                                     .masters = masters_.get(),
                                                     .scaler = scaler_.get(),
                                                     .opt_params = opt_params_},
                                      run.compile, *log_);
  // Rank 0 alone writes metrics, TensorBoard events, the profile and the plot.
  if (is_main) {
    outputs_ = std::make_unique<RunOutputs>(run, start_step_ > 0 ? start_step_ : -1, *log_);
    r_.metrics_log = outputs_->metrics_path();
  }
  allocator_for(run.device).reset_peak();
  // tokens/s counts every rank's tokens, so MFU divides by every rank's device: the peak of one device times the
  // world (a DDP run of two GPUs printed twice its per-GPU utilization before).
  const double peak = task.flops_per_token > 0
                          ? peak_flops(run.device.is_cuda(), run.dtype != DType::f32, run.peak_tflops) *
                                static_cast<double>(dp_ ? dp_->world_size() : 1)
                          : 0;
  meter_ = std::make_unique<ProgressMeter>(ProgressOptions{.start_step = start_step_,
                                                           .max_steps = run.max_steps,
                                                           .log_every = o_.log_every,
                                                           .tokens_per_step = task.tokens_per_step,
                                                           .flops_per_token = task.flops_per_token,
                                                           .peak_flops = peak,
                                                           .compiled = step_->compiled() != nullptr,
                                                           .earlier_train_s = st.train_s},
                                           outputs_.get(), *log_);
  consumed_position_ = task.data_position();
  prefetch_ = std::make_unique<BatchPrefetcher>(run.device);
}

Trainer::~Trainer() = default;

std::string Trainer::set_up_parameters() {
  // bf16: the model computes in bf16 parameters; the optimizer updates f32 masters that are rounded back each
  // step. Parameter handles stay valid across to() (module.h), so task.params still names the trained tensors.
  if (run_.dtype != DType::f32) task_.model->to(run_.dtype);
  // f16: the loss is scaled before backward and the step skipped when a gradient overflows (loss_scaler.h).
  if (run_.dtype == DType::f16)
    scaler_ = std::make_unique<optim::LossScaler>(optim::LossScalerOptions{.init_scale = o_.init_loss_scale});
  spec_ = optimizer_spec(o_);
  // Resuming ZeRO-1/2/3 reads part of the checkpoint while the parameters are still whole (checkpoint_io.h).
  checkpoints_ = std::make_unique<CheckpointIO>(run_, task_, dp_.get(), spec_, o_.master_weights, *log_);
  checkpoints_->read_before_wrap();
  std::string load_note = load_weights_and_wrap(run_, task_, dp_.get());
  opt_params_ = dp_ ? dp_->optimizer_params() : task_.params;
  // train.master_weights false: AdamW updates the bf16 weights themselves (Note [Stochastic rounding]).
  if (run_.dtype != DType::f32 && o_.master_weights) {
    masters_ = std::make_unique<optim::MasterWeights>(opt_params_);
    opt_params_ = masters_->master();
    // ZeRO-3: no 16-bit shards beside the f32 masters; each unit is gathered from its masters, rounded (Note
    // [Shards cast from their masters], distributed/fsdp.h). The shards were filled above (wrap, shard-wise
    // loading) and the masters made from them; a resume fills the masters alone (CheckpointIO::resume).
    if (dp_ && dp_->zero_stage() == 3 && !keep_shards_for_test()) {
      dp_->gather_from_masters(masters_->master());
      *log_ << "distributed | ZeRO-3: units are gathered from their f32 master shards cast to "
            << dtype_name(run_.dtype) << "; no " << dtype_name(run_.dtype) << " shards are kept\n";
    }
  }
  opt_ = optim::make_optimizer(opt_params_, spec_);
  // Note [Optimizer state offloaded] (optim/optimizer.cpp): before the checkpoint's state is loaded, so it lands on
  // the host.
  if (o_.optimizer_offload && run_.device.is_cuda()) opt_->set_offload(true);
  sched_ = lr_schedule(run_, o_);
  return load_note;
}

TrainState Trainer::resume(const std::string& load_note) {
  r_ = fresh_summary(run_, task_);
  // Resume before anything is written: a corrupt checkpoint leaves the run directory as it was.
  checkpoints_->attach(*opt_, masters_.get());
  TrainState st = checkpoints_->resume();
  if (!run_.resume_checkpoint.empty()) continue_from(st, run_, task_, scaler_.get(), r_);
  start_step_ = saved_step_ = st.step;
  *log_ << task_.header << "\n" << load_note << optimizer_line(spec_, opt_params_, dp_ && dp_->sharded(),
                                                           masters_ ? count_elements(opt_params_) * 4 : 0,
                                                           run_.dtype == DType::bf16 && !o_.master_weights);
  if (o_.optimizer_offload)
    *log_ << (opt_->offload() ? "optimizer | offloaded: its state in page-locked host memory, each parameter's passed "
                                "through the GPU for its update in the backward (train.optimizer_offload)\n"
                              : "optimizer | train.optimizer_offload: ignored on the CPU, where the state is in host "
                                "memory already\n");
  log_resume(run_, st.step, *log_);
  return st;
}

bool Trainer::train() {
  // Note [Failed runs leave no metrics past their last checkpoint] (SetAsideOnFailure).
  const SetAsideOnFailure set_aside{outputs_.get(), saved_step_};
  for (int64_t step = start_step_; step < run_.max_steps; ++step) {
    const double lr = run_step(step);
    if (!after_step(step + 1, lr)) return false;
  }
  return true;
}

double Trainer::run_step(int64_t step) {
  meter_->begin_step();
  Allocator& alloc = allocator_for(run_.device);
  alloc.reset_peak();
  if (outputs_) outputs_->begin_step(step + 1);
  const double lr = sched_.at(step);
  opt_->set_lr(lr);
  if (!prefetch_->pending()) prefetch_->put(draw_batch(o_, task_, dp_.get()));
  const std::vector<Tensor> batch = prefetch_->take();
  // A step that runs out of GPU memory says which keys would make it need less.
  const TrainStep::Result out = [&] {
    try {
      return step_->run(batch);
    } catch (const OutOfMemoryError& e) {
      throw OutOfMemoryError(std::string(e.what()) + "\n" + memory_advice(advice_input()));
    }
  }();
  if (out.skipped)
    *log_ << "f16 | step " << step + 1 << ": the gradients overflowed at loss scale " << out.loss_scale
          << ", so the update is skipped and the scale is now " << scaler_->scale() << "\n";
  consumed_position_ = task_.data_position();
  // Overlaps this step (see prefetch.h).
  if (step + 1 < run_.max_steps) prefetch_->put(draw_batch(o_, task_, dp_.get()));
  double loss = out.loss.item();
  if (dp_) loss = dp_->mean(loss);  // each rank's loss is the mean over its equal share of the global batch
  INGOT_CHECK(std::isfinite(loss), "training diverged: the loss is ", loss, " at step ", step + 1, " (lr ", lr,
              "); lower train.lr or set train.grad_clip");
  meter_->stop_clock();
  const double grad_norm = out.grad_norm();
  const int64_t step_peak = alloc.stats().peak_allocated_bytes;
  if (outputs_) outputs_->end_step(step + 1);
  record_loss(step + 1, loss);
  meter_->log_step(
      {.step = step + 1, .loss = loss, .lr = lr, .grad_norm = grad_norm, .peak_memory_bytes = step_peak});
  return lr;
}

MemoryAdviceInput Trainer::advice_input() const {
  MemoryAdviceInput in{.opts = o_, .dtype = run_.dtype};
  in.frozen_base = r_.trainable_parameters < r_.num_parameters;
  in.quantized_base = models::quantized_base(*task_.model).tensors > 0;
  if (dp_) {
    in.world_size = dp_->world_size();
    in.zero_stage = dp_->zero_stage();
  }
  return in;
}

void Trainer::record_loss(int64_t step, double loss) {
  if (step == 1) r_.first_loss = loss;
  r_.final_loss = loss;
  r_.best_loss = std::min(r_.best_loss, loss);
  r_.steps = step;
}

bool Trainer::after_step(int64_t done, double lr) {
  const bool last = done == run_.max_steps;
  if (task_.evaluate && o_.eval_every > 0 && done % o_.eval_every == 0 && !last)
    evaluate_between_steps(task_, dp_.get(), done, outputs_.get(), *log_);
  if (run_.save_every > 0 && (done % run_.save_every == 0 || last)) {
    checkpoints_->save(train_state(run_, o_, r_,
                                   {.step = done,
                                    .lr = lr,
                                    .data_position = consumed_position_,
                                    .train_s = meter_->total_train_s(),
                                    .tokens_per_step = task_.tokens_per_step,
                                    .scaler = scaler_.get()}));
    saved_step_ = done;
  }
  if (dp_) maybe_kill_for_test(dp_->rank(), done);
  if (task_.halt_after_steps > 0 && done - start_step_ >= task_.halt_after_steps) {
    r_.train_s = meter_->this_process_s();
    return false;
  }
  return true;
}

void Trainer::finish() {
  meter_->summarize(r_);
  if (task_.evaluate) evaluate_at_end(task_, dp_.get(), outputs_.get(), r_, *log_);
  // The steps' peak and the eval's.
  r_.peak_memory_bytes = std::max(meter_->peak_memory_bytes(), allocator_for(run_.device).stats().peak_allocated_bytes);
  if (step_->compiled()) log_compile_stats(*step_->compiled(), r_, *log_);
}

}  // namespace ingot::recipes
