#include "recipes/train.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <system_error>

#include "autograd/nn/layers.h"
#include "models/gpt2.h"
#include "recipes/data.h"
#include "recipes/data_parallel.h"
#include "recipes/metrics.h"
#include "recipes/sharded_checkpoint.h"
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
    add_train_keys(s, TrainDefaults{});
    return s;
  }();
  return schema;
}

PretrainSettings resolve_pretrain(const Config& cfg, ConfigErrors& errors) {
  PretrainSettings s;
  s.run = resolve_run(cfg, errors);
  const ConfigReader rd(cfg, errors);

  s.n_layer = rd.i64("model.n_layer");
  s.n_head = rd.i64("model.n_head");
  s.n_embd = rd.i64("model.n_embd");
  s.block_size = rd.i64("model.block_size");
  s.dropout = rd.f64("model.dropout");
  if (s.n_head > 0 && s.n_embd % s.n_head != 0)
    errors.fail(cfg, "model.n_head",
                std::to_string(s.n_head) + " heads do not divide model.n_embd = " + std::to_string(s.n_embd));

  s.data_path = rd.str("data.path");
  std::error_code ec;
  if (!errors.has_error_for("data.path") && !fs::is_regular_file(s.data_path, ec))
    errors.fail(cfg, "data.path",
                "no such file '" + s.data_path + "'" +
                    (s.data_path.rfind("data/", 0) == 0 ? " (run ./scripts/get_data.sh to fetch it)" : ""));
  else if (std::string problem = text_file_problem(s.data_path); !errors.has_error_for("data.path") && !problem.empty())
    errors.fail(cfg, "data.path", "'" + s.data_path + "' " + problem);
  s.val_fraction = rd.f64("data.val_fraction");

  s.train = resolve_train_options(cfg, errors);
  check_global_batch(cfg, s.run, s.train.batch_size, errors);
  check_optimizer_in_backward(cfg, s.run, s.train, errors);
  if (s.train.eval_batches > 0 && s.val_fraction == 0 && !errors.has_error_for("data.val_fraction"))
    errors.fail(cfg, "data.val_fraction",
                "is 0, so there is nothing to evaluate on; set train.eval_batches: 0 to skip eval");
  // A split shorter than one window (block_size + 1 tokens) cannot give a batch: found here, not at run time.
  // (A file that cannot be read is data.path's own error above.)
  std::error_code size_ec;
  const auto bytes = static_cast<int64_t>(fs::file_size(s.data_path, size_ec));
  if (!size_ec && !errors.has_error_for("data.path") && !errors.has_error_for("data.val_fraction") &&
      !errors.has_error_for("model.block_size")) {
    const auto [n_train, n_val] = split_sizes(bytes, s.val_fraction);
    const int64_t window = s.block_size + 1;
    auto split_text = [&](const char* which, int64_t n) {
      return "'" + s.data_path + "' (" + std::to_string(bytes) + " tokens (bytes)) leaves a " + which + " split of " +
             std::to_string(n) + " tokens, fewer than model.block_size + 1 = " + std::to_string(window);
    };
    if (n_train < window)
      errors.fail(cfg, "data.path", split_text("train", n_train) + "; use a longer text or a smaller model.block_size");
    else if (s.train.eval_batches > 0 && s.val_fraction > 0 && n_val < window)
      errors.fail(cfg, "data.val_fraction",
                  cfg.value("data.val_fraction").text + " of " + split_text("validation", n_val) +
                      "; raise data.val_fraction, use a smaller model.block_size or a longer text, or set "
                      "train.eval_batches: 0 to skip eval");
  }
  return s;
}

PretrainSettings resolve_pretrain(const Config& cfg) {
  ConfigErrors errors;
  PretrainSettings s = resolve_pretrain(cfg, errors);
  errors.raise_if_any();
  return s;
}

namespace {

// Splits windows [B, T+1] into inputs [B, T] and next-token targets [B, T].
std::pair<Tensor, Tensor> inputs_and_targets(const Tensor& window) {
  int64_t t1 = window.size(1);
  return {contiguous(slice(window, 1, 0, t1 - 1)), contiguous(slice(window, 1, 1, t1))};
}

}  // namespace

PretrainModel build_pretrain_model(const PretrainSettings& s, int64_t vocab_size) {
  const RunSettings& run = s.run;
  manual_seed(run.seed);
  models::GPT2Config mc;
  mc.vocab_size = vocab_size;
  mc.n_positions = s.block_size;
  mc.n_embd = s.n_embd;
  mc.n_layer = s.n_layer;
  mc.n_head = s.n_head;
  mc.dropout = s.dropout;
  PretrainModel out;
  // As full fine-tuning's shard-wise build (recipes/finetune.cpp): a whole checkpoint is read into a whole model.
  const bool shard_wise = run.distributed.zero_stage == 3 && (run.world_size > 1 || run.mpi) &&
                          (run.resume_checkpoint.empty() || is_sharded_checkpoint(run.resume_checkpoint));
  if (!shard_wise) {
    out.model = std::make_shared<models::GPT2>(mc);
    out.model->to(run.device);
    return out;
  }
  // Built in the run's dtype, as the training loop would cast it (Module::to); the generator moves as if drawn,
  // so dropout draws what it draws in any other run.
  std::vector<nn::DeferredInit> inits;
  uint64_t total = 0;
  {
    nn::SkipInit skip(run.dtype, run.device);
    out.model = std::make_shared<models::GPT2>(mc);
    for (const Tensor& p : out.model->parameters()) {
      inits.push_back(skip.deferred(p));
      total += p.nbytes();
    }
  }
  auto drawn = std::make_shared<uint64_t>(0);
  out.initial_values = TrainTask::WeightSlices{
      [inits = std::move(inits), drawn](size_t i, int64_t begin, int64_t end, Tensor& dst) {
        inits.at(i).fill(begin, end, dst);
        *drawn += dst.nbytes();
      },
      [drawn, total] { return std::make_pair(*drawn, total); }, /*drawn=*/true};
  return out;
}

TrainSummary run_pretrain(const PretrainSettings& s, std::ostream& log) {
  const RunSettings& run = s.run;
  const TrainOptions& o = s.train;
  TextDataset data = TextDataset::from_file(s.data_path, s.val_fraction);
  // Each rank reads its rows of every global batch (train.batch_size is the global batch).
  BatchSampler train_batches(data, Split::Train, o.batch_size, s.block_size, run.seed, run.rank, run.world_size);
  std::unique_ptr<BatchSampler> val_batches;
  if (o.eval_batches > 0)
    val_batches = std::make_unique<BatchSampler>(data, Split::Val, o.batch_size, s.block_size, run.seed, run.rank,
                                                 run.world_size);

  PretrainModel built = build_pretrain_model(s, data.vocab_size());
  const std::shared_ptr<models::GPT2> model = built.model;
  const models::GPT2Config& mc = model->config();
  models::set_checkpointing(*model, o.checkpointing, o.checkpointing_layers);  // train.activation_checkpointing
  model->set_loss_chunks(o.loss_chunks);
  model->set_trained_head_in_chunks(o.trained_head_in_chunks);

  TrainTask task;
  task.model = model.get();
  task.params = model->parameters();
  task.loss = [&](const MicroBatch& b) { return model->loss(b.inputs, b.targets); };
  task.next_batch = [&] {
    auto [x, y] = inputs_and_targets(train_batches.next());
    return MicroBatch{x, y, Tensor()};
  };
  task.data_position = [&] { return train_batches.position(); };
  task.set_data_position = [&](int64_t p) { train_batches.set_position(p); };
  if (val_batches) {
    task.evaluate = [&] {
      double total = 0;
      for (int64_t i = 0; i < o.eval_batches; ++i) {
        auto [x, y] = inputs_and_targets(val_batches->batch(i).to(run.device));
        total += model->loss(x, y).item();
      }
      return total / static_cast<double>(o.eval_batches);
    };
    task.eval_description = std::to_string(o.eval_batches) + " batches";
  }
  task.weight_slices = std::move(built.initial_values);
  task.tokens_per_step = static_cast<double>(o.batch_size * s.block_size * o.grad_accum);
  const int64_t n_embedding = mc.vocab_size * s.n_embd + s.block_size * s.n_embd;
  task.flops_per_token =
      transformer_flops_per_token(model->num_parameters() - n_embedding, 0, s.n_layer, s.block_size, s.n_embd);
  task.halt_after_steps = s.halt_after_steps;

  std::ostringstream header;
  header << "pretrain | GPT-2 " << s.n_layer << " layers, " << s.n_head << " heads, " << s.n_embd << " wide, "
         << format_count(static_cast<double>(model->num_parameters())) << " parameters | " << run.device.str() << " "
         << dtype_name(run.dtype) << " | " << data.name() << ": "
         << format_count(static_cast<double>(data.tokens(Split::Train).size())) << " train / "
         << format_count(static_cast<double>(data.tokens(Split::Val).size())) << " val tokens (bytes) | batch "
         << o.batch_size << " x " << s.block_size;
  if (o.grad_accum > 1) header << " x " << o.grad_accum << " accumulated";
  if (run.world_size > 1) header << " (" << o.batch_size / run.world_size << " per rank x " << run.world_size << " ranks)";
  task.header = header.str();

  task.save_final = [&] {
    std::string weights = (fs::path(run.output_dir) / "model.safetensors").string();
    std::string config = (fs::path(run.output_dir) / "config.yaml").string();
    model->save(weights);
    write_file_atomic(config,
                      [&](std::FILE* f) { write_bytes(f, run.resolved_yaml.data(), run.resolved_yaml.size()); });
    return std::vector<std::string>{weights, config};
  };
  // ZeRO-3: the same file from the shards, one gathered tensor at a time (rank 0 never holds the model whole).
  task.save_final_sharded = [&](const ShardedWeights& w) {
    std::string weights = (fs::path(run.output_dir) / "model.safetensors").string();
    std::string config = (fs::path(run.output_dir) / "config.yaml").string();
    save_module_streamed(*model, task.params, weights, w);
    if (w.writer)
      write_file_atomic(config,
                        [&](std::FILE* f) { write_bytes(f, run.resolved_yaml.data(), run.resolved_yaml.size()); });
    return std::vector<std::string>{weights, config};
  };
  return run_training(run, o, task, log);
}

}  // namespace ingot::recipes
