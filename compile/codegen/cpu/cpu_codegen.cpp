// CPU code generation driver: in-process table, disk cache, batched parallel compiles (see cpu_codegen.h).
#include "compile/codegen/cpu/cpu_codegen.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>

#include "compile/cache/compile_cache.h"
#include "compile/codegen/cpu/jit_cc.h"
#include "compile/codegen/cpu/render_cpp.h"
#include "compile/codegen/common/batch.h"
#include "compile/codegen/common/scalar_math.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::codegen::cpu {

namespace {

constexpr const char* kEntryKind = "cpu_kernel";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::shared_ptr<void> open_library(const std::string& path) {
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  INGOT_CHECK(h != nullptr, "[codegen] cannot load compiled kernels '", path, "': ", ::dlerror());
  return std::shared_ptr<void>(h, [](void* p) { ::dlclose(p); });
}

KernelFn find_symbol(const std::shared_ptr<void>& lib, const std::string& symbol, const std::string& path) {
  void* f = ::dlsym(lib.get(), symbol.c_str());
  INGOT_CHECK(f != nullptr, "[codegen] compiled kernels '", path, "' lack the function '", symbol, "'");
  return reinterpret_cast<KernelFn>(f);
}

// A scratch directory for one batch's sources and objects: inside the cache directory (same filesystem, so
// publishing is a rename) or a temporary one when the disk cache is off.
class WorkDir {
 public:
  explicit WorkDir(const std::string& cache_dir) {
    if (!cache_dir.empty()) {
      const std::string parent = cache_dir + "/tmp";
      std::error_code ec;
      std::filesystem::create_directories(parent, ec);
      std::string templ = parent + "/build-XXXXXX";
      if (!ec && ::mkdtemp(templ.data()) != nullptr) {
        path_ = templ;
        return;
      }
      // A read-only or full cache directory costs the warm start, not the run.
      std::fprintf(stderr, "ingot: warning: cannot build kernels in the cache directory '%s'; using a temporary one\n",
                   cache_dir.c_str());
    }
    tmp_.emplace("ingot-kernels-");
    path_ = tmp_->path();
  }
  ~WorkDir() {
    if (!tmp_ && !keep_) {
      std::error_code ec;  // best effort
      std::filesystem::remove_all(path_, ec);
    }
  }
  const std::string& path() const { return path_; }
  void keep() { keep_ = true; }  // after a compiler failure: the sources stay for the error message

 private:
  std::optional<TempDir> tmp_;
  std::string path_;
  bool keep_ = false;
};

struct Pending {
  std::string key;     // structural key
  std::string symbol;  // exported function name
  std::string source;  // rendered function
  int unit = -1;
};

using KernelTable = std::map<std::string, CpuKernel>;

// One CpuCodegen::compile call: the toolchain and disk cache it works against, the table it fills and the counts
// it reports.
struct Batch {
  const Toolchain& tc;
  const CpuCodegenOptions& options;
  KernelTable& table;
  CodegenStats& st;
  std::optional<cache::CompileCache> disk;
  std::optional<FileLock> lock;  // Note [One compiler per batch across processes]: held until the batch is published

  std::string disk_key(const std::string& key) const {
    return std::string(kEntryKind) + "\n" + tc.identity + "\n" + renderer_fingerprint() + "\n" + key;
  }

  // A kernel library from the disk cache into the table; false when there is no usable entry.
  bool from_disk(const std::string& key) {
    if (!disk) return false;
    auto e = disk->get(disk_key(key), kEntryKind);
    if (!e || e->files.size() != 1) return false;
    const std::string path = disk->file_path(e->files[0]);
    try {
      auto lib = open_library(path);
      table[key] = CpuKernel{find_symbol(lib, e->payload, path), e->payload, lib};
      ++st.disk_hits;
      return true;
    } catch (const Error& err) {  // an unloadable library is a miss like any other bad entry
      std::fprintf(stderr, "ingot: warning: ignoring cached kernel library: %s; recompiling\n", err.what());
      return false;
    }
  }

  // The distinct kernels that neither this process nor the disk cache has, in the order of their first spec.
  std::vector<Pending> missing(const std::vector<KernelSpec>& specs, const std::vector<std::string>& keys) {
    std::vector<Pending> pending;
    std::set<std::string> seen;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (table.count(keys[i]) || seen.count(keys[i])) {
        ++st.memory_hits;
        continue;
      }
      if (from_disk(keys[i])) continue;
      seen.insert(keys[i]);
      pending.push_back(Pending{keys[i], specs[i].symbol(), {}, -1});
    }
    // Note [One compiler per batch across processes]: the ranks of a job trace the same graph and miss the
    // same kernels at the same time. The first to take the batch's lock compiles; the others wait, then find
    // everything in the cache.
    if (!disk || pending.empty()) return pending;
    std::string batch_id = tc.identity;
    for (const Pending& p : pending) batch_id += "\n" + p.key;
    lock.emplace(options.cache_dir + "/locks/" + cache::hex64(cache::hash_bytes(batch_id)) + ".lock");
    std::vector<Pending> still;
    for (Pending& p : pending)
      if (!from_disk(p.key)) still.push_back(std::move(p));
    return still;
  }

  // Each pending kernel rendered and placed in one of at most max_parallel translation units; their sources.
  std::vector<std::string> render_units(const std::vector<KernelSpec>& specs, const std::vector<std::string>& keys,
                                        std::vector<Pending>& pending) const {
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < pending.size(); ++i) index[pending[i].key] = i;
    std::vector<size_t> order;
    for (size_t i = 0; i < specs.size(); ++i) {
      auto it = index.find(keys[i]);
      if (it == index.end() || !pending[it->second].source.empty()) continue;
      pending[it->second].source = render_kernel(specs[i], pending[it->second].symbol);
      order.push_back(it->second);
    }
    const int units = std::min<int>(options.max_parallel, static_cast<int>(pending.size()));
    std::vector<std::string> unit_src(units, render_preamble());
    for (auto [p, u] : balance_units(order, units, [&](size_t k) { return pending[k].source.size(); })) {
      pending[p].unit = u;
      unit_src[u] += "\n" + pending[p].source;
    }
    return unit_src;
  }

  // The units' sources and the scalar math header they include, written into `work`; one compile job per unit and
  // the cache name of the library it builds.
  struct Units {
    std::vector<CompileJob> jobs;
    std::vector<std::string> so_names;
  };
  Units write_units(const WorkDir& work, const std::vector<std::string>& unit_src) const {
    Units out;
    // The header every unit includes by name (Note [Scalar math written once], runtime/kernels/scalar_math.h).
    const std::string& math = scalar_math_source();
    write_file_atomic(work.path() + "/" + kScalarMathHeader,
                      [&](std::FILE* f) { write_bytes(f, math.data(), math.size()); });
    for (size_t u = 0; u < unit_src.size(); ++u) {
      const std::string base = work.path() + "/unit" + std::to_string(u);
      write_file_atomic(base + ".cpp", [&](std::FILE* f) { write_bytes(f, unit_src[u].data(), unit_src[u].size()); });
      out.jobs.push_back(CompileJob{base + ".cpp", base + ".so", base + ".log"});
      // Named by content: equal names mean equal libraries, whoever (which process) wrote them.
      out.so_names.push_back("kernels-" + cache::hex64(cache::hash_bytes(unit_src[u] + math + tc.identity)) + ".so");
    }
    return out;
  }

  // The built libraries published to the cache and loaded; one table and cache entry per kernel.
  void publish(const std::vector<Pending>& pending, const Units& built) {
    const size_t units = built.jobs.size();
    std::vector<std::shared_ptr<void>> libs(units);
    std::vector<std::string> lib_paths(units);
    bool cache_ok = disk.has_value();
    for (size_t u = 0; u < units; ++u) {
      lib_paths[u] = built.jobs[u].output;
      if (cache_ok) {
        try {
          lib_paths[u] = disk->put_file(built.so_names[u], read_file(built.jobs[u].output));
        } catch (const Error& e) {  // a full or read-only cache costs the warm start, not the run
          std::fprintf(stderr, "ingot: warning: cannot store compiled kernels in the cache '%s': %s\n",
                       options.cache_dir.c_str(), e.what());
          cache_ok = false;
          lib_paths[u] = built.jobs[u].output;
        }
      }
      libs[u] = open_library(lib_paths[u]);
    }
    for (const Pending& p : pending) {
      table[p.key] = CpuKernel{find_symbol(libs[p.unit], p.symbol, lib_paths[p.unit]), p.symbol, libs[p.unit]};
      if (!cache_ok) continue;
      try {
        disk->put(disk_key(p.key), cache::CacheEntry{kEntryKind, p.symbol, {built.so_names[p.unit]}});
      } catch (const Error& e) {
        std::fprintf(stderr, "ingot: warning: cannot write a compile cache entry: %s\n", e.what());
        cache_ok = false;
      }
    }
  }
};

}  // namespace

CpuCodegen::CpuCodegen(CpuCodegenOptions options) : options_(std::move(options)) {
  if (options_.use_disk_cache && options_.cache_dir.empty()) options_.cache_dir = cache::CompileCache::default_dir();
  if (options_.max_parallel <= 0) options_.max_parallel = std::max(1u, std::thread::hardware_concurrency());
}

CpuCodegen& CpuCodegen::shared() {
  static CpuCodegen* instance = new CpuCodegen();  // never destroyed: kernels may run during static teardown
  return *instance;
}

CodegenStats CpuCodegen::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

CpuKernel CpuCodegen::compile(const KernelSpec& spec, CodegenStats* stats) {
  return compile(std::vector<KernelSpec>{spec}, stats).front();
}

std::vector<CpuKernel> CpuCodegen::compile(const std::vector<KernelSpec>& specs, CodegenStats* stats,
                                           const ProgressFn& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  CodegenStats st;
  st.kernels_requested = static_cast<int64_t>(specs.size());
  Batch batch{Toolchain::host(), options_, table_, st, {}, {}};
  if (options_.use_disk_cache) batch.disk.emplace(options_.cache_dir);

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
    // 2. render, balanced over at most max_parallel translation units (largest kernels first).
    t0 = std::chrono::steady_clock::now();
    const std::vector<std::string> unit_src = batch.render_units(specs, keys, pending);
    st.emit_s += seconds_since(t0);

    // 3. compile all units side by side.
    WorkDir work(options_.use_disk_cache ? options_.cache_dir : std::string());
    const Batch::Units built = batch.write_units(work, unit_src);
    t0 = std::chrono::steady_clock::now();
    try {
      std::vector<int64_t> per_unit(unit_src.size(), 0);
      for (const Pending& p : pending) ++per_unit[p.unit];
      run_compilers(batch.tc, built.jobs, options_.max_parallel, [&](size_t u) {
        ready += per_unit[u];
        if (progress) progress(ready, distinct);
      });
    } catch (...) {
      work.keep();
      throw;
    }
    st.compiler_s += seconds_since(t0);
    st.compiler_processes += static_cast<int64_t>(unit_src.size());
    st.compiled += static_cast<int64_t>(pending.size());

    // 4. publish to the cache, load, and record one entry per kernel.
    t0 = std::chrono::steady_clock::now();
    batch.publish(pending, built);
    st.load_s += seconds_since(t0);
  }

  std::vector<CpuKernel> out;
  out.reserve(specs.size());
  for (const std::string& k : keys) out.push_back(table_.at(k));
  totals_ += st;
  if (stats) *stats += st;
  return out;
}

}  // namespace ingot::codegen::cpu
