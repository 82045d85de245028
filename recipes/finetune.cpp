#include "recipes/finetune.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "autograd/nn/layers.h"
#include "models/hf_checkpoint.h"
#include "models/peft.h"
#include "models/qlora.h"
#include "recipes/data_parallel.h"
#include "recipes/memory_advice.h"
#include "recipes/metrics.h"
#include "recipes/sharded_checkpoint.h"
#include "runtime/file_util.h"
#include "runtime/rng.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

namespace {

TrainDefaults finetune_train_defaults(bool lora) {
  TrainDefaults d;
  d.batch_size = "8";
  d.lr = lora ? "2e-4" : "2e-5";
  d.min_lr = "0";
  d.warmup_steps = "0";
  d.weight_decay = "0.0";
  d.beta2 = "0.999";
  d.eval_batches = "10";
  return d;
}

ConfigSchema finetune_schema(bool lora) {
  using T = ConfigType;
  using K = ConfigKey;
  ConfigSchema s;
  const std::string name = lora ? "lora_finetune" : "full_finetune";
  add_run_keys(s, name, "runs/" + name);
  add_model_keys(s, /*adapter=*/false);
  add_data_keys(s, /*training=*/true, "instruction");
  add_train_keys(s, finetune_train_defaults(lora));
  s.add(K::of(T::Int, "train.epochs", "0", "passes over the data (> 0 replaces max_steps)").at_least(0));
  if (lora) {
    s.add(K::of(T::Int, "lora.rank", "8", "rank r of the adapters").at_least(1));
    s.add(K::of(T::Float, "lora.alpha", "16", "the update is scaled by alpha / rank").at_least(1e-9));
    s.add(K::of(T::Float, "lora.dropout", "0.0", "dropout on the adapters' input").at_least(0).at_most(0.99));
    s.add(K::of(T::StringList, "lora.target_modules", "[q_proj, v_proj]",
                "projections to adapt (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head; "
                "GPT-2: c_attn, c_proj, c_fc), or all-linear: every one but lm_head, as PEFT's all-linear"));
    s.add(K::of(T::Bool, "lora.merge_on_export", "true", "also export the merged model to output_dir/hf"));
    s.add(K::of(T::String, "lora.quantize_base", "none",
                "nf4: keep the frozen base projections in NF4 (QLoRA: 64-weight blocks, double-quantized absmax), "
                "quantized at load; lm_head, embeddings and norms stay dense")
              .one_of({"none", "nf4"}));
  }
  s.add(K::of(T::Float, "export.max_shard_mb", "5000", "exported weights are split into shards above this size (MB)")
            .at_least(0.001));
  return s;
}

// Examples [0, n - held_out) train, the rest validate.
int64_t held_out_count(size_t n, double fraction) {
  if (fraction <= 0) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * fraction));
}

std::vector<std::string> files_to_export(const ModelSource& src) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                        "merges.txt"}) {
    fs::path p = fs::path(src.tokenizer_path) / f;
    if (fs::is_regular_file(p, ec)) out.push_back(p.string());
  }
  fs::path gen = fs::path(src.path) / "generation_config.json";
  if (fs::is_regular_file(gen, ec)) out.push_back(gen.string());
  return out;
}

// Sets "chat_template" in <dir>/tokenizer_config.json (the copy of the source's, or a new file), so that
// the export renders prompts with the template the model was fine-tuned on (`generate` with
// chat_template auto, transformers' apply_chat_template).
void export_chat_template(const fs::path& dir, const std::string& jinja) {
  const fs::path path = dir / "tokenizer_config.json";
  std::error_code ec;
  nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
  if (fs::is_regular_file(path, ec)) cfg = nlohmann::ordered_json::parse(read_file(path.string()));
  cfg["chat_template"] = jinja;
  const std::string text = cfg.dump(2) + "\n";
  write_file_atomic(path.string(), [&](std::FILE* f) { write_bytes(f, text.data(), text.size()); });
}

int64_t count_loss_tokens(const std::vector<datasets::Example>& ex) {
  int64_t n = 0;
  for (const auto& e : ex)
    for (int32_t l : e.labels) n += l != kIgnoreIndex;
  return n;
}

}  // namespace

const ConfigSchema& full_finetune_schema() {
  static const ConfigSchema s = finetune_schema(false);
  return s;
}

const ConfigSchema& lora_finetune_schema() {
  static const ConfigSchema s = finetune_schema(true);
  return s;
}

std::vector<std::string> lora_target_names(const models::HFConfig& cfg) {
  std::vector<std::string> names;
  if (cfg.arch == models::HFConfig::Arch::GPT2) names = {"c_attn", "c_proj", "c_fc"};
  else names = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  if (!cfg.tie_word_embeddings()) names.push_back("lm_head");  // a tied head is the embedding, not a projection
  return names;
}

FinetuneSettings resolve_finetune(const Config& cfg, ConfigErrors& errors) {
  FinetuneSettings s;
  s.run = resolve_run(cfg, errors);
  s.lora = s.run.recipe == "lora_finetune";
  s.model = resolve_model_source(cfg, errors);
  const bool model_ok = !errors.has_error_for("model.path");
  s.data = resolve_data(cfg, s.model.config, errors);
  check_tokenizer_and_data(cfg, s.model, s.data, errors);
  s.train = resolve_train_options(cfg, errors);
  check_global_batch(cfg, s.run, s.train.batch_size, errors);
  check_optimizer_in_backward(cfg, s.run, s.train, errors);
  const ConfigReader rd(cfg, errors);
  s.epochs = rd.i64("train.epochs");
  s.max_shard_bytes = static_cast<int64_t>(rd.f64("export.max_shard_mb") * 1e6);
  if (s.lora) {
    s.lora_config.rank = rd.i64("lora.rank");
    s.lora_config.alpha = rd.f64("lora.alpha");
    s.lora_config.dropout = rd.f64("lora.dropout");
    s.lora_config.target_modules = rd.list("lora.target_modules");
    s.merge_on_export = rd.flag("lora.merge_on_export");
    s.quantize_base_nf4 = rd.str("lora.quantize_base") == "nf4";
  }
  if (s.data.val_fraction > 0 && s.train.eval_batches == 0 && cfg.has("train.eval_batches"))
    errors.fail(cfg, "train.eval_batches", "is 0 while data.val_fraction holds examples out; set it to evaluate them");
  if (s.lora && model_ok) {
    const std::vector<std::string> known = lora_target_names(s.model.config);
    std::vector<std::string>& targets = s.lora_config.target_modules;
    // PEFT's shorthand: every linear projection of the blocks, the output head excepted.
    if (std::find(targets.begin(), targets.end(), "all-linear") != targets.end()) {
      if (targets.size() > 1)
        errors.fail(cfg, "lora.target_modules", "'all-linear' names every projection; write it alone, not in a list");
      targets = known;
      std::erase(targets, "lm_head");
    }
    if (s.lora_config.target_modules.empty())
      errors.fail(cfg, "lora.target_modules", "is empty; name at least one projection");
    for (const std::string& t : s.lora_config.target_modules)
      if (std::find(known.begin(), known.end(), t) == known.end()) {
        std::string list;
        for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
        errors.fail(cfg, "lora.target_modules",
                    "unknown module '" + t + "' for a " + s.model.config.model_type + " model (" + s.model.path +
                        "); its projections are " + list);
      }
  }
  return s;
}

FinetuneSettings resolve_finetune(const Config& cfg) {
  ConfigErrors errors;
  FinetuneSettings s = resolve_finetune(cfg, errors);
  errors.raise_if_any();
  return s;
}

namespace {

// What a fine-tuning run holds while run_training trains it: the TrainTask's callbacks refer to it.
struct FinetuneRun {
  explicit FinetuneRun(const FinetuneSettings& settings)
      : s(settings), run(settings.run), tok(load_tokenizer(settings.model)) {}
  const FinetuneSettings& s;
  RunSettings run;  // s.run, with max_steps from train.epochs when set
  const Tokenizer tok;
  std::vector<datasets::Example> examples, val;  // training examples and the held-out ones
  std::unique_ptr<datasets::DataLoader> loader;
  int64_t per_epoch = 0;  // batches per pass over the examples
  // ZeRO-3 full fine-tuning builds the model without its weights: the training loop fills each rank's shards
  // with only their slices of the checkpoint (TrainTask::weight_slices), or a resume loads them.
  bool shard_wise = false;
  models::HFModel hf;
  std::vector<std::string> adapted;  // the projections LoRA adapts
  models::QuantizedBase quantized;   // lora.quantize_base: nf4
};

// The examples, the last data.val_fraction of them held out, and the loader over the rest; with train.epochs
// the run's length follows from the loader's batches per epoch.
void load_examples(FinetuneRun& f) {
  const FinetuneSettings& s = f.s;
  f.examples = load_data(s.data, f.tok);
  const int64_t n_val = held_out_count(f.examples.size(), s.data.val_fraction);
  INGOT_CHECK(n_val < static_cast<int64_t>(f.examples.size()), s.data.path, ": ", f.examples.size(),
              " examples leave none for training after data.val_fraction = ", s.data.val_fraction);
  f.val.assign(f.examples.end() - n_val, f.examples.end());
  f.examples.resize(f.examples.size() - static_cast<size_t>(n_val));

  datasets::LoaderOptions lo;
  lo.seq_len = s.data.seq_len;
  lo.global_batch_size = s.train.batch_size;
  lo.pack = s.data.packing;
  lo.shuffle = s.data.shuffle;
  lo.pad_id = f.tok.pad_id().value_or(f.tok.eos_id().value_or(0));
  lo.seed = s.run.seed;
  lo.rank = s.run.rank;  // each rank reads its rows of every global batch
  lo.world_size = s.run.world_size;
  try {
    f.loader = std::make_unique<datasets::DataLoader>(f.examples, lo);
  } catch (const Error& e) {
    INGOT_FAIL(s.data.path, ": ", e.what(), "; lower train.batch_size or data.seq_len, or add data");
  }
  f.per_epoch = f.loader->batches_per_epoch();
  if (s.epochs > 0)
    f.run.lr_schedule_steps = f.run.max_steps = std::max<int64_t>(1, s.epochs * f.per_epoch / s.train.grad_accum);
}

// The model on the run's device: built without weights (shard-wise), or loaded, with LoRA adapters and an NF4
// base as configured.
void build_model(FinetuneRun& f) {
  const FinetuneSettings& s = f.s;
  const RunSettings& run = f.run;
  manual_seed(run.seed);
  f.shard_wise = !s.lora && run.distributed.zero_stage == 3 && (run.world_size > 1 || run.mpi);
  if (f.shard_wise) {
    f.hf.config = models::load_hf_config(s.model.path);
    // Note [Parameters made to be overwritten]: the slices or a resume fill them. Without bytes (the model is
    // never whole on a rank: Note [Parameters without bytes], distributed/fsdp.h) unless a whole checkpoint is
    // resumed, which is read into the whole model before it is sharded.
    const bool into_shards = run.resume_checkpoint.empty() || is_sharded_checkpoint(run.resume_checkpoint);
    std::optional<nn::SkipInit> skip;
    if (into_shards) skip.emplace(run.dtype, run.device);
    else skip.emplace(DType::f32);
    f.hf.model = models::make_causal_lm(f.hf.config);
  } else {
    // Loaded straight into the compute dtype: the weights never exist in f32 (on the device that would be a load
    // peak of twice the bf16 weights: 32 GB for an 8B model whose offloaded full fine-tune steps in 21.5 GB), and
    // LoRA's adapters, made after, are rounded to it as the training loop's cast would round them. The training
    // loop casts the model to its dtype before it makes f32 masters from it, so f32 values loaded would be rounded
    // the same way before any master saw them. An NF4 base is quantized from the checkpoint's f32 values on the CPU.
    f.hf = models::load_hf_model(s.model.path, s.quantize_base_nf4 ? DType::f32 : run.dtype);
  }
  models::CausalLM& model = *f.hf.model;
  // The weights alone not fitting on the GPU is a different problem from a step's: say what shrinks them.
  auto to_device = [&] {
    try {
      model.to(run.device);
      if (s.quantize_base_nf4) models::quantized_base_to(model, run.device);
    } catch (const OutOfMemoryError& e) {
      WeightsAdviceInput in{.bytes = 0, .dtype = run.dtype, .lora = s.lora, .quantized_base = s.quantize_base_nf4};
      for (const Tensor& p : model.parameters()) in.bytes += static_cast<int64_t>(p.nbytes());
      in.bytes += models::quantized_base(model).bytes;
      throw OutOfMemoryError(std::string(e.what()) + "\n" + weights_advice(in));
    }
  };
  if (s.quantize_base_nf4) {
    // Quantized on the CPU before the move: the dense base never reaches the device.
    f.adapted = nn::apply_lora(model, s.lora_config);
    f.quantized = models::quantize_base_nf4(model);
    to_device();
  } else {
    to_device();
    if (s.lora) f.adapted = nn::apply_lora(model, s.lora_config);  // freezes every other parameter
  }
  model.set_tensor_names();
  models::set_checkpointing(model, s.train.checkpointing, s.train.checkpointing_layers);  // train.activation_checkpointing
  model.set_loss_chunks(s.train.loss_chunks);
  model.set_trained_head_in_chunks(s.train.trained_head_in_chunks);
}

// Shard-wise weights of a fresh ZeRO-3 start, read from the checkpoint's files (checked against the model now,
// before anything is trained or written).
TrainTask::WeightSlices weight_slices(FinetuneRun& f) {
  models::CausalLM& model = *f.hf.model;
  auto reader = std::make_shared<models::HFSliceReader>(model, f.hf.config, f.s.model.path);
  std::vector<std::string> names;
  for (const auto& [name, _] : model.named_parameters()) names.push_back(name);
  return TrainTask::WeightSlices{
      [reader, names](size_t i, int64_t begin, int64_t end, Tensor& dst) { reader->read(names[i], begin, end, dst); },
      [reader] { return std::make_pair(reader->bytes_read(), reader->total_bytes()); }};
}

// The task's loss, batches, data position and evaluation.
void set_data(FinetuneRun& f, TrainTask& task) {
  const FinetuneSettings& s = f.s;
  models::CausalLM& model = *f.hf.model;
  task.loss = [&model](const MicroBatch& b) { return model.loss(b.inputs, b.targets, b.positions); };
  task.next_batch = [&f] {
    datasets::Batch b = f.loader->next();
    return MicroBatch{b.input_ids, b.labels, b.positions};
  };
  task.positions = s.data.packing;
  task.loss_tokens = [](const Tensor& labels) {
    double n = 0;
    for (double l : labels.to_vector()) n += l != kIgnoreIndex;
    return n;
  };
  task.data_position = [&f] {
    datasets::DataPosition p = f.loader->position();
    return p.epoch * f.per_epoch + p.index;
  };
  task.set_data_position = [&f](int64_t p) { f.loader->set_position({p / f.per_epoch, p % f.per_epoch}); };
  const TrainOptions& o = s.train;
  if (!f.val.empty() && o.eval_batches > 0) {
    task.evaluate = [&f, &model, &o] {
      return sum_loss(model, f.val, f.s.data.seq_len, o.batch_size, o.eval_batches, f.run.device).mean();
    };
    task.evaluate_shard = [&f, &model, &o](int rank, int world) {
      const LossSum ls =
          sum_loss(model, f.val, f.s.data.seq_len, o.batch_size, o.eval_batches, f.run.device, rank, world);
      return std::make_pair(ls.total_nll, static_cast<double>(ls.tokens));
    };
    task.eval_description = std::to_string(f.val.size()) + " held-out examples";
  }
}

// Tokens and FLOPs per step (for throughput and MFU) and the banner's first line.
void describe(const FinetuneRun& f, TrainTask& task) {
  const FinetuneSettings& s = f.s;
  const TrainOptions& o = s.train;
  const RunSettings& run = f.run;
  const models::HFConfig& cfg = f.hf.config;
  task.tokens_per_step = static_cast<double>(o.batch_size * s.data.seq_len * o.grad_accum);
  const bool gpt2 = cfg.arch == models::HFConfig::Arch::GPT2;
  const int64_t n_layer = gpt2 ? cfg.gpt2.n_layer : cfg.llama.num_hidden_layers;
  const int64_t d_model = gpt2 ? cfg.gpt2.n_embd : cfg.llama.hidden_size;
  int64_t trained = 0;
  for (const Tensor& p : task.params) trained += p.numel();
  // MFU counts the products that run: a frozen base weight has no weight-gradient product (LoRA), the adapters
  // and every weight of a full fine-tune have all three. Embedding tables are lookups, not products.
  const int64_t embeddings = (cfg.vocab_size() + (gpt2 ? cfg.gpt2.n_positions : 0)) * d_model;
  const int64_t products = f.hf.model->num_parameters() + f.quantized.parameters - embeddings;
  task.flops_per_token =
      s.lora ? transformer_flops_per_token(trained, products - trained, n_layer, s.data.seq_len, d_model)
             : transformer_flops_per_token(products, 0, n_layer, s.data.seq_len, d_model);
  std::ostringstream h;
  h << run.recipe << " | " << cfg.model_type << " " << n_layer << " layers, "
    << format_count(static_cast<double>(f.hf.model->num_parameters() + f.quantized.parameters)) << " parameters, "
    << format_count(static_cast<double>(trained)) << " trained";
  if (s.lora) h << " (LoRA r=" << s.lora_config.rank << " on " << f.adapted.size() << " projections)";
  if (f.quantized.tensors > 0)
    h << " | NF4 base: " << f.quantized.tensors << " weights, "
      << format_bytes(static_cast<double>(f.quantized.bytes)) << " ("
      << format_bytes(static_cast<double>(f.quantized.dense_bytes)) << " dense)";
  h << " | " << run.device.str() << " " << dtype_name(run.dtype) << " | " << s.data.path << ": "
    << f.examples.size() << " examples, " << format_count(static_cast<double>(count_loss_tokens(f.examples)))
    << " loss tokens";
  if (!f.val.empty()) h << " (+" << f.val.size() << " held out)";
  h << " | batch " << o.batch_size << " x " << s.data.seq_len << (s.data.packing ? " packed" : " padded");
  if (o.grad_accum > 1) h << " x " << o.grad_accum << " accumulated";
  if (run.world_size > 1) h << " (" << o.batch_size / run.world_size << " per rank x " << run.world_size << " ranks)";
  h << " | " << f.per_epoch << " batches per epoch";
  task.header = h.str();
}

// What a fine-tuning run leaves in output_dir besides its checkpoints: config.yaml, hf/ (the model, LoRA
// adapters merged unless lora.merge_on_export is false) and adapter/ (LoRA).
class FinetuneExport {
 public:
  explicit FinetuneExport(FinetuneRun& f)
      : f_(f),
        out_dir_(f.run.output_dir),
        config_out_((out_dir_ / "config.yaml").string()),
        export_dir_((out_dir_ / "hf").string()) {}

  std::vector<std::string> save_final();
  // ZeRO-3 full fine-tuning: the same export streamed from the shards (every rank follows the writer's order,
  // rank 0 holds one gathered tensor at a time), f32 from the masters of a bf16 run.
  std::vector<std::string> save_final_sharded(const ShardedWeights& w);

 private:
  void write_config() const {
    const std::string& yaml = f_.run.resolved_yaml;
    write_file_atomic(config_out_, [&](std::FILE* file) { write_bytes(file, yaml.data(), yaml.size()); });
  }
  models::HFSaveOptions export_options() const {
    models::HFSaveOptions so;
    so.max_shard_bytes = f_.s.max_shard_bytes;
    so.extra_files = files_to_export(f_.s.model);
    return so;
  }
  // A named template is not the source tokenizer's own (auto keeps that one, copied with the extra files).
  void export_template() const {
    const DataSettings& d = f_.s.data;
    const bool uses_chat_template = d.format == "instruction" || d.format == "chat";
    if (uses_chat_template && d.chat_template != "auto")
      if (std::string jinja = chat_template_jinja(chat_template_for(d.chat_template, f_.tok).format); !jinja.empty())
        export_chat_template(export_dir_, jinja);
  }

  FinetuneRun& f_;
  const fs::path out_dir_;
  const std::string config_out_, export_dir_;
};

std::vector<std::string> FinetuneExport::save_final() {
  const FinetuneSettings& s = f_.s;
  models::CausalLM& model = *f_.hf.model;
  std::vector<std::string> out;
  write_config();
  if (s.lora) {
    std::string adapter = (out_dir_ / "adapter").string();
    models::save_lora_adapter(model, s.lora_config, f_.hf.config, adapter, s.model.path);
    out.push_back(adapter);
  }
  if (s.lora && (f_.run.dtype != DType::f32 || f_.quantized.tensors > 0)) {
    // The frozen base was rounded to the compute dtype or to NF4; merge the adapters into the checkpoint's
    // own weights instead (load_hf_weights leaves the adapters alone). An NF4 base gets dense weights first,
    // on the CPU: the device was sized for the quantized model, and nothing runs on it after this.
    NoGradGuard no_grad;
    if (f_.quantized.tensors > 0) {
      model.to(Device::cpu());
      models::restore_dense_base(model, /*dequantize=*/false);
    }
    models::load_hf_weights(model, f_.hf.config, s.model.path);
  }
  if (!s.lora || s.merge_on_export) {
    models::save_hf_model(model, f_.hf.config, export_dir_, export_options());  // LoRA adapters merged in
    export_template();
    out.push_back(export_dir_);
  }
  out.push_back(config_out_);
  return out;
}

std::vector<std::string> FinetuneExport::save_final_sharded(const ShardedWeights& w) {
  models::CausalLM& model = *f_.hf.model;
  models::HFSaveOptions so = export_options();
  if (!so.dtype) so.dtype = w.dtype;
  if (!w.writer) {
    for (size_t i : models::hf_export_order(model, f_.hf.config, so)) w.fetch(i);
    return {export_dir_, config_out_};
  }
  write_config();
  models::save_hf_model_streamed(model, f_.hf.config, export_dir_, so, w.fetch);
  export_template();
  return {export_dir_, config_out_};
}

}  // namespace

TrainSummary run_finetune(const FinetuneSettings& s, std::ostream& log) {
  // Everything that can fail on the inputs happens before the loop creates any file in output_dir.
  FinetuneRun f(s);
  load_examples(f);
  build_model(f);

  TrainTask task;
  task.model = f.hf.model.get();
  task.params = s.lora ? nn::trainable_parameters(*f.hf.model) : f.hf.model->parameters();
  if (f.shard_wise && f.run.resume_checkpoint.empty()) task.weight_slices = weight_slices(f);
  set_data(f, task);
  describe(f, task);
  task.halt_after_steps = s.halt_after_steps;
  FinetuneExport exports(f);
  task.save_final = [&exports] { return exports.save_final(); };
  if (!s.lora) task.save_final_sharded = [&exports](const ShardedWeights& w) { return exports.save_final_sharded(w); };
  return run_training(f.run, s.train, task, log);
}

}  // namespace ingot::recipes
