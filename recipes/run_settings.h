// Config sections every training recipe shares, with their schema keys and resolved form:
//   top level    recipe, device, dtype, max_steps, seed, output_dir, resume, resume_from,
//                resume_schedule, overwrite_output_dir
//   checkpoint:  save_every, keep_last
//   logging:     tensorboard, plot, peak_tflops
//   profile:     enabled, start_step, num_steps, top_k
//   compile:     enabled, mode, fullgraph, dynamic, memory_budget, unit_reduction_lag, cache_dir (the compiler's
//                options)
//   distributed: backend, bucket_cap_mb, reduce_dtype, reduce_wire_dtype, zero_stage, reshard_after_forward, keep_last_blocks,
//                vocab_parallel_embeddings, prefetch, overlap, timeout_s, init_timeout_s (DDP's and FSDP's options)
// A recipe's schema is add_run_keys() plus its own model/data/train keys.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "recipes/config.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace ingot::recipes {

// device and dtype only (recipes that do not train: eval, generate).
void add_device_keys(ConfigSchema& s);
// The `device` key as a Device, checked against the GPUs present (problems go to `errors`; cpu then).
Device resolve_device(const Config& cfg, ConfigErrors& errors);

// Adds the shared keys; `recipe` is the recipe's name (the default of the `recipe` key) and `output_dir`
// the default run directory.
void add_run_keys(ConfigSchema& s, const std::string& recipe, const std::string& output_dir);

struct CompileSettings {
  bool enabled = false;
  std::string mode = "default";  // default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs
  bool fullgraph = false, dynamic = false;
  double memory_budget = 1.0;  // fraction of activations kept (< 1 recomputes: activation checkpointing)
  // Compiled ZeRO-3: each unit's gradient reduce-scatter is waited for this many units later
  // (CompileOptions::unit_reduction_lag); 0: every wait at the backward's end.
  int64_t unit_reduction_lag = 1;
  std::string cache_dir;
};

struct DistributedSettings {
  std::string backend = "auto";  // auto | nccl | gloo
  double bucket_cap_mb = 100;
  std::string reduce_dtype = "f32";  // f32 | bf16: the dtype gradients are averaged in
  // f32 | bf16: zero_stage 3, the dtype gradients are sent in, summed in reduce_dtype (FsdpOptions::reduce_wire_dtype)
  std::string reduce_wire_dtype = "f32";
  int64_t zero_stage = 0;  // 0 (DDP) to 3 (FSDP)
  bool reshard_after_forward = true;  // zero_stage 3
  bool prefetch = true;   // zero_stage 3, eager: Note [Eager prefetch] (distributed/fsdp.h)
  int64_t keep_last_blocks = 0;  // zero_stage 3: Note [The last blocks kept] (distributed/fsdp.h)
  bool vocab_parallel_embeddings = true;  // zero_stage 3: Note [Vocabulary-parallel embeddings] (distributed/fsdp.h)
  bool overlap = true;
  // SMs left to communication kernels (Note [SM carve-out], runtime/sm_budget.h); 0: INGOT_SM_CARVEOUT, else none.
  int64_t sm_carveout = 0;
  // Seconds: a collective that takes longer fails naming the op and the ranks that never joined; ranks wait
  // this long for each other at start-up and in store barriers (checkpoint saves). Resolved from the config,
  // else `ingot launch --collective-timeout / --init-timeout` (INGOT_COLLECTIVE_TIMEOUT_S, INGOT_INIT_TIMEOUT_S).
  double timeout_s = 600, init_timeout_s = 300;
};

struct ProfileSettings {
  bool enabled = false;
  bool device_timing = false;  // CUDA: Note [Ops timed on the device] (recipes/profile.h)
  int64_t start_step = 0, num_steps = 0, top_k = 0;  // 1-based first step
};

struct RunSettings {
  std::string recipe;
  std::string config_file;
  std::string resolved_yaml;  // the config with defaults and overrides applied, saved in the run dir
  Device device;
  DType dtype = DType::f32;
  int64_t max_steps = 0;
  uint64_t seed = 0;
  std::string output_dir;
  // Where to resume from: empty = start fresh. Set from resume_from, from resume: true (latest checkpoint in
  // output_dir), or from INGOT_RESTART_COUNT > 0 (the launcher restarted the job) when a checkpoint exists.
  std::string resume_checkpoint;
  std::string resume_reason;  // for the log: "resume_from", "resume: true", "INGOT_RESTART_COUNT=2"
  // The LR schedule's length: max_steps, or the checkpoint's with resume_schedule: keep.
  int64_t lr_schedule_steps = 0;
  std::string resume_note;    // said before training: resume: true found nothing to resume, so it starts fresh
  // A fresh run may replace checkpoints an earlier run left in output_dir (without it, resolve_run refuses).
  bool overwrite_output_dir = false;
  int64_t save_every = 0, keep_last = 0;
  bool tensorboard = false, plot = true;
  double peak_tflops = 0;
  ProfileSettings profile;
  CompileSettings compile;
  DistributedSettings distributed;
  // This process's place in a data-parallel job (recipes/data_parallel.h), from the environment: RANK,
  // WORLD_SIZE, LOCAL_RANK (`ingot launch`, torchrun) or mpirun/srun's variables (mpi). A single process is
  // rank 0 of 1. Under a job, a CUDA device is cuda:LOCAL_RANK (cuda:0 when the launcher pinned one GPU).
  int rank = 0, world_size = 1, local_rank = 0;
  bool mpi = false;
  // Training-relevant config entries and their hash (recorded in checkpoints, checked on resume).
  std::map<std::string, std::string> config_entries;
  std::string config_hash;
};

// Resolves the shared keys; problems are recorded in `errors` (nothing is thrown for config mistakes).
// Resuming: the checkpoint must exist and have a manifest, and its config hash must match (otherwise the
// differing keys are listed).
RunSettings resolve_run(const Config& cfg, ConfigErrors& errors);

// Fills rank, world_size, local_rank and mpi from the environment; malformed variables throw ingot::Error.
void resolve_placement(RunSettings& s);

// Why `path` cannot be written as a directory (`directory`) or a file: "" when it can (it exists as that kind
// and is writable, or the nearest existing parent is a writable directory). Checked before step 1, so an
// unreachable checkpoints/ or --summary path is not found only at the first save or after training.
std::string output_location_problem(const std::string& path, bool directory);

// INGOT_RESTART_COUNT as an integer (0 when unset); a malformed value is a ConfigError.
int64_t restart_count_from_env();

}  // namespace ingot::recipes
