// CUDA code generation driver: in-process table, disk cache of cubins, batched parallel NVRTC, driver-API
// loading and launching (see cuda_codegen.h).
#include "compile/codegen/cuda/cuda_codegen.h"

#include <cuda.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "compile/cache/compile_cache.h"
#include "compile/codegen/common/batch.h"
#include "compile/codegen/cuda/driver_api.h"
#include "compile/codegen/cuda/nvrtc_jit.h"
#include "runtime/cuda_runtime.h"
#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/sm_budget.h"

namespace ingot::codegen::cuda {

namespace {

constexpr const char* kEntryKind = "cuda_kernel";
// Note [Tables of per-bucket updates]: the multi-tensor tables one kernel keeps uploaded before a flush.
constexpr size_t kMaxTableBytesPerKernel = size_t{64} << 20;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void check_cu(CUresult r, const char* what, const std::string& name) {
  if (r == CUDA_SUCCESS) return;
  const char* msg = nullptr;
  driver::api().get_error_string(r, &msg);
  INGOT_FAIL("[codegen] CUDA driver ", what, " failed for '", name, "': ", msg ? msg : "unknown error", " (", static_cast<int>(r), ")");
}

// The driver API acts on the thread's current context; make it the runtime's primary context of `device`
// (the one ingot's tensors and streams live in) when this thread has none or another one.
void ensure_context(int device) {
  CUcontext cur = nullptr;
  driver::api().ctx_get_current(&cur);
  CUdevice want = 0;
  if (cur != nullptr && driver::api().ctx_get_device(&want) == CUDA_SUCCESS && static_cast<int>(want) == device) return;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaFree(nullptr);  // creates the primary context if needed
  INGOT_CHECK(e == cudaSuccess, "[codegen] cannot make cuda:", device, " current: ", cudaGetErrorString(e));
}

int arch_of(int device) {
  static std::mutex mu;
  static std::map<int, int> arch;
  std::lock_guard<std::mutex> lock(mu);
  auto it = arch.find(device);
  return it != arch.end() ? it->second : arch[device] = device_arch(device);
}

// A loaded cubin. Never unloaded: kernels may run until the process exits, and unloading during static
// teardown (after the runtime destroyed the context) would crash.
struct Module {
  CUmodule handle = nullptr;
  std::string name;
};

std::shared_ptr<Module> load_module(const std::string& cubin, const std::string& name) {
  auto m = std::make_shared<Module>();
  m->name = name;
  check_cu(driver::api().module_load_data(&m->handle, cubin.data()), "cuModuleLoadData", name);
  return m;
}

// The ABI travels in the cache entry's payload so that a warm process does not even render the source.
std::string encode_abi(const std::string& symbol, const KernelAbi& a) {
  std::ostringstream o;
  o << symbol << '\n'
    << static_cast<int>(a.kind) << ' ' << a.num_buffers << ' ' << a.num_syms << ' ' << a.num_scalars << ' '
    << a.sym_slots << ' ' << a.scalar_slots << ' ' << a.vector_width << ' ' << a.index32 << ' ' << a.prefer_columns
    << ' ' << a.split_reductions << ' ' << a.column_sums << ' ' << a.dims.size()
    << ' ' << a.functions.size() << '\n';
  for (const SymInt& d : a.dims) o << d.value << ' ' << d.sym << '\n';
  for (const std::string& f : a.functions) o << (f.empty() ? "-" : f) << '\n';  // "-": not generated
  return o.str();
}

bool decode_abi(const std::string& payload, std::string& symbol, KernelAbi& a) {
  std::istringstream in(payload);
  int kind = 0;
  size_t nd = 0, nf = 0;
  if (!std::getline(in, symbol)) return false;
  if (!(in >> kind >> a.num_buffers >> a.num_syms >> a.num_scalars >> a.sym_slots >> a.scalar_slots >>
        a.vector_width >> a.index32 >> a.prefer_columns >> a.split_reductions >> a.column_sums >> nd >> nf) ||
      kind < 0 || kind > 2 || nd > 64 || nf > 5)
    return false;
  a.kind = static_cast<KernelKind>(kind);
  a.dims.resize(nd);
  for (SymInt& d : a.dims)
    if (!(in >> d.value >> d.sym)) return false;
  a.functions.resize(nf);
  for (std::string& f : a.functions) {
    if (!(in >> f)) return false;
    if (f == "-") f.clear();
  }
  return nf > 0;
}

int64_t eval(const SymInt& s, const int64_t* syms) { return s.is_constant() ? s.value : syms[s.sym]; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t multi_tensor_chunk(const std::vector<int64_t>& sizes, int64_t sms, int64_t resident_blocks, int64_t grid_blocks,
                           int block_threads, int vector_width, int64_t chunk_elems) {
  const int64_t v = std::max(1, vector_width), least = 8 * static_cast<int64_t>(std::max(block_threads, 1));
  const auto round = [&](int64_t n) { return ceil_div(std::max<int64_t>(n, 1), v) * v; };
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  const auto count = [&](int64_t chunk) {
    int64_t c = 0;
    for (int64_t n : sizes) c += ceil_div(n, chunk);
    return c;
  };
  const int64_t resident = std::max<int64_t>(resident_blocks, 1);
  const int64_t wide = round(std::min<int64_t>(std::max<int64_t>(chunk_elems, 1),
                                               std::max(ceil_div(total, 4 * std::max<int64_t>(sms, 1)), least)));
  if (count(wide) >= 2 * resident) return wide;
  return round(std::min(wide, std::max(ceil_div(total, 4 * grid_blocks), least)));
}

struct LoadedKernel {
  std::shared_ptr<Module> module;
  CUfunction fns[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  // _colsplit's workspace (KernelAbi::split_reductions) or the column sums' partials, grown on demand.
  // Outgrown buffers are kept: a captured CUDA graph may still point at them. One launch of a kernel at a time per process (its counters
  // are shared), which the executor's single stream per device gives.
  CUdeviceptr ws = 0;
  size_t ws_bytes = 0;
  std::vector<CUdeviceptr> old_ws;
  // Grows ws to at least `need` bytes (call with mu held); true when it allocated a new buffer.
  bool grow_ws(size_t need, const char* what, const std::string& symbol) {
    if (ws_bytes >= need) return false;
    if (ws) old_ws.push_back(ws);
    check_cu(driver::api().mem_alloc(&ws, need), what, symbol);
    ws_bytes = need;
    return true;
  }
  // MultiTensor: uploaded tables by content hash. A table is immutable once uploaded (a launch still in
  // flight may read it), so the same parameter list costs one upload for the life of the process.
  std::mutex mu;
  std::map<uint64_t, CUdeviceptr> tables;
  // The host bytes of each table, kept as long as it: under a CUDA graph capture (reduce-overhead) the upload
  // is captured as a memcpy node that reads them again at every replay.
  std::map<uint64_t, std::vector<uint64_t>> table_bytes;
  // Tables a captured launch uses (uploaded in the capture, or found by it): a graph reads them at every replay,
  // for as long as it lives, so the flush past multi_tensor_table_limit() never frees them (Note [Tables of captured launches]).
  std::set<uint64_t> captured_tables;
  // Note [Multi-tensor chunks]: the blocks of the multi-tensor function (fns[0]) one SM holds, by block size, asked
  // of the driver once rather than at every launch.
  std::map<int, int> resident_per_sm;
};

size_t multi_tensor_table_limit() { return 1024; }

size_t CudaKernel::split_workspace_bytes() const {
  if (!loaded) return 0;
  std::lock_guard<std::mutex> lock(loaded->mu);
  return loaded->ws_bytes;
}

void CudaKernel::operator()(void* const* bufs, const int64_t* syms, const double* scalars) const {
  launch(bufs, syms, scalars, config, nullptr);
}

namespace {

// One launch of a loaded kernel: its stream, the device's limits, and the parameter block (8-byte slots) that
// every generated function takes as its one argument.
struct Launcher {
  const CudaKernel& k;
  CUstream stream;
  int sms;      // the SMs launches plan for: all but the carve-out left to communication (Note [SM carve-out])
  int64_t cap;  // the grid of grid-stride loops: cfg.waves waves of those SMs
  int block;
  uint64_t flags;  // bit 0: take the vector path where the kernel has one
  std::vector<uint64_t> params;

  Launcher(const CudaKernel& kernel, const LaunchConfig& cfg, void* s)
      : k(kernel),
        stream(static_cast<CUstream>(s ? s : ingot::cuda::current_stream(kernel.device).handle)),
        sms(usable_sms(kernel.device)),
        cap(std::max<int64_t>(1, static_cast<int64_t>(cfg.waves) * sms)),
        block(std::clamp(cfg.block_threads / 32 * 32, 32, 1024)),
        flags(cfg.vectorize ? 1 : 0) {}

  void push_double(double d) {
    uint64_t u;
    std::memcpy(&u, &d, 8);
    params.push_back(u);
  }
  // The scalar slots; zeros where `scalars` is null (a multi-tensor kernel reading them from device memory).
  void push_scalars(const double* scalars) {
    for (int i = 0; i < k.abi.scalar_slots; ++i) push_double(scalars && i < k.abi.num_scalars ? scalars[i] : 0.0);
  }
  void run(CUfunction fn, int64_t grid, int threads, int threads_y = 1, int64_t grid_y = 1,
           unsigned shared_bytes = 0) {
    void* args[] = {params.data()};
    check_cu(driver::api().launch_kernel(fn, static_cast<unsigned>(grid), static_cast<unsigned>(grid_y), 1,
                                         static_cast<unsigned>(threads), static_cast<unsigned>(threads_y), 1,
                                         shared_bytes, stream, args, nullptr),
             "cuLaunchKernel", k.symbol);
  }
};

// Note [Tables of per-bucket updates]
// The flush below synchronizes the device: the host waits for the GPU to drain, and the GPU then idles while the
// host queues the rest of the step. It must not happen in a steady training step. Compiled DDP updates each bucket
// right after its all-reduce (split_update_by_bucket), one launch of the one AdamW kernel per bucket: the ~1B Llama
// at PyTorch's 25 MB buckets made 65 distinct tables per step, past the 64 the cache then kept, so every step
// flushed: 102.8-105.3 ms per step on 2x H200 against 82.7 ms with one update after all reductions, and the host
// busy for the whole step (bench/RESULTS.md, twenty-eighth session). The cache now keeps up to
// multi_tensor_table_limit() (1024) tables and kMaxTableBytesPerKernel (64 MiB) per kernel (an update table is ~16 bytes per chunk:
// ~64 KB for a 67M-element bucket in 17K chunks): a step's tables stay, and only pointers that keep changing
// (outputs not updated in place, many compiled shapes sharing a kernel) reach the flush.
//
// Note [Tables of captured launches]
// Tables pile up when a kernel's pointers keep changing (outputs not updated in place, several compiled steps or
// shapes sharing the kernel), so past multi_tensor_table_limit() the uploaded ones are freed after a device synchronize. A
// captured CUDA graph, though, keeps reading its tables (and re-copying them from their host bytes) at every
// replay, long after the synchronize: freed, a later replay would read pointers from reused memory. So a table
// that a capturing stream uploads or finds is pinned: it is never flushed (they are few: one per captured launch),
// and no flush happens during a capture (a device synchronize is not allowed there).
// The device copy of a multi-tensor table, uploaded once per distinct content (LoadedKernel::tables).
CUdeviceptr upload_table(LoadedKernel& loaded, const std::vector<uint64_t>& table, CUstream st,
                         const std::string& symbol) {
  const std::string_view bytes(reinterpret_cast<const char*>(table.data()), table.size() * 8);
  const uint64_t h = cache::hash_bytes(bytes);  // SHA-256-derived: one 64-bit key suffices
  const bool capturing = ingot::cuda::is_capturing(ingot::cuda::Stream{st});
  std::lock_guard<std::mutex> lock(loaded.mu);
  if (capturing) loaded.captured_tables.insert(h);
  auto it = loaded.tables.find(h);
  if (it != loaded.tables.end()) return it->second;
  size_t unpinned_bytes = 0;  // Note [Tables of per-bucket updates]
  for (const auto& [key, host] : loaded.table_bytes)
    if (!loaded.captured_tables.count(key)) unpinned_bytes += host.size() * 8;
  const size_t pinned = std::min(loaded.captured_tables.size(), loaded.tables.size());
  if (!capturing && (loaded.tables.size() - pinned >= multi_tensor_table_limit() ||
                     unpinned_bytes + bytes.size() > kMaxTableBytesPerKernel)) {
    check_cu(driver::api().ctx_synchronize(), "cuCtxSynchronize (multi-tensor tables)", symbol);
    for (auto t = loaded.tables.begin(); t != loaded.tables.end();) {
      if (loaded.captured_tables.count(t->first)) {
        ++t;
        continue;
      }
      driver::api().mem_free(t->second);
      loaded.table_bytes.erase(t->first);
      t = loaded.tables.erase(t);
    }
  }
  CUdeviceptr dev = 0;
  check_cu(driver::api().mem_alloc(&dev, bytes.size()), "cuMemAlloc (multi-tensor table)", symbol);
  // On the launch stream: a synchronous cuMemcpyHtoD from pageable memory runs on the legacy stream and may
  // return before the DMA lands, so a kernel on ingot's (non-blocking) stream could read a half-written table.
  // The source stays alive with the table: a graph capture records the copy and replays it from these bytes (a
  // launch captured on the first call of a multi-tensor cast crashed at replay when they were a local vector).
  const std::vector<uint64_t>& kept = loaded.table_bytes[h] = table;
  check_cu(driver::api().memcpy_htod_async(dev, kept.data(), bytes.size(), st),
           "cuMemcpyHtoDAsync (multi-tensor table)", symbol);
  loaded.tables[h] = dev;
  return dev;
}

void launch_multi_tensor(Launcher& L, void* const* bufs, const int64_t* syms, const double* scalars,
                         const double* device_scalars, const LaunchConfig& cfg) {
  const KernelAbi& abi = L.k.abi;
  const int64_t T = syms[0];
  const int V = std::max(1, abi.vector_width);
  // Note [Multi-tensor chunks] (render_cuda.h). A short list (an update of 0.9M elements, as for adapters or the
  // norms alone) in 64K-element chunks ran 62 blocks, each looping alone: 95 us on an H200, 10 us in 434.
  const int64_t grid = L.cap * 4;
  std::vector<int64_t> sizes(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) sizes[static_cast<size_t>(t)] = syms[1 + t];
  int resident_per_sm = 0;
  {
    LoadedKernel& loaded = *L.k.loaded;
    std::lock_guard<std::mutex> lock(loaded.mu);
    const auto [it, fresh] = loaded.resident_per_sm.try_emplace(L.block, 0);
    if (fresh)
      check_cu(driver::api().occupancy_max_active_blocks(&it->second, loaded.fns[0], L.block, 0),
               "cuOccupancyMaxActiveBlocksPerMultiprocessor", L.k.symbol);
    resident_per_sm = it->second;
  }
  const int64_t chunk = multi_tensor_chunk(sizes, L.sms, static_cast<int64_t>(std::max(resident_per_sm, 1)) * L.sms,
                                           grid, L.block, V, cfg.chunk_elems);
  // The table: T entries of {NB pointers, numel}, then (tensor, start) per chunk.
  std::vector<uint64_t> table;
  std::vector<uint64_t> chunks;
  for (int64_t t = 0; t < T; ++t) {
    for (int b = 0; b < abi.num_buffers; ++b)
      table.push_back(reinterpret_cast<uint64_t>(bufs[t * abi.num_buffers + b]));
    const int64_t n = syms[1 + t];
    table.push_back(static_cast<uint64_t>(n));
    for (int64_t s = 0; s < n; s += chunk) {
      chunks.push_back(static_cast<uint64_t>(t));
      chunks.push_back(static_cast<uint64_t>(s));
    }
  }
  const int64_t num_chunks = static_cast<int64_t>(chunks.size() / 2);
  if (num_chunks == 0) return;
  table.insert(table.end(), chunks.begin(), chunks.end());
  const CUdeviceptr dev = upload_table(*L.k.loaded, table, L.stream, L.k.symbol);
  L.params.push_back(static_cast<uint64_t>(dev));
  L.params.push_back(static_cast<uint64_t>(T));
  L.params.push_back(static_cast<uint64_t>(num_chunks));
  L.params.push_back(static_cast<uint64_t>(chunk));
  L.push_scalars(device_scalars ? nullptr : scalars);
  L.params.push_back(L.flags);
  L.params.push_back(reinterpret_cast<uint64_t>(device_scalars));  // cs: null reads c
  L.run(L.k.loaded->fns[0], std::min<int64_t>(num_chunks, grid), L.block);
}

void launch_pointwise(Launcher& L, const int64_t* syms, const LaunchConfig& cfg) {
  int64_t total = 1;
  for (const SymInt& d : L.k.abi.dims) total *= eval(d, syms);
  if (total == 0) return;
  const int64_t per_thread = cfg.vectorize ? L.k.abi.vector_width : 1;
  L.run(L.k.loaded->fns[0], std::clamp<int64_t>(ceil_div(ceil_div(total, per_thread), L.block), 1, L.cap), L.block);
}

// Note [Column sums in row reductions] (render_cuda_rows.cpp): the _warp function with each warp's shared rows,
// at most kColumnSumBlocksPerSM blocks per SM so that the per-block partials stay small (GPT-2's 768 columns: 528
// blocks of 8 warps on an H100 is 3.2 MB for dw and db), then _colfin over the columns.
void launch_column_sums(Launcher& L, int64_t rows, int64_t cols) {
  constexpr int kColumnSumBlocksPerSM = 4;
  const KernelAbi& abi = L.k.abi;
  LoadedKernel& loaded = *L.k.loaded;
  const int64_t row_bytes = static_cast<int64_t>(abi.column_sums) * column_sum_row(cols, abi.vector_width) * 4;
  INGOT_CHECK(row_bytes <= kColumnSumSharedBytes, "[codegen] kernel '", L.k.symbol, "': ", abi.column_sums,
              " column sums of ", cols, " columns need ", row_bytes, " bytes of shared memory per warp (at most ",
              kColumnSumSharedBytes, ")");
  const int warps = static_cast<int>(std::clamp<int64_t>(
      std::min<int64_t>(L.block / 32, kColumnSumSharedBytes / row_bytes), 1, kWarpRowMaxThreads / 32));
  const int64_t parts = std::clamp<int64_t>(ceil_div(rows, warps), 1, int64_t{kColumnSumBlocksPerSM} * L.sms);
  {
    std::lock_guard<std::mutex> lock(loaded.mu);
    loaded.grow_ws(static_cast<size_t>(row_bytes * parts), "cuMemAlloc (column-sum partials)", L.k.symbol);
    L.params[L.params.size() - 2] = static_cast<uint64_t>(loaded.ws);
  }
  L.params.back() = static_cast<uint64_t>(parts);
  L.run(loaded.fns[0], parts, warps * 32, 1, 1, static_cast<unsigned>(row_bytes * warps));
  L.run(loaded.fns[4], ceil_div(cols, 32), 32, 32);
}

// A transposed reduction: tiles of cfg.col_rows rows, their columns split over the block's y threads and, when the
// tiles alone leave SMs idle, over blocks (_colsplit).
void launch_columns(Launcher& L, int64_t rows, int64_t cols, const LaunchConfig& cfg) {
  LoadedKernel& loaded = *L.k.loaded;
  const int x = std::clamp(cfg.col_rows, 1, 1024);
  int y = cfg.col_splits;
  if (y <= 0) {  // about 8 columns per thread, a power of two
    y = 1;
    while (y * 2 * x <= 1024 && y * 8 < cols) y *= 2;
  }
  y = std::clamp(y, 1, 1024 / x);
  const int64_t tiles = ceil_div(rows, x);
  // Note [Split column reductions]: split when the tiles alone leave SMs idle, keeping >= 16 columns per
  // thread in each split.
  int64_t splits = cfg.col_grid_splits;
  if (splits <= 0) splits = tiles >= 2 * L.sms ? 1 : std::min(ceil_div(2 * L.sms, tiles), cols / (16 * y));
  splits = std::clamp<int64_t>(splits, 1, std::min<int64_t>(cols, 65535));
  if (splits > 1 && loaded.fns[3] != nullptr && tiles <= kSplitCounterBytes / 4) {
    const size_t need = static_cast<size_t>(kSplitCounterBytes + L.k.abi.split_reductions * splits * rows * 8);
    std::lock_guard<std::mutex> lock(loaded.mu);
    if (loaded.grow_ws(need, "cuMemAlloc (split-reduction workspace)", L.k.symbol)) {
      // Counters start at zero; every launch leaves them at zero.
      const cudaError_t e = cudaMemsetAsync(reinterpret_cast<void*>(loaded.ws), 0,
                                            static_cast<size_t>(kSplitCounterBytes),
                                            static_cast<cudaStream_t>(L.stream));
      INGOT_CHECK(e == cudaSuccess, "[codegen] cannot clear the workspace of '", L.k.symbol, "': ",
                  cudaGetErrorString(e));
    }
    L.params[L.params.size() - 2] = static_cast<uint64_t>(loaded.ws);
    L.run(loaded.fns[3], tiles, x, y, splits);
    return;
  }
  L.run(loaded.fns[2], std::clamp<int64_t>(tiles, 1, L.cap * 8), x, y);
}

void launch_rows(Launcher& L, const int64_t* syms, const LaunchConfig& cfg) {
  const KernelAbi& abi = L.k.abi;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < abi.dims.size(); ++d) rows *= eval(abi.dims[d], syms);
  const int64_t cols = eval(abi.dims.back(), syms);
  if (rows == 0) return;
  if (abi.column_sums > 0) return launch_column_sums(L, rows, cols);
  LaunchConfig::Rows how = cfg.rows;
  if (how == LaunchConfig::Rows::Auto)
    how = abi.prefer_columns && rows > 1 ? LaunchConfig::Rows::Columns
          : cols <= cfg.warp_row_max_cols ? LaunchConfig::Rows::WarpPerRow
                                          : LaunchConfig::Rows::BlockPerRow;
  if (how == LaunchConfig::Rows::Columns) return launch_columns(L, rows, cols, cfg);
  if (how == LaunchConfig::Rows::WarpPerRow) {
    const int threads = std::min(L.block, kWarpRowMaxThreads);  // Note [Warp-per-row launch bounds]
    L.run(L.k.loaded->fns[0], std::clamp<int64_t>(ceil_div(rows, threads / 32), 1, L.cap), threads);
    return;
  }
  int threads = cfg.row_block_threads;
  if (threads <= 0) {  // about 4 vector groups per thread, 64..1024 threads
    const int64_t want = ceil_div(cols, 4 * std::max(1, abi.vector_width));
    threads = static_cast<int>(std::clamp<int64_t>(ceil_div(want, 32) * 32, 64, 1024));
  }
  threads = std::clamp(threads / 32 * 32, 32, 1024);
  L.run(L.k.loaded->fns[1], std::clamp<int64_t>(rows, 1, L.cap * 8), threads);
}

}  // namespace

void CudaKernel::launch_reading_device_scalars(void* const* bufs, const int64_t* syms,
                                               const double* device_scalars) const {
  INGOT_CHECK(abi.kind == KernelKind::MultiTensor && device_scalars != nullptr, "[codegen] kernel '", symbol,
              "': only a multi-tensor kernel reads its scalars from device memory");
  INGOT_CHECK(loaded != nullptr, "[codegen] kernel '", symbol, "' was not compiled");
  ensure_context(device);
  Launcher L(*this, config, nullptr);
  launch_multi_tensor(L, bufs, syms, nullptr, device_scalars, config);
}

void CudaKernel::launch(void* const* bufs, const int64_t* syms, const double* scalars, const LaunchConfig& cfg,
                        void* stream) const {
  INGOT_CHECK(loaded != nullptr, "[codegen] kernel '", symbol, "' was not compiled");
  ensure_context(device);
  Launcher L(*this, cfg, stream);
  if (abi.kind == KernelKind::MultiTensor) return launch_multi_tensor(L, bufs, syms, scalars, nullptr, cfg);
  for (int b = 0; b < abi.num_buffers; ++b) L.params.push_back(reinterpret_cast<uint64_t>(bufs[b]));
  for (int k = 0; k < abi.sym_slots; ++k) L.params.push_back(static_cast<uint64_t>(k < abi.num_syms ? syms[k] : 0));
  L.push_scalars(scalars);
  L.params.push_back(L.flags);
  if (abi.kind == KernelKind::Pointwise) return launch_pointwise(L, syms, cfg);
  L.params.push_back(0);  // ws, set by a launch of _colsplit or column sums
  L.params.push_back(0);  // parts (column sums)
  launch_rows(L, syms, cfg);
}

CudaCodegen::CudaCodegen(CudaCodegenOptions options) : options_(std::move(options)) {
  if (options_.use_disk_cache && options_.cache_dir.empty()) options_.cache_dir = cache::CompileCache::default_dir();
  if (options_.max_parallel <= 0) options_.max_parallel = std::max(1u, std::thread::hardware_concurrency());
}

CudaCodegen& CudaCodegen::shared() {
  static CudaCodegen* instance = new CudaCodegen();  // never destroyed: kernels may run during static teardown
  return *instance;
}

CodegenStats CudaCodegen::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

CudaKernel CudaCodegen::compile(const KernelSpec& spec, CodegenStats* stats) {
  return compile(std::vector<KernelSpec>{spec}, stats).front();
}

namespace {

// A kernel of the batch that neither this process nor the disk cache has.
struct Pending {
  size_t spec;
  std::string key, symbol;
  RenderedKernel rendered;
  int program = -1;
};

using KernelTable = std::map<std::pair<int, std::string>, CudaKernel>;

// One CudaCodegen::compile call: the device and target it compiles for, its disk cache and the cubins loaded from
// it, the table it fills and the counts it reports.
struct Batch {
  const CudaCodegenOptions& options;
  KernelTable& table;
  CodegenStats& st;
  int device = 0, arch = 0;
  std::string target;
  std::optional<cache::CompileCache> disk;
  std::map<std::string, std::shared_ptr<Module>> modules;  // cubin file -> module, within this call
  std::optional<FileLock> lock;  // held from the second lookup until the batch is published

  Batch(const CudaCodegenOptions& o, KernelTable& t, CodegenStats& s, int dev)
      : options(o), table(t), st(s), device(dev), arch(arch_of(dev)) {
    target = "sm_" + std::to_string(arch) + " " + nvrtc_version() + " " + renderer_fingerprint();
    if (options.use_disk_cache) disk.emplace(options.cache_dir);
  }

  std::string disk_key(const std::string& key) const { return std::string(kEntryKind) + "\n" + target + "\n" + key; }

  CudaKernel make(const std::string& symbol, const KernelAbi& abi, const std::shared_ptr<Module>& m) const {
    CudaKernel k;
    k.symbol = symbol;
    k.abi = abi;
    k.device = device;
    k.config = options.launch;
    k.loaded = std::make_shared<LoadedKernel>();
    k.loaded->module = m;
    for (size_t f = 0; f < abi.functions.size() && f < std::size(k.loaded->fns); ++f)
      if (!abi.functions[f].empty())
        check_cu(driver::api().module_get_function(&k.loaded->fns[f], m->handle, abi.functions[f].c_str()),
                 "cuModuleGetFunction", abi.functions[f] + "' in '" + m->name);
    return k;
  }

  // A kernel from the disk cache into the table; false when there is no usable entry.
  bool from_disk(const std::string& key) {
    if (!disk) return false;
    auto e = disk->get(disk_key(key), kEntryKind);
    std::string symbol;
    KernelAbi abi;
    if (!e || e->files.size() != 1 || !decode_abi(e->payload, symbol, abi)) return false;
    try {
      std::shared_ptr<Module>& m = modules[e->files[0]];
      if (!m) m = load_module(read_file(disk->file_path(e->files[0])), e->files[0]);
      table[{device, key}] = make(symbol, abi, m);
      ++st.disk_hits;
      return true;
    } catch (const Error& err) {  // an unloadable cubin is a miss like any other bad entry
      modules.erase(e->files[0]);
      std::fprintf(stderr, "ingot: warning: ignoring cached CUDA kernels: %s; recompiling\n", err.what());
      return false;
    }
  }

  // The distinct kernels that neither this process nor the disk cache has, in the order of their first spec.
  std::vector<Pending> missing(const std::vector<KernelSpec>& specs, const std::vector<std::string>& keys) {
    std::vector<Pending> pending;
    std::set<std::string> seen;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (table.count({device, keys[i]}) || seen.count(keys[i])) {
        ++st.memory_hits;
        continue;
      }
      if (from_disk(keys[i])) continue;
      seen.insert(keys[i]);
      pending.push_back(Pending{i, keys[i], specs[i].symbol(), {}, -1});
    }
    // The ranks of a job trace the same graph and miss the same kernels at once: the first to take the batch's
    // lock compiles, the others wait and then find everything in the cache.
    if (!disk || pending.empty()) return pending;
    std::string batch_id = target;
    for (const Pending& p : pending) batch_id += "\n" + p.key;
    lock.emplace(options.cache_dir + "/locks/cuda-" + cache::hex64(cache::hash_bytes(batch_id)) + ".lock");
    std::vector<Pending> still;
    for (Pending& p : pending)
      if (!from_disk(p.key)) still.push_back(std::move(p));
    return still;
  }

  // Each pending kernel rendered and placed in one of at most max_parallel NVRTC programs.
  std::vector<NvrtcProgram> render_programs(const std::vector<KernelSpec>& specs, std::vector<Pending>& pending) const {
    for (Pending& p : pending) p.rendered = render_kernel(specs[p.spec], p.symbol);
    const int programs = std::min<int>(options.max_parallel, static_cast<int>(pending.size()));
    std::vector<NvrtcProgram> progs(programs);
    for (int u = 0; u < programs; ++u) {
      progs[u].name = "ingot_kernels_" + std::to_string(u) + ".cu";
      progs[u].source = render_preamble();
    }
    std::vector<size_t> order(pending.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    for (auto [p, u] : balance_units(order, programs, [&](size_t k) { return pending[k].rendered.source.size(); })) {
      pending[p].program = u;
      progs[u].source += "\n" + pending[p].rendered.source;
    }
    return progs;
  }

  // The cubins loaded and published to the cache; one table and cache entry per kernel.
  void publish(const std::vector<Pending>& pending, const std::vector<std::string>& cubins) {
    const size_t programs = cubins.size();
    std::vector<std::shared_ptr<Module>> mods(programs);
    std::vector<std::string> names(programs);
    bool cache_ok = disk.has_value();
    for (size_t u = 0; u < programs; ++u) {
      // Named by content: equal names mean equal cubins, whichever process wrote them.
      names[u] = "cuda-" + cache::hex64(cache::hash_bytes(cubins[u])) + "-" +
                 cache::hex64(cache::hash_bytes(cubins[u], 1)) + ".cubin";
      mods[u] = load_module(cubins[u], names[u]);
      if (!cache_ok) continue;
      try {
        disk->put_file(names[u], cubins[u]);
      } catch (const Error& e) {  // a full or read-only cache costs the warm start, not the run
        std::fprintf(stderr, "ingot: warning: cannot store compiled CUDA kernels in the cache '%s': %s\n",
                     options.cache_dir.c_str(), e.what());
        cache_ok = false;
      }
    }
    for (const Pending& p : pending) {
      table[{device, p.key}] = make(p.symbol, p.rendered.abi, mods[p.program]);
      if (!cache_ok) continue;
      try {
        disk->put(disk_key(p.key),
                  cache::CacheEntry{kEntryKind, encode_abi(p.symbol, p.rendered.abi), {names[p.program]}});
      } catch (const Error& e) {
        std::fprintf(stderr, "ingot: warning: cannot write a compile cache entry: %s\n", e.what());
        cache_ok = false;
      }
    }
  }
};

}  // namespace

std::vector<CudaKernel> CudaCodegen::compile(const std::vector<KernelSpec>& specs, CodegenStats* stats,
                                             const ProgressFn& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  CodegenStats st;
  st.kernels_requested = static_cast<int64_t>(specs.size());
  const int device = ingot::cuda::current_device();
  ensure_context(device);
  Batch batch(options_, table_, st, device);

  // 1. keys; what this process already has; what the disk cache has.
  auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> keys = validated_keys(specs);
  st.emit_s += seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  std::vector<Pending> pending = batch.missing(specs, keys);
  st.load_s += seconds_since(t0);
  const int64_t distinct = distinct_keys(keys);
  int64_t ready = distinct - static_cast<int64_t>(pending.size());
  if (progress) progress(ready, distinct);

  if (!pending.empty()) {
    // 2. render, balanced over at most max_parallel programs (largest kernels first).
    t0 = std::chrono::steady_clock::now();
    const std::vector<NvrtcProgram> progs = batch.render_programs(specs, pending);
    st.emit_s += seconds_since(t0);

    // 3. NVRTC, programs side by side.
    t0 = std::chrono::steady_clock::now();
    std::vector<int64_t> per_program(progs.size(), 0);
    for (const Pending& p : pending) ++per_program[p.program];
    const std::vector<std::string> cubins = compile_cubins(progs, batch.arch, options_.max_parallel, [&](size_t u) {
      ready += per_program[u];
      if (progress) progress(ready, distinct);
    });
    st.compiler_s += seconds_since(t0);
    st.compiler_processes += static_cast<int64_t>(progs.size());
    st.compiled += static_cast<int64_t>(pending.size());

    // 4. load, publish to the cache, one entry per kernel.
    t0 = std::chrono::steady_clock::now();
    batch.publish(pending, cubins);
    st.load_s += seconds_since(t0);
  }

  std::vector<CudaKernel> out;
  out.reserve(specs.size());
  for (const std::string& k : keys) out.push_back(table_.at({device, k}));
  totals_ += st;
  if (stats) *stats += st;
  return out;
}

}  // namespace ingot::codegen::cuda
