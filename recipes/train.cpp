#include "recipes/train.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <ostream>
#include <system_error>

#include "models/gpt2.h"
#include "optim/clip.h"
#include "optim/lr_schedule.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "recipes/checkpoint.h"
#include "recipes/compiled_step.h"
#include "recipes/data.h"
#include "recipes/metrics.h"
#include "recipes/run_outputs.h"
#include "recipes/train_state.h"
#include "runtime/allocator.h"
#include "runtime/file_util.h"
#include "runtime/rng.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

const ConfigSchema& pretrain_schema() {
  static const ConfigSchema schema = [] {
    using T = ConfigType;
    using K = ConfigKey;
    ConfigSchema s;
    add_run_keys(s, "pretrain", "runs/pretrain");
    s.add(K::of(T::Int, "model.n_layer", "4", "transformer blocks").at_least(1));
    s.add(K::of(T::Int, "model.n_head", "4", "attention heads (must divide n_embd)").at_least(1));
    s.add(K::of(T::Int, "model.n_embd", "128", "hidden width").at_least(1));
    s.add(K::of(T::Int, "model.block_size", "64", "context length T in tokens").at_least(1));
    s.add(K::of(T::Float, "model.dropout", "0.0", "dropout probability").at_least(0).at_most(0.99));
    s.add(K::required_key(T::String, "data.path", "UTF-8 text file (relative to the working directory)"));
    s.add(K::of(T::Float, "data.val_fraction", "0.1", "trailing fraction of the text held out for eval")
              .at_least(0)
              .at_most(0.9));
    s.add(K::of(T::Int, "train.batch_size", "16", "sequences per micro-batch").at_least(1));
    s.add(K::of(T::Int, "train.gradient_accumulation_steps", "1", "micro-batches summed into one optimizer step")
              .at_least(1));
    s.add(K::of(T::Float, "train.lr", "1e-3", "peak learning rate").at_least(0));
    s.add(K::of(T::Float, "train.min_lr", "1e-4", "learning rate at the end of the decay").at_least(0));
    s.add(K::of(T::Int, "train.warmup_steps", "100", "linear warm-up steps").at_least(0));
    s.add(K::of(T::String, "train.lr_schedule", "cosine", "decay after warm-up")
              .one_of({"cosine", "linear", "constant"}));
    s.add(K::of(T::Float, "train.weight_decay", "0.1", "AdamW decoupled weight decay").at_least(0));
    s.add(K::of(T::Float, "train.beta1", "0.9", "AdamW beta1").at_least(0).at_most(0.999999));
    s.add(K::of(T::Float, "train.beta2", "0.95", "AdamW beta2").at_least(0).at_most(0.999999));
    s.add(K::of(T::Float, "train.grad_clip", "1.0", "max global gradient norm (0: no clipping)").at_least(0));
    s.add(K::of(T::Int, "train.log_every", "10", "steps between progress lines").at_least(1));
    s.add(K::of(T::Int, "train.eval_every", "0", "steps between validation evals (0: only at the end)").at_least(0));
    s.add(K::of(T::Int, "train.eval_batches", "20", "validation batches per eval (0: skip eval)").at_least(0));
    return s;
  }();
  return schema;
}

PretrainSettings resolve_pretrain(const Config& cfg, ConfigErrors& errors) {
  PretrainSettings s;
  s.run = resolve_run(cfg, errors);
  auto get = [&](std::string_view key, auto fallback, auto getter) {
    try {
      return (cfg.*getter)(key);
    } catch (const ConfigError& e) {
      errors.add_exception(key, cfg.has(key) ? cfg.origin(key) : ConfigOrigin{}, e);
      return decltype((cfg.*getter)(key))(fallback);
    }
  };
  auto i64 = [&](std::string_view k, int64_t d) { return get(k, d, &Config::get_int); };
  auto f64 = [&](std::string_view k, double d) { return get(k, d, &Config::get_double); };
  auto str = [&](std::string_view k) { return get(k, std::string(), &Config::get_string); };

  s.n_layer = i64("model.n_layer", 1);
  s.n_head = i64("model.n_head", 1);
  s.n_embd = i64("model.n_embd", 1);
  s.block_size = i64("model.block_size", 1);
  s.dropout = f64("model.dropout", 0);
  if (s.n_head > 0 && s.n_embd % s.n_head != 0)
    errors.fail(cfg, "model.n_head",
                std::to_string(s.n_head) + " heads do not divide model.n_embd = " + std::to_string(s.n_embd));

  s.data_path = str("data.path");
  std::error_code ec;
  if (!errors.has_error_for("data.path") && !fs::is_regular_file(s.data_path, ec))
    errors.fail(cfg, "data.path",
                "no such file '" + s.data_path + "'" +
                    (s.data_path.rfind("data/", 0) == 0 ? " (run ./scripts/get_data.sh to fetch it)" : ""));
  s.val_fraction = f64("data.val_fraction", 0.1);

  s.batch_size = i64("train.batch_size", 1);
  s.grad_accum = i64("train.gradient_accumulation_steps", 1);
  s.lr = f64("train.lr", 1e-3);
  s.min_lr = f64("train.min_lr", 0);
  if (s.min_lr > s.lr) errors.fail(cfg, "train.min_lr", "must not exceed train.lr (" + cfg.value("train.lr").text + ")");
  s.warmup_steps = i64("train.warmup_steps", 0);
  s.lr_schedule = str("train.lr_schedule");
  s.weight_decay = f64("train.weight_decay", 0);
  s.beta1 = f64("train.beta1", 0.9);
  s.beta2 = f64("train.beta2", 0.95);
  s.grad_clip = f64("train.grad_clip", 0);
  s.log_every = i64("train.log_every", 10);
  s.eval_every = i64("train.eval_every", 0);
  s.eval_batches = i64("train.eval_batches", 0);
  if (s.eval_batches > 0 && s.val_fraction == 0 && !errors.has_error_for("data.val_fraction"))
    errors.fail(cfg, "data.val_fraction",
                "is 0, so there is nothing to evaluate on; set train.eval_batches: 0 to skip eval");
  if (s.eval_every > 0 && s.eval_batches == 0)
    errors.fail(cfg, "train.eval_every", "is set but train.eval_batches is 0, so each eval would use no data");
  return s;
}

PretrainSettings resolve_pretrain(const Config& cfg) {
  ConfigErrors errors;
  PretrainSettings s = resolve_pretrain(cfg, errors);
  errors.raise_if_any();
  return s;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Splits windows [B, T+1] into inputs [B, T] and next-token targets [B, T].
std::pair<Tensor, Tensor> inputs_and_targets(const Tensor& window) {
  int64_t t1 = window.size(1);
  return {contiguous(slice(window, 1, 0, t1 - 1)), contiguous(slice(window, 1, 1, t1))};
}

double evaluate(models::GPT2& model, const BatchSampler& batches, int64_t n, Device device) {
  NoGradGuard no_grad;
  model.eval();
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto [x, y] = inputs_and_targets(batches.batch(i).to(device));
    total += model.loss(x, y).item();
  }
  model.train();
  return total / static_cast<double>(n);
}

}  // namespace

TrainSummary run_pretrain(const PretrainSettings& s, std::ostream& log) {
  const RunSettings& run = s.run;
  TextDataset data = TextDataset::from_file(s.data_path, s.val_fraction);
  BatchSampler train_batches(data, Split::Train, s.batch_size, s.block_size, run.seed);
  std::unique_ptr<BatchSampler> val_batches;
  if (s.eval_batches > 0)
    val_batches = std::make_unique<BatchSampler>(data, Split::Val, s.batch_size, s.block_size, run.seed);

  manual_seed(run.seed);
  models::GPT2Config mc;
  mc.vocab_size = data.vocab_size();
  mc.n_positions = s.block_size;
  mc.n_embd = s.n_embd;
  mc.n_layer = s.n_layer;
  mc.n_head = s.n_head;
  mc.dropout = s.dropout;
  auto model = std::make_shared<models::GPT2>(mc);
  model->to(run.device);
  model->train();

  // bf16: the model computes in bf16 parameters; AdamW updates f32 masters that are rounded back each step.
  std::unique_ptr<optim::MasterWeights> masters;
  std::vector<Tensor> opt_params = model->parameters();
  if (run.dtype == DType::bf16) {
    model->to(DType::bf16);
    masters = std::make_unique<optim::MasterWeights>(model->parameters());
    opt_params = masters->master();
  }
  optim::AdamWOptions ao;
  ao.lr = s.lr;
  ao.beta1 = s.beta1;
  ao.beta2 = s.beta2;
  ao.weight_decay = s.weight_decay;
  optim::AdamW opt(opt_params, ao);
  optim::LrSchedule sched;
  sched.kind = optim::LrSchedule::parse_kind(s.lr_schedule);
  sched.base_lr = s.lr;
  sched.min_lr = s.min_lr;
  sched.warmup_steps = s.warmup_steps;
  sched.total_steps = run.max_steps;

  TrainSummary r;
  r.device = run.device.str();
  r.dtype = std::string(dtype_name(run.dtype));
  r.output_dir = run.output_dir;
  r.config_file = run.config_file;
  r.num_parameters = model->num_parameters();
  r.best_loss = std::numeric_limits<double>::infinity();

  // Resume before anything is written: a corrupt checkpoint leaves the run directory as it was.
  TrainState st;
  if (!run.resume_checkpoint.empty()) {
    st = load_training_checkpoint(run.resume_checkpoint, *model, opt, masters.get());
    restore_rng(st.rng);
    train_batches.set_position(st.sampler_position);
    r.first_loss = st.first_loss;
    r.best_loss = st.best_loss;
    r.final_loss = st.last_loss;
    r.steps = st.step;
    r.resumed_from = run.resume_checkpoint;
    r.resumed_from_step = st.step;
  }
  const int64_t start_step = st.step;

  log << "pretrain | GPT-2 " << s.n_layer << " layers, " << s.n_head << " heads, " << s.n_embd << " wide, "
      << format_count(static_cast<double>(r.num_parameters)) << " parameters | " << r.device << " " << r.dtype << " | "
      << data.name() << ": " << format_count(static_cast<double>(data.tokens(Split::Train).size())) << " train / "
      << format_count(static_cast<double>(data.tokens(Split::Val).size())) << " val tokens (bytes) | batch "
      << s.batch_size << " x " << s.block_size;
  if (s.grad_accum > 1) log << " x " << s.grad_accum << " accumulated";
  log << "\n";
  if (!run.resume_checkpoint.empty())
    log << "resume | " << run.resume_reason << ": continuing after step " << st.step << " from "
        << run.resume_checkpoint << "\n";
  log.flush();

  // One training step: every micro-batch's forward and backward, clipping, the optimizer update and the
  // master-weight copies. Compiled, it is traced into one graph on the first call (compile/api.h); the clip
  // then stays on the device (clip_grad_norm_tensor) instead of reading the norm back to the host.
  const double inv_accum = 1.0 / static_cast<double>(s.grad_accum);
  auto step_body = [&](const std::vector<Tensor>& batch, bool traced) {
    Tensor total;
    for (int64_t micro = 0; micro < s.grad_accum; ++micro) {
      Tensor loss = model->loss(batch[2 * micro], batch[2 * micro + 1]);
      // Gradients of the mean over micro-batches; with one micro-batch the loss is used as is.
      Tensor scaled = s.grad_accum > 1 ? loss * inv_accum : loss;
      scaled.backward();
      total = total.defined() ? total + scaled.detach() : scaled.detach();
    }
    if (masters) masters->copy_grads_to_master();
    if (s.grad_clip > 0) {
      if (traced) optim::clip_grad_norm_tensor(opt_params, s.grad_clip);
      else opt.set_grad_scale(optim::clip_coefficient(optim::grad_norm(opt_params), s.grad_clip));
    }
    opt.step();
    opt.zero_grad();
    if (masters) {
      masters->copy_to_model();
      model->zero_grad();
    }
    return std::vector<Tensor>{total};
  };
  std::optional<CompiledFunction> compiled;
  if (run.compile.enabled) {
    compiled = compile([&](const std::vector<Tensor>& b) { return step_body(b, true); },
                       compile_options(run.compile));
    log << "compile | mode " << run.compile.mode << ": the first step traces and compiles the whole training step\n";
  }

  RunOutputs outputs(run, start_step > 0 ? start_step : -1, log);
  r.metrics_log = outputs.metrics_path();

  Allocator& alloc = allocator_for(run.device);
  alloc.reset_peak();
  const double tokens_per_step = static_cast<double>(s.batch_size * s.block_size * s.grad_accum);
  const int64_t n_embedding = static_cast<int64_t>(mc.vocab_size * s.n_embd + s.block_size * s.n_embd);
  const double flops_per_token =
      transformer_flops_per_token(r.num_parameters - n_embedding, s.n_layer, s.block_size, s.n_embd);
  const double peak = peak_flops(run.device.is_cuda(), run.dtype == DType::bf16, run.peak_tflops);
  double window_loss = 0, train_s = 0;
  int64_t window_steps = 0;
  Clock::time_point window_start = Clock::now();

  auto make_state = [&](int64_t step, double lr) {
    TrainState t;
    t.step = step;
    t.sampler_position = train_batches.position();
    t.tokens_seen = static_cast<int64_t>(tokens_per_step) * step;
    t.lr_schedule = s.lr_schedule;
    t.base_lr = s.lr;
    t.min_lr = s.min_lr;
    t.last_lr = lr;
    t.warmup_steps = s.warmup_steps;
    t.total_steps = run.max_steps;
    t.rng = capture_rng();
    t.first_loss = r.first_loss;
    t.best_loss = r.best_loss;
    t.last_loss = r.final_loss;
    t.train_s = st.train_s + train_s;
    t.config_hash = run.config_hash;
    t.config = run.config_entries;
    return t;
  };

  bool stale_removed = false;
  std::error_code ec;
  for (int64_t step = start_step; step < run.max_steps; ++step) {
    Clock::time_point step_start = Clock::now();
    outputs.begin_step(step + 1);
    double lr = sched.at(step);
    opt.set_lr(lr);
    std::vector<Tensor> batch;
    for (int64_t micro = 0; micro < s.grad_accum; ++micro) {
      auto [x, y] = inputs_and_targets(train_batches.next().to(run.device));
      batch.push_back(x);
      batch.push_back(y);
    }
    const double l = (compiled ? (*compiled)(batch) : step_body(batch, false))[0].item();
    INGOT_CHECK(std::isfinite(l), "training diverged: the loss is ", l, " at step ", step + 1, " (lr ", lr,
                "); lower train.lr or set train.grad_clip");
    double step_s = seconds_since(step_start);
    train_s += step_s;
    outputs.end_step(step + 1);
    if (step == 0) r.first_loss = l;
    r.final_loss = l;
    r.best_loss = std::min(r.best_loss, l);
    r.steps = step + 1;
    window_loss += l;
    ++window_steps;

    const double rate = tokens_per_step / std::max(step_s, 1e-9);
    const double mfu = peak > 0 ? rate * flops_per_token / peak : -1;
    const double mem = static_cast<double>(alloc.stats().allocated_bytes);
    nlohmann::ordered_json rec;
    rec["kind"] = "train";
    rec["step"] = step + 1;
    rec["loss"] = l;
    rec["lr"] = lr;
    rec["tokens"] = static_cast<int64_t>(tokens_per_step) * (step + 1);
    rec["tokens_per_s"] = rate;
    rec["mfu"] = std::max(mfu, 0.0);
    rec["memory_bytes"] = static_cast<int64_t>(mem);
    rec["time_s"] = st.train_s + train_s;
    outputs.log_train(rec.dump(), step + 1, l, lr, rate);

    bool last = step + 1 == run.max_steps;
    if (step == start_step || (step + 1) % s.log_every == 0 || last) {
      double window_rate =
          tokens_per_step * static_cast<double>(window_steps) / std::max(seconds_since(window_start), 1e-9);
      double done = static_cast<double>(step + 1 - start_step);
      double eta = train_s / done * static_cast<double>(run.max_steps - step - 1);
      double window_mfu = peak > 0 ? window_rate * flops_per_token / peak : -1;
      log << progress_line(step + 1, run.max_steps, window_loss / static_cast<double>(window_steps), lr, window_rate,
                           window_mfu, mem, eta)
          << "\n"
          << std::flush;
      window_loss = 0;
      window_steps = 0;
      window_start = Clock::now();
    }
    if (val_batches && s.eval_every > 0 && (step + 1) % s.eval_every == 0 && !last) {
      double v = evaluate(*model, *val_batches, s.eval_batches, run.device);
      outputs.log_eval(step + 1, v);
      char buf[120];
      std::snprintf(buf, sizeof buf, "eval | step %lld | val_loss %.3f\n", static_cast<long long>(step + 1), v);
      log << buf << std::flush;
    }
    if (run.save_every > 0 && ((step + 1) % run.save_every == 0 || last)) {
      std::string path = save_training_checkpoint(run.output_dir, *model, opt, masters.get(), make_state(step + 1, lr));
      if (!stale_removed) {
        // Checkpoints past this run's starting point belong to an earlier run in the same output_dir (or a
        // future this run has replaced); they go once this run has a checkpoint of its own.
        for (const auto& [old_step, old_path] : list_checkpoints(run.output_dir))
          if (old_step > start_step && old_path != path) fs::remove_all(old_path, ec);
        stale_removed = true;
      }
      prune_checkpoints(run.output_dir, run.keep_last);
      log << "checkpoint | step " << step + 1 << " | " << path << "\n" << std::flush;
    }
    if (s.halt_after_steps > 0 && step + 1 - start_step >= s.halt_after_steps) {
      r.train_s = train_s;
      return r;
    }
  }
  r.train_s = st.train_s + train_s;
  const double run_steps = static_cast<double>(r.steps - start_step);
  r.tokens_per_s = tokens_per_step * run_steps / std::max(train_s, 1e-9);
  r.mfu = peak > 0 ? r.tokens_per_s * flops_per_token / peak : 0;

  if (val_batches) {
    r.val_loss = evaluate(*model, *val_batches, s.eval_batches, run.device);
    outputs.log_eval(r.steps, r.val_loss);
    char buf[160];
    std::snprintf(buf, sizeof buf, "eval | val_loss %.3f over %lld batches | train loss %.3f (last step)\n", r.val_loss,
                  static_cast<long long>(s.eval_batches), r.final_loss);
    log << buf;
  }
  r.peak_memory_bytes = alloc.stats().peak_allocated_bytes;
  if (compiled) {
    const CompileStats& cs = compiled->stats();
    r.compile_s = cs.time.total_ms / 1e3;
    r.graphs = cs.compiles;
    r.graph_breaks = static_cast<int64_t>(cs.graph_breaks.size());
    r.recompiles = cs.recompiles;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "compile | %lld graph(s), %lld break(s), %lld recompile(s) | %lld launches per step for %lld eager "
                  "ops (%lld generated kernels) | compile %.2f s\n",
                  static_cast<long long>(r.graphs), static_cast<long long>(r.graph_breaks),
                  static_cast<long long>(r.recompiles), static_cast<long long>(cs.launches),
                  static_cast<long long>(cs.compute_ops), static_cast<long long>(cs.kernels), r.compile_s);
    log << buf;
    for (const std::string& b : cs.graph_breaks) log << "compile | graph break: " << b << "\n";
  }

  // Save f32 weights: in bf16 mode the masters hold the precise values.
  if (masters) {
    NoGradGuard no_grad;
    model->to(DType::f32);
    std::vector<Tensor> params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters->master()[i]);
  }
  fs::create_directories(run.output_dir, ec);
  INGOT_CHECK(!ec, "cannot create output_dir '", run.output_dir, "': ", ec.message());
  std::string weights = (fs::path(run.output_dir) / "model.safetensors").string();
  std::string config = (fs::path(run.output_dir) / "config.yaml").string();
  model->save(weights);
  write_file_atomic(config, [&](std::FILE* f) { write_bytes(f, run.resolved_yaml.data(), run.resolved_yaml.size()); });
  r.checkpoints = {weights, config};
  for (const auto& [step, path] : list_checkpoints(run.output_dir)) r.training_checkpoints.push_back(path);
  outputs.finish(r);
  write_summary(r, (fs::path(run.output_dir) / "summary.json").string());

  log << "done | " << r.steps << " steps in " << format_duration(r.train_s) << " | loss ";
  char buf[200];
  std::snprintf(buf, sizeof buf, "%.3f -> %.3f | %s tok/s | saved %s\n", r.first_loss, r.final_loss,
                format_count(r.tokens_per_s).c_str(), weights.c_str());
  log << buf << std::flush;
  return r;
}

std::string summary_json(const TrainSummary& r) {
  nlohmann::ordered_json j;
  j["steps"] = r.steps;
  j["first_loss"] = r.first_loss;
  j["final_loss"] = r.final_loss;
  j["best_loss"] = std::isfinite(r.best_loss) ? r.best_loss : 0.0;
  j["val_loss"] = r.val_loss;
  j["tokens_per_s"] = r.tokens_per_s;
  j["mfu"] = r.mfu;
  j["train_s"] = r.train_s;
  j["compile_s"] = r.compile_s;
  j["graphs"] = r.graphs;
  j["graph_breaks"] = r.graph_breaks;
  j["recompiles"] = r.recompiles;
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["num_parameters"] = r.num_parameters;
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
