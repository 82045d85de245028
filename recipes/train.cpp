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
#include "recipes/data.h"
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
    s.add(K::of(T::String, "device", "auto", "auto (a GPU when present), cpu, cuda or cuda:N"));
    s.add(K::of(T::String, "dtype", "f32", "f32, or bf16 compute with f32 master weights").one_of({"f32", "bf16"}));
    s.add(K::of(T::Int, "max_steps", "1000", "optimizer steps to run").at_least(1));
    s.add(K::of(T::Int, "seed", "0", "seeds weight init, dropout and batch sampling").at_least(0));
    s.add(K::of(T::String, "output_dir", "runs/pretrain", "where model.safetensors, config.yaml, summary.json go"));
    s.add(K::of(T::Bool, "resume", "false", "continue from the checkpoint in output_dir (not implemented yet)"));
    s.add(K::of(T::Bool, "compile.enabled", "false", "compile the training step (compiler not built yet: runs eager)"));
    s.add(K::of(T::String, "compile.mode", "default", "compiler mode")
              .one_of({"default", "reduce-overhead", "max-autotune"}));
    s.add(K::of(T::Int, "model.n_layer", "4", "transformer blocks").at_least(1));
    s.add(K::of(T::Int, "model.n_head", "4", "attention heads (must divide n_embd)").at_least(1));
    s.add(K::of(T::Int, "model.n_embd", "128", "hidden width").at_least(1));
    s.add(K::of(T::Int, "model.block_size", "64", "context length T in tokens").at_least(1));
    s.add(K::of(T::Float, "model.dropout", "0.0", "dropout probability").at_least(0).at_most(0.99));
    s.add(K::required_key(T::String, "data.path", "UTF-8 text file (relative to the working directory)"));
    s.add(K::of(T::Float, "data.val_fraction", "0.1", "trailing fraction of the text held out for eval")
              .at_least(0)
              .at_most(0.9));
    s.add(K::of(T::Int, "train.batch_size", "16", "sequences per step").at_least(1));
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
    s.add(K::of(T::Int, "train.eval_batches", "20", "validation batches for the final eval (0: skip)").at_least(0));
    return s;
  }();
  return schema;
}

PretrainSettings resolve_pretrain(const Config& cfg) {
  PretrainSettings s;
  s.config_file = cfg.file();
  s.resolved_yaml = cfg.to_yaml();

  std::string dev = cfg.get_string("device");
  try {
    s.device = parse_device(dev);
  } catch (const Error& e) {
    cfg.fail("device", e.what());
  }
  if (s.device.is_cuda()) {
    int n = cuda_device_count();
    if (n == 0) {
#ifdef INGOT_WITH_CUDA
      cfg.fail("device", "'" + dev + "' asks for a GPU, but no CUDA device is visible (use auto or cpu)");
#else
      cfg.fail("device", "'" + dev + "' asks for a GPU, but this ingot was built without CUDA (use auto or cpu)");
#endif
    }
    if (s.device.index >= n)
      cfg.fail("device", "'" + dev + "': only " + std::to_string(n) + " CUDA device(s) are visible");
  }
  s.dtype = parse_dtype(cfg.get_string("dtype"));
  s.max_steps = cfg.get_int("max_steps");
  s.seed = static_cast<uint64_t>(cfg.get_int("seed"));
  s.output_dir = cfg.get_string("output_dir");
  if (s.output_dir.empty()) cfg.fail("output_dir", "must not be empty");
  s.compile = cfg.get_bool("compile.enabled");
  s.compile_mode = cfg.get_string("compile.mode");

  s.n_layer = cfg.get_int("model.n_layer");
  s.n_head = cfg.get_int("model.n_head");
  s.n_embd = cfg.get_int("model.n_embd");
  s.block_size = cfg.get_int("model.block_size");
  s.dropout = cfg.get_double("model.dropout");
  if (s.n_embd % s.n_head != 0)
    cfg.fail("model.n_head",
             std::to_string(s.n_head) + " heads do not divide model.n_embd = " + std::to_string(s.n_embd));

  s.data_path = cfg.get_string("data.path");
  std::error_code ec;
  if (!fs::is_regular_file(s.data_path, ec))
    cfg.fail("data.path", "no such file '" + s.data_path + "'" +
                              (s.data_path.rfind("data/", 0) == 0 ? " (run ./scripts/get_data.sh to fetch it)" : ""));
  s.val_fraction = cfg.get_double("data.val_fraction");

  s.batch_size = cfg.get_int("train.batch_size");
  s.lr = cfg.get_double("train.lr");
  s.min_lr = cfg.get_double("train.min_lr");
  if (s.min_lr > s.lr) cfg.fail("train.min_lr", "must not exceed train.lr (" + cfg.value("train.lr").text + ")");
  s.warmup_steps = cfg.get_int("train.warmup_steps");
  s.lr_schedule = cfg.get_string("train.lr_schedule");
  s.weight_decay = cfg.get_double("train.weight_decay");
  s.beta1 = cfg.get_double("train.beta1");
  s.beta2 = cfg.get_double("train.beta2");
  s.grad_clip = cfg.get_double("train.grad_clip");
  s.log_every = cfg.get_int("train.log_every");
  s.eval_batches = cfg.get_int("train.eval_batches");
  if (s.eval_batches > 0 && s.val_fraction == 0)
    cfg.fail("data.val_fraction", "is 0, so there is nothing to evaluate on; set train.eval_batches: 0 to skip eval");

  if (cfg.get_bool("resume")) {
    fs::path ckpt = fs::path(s.output_dir) / "model.safetensors";
    if (!fs::exists(ckpt, ec))
      cfg.fail("resume", "true, but there is no checkpoint to resume from (" + ckpt.string() + " does not exist)");
    cfg.fail("resume",
             "resuming is not implemented yet (found " + ckpt.string() + "); set resume: false to start over");
  }
  return s;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string format_rate(double tok_per_s) {
  char buf[32];
  if (tok_per_s >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", tok_per_s / 1e6);
  else if (tok_per_s >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", tok_per_s / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", tok_per_s);
  return buf;
}

std::string format_duration(double seconds) {
  int64_t t = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return buf;
}

std::string format_count(double n) {
  char buf[32];
  if (n >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

// Splits windows [B, T+1] into inputs [B, T] and next-token targets [B, T].
std::pair<Tensor, Tensor> inputs_and_targets(const Tensor& window) {
  int64_t t1 = window.size(1);
  return {contiguous(slice(window, 1, 0, t1 - 1)), contiguous(slice(window, 1, 1, t1))};
}

}  // namespace

TrainSummary run_pretrain(const PretrainSettings& s, std::ostream& log) {
  TextDataset data = TextDataset::from_file(s.data_path, s.val_fraction);
  BatchSampler train_batches(data, Split::Train, s.batch_size, s.block_size, s.seed);
  std::unique_ptr<BatchSampler> val_batches;
  if (s.eval_batches > 0)
    val_batches = std::make_unique<BatchSampler>(data, Split::Val, s.batch_size, s.block_size, s.seed);

  manual_seed(s.seed);
  models::GPT2Config mc;
  mc.vocab_size = data.vocab_size();
  mc.n_positions = s.block_size;
  mc.n_embd = s.n_embd;
  mc.n_layer = s.n_layer;
  mc.n_head = s.n_head;
  mc.dropout = s.dropout;
  auto model = std::make_shared<models::GPT2>(mc);
  model->to(s.device);
  model->train();

  // bf16: the model computes in bf16 parameters; AdamW updates f32 masters that are rounded back each step.
  std::unique_ptr<optim::MasterWeights> masters;
  std::vector<Tensor> opt_params = model->parameters();
  if (s.dtype == DType::bf16) {
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
  sched.total_steps = s.max_steps;

  TrainSummary r;
  r.device = s.device.str();
  r.dtype = std::string(dtype_name(s.dtype));
  r.output_dir = s.output_dir;
  r.config_file = s.config_file;
  r.num_parameters = model->num_parameters();

  log << "pretrain | GPT-2 " << s.n_layer << " layers, " << s.n_head << " heads, " << s.n_embd << " wide, "
      << format_count(static_cast<double>(r.num_parameters)) << " parameters | " << r.device << " " << r.dtype << " | "
      << data.name() << ": " << format_count(static_cast<double>(data.tokens(Split::Train).size())) << " train / "
      << format_count(static_cast<double>(data.tokens(Split::Val).size())) << " val tokens (bytes) | batch "
      << s.batch_size << " x " << s.block_size << "\n";
  if (s.compile)
    log << "note: compile.enabled is true (mode " << s.compile_mode
        << "), but the compiler is not built yet; running eager\n";
  log.flush();

  Allocator& alloc = allocator_for(s.device);
  alloc.reset_peak();
  const double tokens_per_step = static_cast<double>(s.batch_size * s.block_size);
  double window_loss = 0;
  int64_t window_steps = 0;
  r.best_loss = std::numeric_limits<double>::infinity();
  Clock::time_point start = Clock::now(), window_start = start;

  for (int64_t step = 0; step < s.max_steps; ++step) {
    double lr = sched.at(step);
    opt.set_lr(lr);
    auto [x, y] = inputs_and_targets(train_batches.next().to(s.device));
    Tensor loss = model->loss(x, y);
    loss.backward();
    if (masters) masters->copy_grads_to_master();
    if (s.grad_clip > 0) opt.set_grad_scale(optim::clip_coefficient(optim::grad_norm(opt_params), s.grad_clip));
    opt.step();
    opt.zero_grad();
    if (masters) {
      masters->copy_to_model();
      model->zero_grad();
    }
    double l = loss.item();
    INGOT_CHECK(std::isfinite(l), "training diverged: the loss is ", l, " at step ", step + 1, " (lr ", lr,
                "); lower train.lr or set train.grad_clip");
    if (step == 0) r.first_loss = l;
    r.final_loss = l;
    r.best_loss = std::min(r.best_loss, l);
    r.steps = step + 1;
    window_loss += l;
    ++window_steps;
    bool last = step + 1 == s.max_steps;
    if (step == 0 || (step + 1) % s.log_every == 0 || last) {
      double elapsed = seconds_since(start);
      double rate = tokens_per_step * static_cast<double>(window_steps) / std::max(seconds_since(window_start), 1e-9);
      double eta = elapsed / static_cast<double>(step + 1) * static_cast<double>(s.max_steps - step - 1);
      char buf[160];
      std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.3f | lr %.1e | %s tok/s | ETA %s\n",
                    static_cast<long long>(step + 1), static_cast<long long>(s.max_steps),
                    window_loss / static_cast<double>(window_steps), lr, format_rate(rate).c_str(),
                    format_duration(eta).c_str());
      log << buf << std::flush;
      window_loss = 0;
      window_steps = 0;
      window_start = Clock::now();
    }
  }
  r.train_s = seconds_since(start);
  r.tokens_per_s = tokens_per_step * static_cast<double>(r.steps) / std::max(r.train_s, 1e-9);

  if (val_batches) {
    NoGradGuard no_grad;
    model->eval();
    double total = 0;
    for (int64_t i = 0; i < s.eval_batches; ++i) {
      auto [x, y] = inputs_and_targets(val_batches->batch(i).to(s.device));
      total += model->loss(x, y).item();
    }
    model->train();
    r.val_loss = total / static_cast<double>(s.eval_batches);
    char buf[160];
    std::snprintf(buf, sizeof buf, "eval | val_loss %.3f over %lld batches | train loss %.3f (last step)\n", r.val_loss,
                  static_cast<long long>(s.eval_batches), r.final_loss);
    log << buf;
  }
  r.peak_memory_bytes = alloc.stats().peak_allocated_bytes;

  // Save f32 weights: in bf16 mode the masters hold the precise values.
  if (masters) {
    NoGradGuard no_grad;
    model->to(DType::f32);
    std::vector<Tensor> params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters->master()[i]);
  }
  std::error_code ec;
  fs::create_directories(s.output_dir, ec);
  INGOT_CHECK(!ec, "cannot create output_dir '", s.output_dir, "': ", ec.message());
  std::string weights = (fs::path(s.output_dir) / "model.safetensors").string();
  std::string config = (fs::path(s.output_dir) / "config.yaml").string();
  model->save(weights);
  write_file_atomic(config, [&](std::FILE* f) { write_bytes(f, s.resolved_yaml.data(), s.resolved_yaml.size()); });
  r.checkpoints = {weights, config};
  write_summary(r, (fs::path(s.output_dir) / "summary.json").string());

  char buf[200];
  std::snprintf(buf, sizeof buf, "done | %lld steps in %s | loss %.3f -> %.3f | %s tok/s | saved %s\n",
                static_cast<long long>(r.steps), format_duration(r.train_s).c_str(), r.first_loss, r.final_loss,
                format_rate(r.tokens_per_s).c_str(), weights.c_str());
  log << buf << std::flush;
  return r;
}

std::string summary_json(const TrainSummary& r) {
  nlohmann::ordered_json j;
  j["steps"] = r.steps;
  j["first_loss"] = r.first_loss;
  j["final_loss"] = r.final_loss;
  j["best_loss"] = r.best_loss;
  j["val_loss"] = r.val_loss;
  j["tokens_per_s"] = r.tokens_per_s;
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
  j["checkpoints"] = r.checkpoints;
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
