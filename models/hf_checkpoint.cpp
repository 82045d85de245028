#include "models/hf_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "autograd/nn/layers.h"
#include "autograd/nn/lora.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"

namespace ingot::models {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_lora_name(const std::string& n) {
  return n.find(".lora_A.") != std::string::npos || n.find(".lora_B.") != std::string::npos;
}

// Our name for a checkpoint tensor, or "" for tensors transformers itself ignores on load.
std::string our_name(const HFConfig& cfg, const std::string& hf) {
  if (cfg.arch == HFConfig::Arch::GPT2) {
    if (ends_with(hf, ".attn.bias") || ends_with(hf, ".attn.masked_bias")) return "";  // causal-mask buffers
    if (hf.rfind("transformer.", 0) != 0 && hf != "lm_head.weight") return "transformer." + hf;  // GPT2Model files
  } else if (ends_with(hf, ".rotary_emb.inv_freq")) {
    return "";
  }
  if (hf == "lm_head.weight" && cfg.tie_word_embeddings()) return "";  // tied: the embedding is the head
  return hf;
}

std::string list_names(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < 10; ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > 10) os << ", ... (" << names.size() - 10 << " more)";
  return os.str();
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  INGOT_CHECK(fd >= 0, "cannot open ", path, " to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  INGOT_CHECK(rc == 0, "fsync failed for ", path);
}

void write_text_file(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size()); });
}

}  // namespace

bool hf_is_transposed(const HFConfig& cfg, const std::string& name) {
  if (cfg.arch != HFConfig::Arch::GPT2) return false;
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

std::vector<std::pair<std::string, std::string>> hf_weight_files(const std::string& dir) {
  const fs::path d(dir);
  std::vector<std::pair<std::string, std::string>> out;
  if (fs::exists(d / kSingleFile)) {
    const std::string path = (d / kSingleFile).string();
    SafetensorsFile f = SafetensorsFile::open(path);
    for (const std::string& n : f.names()) out.emplace_back(n, path);
    return out;
  }
  const std::string index = (d / kIndexFile).string();
  INGOT_CHECK(fs::exists(index), "no ", kSingleFile, " or ", kIndexFile, " in ", dir,
              " (only safetensors checkpoints are supported; re-save with safe_serialization=True)");
  json j;
  try {
    j = json::parse(read_file(index));
  } catch (const json::parse_error& e) {
    INGOT_CHECK(false, index, ": not valid JSON: ", e.what());
  }
  INGOT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index,
              ": expected an object with a \"weight_map\" object");
  for (auto& [name, file] : j["weight_map"].items()) {
    INGOT_CHECK(file.is_string(), index, ": weight_map entry '", name, "' must be a file name, got ", file.dump());
    const std::string f = file.get<std::string>();
    INGOT_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty(), index, ": weight_map entry '", name,
                "' names '", f, "', which is not a file in the checkpoint directory");
    const fs::path p = d / f;
    INGOT_CHECK(fs::exists(p), index, ": tensor '", name, "' is in ", f, ", which does not exist");
    out.emplace_back(name, p.string());
  }
  return out;
}

namespace {

// Where each of the model's parameters (LoRA adapters aside) comes from, checked against the model: every
// parameter present once, nothing unexpected, shapes as the config says, floating dtypes. Throws before
// anything is copied, so a bad checkpoint leaves the model as it was.
struct HFSource {
  std::string name;  // ours
  Tensor param;
  std::string hf_name, path;
  TensorInfo info;
  bool transposed = false;
};

std::vector<HFSource> plan_hf_weights(const CausalLM& model, const HFConfig& cfg, const std::string& dir) {
  struct Source {
    std::string hf_name, path;
  };
  std::map<std::string, Source> sources;
  std::map<std::string, SafetensorsFile> files;
  for (auto& [hf, path] : hf_weight_files(dir)) {
    if (!files.count(path)) files.emplace(path, SafetensorsFile::open(path));
    const SafetensorsFile& f = files.at(path);
    INGOT_CHECK(f.has(hf), dir, "/", kIndexFile, " puts tensor '", hf, "' in ", path, ", which does not hold it");
    const std::string n = our_name(cfg, hf);
    if (n.empty()) continue;
    auto [it, fresh] = sources.emplace(n, Source{hf, path});
    INGOT_CHECK(fresh, "checkpoint ", dir, ": tensor '", n, "' appears twice (", it->second.hf_name, " in ",
                it->second.path, " and ", hf, " in ", path, ")");
  }

  std::vector<HFSource> plan;
  std::vector<std::string> missing, unexpected;
  std::set<std::string> used;
  for (auto& [name, param] : model.named_parameters()) {
    if (is_lora_name(name)) continue;
    auto it = sources.find(name);
    if (it == sources.end()) {
      missing.push_back(name);
      continue;
    }
    used.insert(name);
    const Source& s = it->second;
    const TensorInfo& info = files.at(s.path).info(s.hf_name);
    Shape want = param.shape();
    if (hf_is_transposed(cfg, name)) std::swap(want[0], want[1]);
    INGOT_CHECK(is_floating(info.dtype), s.path, ": tensor '", s.hf_name, "' has dtype ", dtype_name(info.dtype),
                ", expected a floating type (F32, BF16 or F16)");
    INGOT_CHECK(info.shape == want, s.path, ": tensor '", s.hf_name, "' has shape ", shape_str(info.shape),
                ", but ", cfg.source, " gives ", shape_str(want),
                hf_is_transposed(cfg, name) ? " (GPT-2 Conv1D layout [in, out])" : "");
    plan.push_back({name, param, s.hf_name, s.path, info, hf_is_transposed(cfg, name)});
  }
  for (auto& [name, s] : sources)
    if (!used.count(name)) unexpected.push_back(s.hf_name);
  INGOT_CHECK(missing.empty() && unexpected.empty(), "checkpoint ", dir, " does not match ", cfg.source, ": ",
              missing.empty() ? "" : "missing tensors (" + std::to_string(missing.size()) + "): " + list_names(missing),
              !missing.empty() && !unexpected.empty() ? "; " : "",
              unexpected.empty() ? ""
                                 : "unexpected tensors (" + std::to_string(unexpected.size()) +
                                       "): " + list_names(unexpected));
  return plan;
}

}  // namespace

void load_hf_weights(CausalLM& model, const HFConfig& cfg, const std::string& dir) {
  const std::vector<HFSource> plan = plan_hf_weights(model, cfg, dir);
  std::map<std::string, SafetensorsFile> files;
  NoGradGuard ng;
  for (const HFSource& step : plan) {
    if (!files.count(step.path)) files.emplace(step.path, SafetensorsFile::open(step.path));
    Tensor src = files.at(step.path).get(step.hf_name);
    if (step.transposed) src = transpose(src, 0, 1);
    Tensor dst = step.param;
    dst.copy_(src);
  }
}

struct HFSliceReader::Impl {
  struct Entry {
    HFSource source;
    int fd = -1;
    uint64_t data_start = 0;  // byte offset of the file's data buffer
  };
  std::map<std::string, Entry> entries;
  std::map<std::string, int> fds;
  uint64_t total = 0;
  mutable uint64_t read = 0;

  ~Impl() {
    for (auto& [_, fd] : fds) ::close(fd);
  }
  // Reads `n` bytes at `offset` of `e`'s file into `out`.
  void pread_all(const Entry& e, uint64_t offset, uint64_t n, void* out) const {
    char* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(e.fd, p, n, static_cast<off_t>(offset));
      INGOT_CHECK(got > 0, e.source.path, ": cannot read ", n, " bytes at offset ", offset, " (tensor '",
                  e.source.hf_name, "'): ", got == 0 ? "unexpected end of file" : std::strerror(errno));
      p += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<uint64_t>(got);
      read += static_cast<uint64_t>(got);
    }
  }
};

HFSliceReader::HFSliceReader(const CausalLM& model, const HFConfig& cfg, const std::string& dir)
    : impl_(std::make_unique<Impl>()) {
  for (HFSource& s : plan_hf_weights(model, cfg, dir)) {
    Impl::Entry e;
    auto it = impl_->fds.find(s.path);
    if (it == impl_->fds.end()) {
      const int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
      INGOT_CHECK(fd >= 0, "cannot open ", s.path, ": ", std::strerror(errno));
      it = impl_->fds.emplace(s.path, fd).first;
    }
    e.fd = it->second;
    uint64_t header = 0;  // safetensors: 8-byte little-endian header length, the header, then the data
    INGOT_CHECK(::pread(e.fd, &header, 8, 0) == 8, s.path, ": cannot read its header length");
    e.data_start = 8 + header;
    impl_->total += s.info.end - s.info.begin;
    const std::string name = s.name;
    e.source = std::move(s);
    impl_->entries.emplace(name, std::move(e));
  }
}

HFSliceReader::~HFSliceReader() = default;

void HFSliceReader::read(const std::string& name, int64_t begin, int64_t end, Tensor& dst) const {
  auto it = impl_->entries.find(name);
  INGOT_CHECK(it != impl_->entries.end(), "HFSliceReader: the checkpoint has no tensor for parameter '", name, "'");
  const Impl::Entry& e = it->second;
  const TensorInfo& info = e.source.info;
  const int64_t n = numel(info.shape);
  INGOT_INTERNAL_CHECK(0 <= begin && begin <= end && end <= n && dst.numel() == end - begin && dst.is_contiguous(),
                       "HFSliceReader::read: bad range [", begin, ", ", end, ") of '", name, "'");
  if (begin == end) return;
  const uint64_t isz = itemsize(info.dtype);
  const uint64_t base = e.data_start + info.begin;
  NoGradGuard ng;
  if (!e.source.transposed) {
    Tensor buf = empty({end - begin}, info.dtype);
    impl_->pread_all(e, base + static_cast<uint64_t>(begin) * isz, static_cast<uint64_t>(end - begin) * isz,
                     buf.data_ptr());
    dst.copy_(buf);
    return;
  }
  // GPT-2 Conv1D: ours is [out, in], the file's [in, out]. Our elements [begin, end) lie in rows o_lo..o_hi,
  // which are columns of the file: one read per file row of those columns.
  const int64_t in = info.shape[0], out = info.shape[1];
  const int64_t o_lo = begin / in, o_hi = (end - 1) / in + 1;
  Tensor cols = empty({in, o_hi - o_lo}, info.dtype);
  char* p = static_cast<char*>(cols.data_ptr());
  for (int64_t i = 0; i < in; ++i)
    impl_->pread_all(e, base + static_cast<uint64_t>(i * out + o_lo) * isz, static_cast<uint64_t>(o_hi - o_lo) * isz,
                     p + static_cast<uint64_t>(i * (o_hi - o_lo)) * isz);
  Tensor rows = contiguous(transpose(cols, 0, 1));  // [o_hi - o_lo, in]: our layout
  dst.copy_(rows.as_strided({end - begin}, {1}, rows.offset() + (begin - o_lo * in)));
}

uint64_t HFSliceReader::bytes_read() const { return impl_->read; }
uint64_t HFSliceReader::total_bytes() const { return impl_->total; }

HFModel load_hf_model(const std::string& dir, DType dtype) {
  INGOT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f64,
              "load_hf_model: dtype must be f32, bf16, f16 or f64, got ", dtype_name(dtype));
  HFModel m;
  m.config = load_hf_config(dir);
  {
    // Note [Parameters made to be overwritten]: built in `dtype`, undrawn; load_hf_weights writes every parameter.
    nn::SkipInit skip(dtype);
    m.model = make_causal_lm(m.config);
  }
  if (dtype != DType::f32) m.model->to(dtype);  // buffers (RoPE tables) and anything a model made itself
  load_hf_weights(*m.model, m.config, dir);
  m.model->eval();  // as transformers' from_pretrained
  return m;
}

void write_dir_atomic(const std::string& dir, const std::function<void(const std::string&)>& write) {
  INGOT_CHECK(!dir.empty(), "save: empty directory path");
  fs::path target = fs::absolute(fs::path(dir)).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  INGOT_CHECK(!fs::exists(target) || fs::is_directory(target), "save: ", dir, " exists and is not a directory");
  const fs::path parent = target.parent_path();
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = parent / (target.filename().string() + ".tmp." + pid);
  const fs::path old = parent / (target.filename().string() + ".old." + pid);
  try {
    fs::create_directories(parent);
    fs::remove_all(tmp);
    fs::create_directory(tmp);
  } catch (const fs::filesystem_error& e) {
    INGOT_CHECK(false, "save: cannot create ", tmp.string(), ": ", e.what());
  }
  try {
    write(tmp.string());
    fsync_path(tmp.string(), true);
    if (fs::exists(target)) {
      fs::rename(target, old);
      fs::rename(tmp, target);
      fs::remove_all(old);
    } else {
      fs::rename(tmp, target);
    }
    fsync_path(parent.string(), true);
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    if (fs::exists(old, ec) && !fs::exists(target, ec)) fs::rename(old, target, ec);
    INGOT_CHECK(false, "save: writing ", target.string(), " failed: ", e.what());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

namespace {

// What an export writes: the exported parameters (LoRA adapters aside) as model.named_parameters() indices, their
// safetensors entries (Hugging Face layout and the export dtype) and their greedy split into files, in parameter
// order, as transformers' shard_checkpoint does.
struct HFExportPlan {
  std::vector<size_t> params;
  std::vector<SafetensorsEntry> entries;  // per exported parameter
  std::vector<bool> transposed;
  std::vector<std::vector<size_t>> shards{1};  // positions into params
  int64_t total = 0;
  DType config_dtype = DType::f32;
};

HFExportPlan plan_hf_export(const CausalLM& model, const HFConfig& cfg, const HFSaveOptions& opts) {
  INGOT_CHECK(opts.max_shard_bytes > 0, "save_hf_model: max_shard_bytes must be positive, got ", opts.max_shard_bytes);
  HFExportPlan plan;
  int64_t in_shard = 0;
  const auto named = model.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, p] = named[i];
    if (is_lora_name(name)) continue;
    const DType dt = opts.dtype ? *opts.dtype : p.dtype();
    hf_dtype_name(dt);  // refuses dtypes transformers cannot hold
    if (plan.params.empty()) plan.config_dtype = dt;
    const bool transposed = hf_is_transposed(cfg, name);
    Shape shape = p.shape();
    if (transposed) std::swap(shape[0], shape[1]);
    const int64_t bytes = p.numel() * static_cast<int64_t>(itemsize(dt));
    if (!plan.shards.back().empty() && in_shard + bytes > opts.max_shard_bytes) {
      plan.shards.emplace_back();
      in_shard = 0;
    }
    plan.shards.back().push_back(plan.params.size());
    in_shard += bytes;
    plan.total += bytes;
    plan.params.push_back(i);
    plan.entries.push_back({name, dt, shape});
    plan.transposed.push_back(transposed);
  }
  return plan;
}

std::vector<SafetensorsEntry> shard_entries(const HFExportPlan& plan, size_t s) {
  std::vector<SafetensorsEntry> entries;
  for (size_t k : plan.shards[s]) entries.push_back(plan.entries[k]);
  return entries;
}

}  // namespace

std::vector<size_t> hf_export_order(const CausalLM& model, const HFConfig& cfg, const HFSaveOptions& opts) {
  const HFExportPlan plan = plan_hf_export(model, cfg, opts);
  std::vector<size_t> order;
  for (size_t s = 0; s < plan.shards.size(); ++s)
    for (size_t k : safetensors_data_order(shard_entries(plan, s))) order.push_back(plan.params[plan.shards[s][k]]);
  return order;
}

void save_hf_model_streamed(const CausalLM& model, const HFConfig& cfg, const std::string& dir,
                            const HFSaveOptions& opts, const std::function<Tensor(size_t param)>& fetch) {
  for (const std::string& f : opts.extra_files)
    INGOT_CHECK(fs::is_regular_file(f), "save_hf_model: extra file ", f, " does not exist");
  const HFExportPlan plan = plan_hf_export(model, cfg, opts);
  const std::string config_text = hf_config_json(cfg, plan.config_dtype);

  write_dir_atomic(dir, [&](const std::string& tmp) {
    json weight_map = json::object();
    char buf[64];
    for (size_t s = 0; s < plan.shards.size(); ++s) {
      std::string file = kSingleFile;
      if (plan.shards.size() > 1) {
        std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", s + 1, plan.shards.size());
        file = buf;
      }
      for (size_t k : plan.shards[s]) weight_map[plan.entries[k].name] = file;
      // transformers refuses safetensors files whose metadata lacks format=pt. The writer converts to the export
      // dtype and makes GPT-2's transposed views contiguous slab by slab, so nothing beyond fetch's tensor is whole.
      write_safetensors_streamed(tmp + "/" + file, shard_entries(plan, s), {{"format", "pt"}}, [&](size_t j) {
        const size_t k = plan.shards[s][j];
        NoGradGuard ng;
        Tensor t = fetch(plan.params[k]);
        return plan.transposed[k] ? transpose(t, 0, 1) : t;
      });
    }
    if (plan.shards.size() > 1) {
      json index = {{"metadata", {{"total_size", plan.total}}}, {"weight_map", weight_map}};
      write_text_file(tmp + "/" + kIndexFile, index.dump(2) + "\n");
    }
    write_text_file(tmp + "/config.json", config_text);
    for (const std::string& f : opts.extra_files)
      write_text_file(tmp + "/" + fs::path(f).filename().string(), read_file(f));
  });
}

void save_hf_model(const CausalLM& model, const HFConfig& cfg, const std::string& dir, const HFSaveOptions& opts) {
  const std::map<std::string, Tensor> merged = nn::merged_state_dict(model);  // LoRA adapters merged
  const auto named = model.named_parameters();
  save_hf_model_streamed(model, cfg, dir, opts, [&](size_t i) { return merged.at(named[i].first); });
}

}  // namespace ingot::models
