// Hugging Face checkpoints: a directory with config.json and the weights as model.safetensors, or as shards
// model-0000k-of-0000n.safetensors listed in model.safetensors.index.json.
//
// Our parameter names are transformers' names. The differences handled here: GPT-2 stores its projections as
// Conv1D [in, out] (transposed on load and save), old GPT-2 files omit the "transformer." prefix and may carry
// the attention-mask buffers (attn.bias / attn.masked_bias), old Llama files may carry rotary_emb.inv_freq, and
// a tied lm_head.weight may be present or absent. Every other difference is an error naming the file and the
// tensor: a missing or unexpected tensor (all of them listed), a shape that differs from the config's, a
// non-floating dtype.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/hf_config.h"

namespace ingot::models {

struct HFModel {
  HFConfig config;
  std::shared_ptr<CausalLM> model;
};

// Builds the model described by dir/config.json in `dtype` (f32, bf16 or f16) and loads its weights, converting
// from the file's dtype while copying (no full-precision copy of the model is kept).
HFModel load_hf_model(const std::string& dir, DType dtype = DType::f32);

// Loads the weights in `dir` into an existing model built from `cfg` (LoRA adapters, if any, are left alone).
void load_hf_weights(CausalLM& model, const HFConfig& cfg, const std::string& dir);

// Shard-wise loading: reads slices of the checkpoint's tensors by our parameter names with pread, so each rank
// of a sharded run reads only the bytes of its slices (~1/N of the checkpoint). The checkpoint is checked against
// the model as load_hf_weights does, before anything is read.
class HFSliceReader {
 public:
  HFSliceReader(const CausalLM& model, const HFConfig& cfg, const std::string& dir);
  ~HFSliceReader();
  HFSliceReader(const HFSliceReader&) = delete;
  HFSliceReader& operator=(const HFSliceReader&) = delete;
  // Elements [begin, end) of parameter `name`'s flattened value in our layout (GPT-2's Conv1D weights
  // transposed), converted into `dst` (contiguous, end - begin elements, any floating dtype).
  void read(const std::string& name, int64_t begin, int64_t end, Tensor& dst) const;
  uint64_t bytes_read() const;   // bytes of tensor data read so far
  uint64_t total_bytes() const;  // bytes of every tensor the model's parameters take from the checkpoint

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The tensor name -> file path map of the checkpoint in `dir` (one file, or the shards of the index).
std::vector<std::pair<std::string, std::string>> hf_weight_files(const std::string& dir);

// True for GPT-2's Conv1D weights, which Hugging Face stores as [in, out].
bool hf_is_transposed(const HFConfig& cfg, const std::string& name);

struct HFSaveOptions {
  // Shards start above this many bytes (transformers' default max_shard_size is 5 GB); one file when it fits.
  int64_t max_shard_bytes = int64_t{5} * 1000 * 1000 * 1000;
  // The dtype written; unset keeps each parameter's dtype.
  std::optional<DType> dtype;
  // Files copied into the directory as they are (tokenizer.json, tokenizer_config.json, generation_config.json).
  std::vector<std::string> extra_files;
};

// Writes config.json + weights that transformers' from_pretrained loads unchanged. LoRA adapters are merged
// into their base weights. The directory is written under a temporary name and renamed into place, so `dir`
// holds either its previous contents or the complete new checkpoint, never a mix; its previous contents are
// replaced as a whole.
void save_hf_model(const CausalLM& model, const HFConfig& cfg, const std::string& dir,
                   const HFSaveOptions& opts = {});

// Streaming export (ZeRO-3, where no rank holds the whole model): writes exactly what save_hf_model writes, but
// parameter i's value (model.named_parameters() index, LoRA adapters excluded) comes from fetch(i), called once
// per parameter in hf_export_order, just before its bytes are written; it is converted (dtype, GPT-2's Conv1D
// transpose) slab by slab and dropped before the next call, so one whole tensor exists at a time. `model` gives
// names, shapes and dtypes only. A throw from fetch leaves `dir` as it was.
void save_hf_model_streamed(const CausalLM& model, const HFConfig& cfg, const std::string& dir,
                            const HFSaveOptions& opts, const std::function<Tensor(size_t param)>& fetch);
// The parameter indices in the order save_hf_model_streamed fetches them (ranks that only help gather follow it).
std::vector<size_t> hf_export_order(const CausalLM& model, const HFConfig& cfg, const HFSaveOptions& opts = {});

// Replaces directory `dir` with what `write(tmp_dir)` puts into a fresh sibling directory, all or nothing
// (files fsynced, then renamed into place; an existing `dir` is moved aside and removed only after).
void write_dir_atomic(const std::string& dir, const std::function<void(const std::string& tmp_dir)>& write);

}  // namespace ingot::models
