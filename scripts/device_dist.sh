#!/usr/bin/env bash
# Data-parallel scaling on a lent multi-GPU machine (nvidia-h200-x2 / -x4): GPT-2 124M, batch 16 x 1024 per GPU,
# bf16, ingot eager and compiled DDP (all-reduces as graph nodes) under `ingot launch`, NCCL all-reduce
# bandwidth, and PyTorch DDP (eager, torch.compile) under torchrun, all in one call. Logs go to $OUT (or ./out).
# Expects the bundle of scripts/device_check.sh with bin/{ingot,bench_gpt2_step,bench_allreduce}.
#   scripts/device_dist.sh [N ...]        (default: 1 2 4, capped at the GPUs present)
set -uo pipefail
out="${OUT:-out}"; mkdir -p "$out"
if [[ -f .device/bundle.tgz ]]; then tar xzf .device/bundle.tgz -C .device; fi
source .device/env.sh
gpus=$(nvidia-smi -L | wc -l); nvidia-smi -L | head -1
counts=("$@"); [[ ${#counts[@]} -eq 0 ]] && counts=(1 2 4)
bench="--device cuda --dtype bf16 --batch 16 --seq 1024 --steps 20 --warmup 5"
for n in "${counts[@]}"; do
  (( n <= gpus )) || continue
  vis=$(seq -s, 0 $((n - 1)))
  run() { if (( n == 1 )); then CUDA_VISIBLE_DEVICES=$vis "$@"; else CUDA_VISIBLE_DEVICES=$vis ingot launch --nproc-per-node gpu --standalone -- "$@"; fi; }
  if (( n > 1 )); then
    run bench_allreduce --min-mb 32 --max-mb 1024 > "$out/allreduce_$n.log" 2>&1; tail -3 "$out/allreduce_$n.log"
  fi
  run bench_gpt2_step $bench > "$out/eager_$n.log" 2>&1; grep "^| ingot" "$out/eager_$n.log"
  run bench_gpt2_step $bench --compile default --cache-dir /tmp/ingot-dist-cache > "$out/compile_$n.log" 2>&1
  grep "^| ingot\|^compile:" "$out/compile_$n.log"
  CUDA_VISIBLE_DEVICES=$vis python3 -m torch.distributed.run --standalone --nproc-per-node "$n" \
    bench/reference/torch_gpt2.py --batch 16 --modes eager,compile > "$out/torch_$n.log" 2>&1
  grep "^|" "$out/torch_$n.log" | tail -2
done
