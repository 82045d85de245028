// max-autotune on CUDA: candidate launch configs timed on scratch buffers, matmul steps run under the
// session's MatmulTuner, winners in the autotune database (see tuner.h).
#include "compile/autotune/cuda/tuner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "compile/cache/compile_cache.h"
#include "compile/codegen/cuda/nvrtc_jit.h"
#include "compile/codegen/cuda/render_cuda.h"
#include "compile/logs.h"
#include "runtime/cuda_runtime.h"
#include "runtime/error.h"
#include "runtime/sm_budget.h"

namespace ingot::autotune {

using codegen::KernelKind;
using codegen::KernelSpec;
using codegen::SymInt;
using codegen::cuda::CudaKernel;
using codegen::cuda::KernelAbi;
using codegen::cuda::LaunchConfig;

namespace {

constexpr int kSamples = 5;                 // timed samples per candidate (after one warm-up launch)
constexpr double kSampleMs = 0.1;           // a sample launches the kernel enough times to last about this long
constexpr int kMaxLaunchesPerSample = 100;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const char* rows_name(LaunchConfig::Rows r) {
  switch (r) {
    case LaunchConfig::Rows::Auto: return "auto";
    case LaunchConfig::Rows::WarpPerRow: return "warp";
    case LaunchConfig::Rows::BlockPerRow: return "block";
    case LaunchConfig::Rows::Columns: return "cols";
  }
  return "auto";
}

bool same(const LaunchConfig& a, const LaunchConfig& b) {
  return a.block_threads == b.block_threads && a.row_block_threads == b.row_block_threads && a.rows == b.rows &&
         a.warp_row_max_cols == b.warp_row_max_cols && a.col_rows == b.col_rows && a.col_splits == b.col_splits &&
         a.col_grid_splits == b.col_grid_splits && a.vectorize == b.vectorize && a.waves == b.waves && a.chunk_elems == b.chunk_elems;
}

// Timed on scratch buffers only when every size and stride is known now (see tuner.h).
bool tunable(const KernelSpec& spec) {
  if (spec.kind == KernelKind::MultiTensor || spec.num_syms > 0) return false;
  for (const SymInt& d : spec.dims)
    if (!d.is_constant() || d.value <= 0) return false;
  for (const codegen::Buffer& b : spec.buffers)
    for (const SymInt& s : b.strides)
      if (!s.is_constant()) return false;
  return !spec.dims.empty() || spec.kind == KernelKind::Pointwise;
}

// Elements a buffer spans: 1 + sum over dims of (size - 1) * |stride|.
int64_t extent(const KernelSpec& spec, const codegen::Buffer& b) {
  int64_t n = 1;
  for (size_t d = 0; d < spec.dims.size() && d < b.strides.size(); ++d)
    n += (spec.dims[d].value - 1) * std::abs(b.strides[d].value);
  return n;
}

}  // namespace

std::string cuda_device_id(int device) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  INGOT_CHECK(e == cudaSuccess, "[autotune] cannot query cuda:", device, ": ", cudaGetErrorString(e));
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  std::string name = prop.name;
  std::replace_if(name.begin(), name.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; }, ' ');
  // Winners timed with an SM carve-out go to a database of their own (Note [SM carve-out], runtime/sm_budget.h).
  return detail::str_cat(name, " sm_", prop.major, prop.minor, " cudart ", runtime, " ", codegen::cuda::nvrtc_version(),
                         " ", kernels::cuda::blas_version(), sm_budget_key(prop.multiProcessorCount));
}

std::vector<LaunchConfig> launch_candidates(const KernelAbi& abi, const LaunchConfig& base) {
  std::vector<LaunchConfig> out{base};
  auto add = [&](const LaunchConfig& c) {
    for (const LaunchConfig& o : out)
      if (same(o, c)) return;
    out.push_back(c);
  };
  std::vector<bool> vector_paths{base.vectorize};
  if (abi.vector_width > 1) vector_paths = {true, false};
  const int threads[] = {128, 256, 512, 1024};
  if (abi.kind == KernelKind::Pointwise) {
    for (bool v : vector_paths)
      for (int t : threads)
        for (int waves : {8, 32}) {
          LaunchConfig c = base;
          c.block_threads = t;
          c.waves = waves;
          c.vectorize = v;
          add(c);
        }
  } else if (abi.kind == KernelKind::RowReduction) {
    for (bool v : vector_paths) {
      for (int t : threads) {
        if (t > codegen::cuda::kWarpRowMaxThreads) continue;  // the launcher would clamp it: the same launch
        LaunchConfig c = base;
        c.rows = LaunchConfig::Rows::WarpPerRow;
        c.block_threads = t;
        c.vectorize = v;
        add(c);
      }
      for (int t : {0, 128, 256, 512, 1024}) {
        LaunchConfig c = base;
        c.rows = LaunchConfig::Rows::BlockPerRow;
        c.row_block_threads = t;
        c.vectorize = v;
        add(c);
      }
      if (!abi.prefer_columns) continue;
      for (int rows : {8, 16, 32, 64})
        for (int splits : {0, 4, 16})
          for (int grid_splits : {0, 1}) {  // split across blocks where it pays, or never
            if (rows * std::max(splits, 1) > 1024 || (grid_splits == 0 && abi.split_reductions == 0)) continue;
            LaunchConfig c = base;
            c.rows = LaunchConfig::Rows::Columns;
            c.col_rows = rows;
            c.col_splits = splits;
            c.col_grid_splits = grid_splits;
            c.vectorize = v;
            add(c);
          }
    }
  }
  return out;
}

std::string encode_config(const LaunchConfig& c) {
  return detail::str_cat("block=", c.block_threads, " rows=", rows_name(c.rows), " rbt=", c.row_block_threads,
                         " cr=", c.col_rows, " cs=", c.col_splits, " gs=", c.col_grid_splits, " vec=", c.vectorize ? 1 : 0, " waves=", c.waves);
}

bool decode_config(const std::string& text, LaunchConfig& cfg) {
  std::istringstream in(text);
  std::string field;
  std::map<std::string, std::string> kv;
  while (in >> field) {
    const size_t eq = field.find('=');
    if (eq == std::string::npos || !kv.emplace(field.substr(0, eq), field.substr(eq + 1)).second) return false;
  }
  auto num = [&](const char* key, int lo, int hi, int& out) {
    auto it = kv.find(key);
    if (it == kv.end()) return false;
    char* end = nullptr;
    const long v = std::strtol(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || v < lo || v > hi) return false;
    out = static_cast<int>(v);
    return true;
  };
  int block = 0, rbt = 0, cr = 0, cs = 0, gs = 0, vec = 0, waves = 0;
  if (kv.size() != 8 || !num("block", 32, 1024, block) || !num("rbt", 0, 1024, rbt) || !num("cr", 1, 1024, cr) ||
      !num("cs", 0, 1024, cs) || !num("gs", 0, 65535, gs) || !num("vec", 0, 1, vec) || !num("waves", 1, 1024, waves) ||
      block % 32 != 0)
    return false;
  const std::string rows = kv.count("rows") ? kv["rows"] : "";
  LaunchConfig::Rows r = LaunchConfig::Rows::Auto;
  if (rows == "warp") r = LaunchConfig::Rows::WarpPerRow;
  else if (rows == "block") r = LaunchConfig::Rows::BlockPerRow;
  else if (rows == "cols") r = LaunchConfig::Rows::Columns;
  else if (rows != "auto") return false;
  cfg.block_threads = block;
  cfg.rows = r;
  cfg.row_block_threads = rbt;
  cfg.col_rows = cr;
  cfg.col_splits = cs;
  cfg.col_grid_splits = gs;
  cfg.vectorize = vec != 0;
  cfg.waves = waves;
  return true;
}

std::string kernel_key(const KernelSpec& spec) {
  const std::string key = spec.structural_key();
  static const std::string renderer = cache::hex64(cache::hash_bytes(codegen::cuda::renderer_fingerprint()));
  const char* kind = spec.kind == KernelKind::Pointwise ? "pointwise" : spec.kind == KernelKind::RowReduction ? "rows" : "multi";
  return detail::str_cat("kernel ", kind, " ", cache::hex64(cache::hash_bytes(key, 1)), cache::hex64(cache::hash_bytes(key, 2)),
                         " r", renderer);
}

CudaSession::CudaSession(std::shared_ptr<AutotuneDb> db, int device, double budget_s, CompileStats& stats)
    : db_(std::move(db)), device_(device), budget_s_(budget_s), stats_(&stats) {}

std::shared_ptr<CudaSession> CudaSession::start(const CompileOptions& opts, int device, CompileStats& stats) {
  auto db = AutotuneDb::shared(AutotuneDb::dir_for(opts.cache_dir), cuda_device_id(device));
  return std::shared_ptr<CudaSession>(new CudaSession(std::move(db), device, opts.autotune_budget_s, stats));
}

int CudaSession::time_candidates(const KernelSpec& spec, const CudaKernel& kernel,
                                 const std::vector<LaunchConfig>& candidates, double* best_ms) {
  // Zero-filled scratch buffers of the kernel's extents; an in-place output shares its input's buffer.
  std::vector<Tensor> scratch(spec.buffers.size());
  std::vector<void*> ptrs(spec.buffers.size(), nullptr);
  for (size_t b = 0; b < spec.buffers.size(); ++b) {
    if (spec.buffers[b].alias_of >= 0) continue;
    scratch[b] = zeros({extent(spec, spec.buffers[b])}, spec.buffers[b].dtype, Device::cuda(device_));
    ptrs[b] = scratch[b].data_ptr();
  }
  for (size_t b = 0; b < spec.buffers.size(); ++b)
    if (spec.buffers[b].alias_of >= 0) ptrs[b] = ptrs[static_cast<size_t>(spec.buffers[b].alias_of)];
  const std::vector<int64_t> syms{0};
  const std::vector<double> scalars(static_cast<size_t>(std::max(spec.num_scalars, 1)), 0.0);
  const ingot::cuda::Stream stream = ingot::cuda::current_stream(device_);
  ingot::cuda::Event start, stop;
  auto sample = [&](const LaunchConfig& cfg, int launches) {
    start.record(stream);
    for (int i = 0; i < launches; ++i) kernel.launch(ptrs.data(), syms.data(), scalars.data(), cfg, stream.handle);
    stop.record(stream);
    stop.synchronize();
    return static_cast<double>(start.elapsed_ms(stop)) / launches;
  };
  // Launches per sample, from the heuristic config (candidates[0]): short kernels are timed in batches.
  kernel.launch(ptrs.data(), syms.data(), scalars.data(), candidates[0], stream.handle);
  const double once = sample(candidates[0], 1);
  const int launches = static_cast<int>(std::clamp(kSampleMs / std::max(once, 1e-4), 1.0, double{kMaxLaunchesPerSample}));
  int best = -1;
  for (size_t c = 0; c < candidates.size(); ++c) {
    std::vector<double> ms;
    try {
      kernel.launch(ptrs.data(), syms.data(), scalars.data(), candidates[c], stream.handle);  // warm-up
      for (int s = 0; s < kSamples; ++s) ms.push_back(sample(candidates[c], launches));
    } catch (const Error&) {  // e.g. too many registers for 1024 threads: not a candidate for this kernel
      continue;
    }
    std::nth_element(ms.begin(), ms.begin() + kSamples / 2, ms.end());
    const double median = ms[kSamples / 2];
    if (best < 0 || median < *best_ms) {
      best = static_cast<int>(c);
      *best_ms = median;
    }
  }
  return best;
}

void CudaSession::tune_kernels(const std::vector<KernelSpec>& specs, std::vector<CudaKernel>& kernels) {
  INGOT_INTERNAL_CHECK(specs.size() == kernels.size(), "autotune: ", specs.size(), " specs, ", kernels.size(), " kernels");
  std::map<std::string, LaunchConfig> chosen;  // database key -> config, within this batch
  AutotuneStats& st = stats_->autotune;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string key = kernel_key(specs[i]);
    if (auto it = chosen.find(key); it != chosen.end()) {
      kernels[i].config = it->second;
      continue;
    }
    LaunchConfig cfg = kernels[i].config;
    if (std::optional<TuneEntry> e = db_->get(key)) {
      LaunchConfig stored = cfg;
      if (decode_config(e->config, stored)) {
        ++st.kernels_from_db;
        kernels[i].config = chosen[key] = stored;
        continue;
      }
    }
    const std::vector<LaunchConfig> candidates = launch_candidates(kernels[i].abi, cfg);
    if (!tunable(specs[i]) || candidates.size() < 2 || !may_time()) {
      ++st.kernels_untuned;
      chosen[key] = cfg;
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    double best_ms = 0;
    int best = -1;
    try {
      best = time_candidates(specs[i], kernels[i], candidates, &best_ms);
    } catch (const Error& e) {  // no memory for the scratch buffers, say: the heuristic config, not a failed compile
      std::fprintf(stderr, "ingot: warning: max-autotune: kernel '%s' keeps its heuristic launch config: %s\n",
                   kernels[i].symbol.c_str(), e.what());
    }
    const double spent = seconds_since(t0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      spent_s_ += spent;
    }
    st.seconds += spent;
    if (best < 0) {
      ++st.kernels_untuned;
      chosen[key] = cfg;
      continue;
    }
    cfg = candidates[static_cast<size_t>(best)];
    ++st.kernels_timed;
    db_->put(key, TuneEntry{encode_config(cfg), best_ms});
    kernels[i].config = chosen[key] = cfg;
  }
  db_->flush();
  if (compiler::log_on(compiler::LogKind::Perf))
    compiler::log(compiler::LogKind::Perf,
                  detail::str_cat("max-autotune: ", chosen.size(), " distinct kernels; launch configs timed ",
                                  st.kernels_timed, ", from the database ", st.kernels_from_db, ", heuristic ",
                                  st.kernels_untuned, " (totals of this function); ", st.seconds, " s timing; ",
                                  db_->path()));
}

void CudaSession::tune_matmuls(const compiler::Graph& g, std::vector<compiler::ExecStep>& steps) {
  for (compiler::ExecStep& s : steps) {
    if (s.kernel || s.node < 0) continue;
    const compiler::Node& n = g.nodes[static_cast<size_t>(s.node)];
    if (n.prim->fusion_kind() != FusionKind::Opaque) continue;
    // What compiler::execute does for a node step, inside the session's scope.
    s.kernel = [self = shared_from_this(), node = n, release = s.release](std::vector<Tensor>& env) {
      kernels::cuda::MatmulTuningScope scope(self.get());
      compiler::run_node(node, release, env);
    };
  }
}

std::optional<std::string> CudaSession::find(const std::string& signature) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = matmuls_.find(signature); it != matmuls_.end()) return it->second;
  std::optional<TuneEntry> e = db_->get("matmul " + signature);
  if (!e) return std::nullopt;
  ++stats_->autotune.matmuls_from_db;
  return matmuls_[signature] = e->config;
}

bool CudaSession::may_time() {
  std::lock_guard<std::mutex> lock(mu_);
  return spent_s_ < budget_s_;
}

void CudaSession::chose(const std::string& signature, const std::string& algo, double ms, double seconds,
                        int candidates) {
  std::lock_guard<std::mutex> lock(mu_);
  matmuls_[signature] = algo;
  spent_s_ += seconds;
  AutotuneStats& st = stats_->autotune;
  st.seconds += seconds;
  if (algo.empty() || candidates == 0) {
    ++st.matmuls_untuned;
    return;
  }
  ++st.matmuls_timed;
  db_->put("matmul " + signature, TuneEntry{algo, ms});
  db_->flush();
}

}  // namespace ingot::autotune
