#include "recipes/train_loop.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <system_error>

#include "compile/explain.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "recipes/checkpoint.h"
#include "recipes/checkpoint_io.h"
#include "recipes/data_parallel.h"
#include "recipes/export_streamed.h"
#include "recipes/metrics.h"
#include "recipes/prefetch.h"
#include "recipes/progress_meter.h"
#include "recipes/run_outputs.h"
#include "recipes/train_state.h"
#include "recipes/train_step.h"
#include "runtime/allocator.h"
#include "runtime/file_util.h"
#include "runtime/kernels/quant8.h"
#include "runtime/rng.h"
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
  s.add(K::of(T::Float, "train.init_loss_scale", "65536",
              "dtype f16: the first loss scale (halved on each step whose gradients overflow, which is skipped; "
              "doubled after 2000 good steps)")
            .at_least(1));
  s.add(K::of(T::Float, "train.grad_clip", d.grad_clip, "max global gradient norm (0: no clipping)").at_least(0));
  s.add(K::of(T::String, "train.activation_checkpointing", "none",
              "blocks: each decoder block keeps only its input for the backward, which runs the block's forward "
              "again (less activation memory for about one more forward; eager and compiled steps)")
            .one_of({"none", "blocks"})
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
  o.checkpoint_blocks = rd.str("train.activation_checkpointing") == "blocks";
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
  // ZeRO shards the optimizer state element-wise; 8-bit state comes in blocks with one absmax each.
  if (o.optimizer == "adamw8bit" && cfg.has("distributed.zero_stage") &&
      cfg.value("distributed.zero_stage").text != "0")
    errors.fail(cfg, "distributed.zero_stage",
                cfg.value("distributed.zero_stage").text +
                    " shards the optimizer state element by element, and optimizer.name is adamw8bit, whose state is "
                    "quantized in 256-element blocks: use distributed.zero_stage=0 (plain DDP) with adamw8bit, or "
                    "optimizer.name=adamw to shard");
  o.init_loss_scale = rd.f64("train.init_loss_scale");
  if (set_by_user("train.init_loss_scale") && cfg.value("dtype").text != "f16")
    errors.fail(cfg, "train.init_loss_scale", "is read with dtype: f16 only, and dtype is " + cfg.value("dtype").text);
  return o;
}

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
std::string optimizer_line(const optim::OptimizerSpec& spec, const std::vector<Tensor>& params, bool sharded) {
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
  if (spec.name == "adamw8bit") {
    optim::OptimizerSpec f32 = spec;
    f32.name = "adamw";
    line += " (f32 AdamW: " + format_bytes(static_cast<double>(optim::optimizer_state_bytes(f32, params))) + ")";
  }
  return line + (sharded ? " on this rank\n" : "\n");
}

// Where ranks other than 0 send their progress lines.
class NullStream : public std::ostream {
 public:
  NullStream() : std::ostream(nullptr) {}
};

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
  for (const std::string& b : cs.graph_breaks) log << "compile | graph break: " << b << "\n";
}

}  // namespace

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
    std::snprintf(buf, sizeof buf, "loading | %s read %llu of the weights' %llu bytes (%.1f%%)%s\n",
                  dp ? "rank 0" : "this process", static_cast<unsigned long long>(got),
                  static_cast<unsigned long long>(total), total ? 100.0 * static_cast<double>(got) / total : 0.0,
                  slices_into_shards ? ": the slices of its shards only" : "");
    load_note = buf;
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
  const int64_t before = alloc.stats().allocated_bytes;
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

TrainSummary run_training(const RunSettings& run, const TrainOptions& o, TrainTask& task, std::ostream& main_log) {
  INGOT_INTERNAL_CHECK(task.model && task.loss && task.next_batch && task.data_position && task.set_data_position &&
                           task.save_final,
                       "run_training: incomplete TrainTask");
  nn::Module& model = *task.model;
  model.train();

  // Data parallel (recipes/data_parallel.h): join the job's process group; rank 0 alone logs and writes.
  std::unique_ptr<DataParallel> dp = DataParallel::join(run, main_log);
  const bool is_main = !dp || dp->rank() == 0;
  const bool sharded = dp && dp->sharded();  // ZeRO-1/2/3: the optimizer holds this rank's shards
  NullStream quiet;
  std::ostream& log = is_main ? main_log : quiet;

  // bf16: the model computes in bf16 parameters; the optimizer updates f32 masters that are rounded back each step.
  // Parameter handles stay valid across to() (module.h), so task.params still names the trained tensors.
  if (run.dtype != DType::f32) model.to(run.dtype);
  // f16: the loss is scaled before backward and the step skipped when a gradient overflows (loss_scaler.h).
  std::unique_ptr<optim::LossScaler> scaler;
  if (run.dtype == DType::f16)
    scaler = std::make_unique<optim::LossScaler>(optim::LossScalerOptions{.init_scale = o.init_loss_scale});
  const optim::OptimizerSpec spec = optimizer_spec(o);

  // Resuming ZeRO-1/2/3 reads part of the checkpoint while the parameters are still whole (checkpoint_io.h).
  CheckpointIO checkpoints(run, task, dp.get(), spec, log);
  checkpoints.read_before_wrap();
  const std::string load_note = load_weights_and_wrap(run, task, dp.get());
  std::vector<Tensor> trained = dp ? dp->optimizer_params() : task.params;
  std::unique_ptr<optim::MasterWeights> masters;
  std::vector<Tensor> opt_params = trained;
  if (run.dtype != DType::f32) {
    masters = std::make_unique<optim::MasterWeights>(trained);
    opt_params = masters->master();
  }
  std::unique_ptr<optim::Optimizer> optimizer = optim::make_optimizer(opt_params, spec);
  optim::Optimizer& opt = *optimizer;
  const optim::LrSchedule sched = lr_schedule(run, o);

  TrainSummary r = fresh_summary(run, task);

  // Resume before anything is written: a corrupt checkpoint leaves the run directory as it was.
  checkpoints.attach(opt, masters.get());
  const TrainState st = checkpoints.resume();
  if (!run.resume_checkpoint.empty()) continue_from(st, run, task, scaler.get(), r);
  const int64_t start_step = st.step;

  log << task.header << "\n" << load_note << optimizer_line(spec, opt_params, sharded);
  log_resume(run, st.step, log);

  // One optimizer step, eager or compiled (recipes/train_step.h).
  TrainStep train_step({.opts = o,
                        .task = task,
                        .dp = dp.get(),
                        .opt = opt,
                        .masters = masters.get(),
                        .scaler = scaler.get(),
                        .opt_params = opt_params},
                       run.compile, log);

  // Rank 0 alone writes metrics, TensorBoard events, the profile and the plot.
  std::unique_ptr<RunOutputs> outputs;
  if (is_main) {
    outputs = std::make_unique<RunOutputs>(run, start_step > 0 ? start_step : -1, log);
    r.metrics_log = outputs->metrics_path();
  }

  Allocator& alloc = allocator_for(run.device);
  alloc.reset_peak();
  const double tokens_per_step = task.tokens_per_step;
  const double peak = task.flops_per_token > 0 ? peak_flops(run.device.is_cuda(), run.dtype != DType::f32,
                                                            run.peak_tflops)
                                               : 0;
  int64_t saved_step = start_step;
  ProgressMeter meter({.start_step = start_step,
                       .max_steps = run.max_steps,
                       .log_every = o.log_every,
                       .tokens_per_step = tokens_per_step,
                       .flops_per_token = task.flops_per_token,
                       .peak_flops = peak,
                       .compiled = train_step.compiled() != nullptr,
                       .earlier_train_s = st.train_s},
                      outputs.get(), log);

  // Where the data stands after the batches of the steps done so far: the live position runs one step
  // ahead once the next batch is prefetched (Note [Prefetching the next batch], prefetch.h).
  int64_t consumed_position = task.data_position();
  auto make_state = [&](int64_t step, double lr) {
    return train_state(run, o, r,
                       {.step = step,
                        .lr = lr,
                        .data_position = consumed_position,
                        .train_s = meter.total_train_s(),
                        .tokens_per_step = tokens_per_step,
                        .scaler = scaler.get()});
  };
  BatchPrefetcher prefetch(run.device);

  // Note [Failed runs leave no metrics past their last checkpoint] (SetAsideOnFailure).
  const SetAsideOnFailure set_aside{outputs.get(), saved_step};
  for (int64_t step = start_step; step < run.max_steps; ++step) {
    meter.begin_step();
    alloc.reset_peak();
    if (outputs) outputs->begin_step(step + 1);
    double lr = sched.at(step);
    opt.set_lr(lr);
    if (!prefetch.pending()) prefetch.put(draw_batch(o, task, dp.get()));
    const std::vector<Tensor> batch = prefetch.take();
    const TrainStep::Result out = train_step.run(batch);
    if (out.skipped)
      log << "f16 | step " << step + 1 << ": the gradients overflowed at loss scale " << out.loss_scale
          << ", so the update is skipped and the scale is now " << scaler->scale() << "\n";
    const Tensor& loss = out.loss;
    consumed_position = task.data_position();
    if (step + 1 < run.max_steps) prefetch.put(draw_batch(o, task, dp.get()));  // overlaps this step (see prefetch.h)
    double l = loss.item();
    if (dp) l = dp->mean(l);  // each rank's loss is the mean over its equal share of the global batch
    INGOT_CHECK(std::isfinite(l), "training diverged: the loss is ", l, " at step ", step + 1, " (lr ", lr,
                "); lower train.lr or set train.grad_clip");
    meter.stop_clock();
    const double grad_norm = out.grad_norm();
    const int64_t step_peak = alloc.stats().peak_allocated_bytes;
    if (outputs) outputs->end_step(step + 1);
    if (step == 0) r.first_loss = l;
    r.final_loss = l;
    r.best_loss = std::min(r.best_loss, l);
    r.steps = step + 1;
    meter.log_step({.step = step + 1, .loss = l, .lr = lr, .grad_norm = grad_norm, .peak_memory_bytes = step_peak});
    const bool last = step + 1 == run.max_steps;
    if (task.evaluate && o.eval_every > 0 && (step + 1) % o.eval_every == 0 && !last)
      evaluate_between_steps(task, dp.get(), step + 1, outputs.get(), log);
    if (run.save_every > 0 && ((step + 1) % run.save_every == 0 || last)) {
      checkpoints.save(make_state(step + 1, lr));
      saved_step = step + 1;
    }
    if (dp) maybe_kill_for_test(dp->rank(), step + 1);
    if (task.halt_after_steps > 0 && step + 1 - start_step >= task.halt_after_steps) {
      r.train_s = meter.this_process_s();
      return r;
    }
  }
  meter.summarize(r);

  if (task.evaluate) evaluate_at_end(task, dp.get(), outputs.get(), r, log);
  // The steps' peak and the eval's.
  r.peak_memory_bytes = std::max(meter.peak_memory_bytes(), alloc.stats().peak_allocated_bytes);
  if (train_step.compiled()) log_compile_stats(*train_step.compiled(), r, log);

  // Final artifacts hold f32 weights: in bf16 mode the masters hold the precise values.
  const FinalExport final_export{run, task, dp.get(), masters.get(), checkpoints, start_step, log};
  const bool writer = dp && dp->zero_stage() == 3 && task.save_final_sharded ? export_streamed(final_export, r)
                                                                              : export_whole(final_export, r);
  if (!writer) return r;  // rank 0 writes the run's artifacts
  for (const auto& [step, path] : list_checkpoints(run.output_dir)) r.training_checkpoints.push_back(path);
  outputs->finish(r);
  write_summary(r, (fs::path(run.output_dir) / "summary.json").string());

  meter.log_done(r);
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
