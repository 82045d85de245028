#include "recipes/run_settings.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>

#include "distributed/bootstrap.h"
#include "optim/lr_schedule.h"
#include "recipes/checkpoint.h"
#include "recipes/train_state.h"
#include "runtime/file_util.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

void add_device_keys(ConfigSchema& s) {
  using T = ConfigType;
  using K = ConfigKey;
  s.add(K::of(T::String, "device", "auto", "auto (a GPU when present), cpu, cuda or cuda:N").not_in_config_hash());
  s.add(K::of(T::String, "dtype", "f32",
              "f32, or bf16 / f16 compute with f32 master weights (training f16: dynamic loss scaling, eager steps)")
            .one_of({"f32", "bf16", "f16"}));
}

Device resolve_device(const Config& cfg, ConfigErrors& errors) {
  const std::string dev = ConfigReader(cfg, errors).str("device");
  Device device = Device::cpu();
  try {
    device = parse_device(dev);
    if (device.is_cuda()) {
      int n = cuda_device_count();
      if (n == 0) {
#ifdef INGOT_WITH_CUDA
        errors.fail(cfg, "device", "'" + dev + "' asks for a GPU, but no CUDA device is visible (use auto or cpu)");
#else
        errors.fail(cfg, "device",
                    "'" + dev + "' asks for a GPU, but this ingot was built without CUDA (use auto or cpu)");
#endif
      } else if (device.index >= n) {
        errors.fail(cfg, "device", "'" + dev + "': only " + std::to_string(n) + " CUDA device(s) are visible");
      }
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    if (!errors.has_error_for("device")) errors.fail(cfg, "device", e.what());
  }
  return device;
}

namespace {

// compile.*: the compiler's options (compile/api.h). Like every key that says how a run goes rather than what a
// step computes, none enters the resume hash.
void add_compile_keys(ConfigSchema& s) {
  using T = ConfigType;
  using K = ConfigKey;
  s.add(K::of(T::Bool, "compile.enabled", "false",
              "trace forward, backward and the optimizer update into one compiled graph")
            .not_in_config_hash());
  s.add(K::of(T::String, "compile.mode", "default",
              "compiler mode (GPU: reduce-overhead replays CUDA graphs; max-autotune tunes kernels and replays them)")
            .one_of({"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"})
            .not_in_config_hash());
  s.add(K::of(T::Bool, "compile.fullgraph", "false", "fail at a graph break instead of splitting the graph")
            .not_in_config_hash());
  s.add(K::of(T::Bool, "compile.dynamic", "false", "treat batch and sequence sizes as symbolic").not_in_config_hash());
  s.add(K::of(T::Float, "compile.memory_budget", "1.0",
              "fraction of activations kept for backward (< 1: recompute the rest, activation checkpointing)")
            .at_least(0)
            .at_most(1)
            .not_in_config_hash());
  s.add(K::of(T::Int, "compile.unit_reduction_lag", "1",
              "compiled ZeRO-3 (distributed.zero_stage 3): wait for each unit's gradient reduce-scatter this many "
              "units later, so at most N + 1 units' flattened gradients are alive (0: every wait at the backward's "
              "end; larger: more overlap, more memory)")
            .at_least(0)
            .not_in_config_hash());
  s.add(K::of(T::String, "compile.cache_dir", "", "compile cache directory (empty: the compiler's default)")
            .not_in_config_hash());
}

// distributed.*: DDP's and FSDP's options (recipes/data_parallel.h); not in the resume hash either (a resume may
// change the number of ranks or the ZeRO stage: checkpoints hold the whole state).
void add_distributed_keys(ConfigSchema& s) {
  using T = ConfigType;
  using K = ConfigKey;
  s.add(K::of(T::String, "distributed.backend", "auto",
              "process group of a data-parallel run (`ingot launch`, mpirun): auto = nccl on CUDA, gloo on CPU")
            .one_of({"auto", "nccl", "gloo"})
            .not_in_config_hash());
  s.add(K::of(T::Float, "distributed.bucket_cap_mb", "100",
              "DDP gradient bucket size in MiB (gradients are averaged across ranks bucket by bucket; 100, not "
              "PyTorch's 25: fewer, larger reductions measured faster)")
            .at_least(0.001)
            .not_in_config_hash());
  s.add(K::of(T::String, "distributed.reduce_dtype", "f32",
              "dtype gradients are averaged in: f32 (ZeRO-1/2/3 keep the f32 average of 16-bit weights' gradients "
              "for the f32 masters; plain DDP averages them in their own dtype), or bf16 (half the bytes on the "
              "wire, as PyTorch's bf16_compress_hook; the average is widened back before the optimizer)")
            .one_of({"f32", "bf16"})
            .not_in_config_hash());
  s.add(K::of(T::String, "distributed.reduce_wire_dtype", "f32",
              "zero_stage 3 with reduce_dtype f32: the dtype each rank's gradients are sent in; bf16 rounds them "
              "to bf16 (as FSDP2's bf16 gradients are) and sums them in f32 where they arrive: half the bytes of "
              "f32 on the wire, the f32 sum unrounded (f32: the gradients stay f32 from the products to the sum)")
            .one_of({"f32", "bf16"})
            .not_in_config_hash());
  s.add(K::of(T::Int, "distributed.zero_stage", "0",
              "0: plain DDP, 1: shard the optimizer state across ranks (ZeRO-1), 2: and the gradients (ZeRO-2), "
              "3: and the weights, gathered per transformer block when used (ZeRO-3); checkpoints hold "
              "the whole state")
            .at_least(0)
            .at_most(3)
            .not_in_config_hash());
  s.add(K::of(T::Bool, "distributed.reshard_after_forward", "true",
              "zero_stage 3: free a block's gathered weights after its forward and gather them again for its "
              "backward (false: keep them until its gradients are reduced; one all-gather less, more memory)")
            .not_in_config_hash());
  s.add(K::of(T::Int, "distributed.keep_last_blocks", "0",
              "zero_stage 3 with reshard_after_forward: the last N blocks keep their gathered weights from forward to "
              "backward (their backward comes first; one all-gather less each, their weights' memory more)")
            .at_least(0)
            .at_most(4096)
            .not_in_config_hash());
  s.add(K::of(T::Bool, "distributed.vocab_parallel_embeddings", "true",
              "zero_stage 3: look an untied token table whose rows split evenly over the ranks up where its rows "
              "lie (ids all-gathered, outputs reduce-scattered) instead of gathering it, and make its gradient "
              "there (false: gather and reduce-scatter it as any unit)")
            .not_in_config_hash());
  s.add(K::of(T::Bool, "distributed.prefetch", "true",
              "zero_stage 3 without compile: all-gather the next block's weights while the current one computes "
              "(forward and backward; on GPUs the host does not wait for gathers); two blocks' weights gathered at "
              "once (false: one, each gathered when used). Compiled steps always prefetch")
            .not_in_config_hash());
  s.add(K::of(T::Bool, "distributed.overlap", "true",
              "reduce each bucket during backward as soon as it fills (false: after the whole backward)")
            .not_in_config_hash());
  s.add(K::of(T::Int, "distributed.sm_carveout", "0",
              "SMs the compute kernels leave to NCCL's beside them in a data-parallel run on GPUs (cuBLASLt's SM "
              "count target, the persistent kernels' grids; 0: INGOT_SM_CARVEOUT, else none)")
            .at_least(0)
            .not_in_config_hash());
  s.add(K::of(T::Float, "distributed.timeout_s", "0",
              "seconds a collective may take before it fails naming the missing ranks (0: ingot launch "
              "--collective-timeout, else 600)")
            .at_least(0)
            .not_in_config_hash());
  s.add(K::of(T::Float, "distributed.init_timeout_s", "0",
              "seconds ranks wait for each other to check in at start and at barriers (0: ingot launch "
              "--init-timeout, else 300)")
            .at_least(0)
            .not_in_config_hash());
}

}  // namespace

void add_run_keys(ConfigSchema& s, const std::string& recipe, const std::string& output_dir) {
  using T = ConfigType;
  using K = ConfigKey;
  // not_in_config_hash(): the key changes where or how long a run goes, not what a step computes, so a resume
  // may change it (recipes/train_state.h).
  s.add(K::of(T::String, "recipe", recipe, "the recipe this config runs (`ingot ls` lists them)"));
  add_device_keys(s);
  s.add(K::of(T::Int, "max_steps", "1000", "optimizer steps to run").at_least(1).not_in_config_hash());
  s.add(K::of(T::Int, "seed", "0", "seeds weight init, dropout and batch sampling").at_least(0));
  s.add(K::of(T::String, "output_dir", output_dir, "the run directory: weights, checkpoints, metrics, plots")
            .not_in_config_hash());
  s.add(K::of(T::Bool, "resume", "false",
              "continue from the latest checkpoint in output_dir/checkpoints (none there: start fresh)")
            .not_in_config_hash());
  s.add(K::of(T::String, "resume_from", "", "continue from this checkpoint directory (overrides resume)")
            .not_in_config_hash());
  s.add(K::of(T::String, "resume_schedule", "refuse",
              "a resume whose max_steps differs from the checkpoint's: refuse, keep (the checkpoint's LR schedule; "
              "min_lr past its end) or stretch (refit the schedule to the new max_steps; the LR jumps)")
            .one_of({"refuse", "keep", "stretch"})
            .not_in_config_hash());
  s.add(K::of(T::Bool, "overwrite_output_dir", "false",
              "a fresh run may replace the checkpoints an earlier run left in output_dir (false: refuse)")
            .not_in_config_hash());
  s.add(
      K::of(T::Int, "checkpoint.save_every", "0", "save a training checkpoint every N steps and at the end (0: never)")
          .at_least(0)
          .not_in_config_hash());
  s.add(K::of(T::Int, "checkpoint.keep_last", "3", "training checkpoints to keep (0: all)")
            .at_least(0)
            .not_in_config_hash());
  s.add(K::of(T::Bool, "logging.tensorboard", "false", "also write TensorBoard event files to output_dir/tensorboard")
            .not_in_config_hash());
  s.add(K::of(T::Bool, "logging.plot", "true", "draw output_dir/loss.png at the end").not_in_config_hash());
  s.add(K::of(T::Float, "logging.peak_tflops", "0", "device peak for MFU (0: H100/H200 figure on CUDA, none on CPU)")
            .at_least(0)
            .not_in_config_hash());
  s.add(K::of(T::Bool, "profile.enabled", "false", "record a per-op timeline (Chrome trace) for some steps")
            .not_in_config_hash());
  s.add(K::of(T::Int, "profile.start_step", "3", "first profiled step (1-based; later than warm-up)")
            .at_least(1)
            .not_in_config_hash());
  s.add(K::of(T::Int, "profile.num_steps", "1", "number of profiled steps").at_least(1).not_in_config_hash());
  s.add(K::of(T::Bool, "profile.device_timing", "false",
              "CUDA: time each op by events on the stream instead of synchronizing around it, so the profiled "
              "steps run (and overlap communication) as the others do")
            .not_in_config_hash());
  s.add(K::of(T::Int, "profile.top_k", "15", "rows of the top-ops table printed at the end")
            .at_least(1)
            .not_in_config_hash());
  add_compile_keys(s);
  add_distributed_keys(s);
}

namespace {

// The learning rate of step `step` (0-based) under a schedule of `total_steps`, as train_loop builds it.
double scheduled_lr(const TrainState& st, int64_t total_steps, int64_t step) {
  optim::LrSchedule sched;
  sched.kind = optim::LrSchedule::parse_kind(st.lr_schedule);
  sched.base_lr = st.base_lr;
  sched.min_lr = st.min_lr;
  sched.warmup_steps = st.warmup_steps;
  sched.total_steps = total_steps;
  return sched.at(step);
}

std::string lr_text(double lr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", lr);
  return buf;
}

// Note [Resuming with a different max_steps]: cosine and linear schedules are fitted to max_steps, so a
// resume that changes it would make the LR jump. That is refused unless the config says how to go on:
// `keep` runs the checkpoint's schedule to its end (min_lr afterwards), `stretch` refits it to max_steps.
void check_resume_schedule(const TrainState& st, const std::string& policy, const Config& cfg, ConfigErrors& errors,
                           RunSettings& s) {
  if (st.total_steps == s.max_steps || st.lr_schedule == "constant") return;
  const std::string then = std::to_string(st.total_steps), now = std::to_string(s.max_steps);
  const std::string next = std::to_string(st.step + 1);
  if (policy == "keep") {
    s.lr_schedule_steps = st.total_steps;
    s.resume_note = "max_steps " + then + " -> " + now + ": the " + st.lr_schedule + " LR schedule keeps its " + then +
                    " steps (resume_schedule: keep)" +
                    (s.max_steps > st.total_steps ? "; after step " + then + " the LR stays at train.min_lr" : "");
    return;
  }
  const std::string jump = "at step " + next + " the LR goes from " + lr_text(scheduled_lr(st, st.total_steps, st.step)) +
                           " to " + lr_text(scheduled_lr(st, s.max_steps, st.step));
  if (policy == "stretch") {
    s.resume_note = "max_steps " + then + " -> " + now + ": the " + st.lr_schedule + " LR schedule is refitted to " + now +
                    " steps (resume_schedule: stretch); " + jump;
    return;
  }
  errors.fail(cfg, "max_steps",
              now + " differs from the " + then + " steps the checkpoint's " + st.lr_schedule +
                  " LR schedule was fitted to, so " + jump +
                  "; set resume_schedule=keep to continue the checkpoint's schedule (min_lr after step " + then +
                  "), resume_schedule=stretch to refit it to " + now + " steps, or max_steps=" + then);
}

// A timeout in seconds: the config's when set (> 0), else the launcher's environment variable, else `fallback`.
double timeout_setting(const Config& cfg, ConfigErrors& errors, const char* key, const char* env, double fallback) {
  const double configured = ConfigReader(cfg, errors).f64(key);
  if (configured > 0) return configured;
  const char* v = std::getenv(env);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (*end != '\0' || !(x > 0)) {
    errors.add(ConfigOrigin{}, std::string("environment ") + env + "='" + v + "': expected seconds > 0");
    return fallback;
  }
  return x;
}

// The first of `names` that is set, as an integer; `fallback` when none is.
int env_int_of(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v && *v) {
      char* end = nullptr;
      long x = std::strtol(v, &end, 10);
      INGOT_CHECK(*end == '\0' && x >= 0, "environment ", n, "='", v, "': expected an integer >= 0");
      return static_cast<int>(x);
    }
  return fallback;
}

}  // namespace

void resolve_placement(RunSettings& s) {
  if (std::optional<distributed::WorldInfo> w = distributed::world_from_env()) {
    s.rank = w->rank;
    s.world_size = w->world_size;
    s.local_rank = w->local_rank;
  } else if (distributed::started_by_mpi()) {
    s.mpi = true;
    s.rank = env_int_of({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}, 0);
    s.world_size = env_int_of({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, 1);
    s.local_rank = env_int_of({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}, 0);
  }
}

std::string output_location_problem(const std::string& path, bool directory) {
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec);
  if (ec) return "'" + path + "' is not a usable path: " + ec.message();
  fs::path dir = p;
  if (fs::exists(p, ec)) {
    if (directory && !fs::is_directory(p, ec)) return "'" + path + "' exists and is not a directory";
    if (!directory && fs::is_directory(p, ec)) return "'" + path + "' is a directory; give a file path";
    if (!directory) dir = p.parent_path();
  } else {
    // The first existing ancestor is where the missing directories would be created.
    dir = p.parent_path();
    while (!dir.empty() && dir != dir.root_path() && !fs::exists(dir, ec)) dir = dir.parent_path();
    if (!fs::is_directory(dir, ec))
      return "'" + path + "' cannot be created: '" + dir.string() + "' is not a directory";
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return "'" + path + "' cannot be written: '" + dir.string() + "': " + std::strerror(errno);
  return "";
}

int64_t restart_count_from_env() {
  const char* v = std::getenv("INGOT_RESTART_COUNT");
  if (!v || !*v) return 0;
  char* end = nullptr;
  long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < 0)
    throw ConfigError(std::string("environment INGOT_RESTART_COUNT='") + v + "': expected a count >= 0");
  return n;
}

namespace {

// recipe, config file, device and this process's place in a data-parallel job: under a job, one GPU per rank.
void resolve_placement_and_device(const Config& cfg, ConfigErrors& errors, RunSettings& s) {
  s.recipe = ConfigReader(cfg, errors).str("recipe");
  s.config_file = cfg.file();
  s.resolved_yaml = cfg.to_yaml();
  s.device = resolve_device(cfg, errors);
  try {
    resolve_placement(s);
  } catch (const Error& e) {
    errors.add(ConfigOrigin{}, e.what());
  }
  if ((s.world_size > 1 || s.mpi) && s.device.is_cuda() && !errors.has_error_for("device")) {
    // One GPU per rank: cuda:LOCAL_RANK, or the only visible one when the launcher pinned this worker.
    const int visible = cuda_device_count();
    if (s.local_rank < visible) s.device = Device::cuda(s.local_rank);
    else if (visible == 1) s.device = Device::cuda(0);
    else
      errors.fail(cfg, "device",
                  "local rank " + std::to_string(s.local_rank) + " has no GPU of its own: only " +
                      std::to_string(visible) + " CUDA device(s) are visible (launch at most that many workers per node)");
  }
}

// output_dir, checkpoint.*, logging.* and profile.*: where the run writes and what it records.
void resolve_outputs(const Config& cfg, ConfigErrors& errors, RunSettings& s) {
  const ConfigReader rd(cfg, errors);
  s.output_dir = rd.str("output_dir");
  if (s.output_dir.empty()) errors.fail(cfg, "output_dir", "must not be empty");
  s.save_every = rd.i64("checkpoint.save_every");
  s.keep_last = rd.i64("checkpoint.keep_last");
  s.tensorboard = rd.flag("logging.tensorboard");
  if (!s.output_dir.empty()) {
    // Every place the run will write, checked before step 1 (the first save may come hours later).
    std::string problem = output_location_problem(s.output_dir, true);
    if (problem.empty() && s.save_every > 0) problem = output_location_problem(checkpoints_dir(s.output_dir), true);
    if (problem.empty() && s.tensorboard)
      problem = output_location_problem((fs::path(s.output_dir) / "tensorboard").string(), true);
    if (!problem.empty()) errors.fail(cfg, "output_dir", problem);
  }
  s.plot = rd.flag("logging.plot");
  s.peak_tflops = rd.f64("logging.peak_tflops");
  s.profile.enabled = rd.flag("profile.enabled");
  s.profile.start_step = rd.i64("profile.start_step");
  s.profile.num_steps = rd.i64("profile.num_steps");
  s.profile.top_k = rd.i64("profile.top_k");
  s.profile.device_timing = rd.flag("profile.device_timing");
  if (s.profile.enabled && s.profile.start_step > s.max_steps)
    errors.fail(cfg, "profile.start_step",
                "step " + std::to_string(s.profile.start_step) + " is after the last step (max_steps = " +
                    std::to_string(s.max_steps) + "), so nothing would be profiled");
}

// compile.* (dtype is resolved: f16 cannot be compiled).
void resolve_compile(const Config& cfg, ConfigErrors& errors, RunSettings& s) {
  const ConfigReader rd(cfg, errors);
  s.compile.enabled = rd.flag("compile.enabled");
  s.compile.mode = rd.str("compile.mode");
  s.compile.fullgraph = rd.flag("compile.fullgraph");
  s.compile.dynamic = rd.flag("compile.dynamic");
  s.compile.memory_budget = rd.f64("compile.memory_budget");
  // The budget is a pass of the compiler (remat); train.activation_checkpointing is what works eagerly too.
  if (s.compile.memory_budget < 1 && !s.compile.enabled && !errors.has_error_for("compile.memory_budget"))
    errors.fail(cfg, "compile.memory_budget",
                cfg.value("compile.memory_budget").text +
                    " recomputes activations in a compiled step only, and compile.enabled is false; set "
                    "compile.enabled=true (or train.activation_checkpointing=blocks, which works eagerly too)");
  s.compile.unit_reduction_lag = rd.i64("compile.unit_reduction_lag");
  s.compile.cache_dir = rd.str("compile.cache_dir");
  // The loss scaler decides on the host whether a step is applied, which a compiled step cannot replay.
  if (s.dtype == DType::f16 && s.compile.enabled && !errors.has_error_for("dtype"))
    errors.fail(cfg, "dtype",
                "f16 trains with dynamic loss scaling, which skips overflowing steps on the host: set "
                "compile.enabled=false, or use dtype=bf16 (no loss scaling needed) to compile the step");
}

void resolve_distributed(const Config& cfg, ConfigErrors& errors, DistributedSettings& d) {
  const ConfigReader rd(cfg, errors);
  d.backend = rd.str("distributed.backend");
  d.bucket_cap_mb = rd.f64("distributed.bucket_cap_mb");
  d.reduce_dtype = rd.str("distributed.reduce_dtype");
  d.zero_stage = rd.i64("distributed.zero_stage");
  d.reduce_wire_dtype = rd.str("distributed.reduce_wire_dtype");
  if (d.reduce_wire_dtype == "bf16" && d.zero_stage != 3 && !errors.has_error_for("distributed.zero_stage"))
    errors.fail(cfg, "distributed.reduce_wire_dtype",
                "bf16 applies to zero_stage 3 (its units' reduce-scatters), this run has zero_stage " +
                    std::to_string(d.zero_stage) + "; DDP and ZeRO-1/2 send gradients in distributed.reduce_dtype");
  d.reshard_after_forward = rd.flag("distributed.reshard_after_forward");
  d.prefetch = rd.flag("distributed.prefetch");
  d.keep_last_blocks = rd.i64("distributed.keep_last_blocks");
  d.vocab_parallel_embeddings = rd.flag("distributed.vocab_parallel_embeddings");
  d.overlap = rd.flag("distributed.overlap");
  d.sm_carveout = rd.i64("distributed.sm_carveout");
  d.timeout_s = timeout_setting(cfg, errors, "distributed.timeout_s", "INGOT_COLLECTIVE_TIMEOUT_S", d.timeout_s);
  d.init_timeout_s =
      timeout_setting(cfg, errors, "distributed.init_timeout_s", "INGOT_INIT_TIMEOUT_S", d.init_timeout_s);
}

// The checkpoint a run continues from: resume_from, or with resume: true (or a launcher's restart) the latest
// one in output_dir. Sets s.resume_checkpoint and its reason, or a note when there is none yet.
void find_resume_checkpoint(const Config& cfg, ConfigErrors& errors, RunSettings& s) {
  const ConfigReader rd(cfg, errors);
  const std::string from = rd.str("resume_from");
  const bool resume = rd.flag("resume");
  int64_t restarts = 0;
  try {
    restarts = restart_count_from_env();
  } catch (const ConfigError& e) {
    errors.add(ConfigOrigin{}, e.what());
  }
  std::error_code ec;
  if (!from.empty()) {
    if (!fs::is_directory(from, ec))
      errors.fail(cfg, "resume_from", "no checkpoint directory '" + from + "'");
    else if (!fs::is_regular_file(fs::path(from) / "manifest.json", ec))
      errors.fail(cfg, "resume_from", "'" + from + "' has no manifest.json, so it is not a complete checkpoint");
    else {
      s.resume_checkpoint = from;
      s.resume_reason = "resume_from";
    }
  } else if (resume || restarts > 0) {
    std::optional<std::string> latest = latest_checkpoint(s.output_dir);
    if (latest) {
      s.resume_checkpoint = *latest;
      s.resume_reason = resume ? "resume: true" : "INGOT_RESTART_COUNT=" + std::to_string(restarts);
    } else if (resume) {
      // One command for the first start and every restart: nothing to resume yet is not a mistake.
      s.resume_note = "resume: true, but " + checkpoints_dir(s.output_dir) + " holds no checkpoint yet: starting fresh";
      if (s.save_every == 0) s.resume_note += " (checkpoint.save_every is 0, so this run will not write any)";
    }
    // A restarted job that never reached its first checkpoint simply starts over.
  }
}

// Note [A fresh run never deletes another run's checkpoints silently]: they are replaced only when the user
// says so (overwrite_output_dir); otherwise the run stops before anything is written.
void check_fresh_output_dir(const Config& cfg, ConfigErrors& errors, const RunSettings& s) {
  std::vector<std::pair<int64_t, std::string>> earlier = list_checkpoints(s.output_dir);
  if (earlier.empty() || s.overwrite_output_dir) return;
  std::string names;
  for (const auto& [step, path] : earlier) names += (names.empty() ? "" : ", ") + fs::path(path).filename().string();
  errors.fail(cfg, "output_dir",
              "'" + s.output_dir + "' holds checkpoints of an earlier run (" + names + " in " +
                  checkpoints_dir(s.output_dir) + "), which a fresh run would replace; continue that run with "
                  "resume=true, start over with overwrite_output_dir=true (they are deleted once this run "
                  "has a checkpoint of its own, or at its end), or choose a new output_dir");
}

// The checkpoint's state.json against this config: the same math (config hash), and a max_steps that leaves
// something to train, or a resume_schedule (`policy`) saying how the LR schedule goes on.
void check_resume_state(const Config& cfg, ConfigErrors& errors, const std::string& policy, RunSettings& s) {
  const std::string from = ConfigReader(cfg, errors).str("resume_from");
  const std::string state_path = (fs::path(s.resume_checkpoint) / "state.json").string();
  try {
    TrainState st = parse_train_state(read_file(state_path), state_path);
    check_resume_config(st, cfg, s.resume_checkpoint);
    // train.epochs (fine-tuning) replaces max_steps once the data is loaded; these checks follow max_steps.
    const bool by_epochs = cfg.has("train.epochs") && cfg.value("train.epochs").text != "0";
    if (!by_epochs && st.step > s.max_steps) {
      errors.fail(cfg, "max_steps",
                  std::to_string(s.max_steps) + " is before the checkpoint's step " + std::to_string(st.step) + " (" +
                      s.resume_checkpoint + "); raise max_steps, or start over in a new output_dir");
    } else if (!by_epochs && st.step == s.max_steps) {
      s.resume_note = "the run already finished its " + std::to_string(s.max_steps) +
                      " steps, so there is nothing to train (raise max_steps to train longer; start over with "
                      "overwrite_output_dir=true or a new output_dir); evaluating and writing the final outputs again";
    } else if (!by_epochs) {
      check_resume_schedule(st, policy, cfg, errors, s);
    }
  } catch (const ConfigError& e) {
    errors.add(cfg.has("resume_from") && !from.empty() ? cfg.origin("resume_from") : ConfigOrigin{}, e.what());
  } catch (const Error& e) {
    errors.fail(cfg, from.empty() ? "resume" : "resume_from",
                "cannot read the checkpoint's training state: " + std::string(e.what()));
  }
}

}  // namespace

RunSettings resolve_run(const Config& cfg, ConfigErrors& errors) {
  RunSettings s;
  const ConfigReader rd(cfg, errors);
  resolve_placement_and_device(cfg, errors, s);
  std::string dt = rd.str("dtype");
  s.dtype = dt == "bf16" ? DType::bf16 : dt == "f16" ? DType::f16 : DType::f32;
  s.max_steps = rd.i64("max_steps");
  s.lr_schedule_steps = s.max_steps;
  s.seed = static_cast<uint64_t>(rd.i64("seed"));
  resolve_outputs(cfg, errors, s);
  resolve_compile(cfg, errors, s);
  resolve_distributed(cfg, errors, s.distributed);
  s.config_entries = training_config_entries(cfg);
  s.config_hash = config_hash(s.config_entries);

  find_resume_checkpoint(cfg, errors, s);
  s.overwrite_output_dir = rd.flag("overwrite_output_dir");
  const std::string resume_schedule = rd.str("resume_schedule");
  if (s.resume_checkpoint.empty() && !errors.has_error_for("output_dir")) check_fresh_output_dir(cfg, errors, s);
  if (!s.resume_checkpoint.empty()) check_resume_state(cfg, errors, resume_schedule, s);
  return s;
}

}  // namespace ingot::recipes
