#include "recipes/lm_inputs.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>

#include "autograd/ops.h"
#include "recipes/data.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

void add_model_keys(ConfigSchema& s, bool adapter) {
  using T = ConfigType;
  using K = ConfigKey;
  s.add(K::required_key(T::String, "model.path",
                        "Hugging Face checkpoint directory (config.json + model.safetensors or shards)"));
  if (adapter)
    s.add(K::of(T::String, "model.adapter", "", "PEFT LoRA adapter directory applied to the model (empty: none)"));
  s.add(K::of(T::String, "tokenizer.path", "", "directory with tokenizer.json (empty: model.path)"));
}

void add_data_keys(ConfigSchema& s, bool training, const std::string& default_format) {
  using T = ConfigType;
  using K = ConfigKey;
  s.add(K::of(T::String, "data.format", default_format,
              "text (a document per line), jsonl (text or prompt/completion), instruction (alpaca "
              "instruction/input/output), chat (messages lists), token_rows (int32 ids, rows of seq_len + 1: "
              "one example a row, as bench/reference's --make-tokens writes them)")
            .one_of({"text", "jsonl", "instruction", "chat", "token_rows"}));
  s.add(K::required_key(T::String, "data.path", "the data file (relative to the working directory)"));
  s.add(K::of(T::Int, "data.seq_len", "0", "tokens per row (0: the model's context, at most 2048)").at_least(0));
  if (training) s.add(K::of(T::Bool, "data.packing", "true", "concatenate examples into full rows (false: pad each)"));
  if (training)
    s.add(K::of(T::Bool, "data.shuffle", "true",
                "visit the rows in a new order every epoch, seeded by `seed` (false: in file order, as a reference run "
                "that reads its rows in order does)"));
  s.add(K::of(T::String, "data.chat_template", "auto",
              "template for instruction/chat data (auto: the tokenizer's own); prompts are masked from the loss")
            .one_of({"auto", "llama3", "chatml", "qwen3", "alpaca"}));
  s.add(K::of(T::String, "data.text_field", "text", "the JSON field holding the text (format jsonl)"));
  if (training)
    s.add(K::of(T::Float, "data.val_fraction", "0.0", "trailing fraction of the examples held out for eval")
              .at_least(0)
              .at_most(0.9));
}

namespace {

bool has_tokenizer_files(const fs::path& dir) {
  std::error_code ec;
  auto file = [&](const char* name) { return fs::is_regular_file(dir / name, ec); };
  return file("tokenizer.json") || (file("vocab.json") && file("merges.txt")) ||
         (file("encoder.json") && file("vocab.bpe"));
}

}  // namespace

ModelSource resolve_model_source(const Config& cfg, ConfigErrors& errors) {
  const ConfigReader rd(cfg, errors);
  ModelSource src;
  std::error_code ec;
  src.path = rd.str("model.path");
  if (!errors.has_error_for("model.path")) {
    if (!fs::is_directory(src.path, ec)) {
      errors.fail(cfg, "model.path", "no such checkpoint directory '" + src.path + "'");
    } else {
      try {
        src.config = models::load_hf_config(src.path);
      } catch (const Error& e) {
        errors.fail(cfg, "model.path", e.what());
      }
      fs::path dir(src.path);
      if (!errors.has_error_for("model.path") && !fs::is_regular_file(dir / "model.safetensors", ec) &&
          !fs::is_regular_file(dir / "model.safetensors.index.json", ec))
        errors.fail(cfg, "model.path",
                    "'" + src.path + "' has no model.safetensors or model.safetensors.index.json (weights in "
                    "PyTorch .bin files are not read; save them with safe_serialization=True)");
    }
  }
  if (rd.listed("model.adapter")) {
    src.adapter = rd.str("model.adapter");
    if (!src.adapter.empty() && !fs::is_regular_file(fs::path(src.adapter) / "adapter_config.json", ec))
      errors.fail(cfg, "model.adapter", "'" + src.adapter + "' holds no adapter_config.json (not a PEFT adapter)");
  }
  src.tokenizer_path = rd.str("tokenizer.path");
  const bool own = src.tokenizer_path.empty();
  if (own) src.tokenizer_path = src.path;
  if (!errors.has_error_for("tokenizer.path") && !errors.has_error_for("model.path") &&
      !has_tokenizer_files(src.tokenizer_path))
    errors.fail(cfg, own ? "model.path" : "tokenizer.path",
                "'" + src.tokenizer_path + "' holds no tokenizer.json (nor vocab.json + merges.txt)" +
                    (own ? "; set tokenizer.path to a directory that has one" : ""));
  return src;
}

DataSettings resolve_data(const Config& cfg, const models::HFConfig& model, ConfigErrors& errors) {
  const ConfigReader rd(cfg, errors);
  DataSettings d;
  d.format = rd.str("data.format");
  d.path = rd.str("data.path");
  std::error_code ec;
  if (!errors.has_error_for("data.path") && !fs::is_regular_file(d.path, ec))
    errors.fail(cfg, "data.path", "no such file '" + d.path + "'");
  d.chat_template = rd.str("data.chat_template");
  d.text_field = rd.str("data.text_field");
  d.seq_len = rd.i64("data.seq_len");
  d.vocab_size = model.vocab_size();
  if (rd.listed("data.packing")) d.packing = rd.flag("data.packing");
  if (rd.listed("data.shuffle")) d.shuffle = rd.flag("data.shuffle");
  if (rd.listed("data.val_fraction")) d.val_fraction = rd.f64("data.val_fraction");
  const int64_t positions = model.arch == models::HFConfig::Arch::GPT2 ? model.gpt2.n_positions
                                                                        : model.llama.max_position_embeddings;
  if (positions > 0) {
    if (d.seq_len == 0) d.seq_len = std::min<int64_t>(positions, 2048);
    else if (d.seq_len > positions)
      errors.fail(cfg, "data.seq_len",
                  std::to_string(d.seq_len) + " is longer than the model's " + std::to_string(positions) +
                      " positions (" + model.source + ")");
  } else if (d.seq_len == 0) {
    d.seq_len = 2048;
  }
  return d;
}

Tokenizer load_tokenizer(const ModelSource& src) {
  Tokenizer tok = Tokenizer::from_dir(src.tokenizer_path);
  INGOT_CHECK(tok.vocab_size() <= src.config.vocab_size(), "tokenizer '", src.tokenizer_path, "' has ",
              tok.vocab_size(), " tokens but the model (", src.config.source, ") embeds only ",
              src.config.vocab_size(), "; set tokenizer.path to the model's own tokenizer");
  return tok;
}

namespace {

// The tokenizer as load_tokenizer gives it, or nothing when a check before failed or it does not load (then
// recorded at the key that names its directory).
std::optional<Tokenizer> checked_tokenizer(const Config& cfg, const ModelSource& src, ConfigErrors& errors) {
  const char* key = cfg.has("tokenizer.path") && !cfg.value("tokenizer.path").text.empty() ? "tokenizer.path"
                                                                                          : "model.path";
  if (errors.has_error_for("model.path") || errors.has_error_for("tokenizer.path")) return std::nullopt;
  try {
    return load_tokenizer(src);
  } catch (const Error& e) {
    errors.fail(cfg, key, e.what());
    return std::nullopt;
  }
}

}  // namespace

void check_chat_template(const Config& cfg, const ModelSource& src, const std::string& key, const std::string& name,
                         ConfigErrors& errors) {
  if (name == "none" || errors.has_error_for(key)) return;
  std::optional<Tokenizer> tok = checked_tokenizer(cfg, src, errors);
  if (!tok) return;
  try {
    chat_template_for(name, *tok);
  } catch (const Error& e) {
    errors.fail(cfg, key, e.what());
  }
}

void check_tokenizer_and_data(const Config& cfg, const ModelSource& src, const DataSettings& d,
                              ConfigErrors& errors) {
  if (!errors.has_error_for("data.path") && d.format != "token_rows")
    if (std::string problem = text_file_problem(d.path); !problem.empty())
      errors.fail(cfg, "data.path", "'" + d.path + "' " + problem);
  if (d.format == "instruction" || d.format == "chat") check_chat_template(cfg, src, "data.chat_template", d.chat_template, errors);
  else checked_tokenizer(cfg, src, errors);
}

ChatTemplate chat_template_for(const std::string& name, const Tokenizer& tok) {
  return name == "auto" ? ChatTemplate::detect(tok) : ChatTemplate::from_name(name, tok);
}

std::vector<datasets::Example> load_data(const DataSettings& d, const Tokenizer& tok) {
  datasets::SourceOptions o;
  if (d.format == "text") o.format = datasets::DatasetFormat::Text;
  else if (d.format == "jsonl") o.format = datasets::DatasetFormat::Jsonl;
  else if (d.format == "token_rows") o.format = datasets::DatasetFormat::TokenRows;
  else o.format = datasets::DatasetFormat::Instruction;  // alpaca fields or messages, per line
  o.text_field = d.text_field;
  o.row_tokens = d.seq_len + 1;
  o.vocab_size = d.vocab_size;
  if (o.format == datasets::DatasetFormat::Instruction) o.chat_template = chat_template_for(d.chat_template, tok);
  std::vector<datasets::Example> ex = datasets::load_examples(d.path, tok, o);
  INGOT_CHECK(!ex.empty(), d.path, ": no examples (the file is empty)");
  return ex;
}

LossSum sum_loss(models::CausalLM& model, const std::vector<datasets::Example>& examples, int64_t seq_len,
                 int64_t batch_size, int64_t max_batches, Device device, int rank, int world) {
  INGOT_CHECK(world >= 1 && rank >= 0 && rank < world, "sum_loss: rank ", rank, " of ", world);
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  LossSum sum;
  auto add = [&](const datasets::Batch& b) {
    if (b.num_loss_tokens == 0) return;  // a row of prompt only: nothing to score
    Tensor loss = model.loss(b.input_ids.to(device), b.labels.to(device));
    sum.total_nll += loss.item() * static_cast<double>(b.num_loss_tokens);
    sum.tokens += b.num_loss_tokens;
    sum.rows += b.input_ids.size(0);
  };
  datasets::LoaderOptions lo;
  lo.seq_len = seq_len;
  lo.pack = false;
  lo.shuffle = false;
  int64_t rows = 0;
  for (const datasets::Example& e : examples) rows += e.ids.size() >= 2;
  INGOT_CHECK(rows > 0, "evaluation: no example has two tokens or more");
  lo.global_batch_size = std::min(batch_size, rows);
  datasets::DataLoader full(examples, lo);
  int64_t batches = 0;
  // `batches` numbers every batch (the tail's single rows continue the count): rank r scores those = r mod world.
  for (int64_t i = 0; i < full.batches_per_epoch() && (max_batches <= 0 || batches < max_batches); ++i, ++batches)
    if (batches % world == rank) add(full.batch_at({0, i}));
  // The rows after the last full batch, one at a time (the loader keeps whole batches only).
  const int64_t covered = full.batches_per_epoch() * lo.global_batch_size;
  if (covered < rows && (max_batches <= 0 || batches < max_batches)) {
    lo.global_batch_size = 1;
    datasets::DataLoader single(examples, lo);
    for (int64_t r = covered; r < rows; ++r, ++batches)
      if (batches % world == rank) add(single.batch_at({0, r}));
  }
  model.train(was_training);
  return sum;
}

}  // namespace ingot::recipes
