#include "recipes/train_state.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <set>

#include "recipes/checkpoint.h"
#include "recipes/hash.h"
#include "recipes/sharded_checkpoint.h"
#include "runtime/file_util.h"
#include "runtime/rng.h"
#include "runtime/safetensors.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kMasterPrefix = "master.";

std::string canonical(const Config::Value& v) {
  if (v.is_null) return "null";
  if (!v.is_sequence) return v.text;
  std::string s = "[";
  for (size_t i = 0; i < v.items.size(); ++i) s += (i ? ", " : "") + v.items[i];
  return s + "]";
}

}  // namespace

std::map<std::string, std::string> training_config_entries(const Config& cfg) {
  const ConfigSchema* schema = cfg.schema();
  INGOT_INTERNAL_CHECK(schema, "training_config_entries: the config was not validated against a schema");
  std::map<std::string, std::string> out;
  for (const auto& [key, v] : cfg.values()) {
    // A key the schema does not list is already a config error; it is hashed like any other.
    const ConfigKey* k = schema->find(key);
    if (!k || k->in_config_hash) out.emplace(key, canonical(v));
  }
  return out;
}

std::string config_hash(const std::map<std::string, std::string>& entries) {
  Sha256 h;
  for (const auto& [k, v] : entries) {
    // Length-prefixed so "a=b" + "c" cannot collide with "a=bc".
    std::string line = std::to_string(k.size()) + ":" + k + "=" + std::to_string(v.size()) + ":" + v + "\n";
    h.update(line);
  }
  return h.hex();
}

std::vector<GeneratorState> capture_rng() {
  std::vector<GeneratorState> out;
  auto add = [&](Device d) {
    Generator& g = default_generator(d);
    out.push_back({d.str(), g.seed(), g.offset()});
  };
  add(Device::cpu());
  for (int i = 0; i < cuda_device_count(); ++i) add(Device::cuda(i));
  return out;
}

void restore_rng(const std::vector<GeneratorState>& states) {
  for (const GeneratorState& s : states) {
    Device d = parse_device(s.device);
    // A checkpoint from a machine with more GPUs than this one: the missing devices' states have no user.
    if (d.is_cuda() && d.index >= cuda_device_count()) continue;
    Generator& g = default_generator(d);
    g.manual_seed(s.seed);
    g.set_offset(s.offset);
  }
}

std::string train_state_json(const TrainState& s) {
  nlohmann::ordered_json j;
  j["step"] = s.step;
  j["sampler_position"] = s.sampler_position;
  j["tokens_seen"] = s.tokens_seen;
  j["lr_schedule"] = {{"kind", s.lr_schedule}, {"base_lr", s.base_lr},         {"min_lr", s.min_lr},
                      {"last_lr", s.last_lr},  {"warmup_steps", s.warmup_steps}, {"total_steps", s.total_steps}};
  nlohmann::ordered_json rng = nlohmann::ordered_json::array();
  for (const GeneratorState& g : s.rng) rng.push_back({{"device", g.device}, {"seed", g.seed}, {"offset", g.offset}});
  j["rng"] = std::move(rng);
  j["first_loss"] = s.first_loss;
  j["best_loss"] = s.best_loss;
  j["last_loss"] = s.last_loss;
  j["train_s"] = s.train_s;
  if (s.loss_scale > 0)
    j["loss_scale"] = {{"scale", s.loss_scale}, {"growth_tracker", s.loss_scale_growth_tracker}};
  j["config_hash"] = s.config_hash;
  j["config"] = s.config;
  return j.dump(2) + "\n";
}

TrainState parse_train_state(const std::string& text, const std::string& file) {
  TrainState s;
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    s.step = j.at("step").get<int64_t>();
    s.sampler_position = j.at("sampler_position").get<int64_t>();
    s.tokens_seen = j.at("tokens_seen").get<int64_t>();
    const auto& lr = j.at("lr_schedule");
    s.lr_schedule = lr.at("kind").get<std::string>();
    s.base_lr = lr.at("base_lr").get<double>();
    s.min_lr = lr.at("min_lr").get<double>();
    s.last_lr = lr.at("last_lr").get<double>();
    s.warmup_steps = lr.at("warmup_steps").get<int64_t>();
    s.total_steps = lr.at("total_steps").get<int64_t>();
    for (const auto& g : j.at("rng"))
      s.rng.push_back({g.at("device").get<std::string>(), g.at("seed").get<uint64_t>(), g.at("offset").get<uint64_t>()});
    s.first_loss = j.at("first_loss").get<double>();
    s.best_loss = j.at("best_loss").get<double>();
    s.last_loss = j.at("last_loss").get<double>();
    s.train_s = j.at("train_s").get<double>();
    if (j.contains("loss_scale")) {
      s.loss_scale = j["loss_scale"].at("scale").get<double>();
      s.loss_scale_growth_tracker = j["loss_scale"].at("growth_tracker").get<int64_t>();
    }
    s.config_hash = j.at("config_hash").get<std::string>();
    s.config = j.at("config").get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    INGOT_FAIL(file, ": not a valid training state: ", e.what());
  }
  INGOT_CHECK(s.step >= 0 && s.sampler_position >= 0, file, ": negative step or data position");
  return s;
}

std::string save_training_checkpoint(const std::string& output_dir, const nn::Module& model,
                                     const optim::Optimizer& opt, const optim::MasterWeights* masters,
                                     const TrainState& state) {
  std::vector<CheckpointFile> files;
  files.push_back({kModelFile, [&](const std::string& path) {
                     std::vector<std::pair<std::string, Tensor>> named;
                     for (auto& [name, t] : model.state_dict()) named.emplace_back(name, t);
                     save_safetensors(path, named, {{"format", "pt"}});
                   }});
  files.push_back({kOptimizerFile, [&](const std::string& path) {
                     std::vector<std::pair<std::string, Tensor>> named;
                     for (auto& [name, t] : opt.state_dict()) named.emplace_back(name, t);
                     if (masters)
                       for (size_t i = 0; i < masters->master().size(); ++i)
                         named.emplace_back(kMasterPrefix + std::to_string(i), masters->master()[i]);
                     save_safetensors(path, named);
                   }});
  std::string json = train_state_json(state);
  files.push_back({kStateFile, [&](const std::string& path) {
                     write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, json.data(), json.size()); });
                   }});
  return write_checkpoint(output_dir, state.step, files);
}

namespace {

TrainState read_state(const std::string& dir, int64_t manifest_step) {
  const std::string state_path = (fs::path(dir) / kStateFile).string();
  TrainState s = parse_train_state(read_file(state_path), state_path);
  INGOT_CHECK(s.step == manifest_step, state_path, ": step ", s.step, " differs from manifest.json's step ",
              manifest_step);
  return s;
}

void load_model_state(nn::Module& model, const std::map<std::string, Tensor>& sd, const std::string& source) {
  try {
    NoGradGuard no_grad;
    model.load_state_dict(sd, /*strict=*/true);
  } catch (const Error& e) {
    INGOT_FAIL(source, ": does not fit this model: ", e.what());
  }
}

// `all` holds the optimizer's state_dict entries and, in bf16 runs, the masters ("master.<i>").
void load_optimizer_state(optim::Optimizer& opt, optim::MasterWeights* masters,
                          const std::map<std::string, Tensor>& all, const std::string& source) {
  std::map<std::string, Tensor> sd;
  std::vector<Tensor> master_values(masters ? masters->master().size() : 0);
  for (const auto& [name, t] : all) {
    if (name.rfind(kMasterPrefix, 0) == 0) {
      INGOT_CHECK(masters, source, ": holds f32 master weights ('", name,
                  "') but this run keeps none (was the checkpoint made with dtype bf16?)");
      size_t i = std::stoul(name.substr(std::strlen(kMasterPrefix)));
      INGOT_CHECK(i < master_values.size(), source, ": unexpected master weight '", name, "'");
      master_values[i] = t;
    } else {
      sd[name] = t;
    }
  }
  try {
    opt.load_state_dict(sd);
  } catch (const Error& e) {
    INGOT_FAIL(source, ": does not fit this optimizer: ", e.what());
  }
  if (!masters) return;
  NoGradGuard no_grad;
  for (size_t i = 0; i < master_values.size(); ++i) {
    INGOT_CHECK(master_values[i].defined(), source, ": missing master weight 'master.", i,
                "' (was the checkpoint made with dtype f32?)");
    INGOT_CHECK(master_values[i].shape() == masters->master()[i].shape(), source, ": master.", i, " has shape ",
                shape_str(master_values[i].shape()), ", expected ", shape_str(masters->master()[i].shape()));
    Tensor dst = masters->master()[i];
    dst.copy_(master_values[i]);
  }
}

std::map<std::string, Tensor> read_all(const ShardedCheckpoint& c, const std::string& prefix) {
  std::map<std::string, Tensor> out;
  for (const std::string& name : c.names(prefix)) out[name.substr(prefix.size())] = c.read(name);
  return out;
}

}  // namespace

TrainState load_training_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& opt,
                                    optim::MasterWeights* masters) {
  if (is_sharded_checkpoint(dir)) {
    ShardedCheckpoint c = ShardedCheckpoint::open(dir);
    TrainState s = read_state(dir, verify_checkpoint_sizes(dir, {}, {}).step);
    const std::string source = "sharded checkpoint '" + dir + "'";
    load_model_state(model, read_all(c, "model/"), source + " (model)");
    load_optimizer_state(opt, masters, read_all(c, "optimizer/"), source + " (optimizer)");
    return s;
  }
  Manifest m = verify_checkpoint(dir, {kModelFile, kOptimizerFile, kStateFile});
  TrainState s = read_state(dir, m.step);
  const std::string model_path = (fs::path(dir) / kModelFile).string();
  {
    SafetensorsFile f = SafetensorsFile::open(model_path);
    std::map<std::string, Tensor> sd;
    for (const std::string& name : f.names()) sd[name] = f.get(name);
    load_model_state(model, sd, model_path);
  }
  const std::string opt_path = (fs::path(dir) / kOptimizerFile).string();
  SafetensorsFile f = SafetensorsFile::open(opt_path);
  std::map<std::string, Tensor> all;
  for (const std::string& name : f.names()) all[name] = f.get(name);
  load_optimizer_state(opt, masters, all, opt_path);
  return s;
}

TrainState load_sharded_model_state(const ShardedCheckpoint& c, nn::Module& model,
                                    const std::vector<Tensor>& trained, bool load_trained) {
  TrainState s = read_state(c.dir(), verify_checkpoint_sizes(c.dir(), {}, {}).step);
  NoGradGuard no_grad;
  for (auto& [name, t] : model.state_dict()) {
    bool is_trained = false;
    for (const Tensor& p : trained) is_trained = is_trained || p.same(t);
    if (is_trained && !load_trained) continue;
    const std::string key = "model/" + name;
    INGOT_CHECK(c.has(key), "sharded checkpoint '", c.dir(), "' does not fit this model: it has no '", name, "'");
    INGOT_CHECK(c.shape(key) == t.shape() && c.dtype(key) == t.dtype(), "sharded checkpoint '", c.dir(),
                "' does not fit this model: '", name, "' is ", dtype_name(c.dtype(key)), " ",
                shape_str(c.shape(key)), " there and ", dtype_name(t.dtype()), " ", shape_str(t.shape()), " here");
    Tensor dst = t;
    dst.copy_(c.read(key));
  }
  return s;
}

void check_resume_config(const TrainState& saved, const Config& cfg, const std::string& checkpoint_dir) {
  std::map<std::string, std::string> now = training_config_entries(cfg);
  if (config_hash(now) == saved.config_hash) return;
  std::string diffs;
  int n = 0;
  std::set<std::string> keys;
  for (const auto& [k, v] : now) keys.insert(k);
  for (const auto& [k, v] : saved.config) keys.insert(k);
  for (const std::string& k : keys) {
    auto a = saved.config.find(k);
    auto b = now.find(k);
    std::string then = a == saved.config.end() ? "(absent)" : "'" + a->second + "'";
    std::string cur = b == now.end() ? "(absent)" : "'" + b->second + "'";
    if (then == cur) continue;
    ++n;
    diffs += "\n  " + k + ": " + then + " in the checkpoint, " + cur + " now";
    if (b != now.end()) diffs += " (" + cfg.origin(k).str() + ")";
  }
  if (n == 0) diffs = "\n  (the checkpoint's recorded entries do not match its hash: state.json was edited)";
  throw ConfigError("resume: checkpoint '" + checkpoint_dir + "' was made with a different config, so the run " +
                    "would not continue exactly; " + std::to_string(n) + " key(s) differ:" + diffs +
                    "\nrestore those values, or start over in a new output_dir");
}

}  // namespace ingot::recipes
