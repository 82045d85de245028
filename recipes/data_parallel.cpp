#include "recipes/data_parallel.h"

#include <signal.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <ostream>
#include <set>

#include "autograd/nn/module.h"
#include "autograd/ops.h"
#include "distributed/bootstrap.h"
#include "distributed/buckets.h"
#include "distributed/collective_ops.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "optim/optimizer.h"
#include "recipes/sharded_checkpoint.h"
#include "recipes/train_loop.h"
#include "runtime/cuda_runtime.h"
#include "runtime/file_util.h"
#include "runtime/kernels/quant8.h"
#include "runtime/sm_budget.h"

namespace ingot::recipes {

namespace dist = ingot::distributed;

namespace {

// A view of `flat` holding `shape` at element `offset`.
Tensor view_at(const Tensor& flat, int64_t offset, const Shape& shape) {
  return flat.as_strided(shape, contiguous_strides(shape), flat.offset() + offset);
}

// Optimizer state entries are buffers shaped like their parameter (f32) or counters (i64 scalars).
bool is_counter(const Tensor& t) { return t.dim() == 0 || t.dtype() == DType::i64; }

}  // namespace

struct DataParallel::Impl {
  RunSettings run;
  dist::DistributedContext ctx;
  std::string backend;
  std::vector<Tensor> params;
  std::vector<dist::BucketPlan> plans;  // the shards' layout: DDP's buckets (checked against it) or FSDP's units
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<dist::FullyShardedDataParallel> fsdp;  // ZeRO-3 instead of ddp
  bool from_masters = false;  // ZeRO-3: the shards hold no bytes (gather_from_masters)

  int64_t chunk(const dist::BucketPlan& p) const { return p.padded_numel / ctx.group->size(); }
  double reduce(double v, dist::ReduceOp op) {
    Tensor t = from_vector(std::vector<double>{v}, {1}, DType::f64, run.device);
    ctx.group->all_reduce(t, op)->wait();
    return t.item();
  }
};

DataParallel::DataParallel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DataParallel::~DataParallel() = default;

std::unique_ptr<DataParallel> DataParallel::join(const RunSettings& run, std::ostream& log) {
  if (run.world_size <= 1 && !run.mpi) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->run = run;
  std::string backend = run.distributed.backend;
  if (backend == "auto") backend = run.device.is_cuda() ? "nccl" : "gloo";
  INGOT_CHECK(backend != "nccl" || run.device.is_cuda(), "distributed.backend: nccl needs a CUDA device, but device is ",
              run.device.str(), " (use distributed.backend: gloo or auto)");
  INGOT_CHECK(backend != "gloo" || !run.device.is_cuda(), "distributed.backend: gloo reduces CPU tensors, but device is ",
              run.device.str(), " (use distributed.backend: nccl or auto)");
  if (run.device.is_cuda()) cuda::set_device(run.device.index);
  dist::InitOptions io;
  io.backend = backend;
  io.timeout = dist::Millis(static_cast<int64_t>(run.distributed.timeout_s * 1000));
  io.store_timeout = dist::Millis(static_cast<int64_t>(run.distributed.init_timeout_s * 1000));
  impl->ctx = dist::init_distributed(io);
  impl->backend = backend;
  const dist::WorldInfo& w = impl->ctx.info;
  INGOT_CHECK(w.world_size == run.world_size && w.rank == run.rank, "distributed: the process group says rank ",
              w.rank, " of ", w.world_size, " but the environment said rank ", run.rank, " of ", run.world_size);
  if (w.world_size == 1) return nullptr;
  // Note [SM carve-out] (runtime/sm_budget.h): set only where collectives run beside the kernels; usable_sms
  // checks it against the GPU (an error naming the key when it leaves no SMs).
  if (run.device.is_cuda() && run.distributed.sm_carveout > 0)
    set_sm_carveout(static_cast<int>(std::min<int64_t>(run.distributed.sm_carveout, INT_MAX)),
                    "distributed.sm_carveout");
  const int usable = run.device.is_cuda() ? usable_sms(run.device.index) : 0;
  if (w.rank == 0) {
    static const char* const kStages[] = {"DDP", "DDP + ZeRO-1 (optimizer state sharded)",
                                          "DDP + ZeRO-2 (gradients and optimizer state sharded)",
                                          "FSDP / ZeRO-3 (weights, gradients and optimizer state sharded)"};
    const bool fsdp = run.distributed.zero_stage == 3;
    log << "distributed | " << w.world_size << " ranks (" << w.source << ", " << backend << ") | "
        << kStages[run.distributed.zero_stage];
    if (fsdp)
      log << ", one unit per transformer block"
          << (run.distributed.reshard_after_forward ? ", gathered for forward and again for backward"
                                                    : ", gathered from forward to backward")
          << (run.distributed.reshard_after_forward && run.distributed.keep_last_blocks > 0
                  ? " (the last " + std::to_string(run.distributed.keep_last_blocks) + " from forward to backward)"
                  : std::string())
          << (run.distributed.prefetch && !run.compile.enabled ? ", the next block's gather prefetched" : "");
    else
      log << ", buckets of " << run.distributed.bucket_cap_mb << " MiB";
    log << (run.distributed.reduce_dtype != "f32" ? ", averaged in " + run.distributed.reduce_dtype : "")
        << (fsdp && run.distributed.reduce_wire_dtype == "bf16" && run.distributed.reduce_dtype == "f32"
                ? ", gradients sent in bf16 and summed in f32"
                : "")
        << (run.distributed.overlap || fsdp ? ", reduced during backward" : ", reduced after backward") << "\n";
    if (sm_carveout() > 0)
      log << "distributed | compute kernels plan for " << usable << " SMs, leaving " << sm_carveout()
          << " to communication (" << sm_carveout_source() << ")\n";
    if (run.compile.enabled && fsdp)
      log << "distributed | compile.enabled: the units' all-gathers and reduce-scatters are nodes of the compiled "
             "step, each unit's gather prefetched while the unit before it computes\n";
    else if (run.compile.enabled)
      log << "distributed | compile.enabled: the bucket "
          << (run.distributed.zero_stage >= 1 ? "reduce-scatters and all-gathers" : "all-reduces")
          << " are nodes of the compiled step\n";
    log.flush();
  }
  return std::unique_ptr<DataParallel>(new DataParallel(std::move(impl)));
}

int DataParallel::rank() const { return impl_->ctx.group->rank(); }
int DataParallel::world_size() const { return impl_->ctx.group->size(); }
int DataParallel::zero_stage() const { return static_cast<int>(impl_->run.distributed.zero_stage); }
const std::string& DataParallel::backend() const { return impl_->backend; }

void DataParallel::wrap(nn::Module& model, const std::vector<Tensor>& params, bool broadcast) {
  Impl& m = *impl_;
  INGOT_INTERNAL_CHECK(!m.ddp && !m.fsdp, "DataParallel::wrap called twice");
  const std::optional<DType> reduce_dtype =
      m.run.distributed.reduce_dtype == "bf16" ? std::optional<DType>(DType::bf16) : std::nullopt;
  m.params = params;
  if (zero_stage() == 3) {
    // The shards are per unit of the model, so the trained tensors must be exactly the model's parameters.
    const std::vector<Tensor> all = model.parameters();
    bool same = all.size() == params.size();
    for (size_t i = 0; same && i < all.size(); ++i) same = all[i].same(params[i]);
    INGOT_CHECK(same, "distributed.zero_stage: 3 shards and trains every parameter of the model, but this recipe "
                "trains ", params.size(), " of its ", all.size(), " parameter tensors (LoRA adapters?); use "
                "zero_stage 2 or less");
    dist::FsdpOptions o;
    o.broadcast_parameters = broadcast;
    o.reshard_after_forward = m.run.distributed.reshard_after_forward;
    o.prefetch = m.run.distributed.prefetch && !m.run.compile.enabled;
    o.keep_last_blocks = static_cast<int>(m.run.distributed.keep_last_blocks);
    o.vocab_parallel_embeddings = m.run.distributed.vocab_parallel_embeddings;
    // f32 unless bf16 was asked for, as FSDP2's MixedPrecisionPolicy(reduce_dtype=f32): a bf16 run's gradients
    // reach its f32 master shards unrounded (Note [Reduced gradients keep their precision], fsdp.h).
    o.reduce_dtype = reduce_dtype.value_or(DType::f32);
    if (m.run.distributed.reduce_wire_dtype == "bf16") o.reduce_wire_dtype = DType::bf16;  // Note [Narrow wire, wide sum]
    m.fsdp = std::make_unique<dist::FullyShardedDataParallel>(model, m.ctx.group, o);
    m.plans = m.fsdp->layout();
    return;
  }
  dist::DdpOptions o;
  o.bucket_cap_mb = m.run.distributed.bucket_cap_mb;
  o.zero_stage = zero_stage();
  // ZeRO-1/2 as ZeRO-3 above: f32 unless bf16 was asked for, and the shards' .grad keep the f32 average for
  // their f32 masters (Note [Reduced gradients keep their precision], fsdp.h). Plain DDP reduces in the
  // gradients' own dtype: its average lands in the weights' .grad, in their dtype whatever it was reduced in.
  o.reduce_dtype = sharded() ? reduce_dtype.value_or(DType::f32) : reduce_dtype;
  m.ddp = std::make_unique<dist::DistributedDataParallel>(params, m.ctx.group, o);
  std::vector<dist::BucketParam> infos;
  for (const Tensor& p : params) infos.push_back({p.numel(), p.dtype()});
  m.plans = dist::plan_buckets(infos, o.bucket_cap_mb * 1024 * 1024, sharded() ? world_size() : 1);
  const auto layout = m.ddp->bucket_layout();
  INGOT_INTERNAL_CHECK(layout.size() == m.plans.size(), "DataParallel: bucket plan differs from DDP's");
  for (size_t b = 0; b < layout.size(); ++b)
    INGOT_INTERNAL_CHECK(layout[b] == m.plans[b].params, "DataParallel: bucket ", b, " differs from DDP's");
}

void DataParallel::load_weight_shards(const std::function<void(size_t, int64_t, int64_t, Tensor&)>& read) {
  INGOT_INTERNAL_CHECK(impl_->fsdp, "load_weight_shards: ZeRO-3 only");
  impl_->fsdp->load_shards(read);
}

void DataParallel::gather_from_masters(const std::vector<Tensor>& masters) {
  INGOT_INTERNAL_CHECK(impl_->fsdp, "gather_from_masters: ZeRO-3 only");
  impl_->fsdp->gather_from_masters(masters);
  impl_->from_masters = true;
}

bool DataParallel::weights_from_masters() const { return impl_->from_masters; }

std::optional<size_t> DataParallel::vocab_parallel_table() const {
  return impl_->fsdp ? impl_->fsdp->vocab_parallel_table() : std::nullopt;
}

std::vector<Tensor> DataParallel::optimizer_params() const {
  return impl_->fsdp ? impl_->fsdp->optimizer_params() : impl_->ddp->optimizer_params();
}

void DataParallel::backward(const Tensor& loss, bool sync) {
  if (impl_->fsdp) {
    loss.backward();
    impl_->fsdp->synchronize();
    return;
  }
  if (sync && impl_->run.distributed.overlap) {
    loss.backward();
    return;
  }
  // Without overlap every bucket is issued by synchronize(), after the whole backward.
  auto guard = impl_->ddp->no_sync();
  loss.backward();
}

void DataParallel::synchronize() {
  if (impl_->ddp) impl_->ddp->synchronize();  // FSDP synchronized after each backward
}
void DataParallel::update_in_backward(std::function<void(size_t unit)> update, int lag) {
  INGOT_INTERNAL_CHECK(impl_->fsdp, "DataParallel::update_in_backward: ZeRO-3 only");
  impl_->fsdp->update_in_backward(std::move(update), lag);
}
Tensor DataParallel::sum_tensor(const Tensor& t) {
  return mul(dist::all_reduce_avg(t, impl_->ctx.group), static_cast<double>(world_size()));
}
void DataParallel::after_step() {
  if (impl_->ddp) impl_->ddp->after_step();  // FSDP gathers the updated shards when a unit is used next
}
void DataParallel::zero_grad() {
  if (impl_->fsdp) impl_->fsdp->zero_grad();
  else impl_->ddp->zero_grad();
}
void DataParallel::unshard_model() {
  if (impl_->fsdp) impl_->fsdp->unshard();
}

double DataParallel::mean(double v) { return impl_->reduce(v, dist::ReduceOp::Avg); }
double DataParallel::sum(double v) { return impl_->reduce(v, dist::ReduceOp::Sum); }
std::vector<double> DataParallel::sum(const std::vector<double>& v) {
  Tensor t = from_vector(v, {static_cast<int64_t>(v.size())}, DType::f64, impl_->run.device);
  impl_->ctx.group->all_reduce(t, dist::ReduceOp::Sum)->wait();
  return t.to(Device::cpu()).to_vector();
}
void DataParallel::barrier() { impl_->ctx.group->barrier()->wait(); }

Tensor DataParallel::gather_param(size_t i, const std::vector<Tensor>& shards) const {
  INGOT_INTERNAL_CHECK(impl_->fsdp, "gather_param: ZeRO-3 only");
  return impl_->fsdp->gather_param(i, shards, 0);
}

std::vector<Tensor> DataParallel::gather_to_params(const std::vector<Tensor>& chunks) {
  Impl& m = *impl_;
  INGOT_INTERNAL_CHECK(chunks.size() == m.plans.size(), "gather_to_params: one chunk per bucket expected");
  std::vector<Tensor> out(m.params.size());
  for (size_t b = 0; b < m.plans.size(); ++b) {
    const dist::BucketPlan& plan = m.plans[b];
    // On the run's device for the collective (AdamW8bit's element-wise moments come from the host).
    Tensor c = chunks[b].to(m.run.device);
    if (!c.is_contiguous()) c = c.clone_raw();
    INGOT_INTERNAL_CHECK(c.numel() == m.chunk(plan), "gather_to_params: bucket ", b, " chunk has ", c.numel(),
                         " elements, expected ", m.chunk(plan));
    Tensor full = empty({plan.padded_numel}, c.dtype(), c.device());
    m.ctx.group->all_gather(full, c)->wait();
    for (size_t k = 0; k < plan.params.size(); ++k) {
      const size_t p = plan.params[k];
      out[p] = view_at(full, plan.offsets[k], m.params[p].shape()).clone_raw();
    }
  }
  return out;
}

std::vector<Tensor> DataParallel::scatter_to_chunks(const std::vector<Tensor>& per_param) const {
  const Impl& m = *impl_;
  INGOT_INTERNAL_CHECK(per_param.size() == m.params.size(), "scatter_to_chunks: one tensor per parameter expected");
  std::vector<Tensor> out;
  for (const dist::BucketPlan& plan : m.plans) {
    const Tensor& first = per_param[plan.params[0]];
    Tensor flat = zeros({plan.padded_numel}, first.dtype(), first.device());
    for (size_t k = 0; k < plan.params.size(); ++k) {
      const size_t p = plan.params[k];
      view_at(flat, plan.offsets[k], m.params[p].shape()).copy_(per_param[p]);
    }
    out.push_back(view_at(flat, rank() * m.chunk(plan), {m.chunk(plan)}).clone_raw());
  }
  return out;
}

// Note [ZeRO-1 checkpoints hold the full optimizer state]
// A shard's optimizer state is a flat [chunk] tensor per vector state (exp_avg, exp_avg_sq) plus scalars (its
// step count). The checkpoint stores what a plain optimizer over the parameters would hold, so vector states
// are all-gathered into the bucket layout and cut per parameter, and each scalar is copied to every parameter
// of its bucket (all of them step together under DDP: a parameter without a gradient gets zeros).
std::map<std::string, Tensor> DataParallel::gather_optimizer_state(const std::map<std::string, Tensor>& shard_state) {
  const Impl& m = *impl_;
  std::map<std::string, Tensor> out;
  std::map<std::string, std::vector<Tensor>> vectors;  // state name -> per-bucket chunk
  for (const auto& [key, t] : shard_state) {
    if (key == "step") {
      out[key] = t;
      continue;
    }
    const size_t dot = key.find('.');
    INGOT_INTERNAL_CHECK(dot != std::string::npos, "gather_optimizer_state: unexpected entry '", key, "'");
    const size_t b = std::stoul(key.substr(0, dot));
    const std::string name = key.substr(dot + 1);
    INGOT_INTERNAL_CHECK(b < m.plans.size(), "gather_optimizer_state: entry '", key, "' names no bucket");
    if (is_counter(t)) {
      for (size_t p : m.plans[b].params) out[std::to_string(p) + "." + name] = t.clone_raw();
    } else {
      auto& v = vectors[name];
      v.resize(m.plans.size());
      v[b] = t;
    }
  }
  // Every rank holds the same state names for every bucket (the shards step together), so the collectives
  // below line up across ranks.
  for (auto& [name, chunks] : vectors) {
    for (size_t b = 0; b < chunks.size(); ++b)
      INGOT_INTERNAL_CHECK(chunks[b].defined(), "gather_optimizer_state: bucket ", b, " has no '", name, "'");
    std::vector<Tensor> per_param = gather_to_params(chunks);
    for (size_t p = 0; p < per_param.size(); ++p) out[std::to_string(p) + "." + name] = per_param[p];
  }
  return out;
}

std::map<std::string, Tensor> DataParallel::scatter_optimizer_state(
    const std::map<std::string, Tensor>& param_state) const {
  const Impl& m = *impl_;
  std::map<std::string, Tensor> out;
  auto step = param_state.find("step");
  INGOT_INTERNAL_CHECK(step != param_state.end(), "scatter_optimizer_state: no 'step'");
  out["step"] = step->second;
  auto get = [&](size_t p, const std::string& name) -> const Tensor* {
    auto it = param_state.find(std::to_string(p) + "." + name);
    return it == param_state.end() ? nullptr : &it->second;
  };
  // The state names of each bucket are those of its first parameter.
  std::map<std::string, bool> names;  // name -> scalar
  for (const auto& [key, t] : param_state)
    if (key != "step") names[key.substr(key.find('.') + 1)] = is_counter(t);
  for (const auto& [name, scalar] : names) {
    if (scalar) {
      for (size_t b = 0; b < m.plans.size(); ++b)
        if (const Tensor* t = get(m.plans[b].params[0], name)) out[std::to_string(b) + "." + name] = *t;
      continue;
    }
    std::vector<Tensor> per_param(m.params.size());
    bool complete = true;
    for (size_t p = 0; p < m.params.size(); ++p) {
      const Tensor* t = get(p, name);
      if (t) per_param[p] = *t;
      else complete = false;
    }
    // A checkpoint saved before the first step holds no state yet; a partial one cannot come from DDP.
    if (!complete) continue;
    std::vector<Tensor> chunks = scatter_to_chunks(per_param);
    for (size_t b = 0; b < chunks.size(); ++b) out[std::to_string(b) + "." + name] = chunks[b];
  }
  return out;
}

namespace {

std::vector<FlatLayout> flat_layouts(const std::vector<dist::BucketPlan>& plans) {
  std::vector<FlatLayout> out;
  for (const dist::BucketPlan& p : plans) out.push_back({p.params, p.offsets, p.padded_numel});
  return out;
}

// Each trained parameter's model state_dict name (the first, alphabetically, of a tied one's names) and the
// other names of tied parameters.
std::vector<std::string> trained_names(const nn::Module& model, const std::vector<Tensor>& params,
                                       std::map<std::string, std::string>* aliases) {
  std::vector<std::string> names(params.size());
  for (const auto& [name, t] : model.state_dict())
    for (size_t p = 0; p < params.size(); ++p) {
      if (!params[p].same(t)) continue;
      if (names[p].empty()) names[p] = name;
      else if (aliases) (*aliases)[name] = names[p];
    }
  for (size_t p = 0; p < params.size(); ++p)
    INGOT_INTERNAL_CHECK(!names[p].empty(), "sharded checkpoint: trained parameter ", p, " is not in the model");
  return names;
}

// A rank's file entries travel as i64 words: ok flag, then per file its size and its SHA-256 in 4 words.
constexpr int64_t kFilesPerRank = 2;
constexpr int64_t kWordsPerRank = 1 + kFilesPerRank * 5;

void put_entry(const ManifestEntry& e, int64_t* w) {
  w[0] = static_cast<int64_t>(e.bytes);
  uint8_t digest[32];
  for (int i = 0; i < 32; ++i) digest[i] = static_cast<uint8_t>(std::stoi(e.sha256.substr(2 * i, 2), nullptr, 16));
  std::memcpy(w + 1, digest, 32);
}

ManifestEntry get_entry(const int64_t* w) {
  uint8_t digest[32];
  std::memcpy(digest, w + 1, 32);
  std::string hex;
  char buf[3];
  for (uint8_t d : digest) {
    std::snprintf(buf, sizeof buf, "%02x", d);
    hex += buf;
  }
  return {static_cast<uint64_t>(w[0]), hex};
}

}  // namespace

std::string DataParallel::save_sharded_checkpoint(const std::string& output_dir, int64_t step, const nn::Module& model,
                                                  const std::map<std::string, Tensor>& shard_state,
                                                  const std::vector<Tensor>& master_chunks,
                                                  const std::string& state_json) {
  Impl& m = *impl_;
  INGOT_INTERNAL_CHECK(zero_stage() >= 2, "save_sharded_checkpoint: ZeRO-2/3 only");
  ShardedState s;
  s.rank = rank();
  s.world = world_size();
  s.zero_stage = zero_stage();
  s.layout = flat_layouts(m.plans);
  s.names = trained_names(model, m.params, &s.aliases);
  for (const Tensor& p : m.params) s.shapes.push_back(p.shape());
  s.weights = optimizer_params();  // the shards: ZeRO-3's weights, ZeRO-2's copies of this rank's chunks
  if (m.from_masters) {
    // Note [Shards cast from their masters] (distributed/fsdp.h): the shards have no bytes; what they would hold
    // is their masters rounded (as MasterWeights::copy_to_model rounds), so the file is the one bf16 shards make.
    INGOT_INTERNAL_CHECK(master_chunks.size() == s.weights.size(), "save_sharded_checkpoint: ", master_chunks.size(),
                         " masters for ", s.weights.size(), " shards");
    NoGradGuard no_grad;
    for (size_t b = 0; b < s.weights.size(); ++b) s.weights[b] = cast(master_chunks[b], s.weights[b].dtype());
  }
  s.optimizer = shard_state;
  s.masters = master_chunks;
  if (s.rank == 0)
    for (const auto& [name, t] : model.state_dict()) {
      bool trained = false;
      for (const Tensor& p : m.params) trained = trained || p.same(t);
      if (!trained) s.whole.emplace_back(name, t);
    }
  const std::string tmp = checkpoint_temp_path(output_dir, step, "sharded");

  // Rank 0 opens the shared temp directory; nobody writes before it exists.
  std::string error;
  Tensor ok = from_vector_i64({1}, {1});
  if (s.rank == 0) {
    try {
      begin_checkpoint(output_dir, step, "sharded");
    } catch (const std::exception& e) {
      error = e.what();
      ok = from_vector_i64({0}, {1});
    }
  }
  // The flags and file entries travel on the run's device: NCCL reduces CUDA tensors only.
  ok = ok.to(m.run.device);
  m.ctx.group->broadcast(ok, 0)->wait();
  if (static_cast<int64_t>(ok.item()) == 0) {
    INGOT_CHECK(s.rank != 0, error);
    INGOT_FAIL("checkpoint step ", step, ": rank 0 could not create '", tmp, "' (see its error)");
  }

  // Every rank writes and syncs its files, then all learn every file's size and checksum.
  std::vector<int64_t> mine(kWordsPerRank, 0);
  const std::vector<CheckpointFile> files = shard_files(s);
  INGOT_INTERNAL_CHECK(static_cast<int64_t>(files.size()) == kFilesPerRank, "sharded checkpoint: file count");
  try {
    for (size_t i = 0; i < files.size(); ++i) put_entry(write_checkpoint_file(tmp, files[i]), &mine[1 + 5 * i]);
    mine[0] = 1;
  } catch (const std::exception& e) {
    error = e.what();
  }
  Tensor all = zeros({kWordsPerRank * s.world}, DType::i64, m.run.device);
  m.ctx.group->all_gather(all, from_vector_i64(mine, {kWordsPerRank}).to(m.run.device))->wait();
  all = all.to(Device::cpu());
  const int64_t* w = static_cast<const int64_t*>(all.data_ptr());
  std::string failed;
  for (int r = 0; r < s.world; ++r)
    if (w[r * kWordsPerRank] != 1) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!failed.empty()) {
    std::error_code ec;
    if (s.rank == 0) std::filesystem::remove_all(tmp, ec);
    INGOT_CHECK(error.empty(), "checkpoint step ", step, ": ", error);
    INGOT_FAIL("checkpoint step ", step, ": rank(s) ", failed, " could not write their shard files (see their errors); ",
               "nothing was committed");
  }
  if (s.rank != 0) return checkpoint_path(output_dir, step);

  std::vector<std::pair<std::string, ManifestEntry>> listed;
  for (int r = 0; r < s.world; ++r) {
    ShardedState other;
    other.rank = r;
    other.world = s.world;
    const std::vector<CheckpointFile> names = shard_files(other);
    for (size_t i = 0; i < names.size(); ++i)
      listed.emplace_back(names[i].name, get_entry(&w[r * kWordsPerRank + 1 + 5 * i]));
  }
  try {
    const CheckpointFile index = shard_index_file(s);
    listed.emplace_back(index.name, write_checkpoint_file(tmp, index));
    const CheckpointFile state{"state.json", [&](const std::string& path) {
                                 write_file_atomic(path, [&](std::FILE* f) {
                                   write_bytes(f, state_json.data(), state_json.size());
                                 });
                               }};
    listed.emplace_back(state.name, write_checkpoint_file(tmp, state));
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    throw;
  }
  return commit_checkpoint(output_dir, step, tmp, listed);
}

DataParallel::EightBitLoad DataParallel::load_shards(const ShardedCheckpoint& c, const nn::Module& model,
                                                     optim::Optimizer& opt, const std::vector<Tensor>& master_chunks) {
  const Impl& m = *impl_;
  INGOT_INTERNAL_CHECK(zero_stage() >= 2, "load_shards: ZeRO-2/3 only");
  const std::vector<FlatLayout> layouts = flat_layouts(m.plans);
  const std::vector<std::string> names = trained_names(model, m.params, nullptr);
  const std::string what = "sharded checkpoint '" + c.dir() + "'";
  for (size_t p = 0; p < names.size(); ++p) {
    const std::string key = "model/" + names[p];
    INGOT_CHECK(c.has(key), what, " does not fit this model: it has no '", names[p], "'");
    INGOT_CHECK(c.shape(key) == m.params[p].shape() && c.dtype(key) == m.params[p].dtype(), what,
                " does not fit this model: '", names[p], "' is ", dtype_name(c.dtype(key)), " ",
                shape_str(c.shape(key)), " there and ", dtype_name(m.params[p].dtype()), " ",
                shape_str(m.params[p].shape()), " here");
  }
  NoGradGuard no_grad;
  // After gather_from_masters the shards hold nothing: the masters read below are the weights (the checkpoint's
  // weights are those masters rounded, whichever way it was written).
  if (m.fsdp && !m.from_masters) {
    std::vector<Tensor> shards = m.fsdp->optimizer_params();
    for (size_t b = 0; b < layouts.size(); ++b)
      shards[b].copy_(c.read_chunk(layouts[b], rank(), world_size(), shards[b].dtype(),
                                   [&](size_t p) { return "model/" + names[p]; }));
  }
  // The optimizer state of each bucket: the names its first parameter has (all of a bucket's step together).
  std::map<std::string, Tensor> sd;
  INGOT_CHECK(c.has("optimizer/step"), what, ": index.json has no 'optimizer/step'");
  sd["step"] = c.read("optimizer/step");
  const auto* eight = dynamic_cast<const optim::AdamW8bit*>(&opt);
  EightBitLoad counts;
  for (size_t b = 0; b < layouts.size(); ++b) {
    const std::string first = "optimizer/" + std::to_string(layouts[b].params[0]) + ".";
    // Note [Moments in their blocks] (sharded_checkpoint.cpp): moments in blocks that this rank's chunk owns
    // exactly as written (same world size, the bucket's parameters at the same offsets) load as their codes.
    std::set<std::string> native;
    for (const optim::Quant8Moment& q : optim::kAdamW8bitMoments) {
      const std::string key = first + q.name;
      if (!eight || !eight->quantized(b) || !c.has(key) || c.world_size() != world_size()) continue;
      const std::optional<ShardedCheckpoint::BlockSource> src = c.block_source(key);
      const int64_t chunk = layouts[b].padded_numel / world_size();
      bool same = src && src->chunk == chunk;
      for (size_t k = 0; same && k < layouts[b].params.size(); ++k) {
        const auto at = c.block_source("optimizer/" + std::to_string(layouts[b].params[k]) + "." + q.name);
        same = at && at->codes == src->codes && at->offset == layouts[b].offsets[k];
      }
      if (!same) continue;
      const int64_t words = quant8_code_words(chunk), blocks = quant8_blocks(chunk);
      sd[std::to_string(b) + "." + q.codes] = c.read_flat(src->codes, rank() * words, (rank() + 1) * words);
      sd[std::to_string(b) + "." + q.absmax] = c.read_flat(src->absmax, rank() * blocks, (rank() + 1) * blocks);
      native.insert(q.name);
    }
    if (eight && eight->quantized(b)) ++(native.empty() ? counts.requantized : counts.as_written);
    for (const std::string& key : c.names(first)) {
      const std::string state = key.substr(first.size());
      if (native.count(state)) continue;
      const bool counter = c.shape(key).empty() || c.dtype(key) == DType::i64;
      sd[std::to_string(b) + "." + state] =
          counter ? c.read(key)
                  : c.read_chunk(layouts[b], rank(), world_size(), c.dtype(key),
                                 [&](size_t p) { return "optimizer/" + std::to_string(p) + "." + state; });
    }
  }
  try {
    opt.load_state_dict(sd);
  } catch (const Error& e) {
    INGOT_FAIL(what, ": does not fit this optimizer: ", e.what());
  }
  const bool has_masters = c.has("optimizer/master.0");
  INGOT_CHECK(has_masters == !master_chunks.empty(), what,
              has_masters ? " holds f32 master weights but this run keeps none (dtype f32, or train.master_weights "
                            "false; was the checkpoint made with dtype bf16 and f32 masters?)"
                          : " holds no f32 master weights (was the checkpoint made with dtype f32 or "
                            "train.master_weights false?)");
  for (size_t b = 0; b < master_chunks.size(); ++b) {
    Tensor dst = master_chunks[b];
    dst.copy_(c.read_chunk(layouts[b], rank(), world_size(), DType::f32,
                           [](size_t p) { return "optimizer/master." + std::to_string(p); }));
  }
  return counts;
}

void check_global_batch(const Config& cfg, const RunSettings& run, int64_t batch_size, ConfigErrors& errors) {
  if (run.world_size <= 1 || errors.has_error_for("train.batch_size")) return;
  if (batch_size % run.world_size == 0) return;
  errors.fail(cfg, "train.batch_size",
              std::to_string(batch_size) + " is the global batch over all ranks and must divide by the world size " +
                  std::to_string(run.world_size) + " (WORLD_SIZE); use a multiple of " +
                  std::to_string(run.world_size));
}

void check_optimizer_in_backward(const Config& cfg, const RunSettings& run, const TrainOptions& o,
                                 ConfigErrors& errors) {
  if (!o.optimizer_in_backward || errors.has_error_for("train.optimizer_in_backward")) return;
  if (run.world_size <= 1 && !run.mpi) return;  // one process: each parameter in its backward (train_step.cpp)
  // Note [Updates in the backward] (distributed/fsdp_compiled.cpp): under data parallelism the update of a unit's
  // shard is traced where its reduction is waited for, which only the compiled ZeRO-3 step does.
  auto need = [&](bool ok, const std::string& why) {
    if (!ok) errors.fail(cfg, "train.optimizer_in_backward", "true " + why);
  };
  const std::string world = std::to_string(run.world_size);
  if (o.optimizer_offload)
    errors.fail(cfg, "train.optimizer_offload",
                "true offloads one process's optimizer state; under data parallelism (" + world +
                    " ranks) ZeRO-3 shards it instead: set it false");
  need(cfg.value("distributed.zero_stage").text == "3",
       "under data parallelism (" + world + " ranks) updates ZeRO-3 shards unit by unit, and "
       "distributed.zero_stage is " + cfg.value("distributed.zero_stage").text + ": set distributed.zero_stage=3");
  need(cfg.value("compile.enabled").text == "true",
       "under data parallelism (" + world + " ranks) runs in the compiled ZeRO-3 step, and compile.enabled is false: "
       "set compile.enabled=true");
  need(cfg.value("compile.unit_reduction_lag").text != "0",
       "waits for each unit's reduction a unit later, and compile.unit_reduction_lag is 0: set it to 1 or more");
}

bool keep_shards_for_test() {
  const char* v = std::getenv("INGOT_TEST_KEEP_BF16_SHARDS");
  return v && std::string(v) == "1";
}

void maybe_kill_for_test(int rank, int64_t step) {
  const char* v = std::getenv("INGOT_TEST_KILL_AT_STEP");
  if (!v || !*v) return;
  const char* restarts = std::getenv("INGOT_RESTART_COUNT");
  if (restarts && *restarts && std::string(restarts) != "0") return;
  std::string s = v;
  size_t colon = s.find(':');
  if (colon == std::string::npos) return;
  if (std::atoi(s.substr(0, colon).c_str()) == rank && std::atoll(s.substr(colon + 1).c_str()) == step)
    ::raise(SIGKILL);
}

}  // namespace ingot::recipes
