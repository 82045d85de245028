#!/usr/bin/env bash
# Data parallel on a lent multi-GPU machine (nvidia-h100-x4 / h200-x4; 2-GPU kinds run the 2-GPU parts), all in
# one call: build (from .device/src.tar.xz or src.tgz when present, else this checkout) with scripts/device_build.sh, the
# multi-GPU tests, then GPT-2 124M (bf16, batch 16 x 1024 per GPU) on 1, 2 and 4 GPUs: ingot compiled DDP in
# default and reduce-overhead with the step timeline (exposed communication), the variants that explain it, NCCL
# all-reduce bandwidth next to PyTorch's process group, and PyTorch DDP + torch.compile under torchrun.
# Logs: $OUT/logs.tgz (or ./out/logs.tgz); the rows are printed as they come.
#   scripts/device_dist.sh [tests] [gpu1] [race] [bucket] [bench] [variants] [peak] [memory] [torch] [llama]
#                          [fsdp] [zero] [fsdp8b] [fsdp8b_one] [carveout] [clocks] [priority] [kernels] [ddpwhy]
#                          [wirewhy] [symwhy] [symddp] [probe] [alone] [chunks] [updates]
#                          (default: tests bench torch)
#   race: the compiled-DDP-vs-eager tests in fresh processes, counting the runs that fail (the default-mode
#         ordering race of bench/RESULTS.md 2026-11-26 showed up in 3-4 runs of 5 before its fix)
#   bucket: the per-bucket optimizer updates test, 3 runs
#   peak: GPT-2 default mode on 1, 2 and 4 GPUs only
#   memory: INGOT_LOGS=memory for GPT-2 default mode on 1 and 2 GPUs (what is alive at the peak)
#   fsdp: the eager ZeRO-2/3 tests on NCCL (FsdpOnGpus.*: vs one GPU and DDP, reshard on/off, f32/bf16 reduction,
#         bytes per rank; FsdpLaunchOnGpus.*: `ingot launch` zero_stage 3 vs 0 on 2 GPUs); prints each suite's
#         exit code, the failures and the '[ fsdp nccl ]' memory lines; CompiledFsdpOnGpus.*: compiled ZeRO-3 vs eager
#         (tests/gpu/test_fsdp_compiled_gpu.cpp: reshard on/off, f32/bf16 reduction, bf16 masters, reduce-overhead)
#   zero: the price of sharding, GPT-2 124M (bf16 autocast, f32 parameters, 16 x 1024 per GPU) eager on 1 GPU, then
#         at 2 and 4 GPUs eager DDP, ZeRO-2, ZeRO-3 (resharded after forward, kept, and without the eager prefetch:
#         z3noprefetch, not in the default rows) and compiled DDP / ZeRO-2 /
#         ZeRO-3 (the units' collectives in the graph):
#         one '| ingot ...' row each (ms/step, tokens/s per rank, peak memory of rank 0)
#   fsdp8b: Llama-3-8B-shaped full fine-tune on all GPUs, 2 x 2048 per GPU, bf16 compute over f32 masters, AdamW:
#         PyTorch FSDP2 eager and + torch.compile per layer (bench/reference/fsdp2_llama.py) and ingot eager ZeRO-3
#         (bench_llama_step --zero-stage 3 --params bf16) on the same checkpoint and tokens, one row each in
#         fsdp2_llama.py's columns with the first 10 losses. The checkpoint (/tmp/ingot-llama8b, ~16 GB) is written
#         first when missing (110 s on 4x H200; the machine keeps it while warm). FSDP8B_PARTS picks the runs
#         (default "ingot eager compile ingot-compiled": 75, 45, 60 s on 4x H200 for the first three, so with the
#         build and the checkpoint they fit one call; ingot-compiled is compiled ZeRO-3, --compile default; a part
#         ending in +coN runs with --sm-carveout N; ingot-noprefetch is eager ZeRO-3 with each block gathered
#         when used, --no-prefetch; a part ending in +prof adds --timeline and the 40 costliest ops timed by CUDA
#         events (--profile 40 --profile-events); +ctasN holds NCCL to N CTAs, +minctasN makes it use N; +castc
#         casts the gathers on the compute stream (INGOT_GATHER_CAST_ON_COMPUTE=1); +eff INGOT_NCCL_CTA_POLICY=efficiency; +keepN
#         --keep-last-blocks N, +keepall --keep-after-forward; +mbB --memory-budget B (compiled: cheap saved activations
#         recomputed in the backward); +gemb --gather-embeddings (the token table gathered as a
#         unit instead of looked up where its rows lie); +rbf16 --reduce-dtype bf16; +wire --reduce-wire-dtype bf16
#         (sent in bf16, summed in f32), +nowire with INGOT_NARROW_WIRE=0 (the same sums, widened before an f32 reduce-scatter),
#         +ata with INGOT_NARROW_WIRE=alltoall (ncclAlltoAll), +env:NAME=VALUE any environment variable; +slots every collective's timeline line (in the log; the last 12 printed); suffixes
#         combine (ingot-compiled+ctas8+prof);
#         ingot-memory: compiled, 2 steps under INGOT_LOGS=memory).
#   (FSDP_SUITES: the fsdp step's gtest filters, FSDP_TEST_TIMEOUT seconds each; ZERO_WORLDS / ZERO_ROWS: the zero
#   step's world sizes and rows, e.g. ZERO_WORLDS=4 ZERO_ROWS="ddp_compiled z3_compiled")
#   carveout: the SM carve-out (Note [SM carve-out], runtime/sm_budget.h): its GPU tests (CudaSmCarveout.*), then
#         GPT-2 compiled default at 1 GPU and at all GPUs (with the timeline) for each N of CARVEOUTS (default
#         "0 8 16"), `--sm-carveout N`: one '| ingot ... carveout N' row each (no suffix for 0); CARVEOUT_CTAS=1
#         adds for each N > 0 the all-GPU row with NCCL_MAX_CTAS=N (NCCL's CTAs held to the SMs left to them)
#   llama: ~1B Llama full fine-tune, 1 GPU and DDP at all GPUs, 4 at most (25 MB buckets, 100 MB, 100 MB in bf16), and
#         with torch or llama_torch transformers + torch.compile on 1 GPU and DDP x4 under torchrun (each row sampled
#         when CLOCKS=1)
#   clocks: CudaOptim.* on GPU 0, then GPT-2 compiled default and reduce-overhead on 1 GPU, DDP in a world of one,
#         DDP at 2 and all GPUs, reduce-overhead and 100 MB bf16 buckets at all
#         GPUs, each with nvidia-smi sampling (CLOCKS=1, below): median SM clock, power and throttle reason per GPU
#   priority: GPT-2 compiled default and reduce-overhead at all GPUs with the comm stream at the lowest priority
#         (INGOT_COMM_STREAM_PRIORITY=low) and at the highest (the default), alternating, two rounds, with the timeline;
#         the 1-GPU default row first: whether NCCL's kernels scheduled ahead of the compute slow it (issue 21)
#   kernels: GPT-2 compiled default on 1 GPU and on all GPUs, twice each, with the op profiler timing every op by
#         CUDA events (bench_gpt2_step --profile 60 --profile-events): which ops slow down beside NCCL (issue 21)
#   symddp: GPT-2 compiled DDP at all GPUs (4 at most) with its buckets in NCCL symmetric windows
#         (INGOT_SYMMETRIC_BUCKETS=1, bench/step_bench.h) and without, two rounds, the 1-GPU row first; the ~1B Llama
#         likewise once
#   probe: where the compiled DDP step's time over one GPU goes (issue 21), GPT-2 then the ~1B Llama at all GPUs (4 at
#         most), compiled default, alternating: reductions as they are, INGOT_ALL_REDUCE_PROBE=one (every all-reduce
#         reduces one element: the ranks still meet at each bucket and NCCL's kernel runs, no bytes move) and =skip (no
#         all-reduce: each rank on its own), the 1-GPU row first; GPT-2 reduce-overhead as is and skipped. The probe
#         rows' values are wrong: timing only
#   alone: the probe's "skip" row taken apart (issue 21): GPT-2 then the ~1B Llama, compiled default: 1 GPU, DDP in a
#         world of one (`--ddp` under `ingot launch --nproc-per-node 1`: the DDP graph, no peers), four independent
#         1-GPU runs at once on GPUs 0-3 (the machine busy, no DDP), DDP at all GPUs with INGOT_ALL_REDUCE_PROBE=skip
#   chunks: DDP scaling at all GPUs (4 at most), compiled default: GPT-2 and the ~1B Llama on 1 GPU and DDP, GPT-2
#         reduce-overhead 1 GPU and DDP (bench/RESULTS.md, twenty-sixth session, ran it beside the multi-tensor chunks
#         of before Note [Multi-tensor chunks] through a switch since removed)
#   updates: the optimizer update per bucket (as it is: each bucket's AdamW right after its all-reduce) against one
#         update after the last all-reduce (INGOT_SKIP_PASSES=split_update_by_bucket), alternating, compiled default at
#         all GPUs (4 at most), GPT-2 then the ~1B Llama, the 1-GPU rows first (issue 21: the per-bucket updates run
#         beside NCCL's kernels and slowed 40% there in the nineteenth session; one update at the end runs alone but
#         waits for the last bucket); then ZeRO-1 and ZeRO-2 (--zero-stage: a quarter of the update on each rank)
#   symwhy: NCCL's symmetric kernels (buffers in ProcessGroup::symmetric_empty's windows) against its ordinary ones at
#         one 8B block's bf16 reduce-scatter, GPT-2's f32 all-reduce and an f32 reduce-scatter, each with an 8192^3
#         bf16 product timed alone and beside it (bench_allreduce --beside-matmul), and NcclProcessGroup.Symm*
#   wirewhy: the narrow wire's pieces timed alone (bench_allreduce's reduce-scatters f32 / bf16 / widened / all_to_all
#         at one 8B block's 436 MB of bf16, bench_cuda_kernels' sum_pieces lines)
#   ddpwhy: GPT-2 compiled default per-op device times on 1 GPU and on all GPUs reduced in f32 and in bf16 (the ops
#         that grow), then all GPUs with NCCL held to 2 and 1 CTAs and with NCCL_P2P_DISABLE=1; the ~1B Llama's
#         per-op device times on 1 GPU and all GPUs (issue 21)
#   fsdp8b_one: the 8B's blocks on GPU 0 alone (--layers 4 and 8, random weights, compiled, per-op device times):
#         its products without NCCL beside them, against fsdp8b's ingot-compiled+prof table (ONE_RUNS: other layer
#         counts and flags, "LAYERS[:FLAGS]" words with ',' for spaces: ONE_RUNS="8 8:--memory-budget,0.5")
#   gpu1: the single-GPU test suites (Cuda*, CodegenCuda*, CompileCudaStep*, ModelsCuda*) on cuda:0
set -uo pipefail
# Logs are written to a scratch folder and packed into one logs.tgz under $OUT at exit (the device tool returns
# only a few files per call).
final="${OUT:-out}"; mkdir -p "$final"
out=$(mktemp -d /tmp/ingot-dist-logs.XXXX)
trap 'tar czf "$final/logs.tgz" -C "$out" .' EXIT
# A step runs only while the call's time lasts (DEADLINE seconds after start, default 540 of the 600 a call gets).
start=$(date +%s)
want() {
  (( $(date +%s) - start < ${DEADLINE:-540} )) || { echo "skipped $1: out of time"; return 1; }
  local w; for w in "${steps[@]}"; do [[ "$w" == "$1" ]] && return 0; done; return 1
}
steps=("$@"); [[ ${#steps[@]} -eq 0 ]] && steps=(tests bench torch)
export NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L | wc -l); nvidia-smi -L | tee "$out/gpu.txt"
src=$PWD
# A source snapshot (`git archive HEAD | xz > .device/src.tar.xz`: a commit, not the working tree) when present.
for snap in .device/src.tar.xz .device/src.tgz; do
  if [[ -f $snap ]]; then src=/tmp/ingot-src; mkdir -p $src; tar xf $snap -C $src; break; fi
done
t0=$(date +%s)
scripts/device_build.sh "$src" /tmp/ingot-build ingot ingot_tests bench_gpt2_step bench_allreduce bench_llama_step \
  > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
multi=/opt/deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$multi:$multi/openblas-pthread:${LD_LIBRARY_PATH:-}" PATH="/tmp/ingot-build/bin:$PATH"
export INGOT_TEST_ROOT=$src INGOT_CONFIG_PATH=$src/configs OMP_WAIT_POLICY=passive

if want tests; then
  for f in 'DdpOnGpus.*' 'LaunchOnGpus.*' 'NcclProcessGroup.*' 'CompiledDdp.*'; do
    log="$out/test_${f%%.*}.log"
    (cd $src && INGOT_CRASH_BACKTRACE=1 timeout 300 ingot_tests --gtest_filter="$f" > "$log" 2>&1); echo "== $f: exit $?"
    grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|^\[ ddp|Failure|Expected|Which is" "$log" | head -24
  done
fi

if want fsdp; then  # eager ZeRO-2/3 on NCCL (tests/gpu/test_fsdp_multi_gpu.cpp)
  for f in ${FSDP_SUITES:-'FsdpOnGpus.*' 'FsdpLaunchOnGpus.*' 'CompiledFsdpOnGpus.*'}; do
    log="$out/test_${f%%.*}.log"
    (cd $src && INGOT_CRASH_BACKTRACE=1 timeout ${FSDP_TEST_TIMEOUT:-600} ingot_tests --gtest_filter="$f" > "$log" 2>&1); echo "== $f: exit $?"
    grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|^\[       OK|^\[ fsdp|Failure|Expected|Which is|error" "$log" | head -40
  done
fi

if want gpu1; then  # the single-GPU suites on cuda:0 (CUDA kernels vs CPU, codegen, compiled GPU steps, models)
  for f in 'CompileCudaStep*:CodegenCuda*' 'Cuda*' 'ModelsCuda*'; do
    log="$out/gpu1_${f%%\**}.log"
    (cd $src && CUDA_VISIBLE_DEVICES=0 INGOT_CRASH_BACKTRACE=1 timeout 240 ingot_tests --gtest_filter="$f" > "$log" 2>&1)
    echo "== $f: exit $?"; grep -E "^\[  FAILED|^\[  PASSED|Failure" "$log" | head -12
  done
fi

if want race; then
  # The quick default-mode check (10 steps, 2 GPUs) in fresh processes, optionally under environment switches
  # (e.g. INGOT_SKIP_PASSES=fuse, CUDA_LAUNCH_BLOCKING=1); then the full 2- and 4-GPU tests twice each.
  race() {  # race NAME RUNS [ENV=VALUE...]
    local name=$1 runs=$2 fails=0 i; shift 2
    for ((i = 1; i <= runs; i++)); do
      want race || return 0
      (cd $src && env "$@" timeout 100 ingot_tests --gtest_filter='DdpOnGpus.CompiledDefaultMode*' \
        > "$out/race_${name}_$i.log" 2>&1) || fails=$((fails + 1))
    done
    echo "race $name: $fails of $runs runs failed"
    grep -h "Which is\|step [0-9]\|parameter [0-9]" "$out"/race_${name}_*.log | head -4
  }
  race committed 10
  for n in Two Two Four Four; do
    want race || break
    (cd $src && timeout 150 ingot_tests --gtest_filter="DdpOnGpus.CompiledDdpFollowsEagerDdpAndOneGpuOn${n}Gpus" \
      > "$out/race_full_$n.log" 2>&1); echo "race full $n GPUs: exit $?"
  done
fi

if want bucket; then  # per-bucket optimizer updates against eager DDP, 3 fresh processes
  for i in 1 2 3; do
    (cd $src && timeout 100 ingot_tests --gtest_filter='DdpOnGpus.PerBucketUpdates*' > "$out/bucket_updates_$i.log" 2>&1)
    echo "per-bucket updates test run $i: exit $?"
  done
  grep -h "Which is\|step [0-9]\|parameter [0-9]" "$out"/bucket_updates_*.log | head -4
fi

bench="--device cuda --dtype bf16 --batch 16 --seq 1024 --steps 20 --warmup 5 --cache-dir /tmp/ingot-dist-cache"
row() { grep -h "^| ingot" "$1" | tail -1; grep -h "^timeline:" "$1" | tail -1; }
# CLOCKS=1: nvidia-smi samples every GPU's SM clock, power and throttle reasons every 100 ms while a row runs
# (NAME.smi.csv) and prints, for the GPUs the row used, the median SM clock and power over its busy samples
# (power above half the limit): whether the step slows with peers because the clocks drop (power cap) rather
# than because kernels share SMs.
smi_start() {
  [[ -n ${CLOCKS:-} ]] || return 0
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,power.limit,clocks_throttle_reasons.active \
    --format=csv,noheader,nounits -lms 100 > "$out/$1.smi.csv" 2>/dev/null &
  smi_pid=$!
}
smi_stop() {  # smi_stop NAME GPUS
  [[ -n ${CLOCKS:-} ]] || return 0
  kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null
  python3 - "$out/$1.smi.csv" "$2" "$1" <<'PY'
import statistics, sys
path, n, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [[x.strip() for x in l.split(",")] for l in open(path) if l.count(",") >= 6]
out = []
for g in range(n):
    busy = [r for r in rows if r[1] == str(g) and r[4] not in ("[N/A]", "") and float(r[4]) > 0.5 * float(r[5])]
    if not busy:
        out.append(f"gpu{g}: no busy samples"); continue
    reasons = {}
    for r in busy: reasons[r[6]] = reasons.get(r[6], 0) + 1
    top = max(reasons, key=reasons.get)
    out.append(f"gpu{g}: sm {statistics.median(float(r[2]) for r in busy):.0f} MHz, "
               f"{statistics.median(float(r[4]) for r in busy):.0f} W of {float(busy[0][5]):.0f}, "
               f"{len(busy)} busy samples, throttle {top} in {reasons[top]}")
print(f"clocks {name}: " + "; ".join(out))
PY
}
gpt2() {  # gpt2 N NAME FLAGS...
  local n=$1 name=$2; shift 2
  want bench || want variants || want memory || want peak || want zero || want carveout || want clocks || want priority ||
    want kernels || want ddpwhy || want symddp || want probe || want chunks || want updates ||
    return 0
  local vis; vis=$(seq -s, 0 $((n - 1)))
  smi_start "$name"
  if (( n == 1 )); then CUDA_VISIBLE_DEVICES=$vis timeout 200 bench_gpt2_step $bench "$@" > "$out/$name.log" 2>&1
  else CUDA_VISIBLE_DEVICES=$vis timeout 200 ingot launch --nproc-per-node gpu --standalone -- bench_gpt2_step $bench "$@" \
      > "$out/$name.log" 2>&1; fi
  smi_stop "$name" "$n"
  row "$out/$name.log"
}
# The ~1B Llama full fine-tune (bench/configs/llama_1b), bf16, 2 x 2048 tokens per GPU, compiled default: what the
# Llama rows of every part run, and llama1b N NAME FLAGS... runs it on one GPU (N = 1) or on all of them under ingot
# launch, into $out/NAME.log, printing NAME and its row (and timeline).
llama="--config $src/bench/configs/llama_1b/config.json --device cuda --dtype bf16 --batch 2 --seq 2048 --steps 10
  --warmup 3 --compile default --cache-dir /tmp/ingot-dist-cache"
llama1b() {
  local n=$1 name=$2; shift 2
  if (( n == 1 )); then CUDA_VISIBLE_DEVICES=0 timeout 200 bench_llama_step $llama "$@" > "$out/$name.log" 2>&1
  else timeout 200 ingot launch --nproc-per-node gpu --standalone -- bench_llama_step $llama "$@" > "$out/$name.log" 2>&1
  fi
  echo "$name:"; grep -h "^| ingot\|^timeline\|error" "$out/$name.log" | tail -2
}
if want bench; then
  for n in 1 2 4; do
    (( n <= gpus )) || continue
    if (( n > 1 )); then
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) ingot launch --nproc-per-node gpu --standalone -- \
        bench_allreduce --min-mb 64 --max-mb 512 > "$out/allreduce_$n.log" 2>&1; grep "^| all_reduce" "$out/allreduce_$n.log" | tail -2
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) python3 -m torch.distributed.run --standalone --nproc-per-node $n \
        bench/reference/torch_allreduce.py --min-mb 64 --max-mb 512 > "$out/torch_allreduce_$n.log" 2>&1
      grep "^| [0-9]" "$out/torch_allreduce_$n.log" | tail -2
    fi
    gpt2 $n default_$n --compile default --timeline
    gpt2 $n ro_$n --compile reduce-overhead --timeline
  done
fi
if want clocks; then  # GPT-2 default mode: 1 GPU, DDP in a world of one (no peers), DDP at 2 and all GPUs, sampled
  (cd $src && CUDA_VISIBLE_DEVICES=0 timeout 120 ingot_tests --gtest_filter='CudaOptim.*' > "$out/test_optim.log" 2>&1)
  echo "== CudaOptim.*: exit $?"; grep -E "^\[  FAILED|^\[  PASSED|Failure" "$out/test_optim.log" | head -6
  CLOCKS=1
  gpt2 1 clocks_1 --compile default
  gpt2 1 clocks_ro_1 --compile reduce-overhead
  smi_start clocks_ddp1
  CUDA_VISIBLE_DEVICES=0 timeout 200 ingot launch --nproc-per-node 1 --standalone -- bench_gpt2_step $bench \
    --compile default --ddp --timeline > "$out/clocks_ddp1.log" 2>&1
  smi_stop clocks_ddp1 1; row "$out/clocks_ddp1.log"
  (( gpus >= 2 )) && gpt2 2 clocks_2 --compile default --timeline
  (( gpus >= 4 )) && gpt2 4 clocks_4 --compile default --timeline
  (( gpus >= 2 )) && gpt2 $gpus clocks_ro_$gpus --compile reduce-overhead --timeline
  (( gpus >= 2 )) && gpt2 $gpus clocks_bf16_$gpus --compile default --timeline --bucket-cap-mb 100 --reduce-dtype bf16
  CLOCKS=
fi
if want torch; then
  for n in 1 4; do
    (( n <= gpus )) || continue
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout 300 python3 -m torch.distributed.run --standalone \
      --nproc-per-node $n bench/reference/torch_gpt2.py --batch 16 --modes compile > "$out/torch_$n.log" 2>&1
    grep "^| torch" "$out/torch_$n.log" | tail -1
  done
fi
if want priority; then  # the comm stream's priority: lowest vs highest (Note [Comm stream priority])
  gpt2 1 prio_1 --compile default
  for r in a b; do
    for p in low high; do
      INGOT_COMM_STREAM_PRIORITY=$p gpt2 $gpus prio_${p}_${r}_$gpus --compile default --timeline
      INGOT_COMM_STREAM_PRIORITY=$p gpt2 $gpus prio_ro_${p}_${r}_$gpus --compile reduce-overhead --timeline
    done
  done
fi
if want kernels; then  # which ops slow down beside NCCL: per-op device time, 1 GPU vs all GPUs (issue 21)
  # --profile-events: CUDA events around every op, nothing synchronized (Note [Ops timed on the device]).
  for n in 1 $gpus; do
    for r in a b; do
      gpt2 $n kernels_${n}_$r --compile default --timeline --profile 60 --profile-events
      sed -n '/^op /,/^(/p' "$out/kernels_${n}_$r.log" | head -64
    done
  done
  (( gpus > 1 )) && for r in a b; do  # the ops that took longer beside the communication
    echo "kernels: 1 GPU vs $gpus GPUs, round $r"
    python3 bench/reference/op_table_diff.py "$out/kernels_1_$r.log" "$out/kernels_${gpus}_$r.log" --top 25
  done
fi
if want ddpwhy; then  # what slows DDP's compute (issue 21): neither bytes nor the machine (bench/RESULTS.md 2026-11-27)
  # Per-op device times of GPT-2 compiled default: 1 GPU, all GPUs reduced in f32 and in bf16 (half the bytes and
  # half NCCL's busy time, the same step in call 8); which ops grow in each. Then NCCL held to 1-2 CTAs (if its
  # kernels' residency slows the compute, the slowdown shrinks and exposure grows) and NCCL without P2P (through host
  # memory: no peer writes into this GPU's memory).
  ev="--compile default --timeline --profile 60 --profile-events"
  gpt2 1 why_1 $ev
  gpt2 $gpus why_f32 $ev
  gpt2 $gpus why_bf16 $ev --reduce-dtype bf16
  for other in f32 bf16; do
    echo "ddpwhy: 1 GPU vs $gpus GPUs reduced in $other"
    python3 bench/reference/op_table_diff.py "$out/why_1.log" "$out/why_$other.log" --top 12
  done
  NCCL_MAX_CTAS=2 NCCL_MIN_CTAS=1 gpt2 $gpus why_ctas2 --compile default --timeline
  NCCL_MAX_CTAS=1 NCCL_MIN_CTAS=1 gpt2 $gpus why_ctas1 --compile default --timeline
  NCCL_P2P_DISABLE=1 gpt2 $gpus why_nop2p --compile default --timeline
  # The ~1B Llama (its step grows 73.5 -> 84.7 ms at 4 GPUs, f32 or bf16 alike): per-op device times, 1 GPU vs all.
  lw="$llama --profile 40 --profile-events"
  CUDA_VISIBLE_DEVICES=0 timeout 200 bench_llama_step $lw > "$out/why_llama_1.log" 2>&1
  timeout 200 ingot launch --nproc-per-node gpu --standalone -- bench_llama_step $lw --timeline \
    > "$out/why_llama_n.log" 2>&1
  grep -h "^| ingot\|^timeline" "$out/why_llama_1.log" "$out/why_llama_n.log"
  python3 bench/reference/op_table_diff.py "$out/why_llama_1.log" "$out/why_llama_n.log" --top 15
fi
if want wirewhy; then  # where the narrow wire's cost is (Note [Narrow wire, wide sum], issue 22)
  # In isolation on all GPUs, one 8B block's gradient (436 MB of bf16 in, 872 MB in f32): NCCL's f32 and bf16
  # reduce-scatters, the widened one (exchange + f32 sum, by grouped send/recv and by ncclAlltoAll), the exchange
  # alone (all_to_all), then the sum alone on GPU 0 (bench_cuda_kernels' sum_pieces lines).
  for spec in "reduce_scatter f32" "reduce_scatter bf16" "reduce_scatter_widen bf16" \
      "reduce_scatter_widen bf16 alltoall" "all_to_all bf16"; do
    read -r op dt mode <<< "$spec"; mb=416; [[ $dt == f32 ]] && mb=832  # the same elements
    INGOT_NARROW_WIRE=$mode timeout 120 ingot launch --nproc-per-node gpu --standalone -- bench_allreduce \
      --min-mb $mb --max-mb $mb --iters 20 --op $op --dtype $dt > "$out/wirewhy_${op}_${dt}${mode:+_$mode}.log" 2>&1
    echo "wirewhy $op $dt ${mode}: exit $?"; grep -h "^| $op" "$out/wirewhy_${op}_${dt}${mode:+_$mode}.log" | tail -1
  done
  CUDA_VISIBLE_DEVICES=0 timeout 120 bench_cuda_kernels > "$out/wirewhy_kernels.log" 2>&1; grep -h "^sum_pieces" "$out/wirewhy_kernels.log"
fi
if want symwhy; then  # do NCCL's symmetric kernels slow the compute beside them less? (issues 21 and 22)
  # On all GPUs: one 8B block's bf16 reduce-scatter (436 MB) and GPT-2's f32 gradient all-reduce (498 MB), in
  # ordinary buffers and in symmetric windows (ProcessGroup::symmetric_empty), each with an 8192^3 bf16 product timed
  # alone and beside the collective (--beside-matmul): the product's slowdown is what the steps lose.
  (cd $src && timeout 120 ingot_tests --gtest_filter='NcclProcessGroup.Symm*' > "$out/test_symm.log" 2>&1)
  echo "== NcclProcessGroup.Symm*: exit $?"; grep -E "^\[  FAILED|^\[  PASSED|^\[ nccl|Failure|Expected|Which" "$out/test_symm.log" | head
  for spec in "reduce_scatter bf16 416" "reduce_scatter bf16 416 --symmetric" "all_reduce f32 475" \
      "all_reduce f32 475 --symmetric" "reduce_scatter f32 832" "reduce_scatter f32 832 --symmetric"; do
    read -r op dt mb sym <<< "$spec"
    log="$out/symwhy_${op}_${dt}${sym:+_sym}.log"
    timeout 150 ingot launch --nproc-per-node gpu --standalone -- bench_allreduce --min-mb $mb --max-mb $mb \
      --iters 20 --op $op --dtype $dt --beside-matmul 8192 $sym > "$log" 2>&1
    echo "symwhy $op $dt ${sym}: exit $?"; grep -h "^| $op" "$log" | tail -1; grep -h "error" "$log" | head -3
  done
fi
if want variants; then
  n=$(( gpus >= 4 ? 4 : 2 ))
  gpt2 $n one_update_$n --compile default --timeline --one-update
  gpt2 $n cap100_bf16_$n --compile default --timeline --bucket-cap-mb 100 --reduce-dtype bf16
  gpt2 $n ro_cap100_bf16_$n --compile reduce-overhead --timeline --bucket-cap-mb 100 --reduce-dtype bf16
  gpt2 $n zero1_$n --compile default --timeline --zero1
fi
if want peak; then  # GPT-2 default mode on 1, 2 and 4 GPUs only (peak memory and step time after a DDP change)
  for n in 1 2 4; do (( n <= gpus )) && gpt2 $n peak_$n --compile default --timeline; done
fi
if want memory; then  # where default-mode DDP's peak comes from: the allocator's peak and what was alive, per call
  INGOT_LOGS=memory gpt2 1 memory_1 --compile default
  INGOT_LOGS=memory gpt2 2 memory_2 --compile default
fi
if want carveout; then  # compute kernels that leave N SMs to NCCL's, 1 GPU and all GPUs
  (cd $src && CUDA_VISIBLE_DEVICES=0 timeout 120 ingot_tests --gtest_filter='CudaSmCarveout.*:SmBudget.*' \
    > "$out/test_carveout.log" 2>&1); echo "== CudaSmCarveout.*:SmBudget.*: exit $?"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure|Expected|Which is" "$out/test_carveout.log" | head -12
  for c in ${CARVEOUTS:-0 8 16}; do
    gpt2 1 carveout_${c}_1 --compile default --sm-carveout $c
    (( gpus > 1 )) && gpt2 $gpus carveout_${c}_$gpus --compile default --timeline --sm-carveout $c
    if [[ -n ${CARVEOUT_CTAS:-} ]] && (( gpus > 1 && c > 0 )); then  # NCCL held to the SMs left to it
      echo "NCCL_MAX_CTAS=$c:"
      NCCL_MAX_CTAS=$c gpt2 $gpus carveout_${c}_ctas_$gpus --compile default --timeline --sm-carveout $c
    fi
  done
fi
if want probe; then  # what slows the DDP step: bytes, meetings or neither (INGOT_ALL_REDUCE_PROBE), issue 21
  n=$(( gpus >= 4 ? 4 : gpus ))
  gpt2 1 probe_gpt2_1 --compile default
  for round in a b; do
    gpt2 $n probe_gpt2_${n}_$round --compile default --timeline
    INGOT_ALL_REDUCE_PROBE=one gpt2 $n probe_gpt2_${n}_one_$round --compile default --timeline
    INGOT_ALL_REDUCE_PROBE=skip gpt2 $n probe_gpt2_${n}_skip_$round --compile default --timeline
  done
  gpt2 1 probe_gpt2_ro_1 --compile reduce-overhead
  gpt2 $n probe_gpt2_ro_$n --compile reduce-overhead --timeline
  INGOT_ALL_REDUCE_PROBE=skip gpt2 $n probe_gpt2_ro_${n}_skip --compile reduce-overhead --timeline
  llama1b 1 probe_llama_1
  for probe in "" one skip; do  # INGOT_ALL_REDUCE_PROBE unset, one, skip
    want probe || break
    INGOT_ALL_REDUCE_PROBE=$probe llama1b $n probe_llama_${n}_${probe:-all} --timeline
  done
fi
if want alone; then  # the DDP step without reductions taken apart: its graph, a busy machine (issue 21)
  n=$(( gpus >= 4 ? 4 : gpus ))
  for model in gpt2 llama; do
    want alone || break
    if [[ $model == gpt2 ]]; then prog="bench_gpt2_step $bench --compile default"; else prog="bench_llama_step $llama"; fi
    CUDA_VISIBLE_DEVICES=0 timeout 200 $prog > "$out/alone_${model}_1.log" 2>&1
    echo "$model 1 GPU:"; grep -h "^| ingot" "$out/alone_${model}_1.log" | tail -1
    CUDA_VISIBLE_DEVICES=0 timeout 200 ingot launch --nproc-per-node 1 --standalone -- $prog --ddp --timeline \
      > "$out/alone_${model}_ddp1.log" 2>&1
    echo "$model DDP in a world of one:"; grep -h "^| ingot\|^timeline\|error" "$out/alone_${model}_ddp1.log" | tail -2
    for g in $(seq 0 $((n - 1))); do
      CUDA_VISIBLE_DEVICES=$g timeout 200 $prog > "$out/alone_${model}_busy_$g.log" 2>&1 &
    done
    wait
    echo "$model $n independent 1-GPU runs at once (GPUs 0..$((n - 1))):"
    for g in $(seq 0 $((n - 1))); do grep -h "^| ingot" "$out/alone_${model}_busy_$g.log" | tail -1; done
    INGOT_ALL_REDUCE_PROBE=skip timeout 200 ingot launch --nproc-per-node gpu --standalone -- $prog --timeline \
      > "$out/alone_${model}_${n}_skip.log" 2>&1
    echo "$model DDP x$n, INGOT_ALL_REDUCE_PROBE=skip:"; grep -h "^| ingot\|^timeline\|error" "$out/alone_${model}_${n}_skip.log" | tail -2
  done
fi
if want chunks; then  # per-bucket updates' chunks at all GPUs (Note [Multi-tensor chunks]), issue 21
  n=$(( gpus >= 4 ? 4 : gpus ))
  gpt2 1 chunks_gpt2_1 --compile default
  gpt2 $n chunks_gpt2_$n --compile default --timeline
  gpt2 $n chunks_gpt2_${n}_b --compile default --timeline
  gpt2 1 chunks_gpt2_ro_1 --compile reduce-overhead
  gpt2 $n chunks_gpt2_ro_$n --compile reduce-overhead --timeline
  llama1b 1 chunks_llama_1
  llama1b $n chunks_llama_$n --timeline
fi
if want updates; then  # per-bucket updates beside NCCL or one update after the last all-reduce, issue 21
  n=$(( gpus >= 4 ? 4 : gpus ))
  gpt2 1 updates_gpt2_1 --compile default
  for round in a b; do
    gpt2 $n updates_gpt2_${n}_$round --compile default --timeline
    INGOT_SKIP_PASSES=split_update_by_bucket gpt2 $n updates_gpt2_${n}_one_$round --compile default --timeline
  done
  llama1b 1 updates_llama_1
  for skip in "" split_update_by_bucket; do  # INGOT_SKIP_PASSES unset, then the per-bucket split left out
    want updates || break
    INGOT_SKIP_PASSES=$skip llama1b $n updates_llama_${n}_${skip:-bucketed} --timeline
  done
  # ZeRO-1 / ZeRO-2: each rank updates a quarter of the parameters (the ~1B Llama's AdamW is 8.6 ms on one GPU) and
  # the same bytes move (reduce-scatter, then all-gather of the updated parameters).
  for z in 1 2; do
    want updates || break
    gpt2 $n updates_gpt2_${n}_zero$z --compile default --timeline --zero-stage $z
    llama1b $n updates_llama_${n}_zero$z --timeline --zero-stage $z
  done
fi
if want symddp; then  # compiled DDP with its buckets in NCCL symmetric windows (INGOT_SYMMETRIC_BUCKETS=1), issue 21
  n=$(( gpus >= 4 ? 4 : gpus ))
  gpt2 1 symddp_gpt2_1 --compile default
  for round in a b; do
    gpt2 $n symddp_gpt2_${n}_$round --compile default --timeline
    INGOT_SYMMETRIC_BUCKETS=1 gpt2 $n symddp_gpt2_${n}_sym_$round --compile default --timeline
  done
  llama1b 1 symddp_llama_1
  for sym in 0 1; do  # INGOT_SYMMETRIC_BUCKETS
    want symddp || break
    INGOT_SYMMETRIC_BUCKETS=$sym llama1b $n symddp_llama_${n}_$sym --timeline
  done
fi
if want llama; then  # the ~1B Llama ($llama), with the smi samples and bucket variants
  smi_start llama_1
  CUDA_VISIBLE_DEVICES=0 timeout 200 bench_llama_step $llama > "$out/llama_1.log" 2>&1
  smi_stop llama_1 1
  grep -h "^| ingot" "$out/llama_1.log" | tail -1
  if (( gpus >= 2 )); then  # DDP at all GPUs (4 at most): 25 MB buckets (PyTorch's), 100 MB (ours), 100 MB in bf16
    n=$(( gpus >= 4 ? 4 : gpus )) i=0
    for extra in "--bucket-cap-mb 25" "" "--reduce-dtype bf16"; do
      i=$((i + 1)); want llama || break; smi_start llama_${n}_$i
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout 200 ingot launch --nproc-per-node gpu --standalone -- \
        bench_llama_step $llama --timeline $extra > "$out/llama_${n}_$i.log" 2>&1
      smi_stop llama_${n}_$i $n
      grep -h "^| ingot\|^timeline" "$out/llama_${n}_$i.log" | tail -2
    done
  fi
  if want torch || want llama_torch; then  # transformers + torch.compile, 1 GPU and DDP at all GPUs (4 at most)
    for n in 1 $(( gpus >= 4 ? 4 : gpus )); do
      (( n <= gpus )) || continue
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout 300 python3 -m torch.distributed.run --standalone \
        --nproc-per-node $n bench/reference/hf_llama.py --config bench/configs/llama_1b/config.json --steps 10 \
        --warmup 3 --modes compile > "$out/torch_llama_$n.log" 2>&1
      grep "^| transformers" "$out/torch_llama_$n.log" | tail -1
    done
  fi
fi
if want zero; then  # the price of sharding: GPT-2 124M, DDP vs ZeRO-2 vs ZeRO-3, eager and compiled
  # ZERO_WORLDS picks the world sizes (default "2 4"), ZERO_ROWS the rows (default all, in this order).
  zrows=${ZERO_ROWS:-one ddp z2 z3 z3keep ddp_compiled z2_compiled z3_compiled}
  zero_row() {  # zero_row N ROW
    case $2 in
      ddp) gpt2 $1 zero_ddp_$1 ;;
      z2) gpt2 $1 zero_z2_$1 --zero-stage 2 ;;
      z3) gpt2 $1 zero_z3_$1 --zero-stage 3 ;;
      z3keep) gpt2 $1 zero_z3keep_$1 --zero-stage 3 --keep-after-forward ;;
      z3noprefetch) gpt2 $1 zero_z3noprefetch_$1 --zero-stage 3 --no-prefetch ;;
      ddp_compiled) gpt2 $1 zero_ddp_compiled_$1 --compile default --timeline ;;
      z2_compiled) gpt2 $1 zero_z2_compiled_$1 --compile default --timeline --zero-stage 2 ;;
      z3_compiled) gpt2 $1 zero_z3_compiled_$1 --compile default --timeline --zero-stage 3 ;;
      z3keep_compiled) gpt2 $1 zero_z3keep_compiled_$1 --compile default --timeline --zero-stage 3 --keep-after-forward ;;
    esac
  }
  [[ " $zrows " == *" one "* ]] && gpt2 1 zero_one_1
  for n in ${ZERO_WORLDS:-2 4}; do
    (( n <= gpus )) || continue
    for r in $zrows; do [[ $r == one ]] || zero_row $n $r; done
  done
fi
if want fsdp8b; then  # Llama-3-8B-shaped full fine-tune: FSDP2 (eager, + torch.compile) vs ingot eager ZeRO-3
  ck=/tmp/ingot-llama8b tok=/tmp/ingot-llama8b-tokens.i32 cfg8=$src/bench/configs/llama_8b/config.json
  # .complete: written after the checkpoint and tokens (transformers may write one file or shards and an index).
  if [[ ! -f $ck/.complete || ! -f $tok ]]; then
    rm -rf "$ck" "$tok"; t1=$(date +%s)
    timeout $(( ${DEADLINE:-540} - ($(date +%s) - start) )) python3 bench/reference/fsdp2_llama.py --config "$cfg8" \
      --make-checkpoint "$ck" --make-tokens "$tok" --rows 128 --seq 2048 > "$out/fsdp8b_make.log" 2>&1 && touch "$ck/.complete"
    echo "fsdp8b checkpoint: $([[ -f $ck/.complete ]] && echo done || echo FAILED), $(( $(date +%s) - t1 )) s"
    tail -2 "$out/fsdp8b_make.log"
  fi
  common8="--batch 2 --seq 2048 --steps 10 --warmup 3"
  for part in ${FSDP8B_PARTS:-ingot eager compile ingot-compiled}; do
    [[ -f $ck/.complete ]] || { echo "fsdp8b: no checkpoint"; break; }
    want fsdp8b || break
    left=$(( ${DEADLINE:-540} - ($(date +%s) - start) )); t1=$(date +%s)
    if [[ $part == ingot* ]]; then
      # A part may end in suffixes, each starting with '+': +coN the same run with --sm-carveout N (Note [SM
      # carve-out], runtime/sm_budget.h); +prof with rank 0's communication timeline and its 40 costliest ops timed
      # by CUDA events (one more step); +ctasN with NCCL held to N CTAs (NCCL_MIN_CTAS=1 NCCL_MAX_CTAS=N); +castc
      # with the gathers' f32 -> bf16 cast on the compute stream (INGOT_GATHER_CAST_ON_COMPUTE=1, Note [Gathers cast
      # on the comm stream]); +eff with NCCL's CTA policy "efficiency"; +rbf16 with gradients reduced in bf16 instead
      # of f32 (half the reduce-scatter bytes; not FSDP2's setting). With CLOCKS=1 each run samples nvidia-smi.
      p=${part%%+*} comp="" envs=() rd=f32
      [[ $p == ingot-compiled ]] && comp="--compile default --cache-dir /tmp/ingot-dist-cache"
      [[ $p == ingot-noprefetch ]] && comp="--no-prefetch"  # eager, each block gathered when used
      IFS=+ read -ra sufs <<< "${part#"$p"}"
      for sf in "${sufs[@]}"; do
        case $sf in
          "") ;;
          prof) comp="$comp --timeline --profile 40 --profile-events" ;;
          co[0-9]*) comp="$comp --sm-carveout ${sf#co}" ;;
          ctas[0-9]*) envs+=(NCCL_MIN_CTAS=1 "NCCL_MAX_CTAS=${sf#ctas}") ;;
          minctas[0-9]*) envs+=("NCCL_MIN_CTAS=${sf#minctas}" "NCCL_MAX_CTAS=${sf#minctas}") ;;
          castc) envs+=(INGOT_GATHER_CAST_ON_COMPUTE=1) ;;
          eff) envs+=(INGOT_NCCL_CTA_POLICY=efficiency) ;;
          keepall) comp="$comp --keep-after-forward" ;;
          gemb) comp="$comp --gather-embeddings" ;;
          keep[0-9]*) comp="$comp --keep-last-blocks ${sf#keep}" ;;
          mb[0-9]*) comp="$comp --memory-budget ${sf#mb}" ;;
          slots) comp="$comp --timeline --timeline-slots" ;;
          rbf16) rd=bf16 ;;
          wire) comp="$comp --reduce-wire-dtype bf16" ;;
          nowire) envs+=(INGOT_NARROW_WIRE=0) ;;
          ata) envs+=(INGOT_NARROW_WIRE=alltoall) ;;
          env:*) envs+=("${sf#env:}") ;;
          *) echo "fsdp8b: unknown part suffix '+$sf' in $part"; continue 2 ;;
        esac
      done
      # ingot-memory: compiled, 2 steps under INGOT_LOGS=memory (the allocation census at rank 0's peak).
      c8=$common8
      if [[ $part == ingot-memory ]]; then
        comp="--compile default --cache-dir /tmp/ingot-dist-cache"; c8="--batch 2 --seq 2048 --steps 2 --warmup 1"
        export INGOT_LOGS=memory
      fi
      smi_start fsdp8b_$part
      env "${envs[@]}" timeout $left ingot launch --nproc-per-node gpu --standalone -- bench_llama_step --checkpoint "$ck" \
        --tokens "$tok" --device cuda --dtype bf16 --params bf16 --zero-stage 3 --reduce-dtype $rd $c8 \
        --losses 10 $comp > "$out/fsdp8b_$part.log" 2>&1
      echo "fsdp8b $part: exit $?, $(( $(date +%s) - t1 )) s"; unset INGOT_LOGS; smi_stop fsdp8b_$part $gpus
      grep -h "^| ingot\|^compile:\|^first step\|error" "$out/fsdp8b_$part.log" | tail -5
      [[ $part == ingot-memory ]] && grep -h -A12 "census of cuda:0" "$out/fsdp8b_$part.log" | tail -13
      [[ $part == *+slots* ]] && grep -h "^timeline" "$out/fsdp8b_$part.log" | tail -12
      [[ $part == *+prof* ]] && { grep -h "^timeline:" "$out/fsdp8b_$part.log"; sed -n '/^op /,/^(/p' "$out/fsdp8b_$part.log" | cut -c1-60,120-; }
    else
      smi_start fsdp8b_$part
      timeout $left python3 -m torch.distributed.run --standalone --nproc-per-node $gpus bench/reference/fsdp2_llama.py \
        --config "$cfg8" --checkpoint "$ck" --tokens "$tok" $common8 --modes $part > "$out/fsdp8b_$part.log" 2>&1
      echo "fsdp8b torch $part: exit $?, $(( $(date +%s) - t1 )) s"; smi_stop fsdp8b_$part $gpus
      grep -h "^| transformers\|^first step\|Error" "$out/fsdp8b_$part.log" | tail -4
    fi
  done
fi
if want fsdp8b_one; then  # the 8B's blocks on one GPU, no communication: what its products cost without NCCL beside
  # them. Random weights (--config), 4 and 8 blocks (the difference / 4 is one block's), compiled default, bf16 over
  # f32 masters, the costliest ops by CUDA events; against the ZeRO-3 x4 +prof table of the same call (issue 22).
  # ONE_RUNS: "LAYERS[:FLAGS]" words (FLAGS with ',' for spaces), e.g. ONE_RUNS="8 8:--memory-budget,0.5".
  i=0
  for run in ${ONE_RUNS:-4 8}; do
    want fsdp8b_one || break
    l=${run%%:*} flags=""; [[ $run == *:* ]] && flags=${run#*:}; flags=${flags//,/ }; i=$((i + 1)); tag=${l}_$i
    smi_start fsdp8b_one_$tag
    left=$(( ${DEADLINE:-540} - ($(date +%s) - start) )); (( left > 150 )) && left=150
    CUDA_VISIBLE_DEVICES=0 timeout $left bench_llama_step --config "$src/bench/configs/llama_8b/config.json" --layers $l \
      --device cuda --dtype bf16 --params bf16 --batch 2 --seq 2048 --steps 10 --warmup 3 --compile default \
      --cache-dir /tmp/ingot-dist-cache --profile 40 --profile-events $flags > "$out/fsdp8b_one_$tag.log" 2>&1
    echo "fsdp8b_one layers $l $flags: exit $?"; smi_stop fsdp8b_one_$tag 1
    grep -h "^| ingot" "$out/fsdp8b_one_$tag.log" | tail -1
    sed -n '/^op /,/^(/p' "$out/fsdp8b_one_$tag.log" | head -14 | cut -c1-60,120-
  done
fi
echo "total: $(( $(date +%s) - t0 )) s"
