#!/usr/bin/env bash
# LoRA fine-tune of a Llama-3-8B-shaped checkpoint on one lent GPU (issue 24), all in one call: build `ingot` (from
# .device/src.tar.xz or src.tgz when present, else this checkout) with scripts/device_build.sh, write a random bf16
# checkpoint and BATCH rows of random token ids when $WORK lacks them (bench/reference/peft_lora.py
# --make-checkpoint; kept between calls on a warm machine), then on the SAME checkpoint and tokens: transformers +
# peft (eager and torch.compile) and ingot's `lora_finetune` (bench/configs/llama_8b/lora_finetune.yaml, compiled
# and eager), same batch, seq, r, alpha, targets, lr and steps. Each run prints one row: ms/step and tokens/s
# (median of the steps after warm-up), peak GB (steady: the largest per-step peak after the first step; ingot's
# from metrics.jsonl, its allocator's per-step peak, with the first step's beside it), the first step's seconds
# and the losses of the first steps (with BATCH rows every step trains on the same batch: they compare one to one).
# Logs: $OUT/logs.tgz (or ./out/logs.tgz); the rows are printed as they come.
#   scripts/device_lora.sh [peft] [peft_eager] [ingot] [qlora] [qlora_ckpt] [qlora_mlp] [ckpt] [mlp] [text50]
#                          [ingot_eager] [memory]
#                          [budget] [long] [long_eager] [long_plain] [full] [full_adamw] [full_masters] [full_f32]
#                          [full_torch] [full_ddp] [full_zero3] [full_zero3_nockpt] [full_zero3_masters]
#                          [full_zero3_resume] [full_fsdp2] [full_inbwd] [full_inbwd_eager] [full_torch_inbwd]
#                          [full_offload] [full_offload_24g] [full_offload_compiled] [full_offload_compiled_24g]
#                              (default: ingot peft budget ingot_eager; they run in the order ingot, qlora, qlora_ckpt, qlora_mlp, mlp, ckpt,
#                              text50, peft, budget, ingot_eager, peft_eager, long, long_eager, long_plain, memory while
#                              DEADLINE allows)
#   peft: peft + torch.compile; peft_eager: peft eager
#   full: a full fine-tune on the one GPU (bench/configs/llama_8b/full_finetune.yaml: bf16 weights without f32
#         masters, rounded stochastically; AdamW8bit; every block checkpointed), compiled; full_adamw: the same
#         with AdamW's f32 state; full_inbwd(_eager): full (eager) with train.optimizer_in_backward;
#         full_torch_inbwd: full_torch with torchtune's optimizer_in_bwd; full_offload: full_inbwd_eager with
#         the optimizer's state in host memory (train.optimizer_offload); full_offload_24g: full_offload within
#         INGOT_CUDA_MEMORY_LIMIT_GIB=23; full_offload_compiled(_24g): the same compiled; full_masters: the same as full through f32 masters; full_f32: all in f32 (the losses rounding should
#         follow); full_torch: PyTorch's pure-bf16 full fine-tune (peft_lora.py --full --grad-ckpt:
#         bf16 weights and AdamW state, gradient checkpointing, torch.compile), lr 1e-5 as the yaml;
#         full_ddp: full under `ingot launch --nproc-per-node gpu` (plain DDP; BATCH is the global batch)
#         full_zero3: full under ZeRO-3 on every GPU (bf16 shards updated in place, AdamW8bit on the shards,
#         gradients reduced in bf16; BATCH global), full_zero3_nockpt: the same without activation checkpointing;
#         full_zero3_masters: ZeRO-3 with f32 masters and f32 AdamW state (f32 reduction), checkpointed;
#         full_zero3_resume: full_zero3, then stopped at step 4 with a checkpoint and resumed (losses side by side;
#         RESUME_GPUS, e.g. "0,1": also resumed on those GPUs alone, another world size, the moments decoded);
#         full_fsdp2: torchtune's recipe under torchrun on every GPU (bench/reference/fsdp2_llama.py --pure-bf16
#         --grad-ckpt: FSDP2 over bf16 parameters, bf16 AdamW state, per-layer checkpointing and torch.compile)
#   autotune / autotune_nocg / overhead: ingot compiled in max-autotune (cuBLASLt candidates timed per product
#         shape, CUDA graphs), max-autotune-no-cudagraphs, reduce-overhead
#   memory: ingot compiled with INGOT_LOGS=memory (what is alive at the peak), 2 steps
#   qlora_ckpt / ckpt: qlora / ingot with train.activation_checkpointing=blocks (only each block's input kept)
#   qlora_mlp / mlp: qlora / ingot with train.activation_checkpointing=mlp (Note [MLP checkpointing]: the MLP's
#         up-projections and activation run again in the backward)
#   qlora: ingot compiled with lora.quantize_base=nf4 (the frozen base in NF4, block 64, double-quantized absmax)
#   budget: ingot compiled with compile.memory_budget=$BUDGET (default 0.5: cheap saved values, the SwiGLU's silu,
#           are recomputed in the backward)
#   long: ingot compiled at batch 1 x $LONG_SEQ (default 8192) with train.activation_checkpointing=blocks (each
#         decoder block keeps its input only and runs its forward again in the backward), on a row of random ids
#         made on the device; long_eager: the same eagerly; long_plain: compiled without checkpointing (may not fit)
#   text50: the issue's QLoRA target "loss within 2% of bf16 LoRA after 50 steps on real text": bf16 LoRA and QLoRA
#           (nf4), both compiled, TEXT_STEPS (50) steps of BATCH x SEQ rows of real English (KJV) tokenized with the
#           Llama 3 tokenizer, read from TEXT_TOKENS (.device/text50_tokens.bin.xz, or an uncompressed .bin). One
#           pass over its rows: a different batch every step, in the same order in both runs (the loader's shuffle
#           is seeded by the config's seed), constant lr as the config has it. Prints a line per run (losses at
#           steps 1, 10, 25, 50 and the mean of the last 5) and `text50: qlora/bf16 loss after 50 steps = X`.
#           The token file is made on a CPU machine, where data/ holds the tokenizer and the text
#           (scripts/get_tokenizers.sh, scripts/get_data.sh; the tokenizer.json is too large to travel):
#             cmake --build build-ft --target bench_token_rows -j2 && build-ft/bin/bench_token_rows \
#               --tokenizer data/tokenizers/llama3 --text data/kjv.txt --seq 2048 --rows 100 \
#               --out .device/text50_tokens.bin && xz -9f .device/text50_tokens.bin
#           (100 rows of 2049 int32 ids, BOS then consecutive KJV text from Genesis 1:1: 819,600 bytes, 158 KB
#           as xz); carry .device/text50_tokens.bin.xz. Rows must be TEXT_STEPS x BATCH of SEQ + 1 ids.
#           TEXT_QLORA_EXTRA: more key=value for the QLoRA run only (e.g. train.activation_checkpointing=mlp).
# Environment: CONFIG (the model's config.json, default bench/configs/llama_8b/config.json; bench/configs/qwen3_8b's
# is Qwen3-8B's shape, whose q/k norms ingot and transformers both run), LAYERS (decoder layers, default the config's: 32 for
# the Llama, 36 for the Qwen3), BATCH (2), SEQ (2048), STEPS (timed, 5), WARMUP
# (3, the first included), WORK (/tmp/ingot-lora), DEADLINE (540 s), INGOT_EXTRA (more key=value for ingot runs),
# PEFT_EXTRA (more arguments for peft_lora.py, e.g. "--dtype f32" beside INGOT_EXTRA="dtype=f32": a parity check),
# INGOT_BUILD (a build directory with bin/ingot already built: nothing is built; a CPU dry run uses it).
set -uo pipefail
final="${OUT:-out}"; mkdir -p "$final"
out=$(mktemp -d /tmp/ingot-lora-logs.XXXX)
trap 'tar czf "$final/logs.tgz" -C "$out" .' EXIT
start=$(date +%s)
want() {
  local w found=1; for w in "${steps[@]}"; do [[ "$w" == "$1" ]] && found=0; done
  (( found == 0 )) || return 1
  (( $(date +%s) - start < ${DEADLINE:-540} )) || { echo "skipped $1: out of time"; return 1; }
}
steps=("$@"); [[ ${#steps[@]} -eq 0 ]] && steps=(ingot peft budget ingot_eager)
LAYERS=${LAYERS:-} BATCH=${BATCH:-2} SEQ=${SEQ:-2048} STEPS=${STEPS:-5} WARMUP=${WARMUP:-3}
WORK=${WORK:-/tmp/ingot-lora}; mkdir -p "$WORK"
nvidia-smi -L | tee "$out/gpu.txt"
src=$PWD
for snap in .device/src.tar.xz .device/src.tgz; do
  if [[ -f $snap ]]; then src=/tmp/ingot-src; rm -rf $src; mkdir -p $src; tar xf $snap -C $src; break; fi
done
t0=$(date +%s)
build=${INGOT_BUILD:-/tmp/ingot-build}
if [[ -n ${INGOT_BUILD:-} ]]; then echo "build: using $build/bin/ingot (INGOT_BUILD)"
else
  scripts/device_build.sh "$src" "$build" ingot > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
multi=/opt/deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$multi:$multi/openblas-pthread:${LD_LIBRARY_PATH:-}" PATH="$build/bin:$PATH"
export INGOT_TEST_ROOT=$src INGOT_CONFIG_PATH=$src/configs OMP_WAIT_POLICY=passive

config=$src/${CONFIG:-bench/configs/llama_8b/config.json}
[[ -n $LAYERS ]] || LAYERS=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" "$config")
tag=$(basename "$(dirname "$config")")  # llama_8b, qwen3_8b: each shape its own checkpoint and tokens
ckpt=$WORK/ckpt_${tag}_${LAYERS}l tokens=$WORK/tokens_${tag}_${BATCH}x${SEQ}.bin
ref() { python3 "$src/bench/reference/peft_lora.py" --config "$config" --layers "$LAYERS" --seq "$SEQ" "$@"; }
# The checkpoint and tokens are made whenever they are missing (a fresh machine), whatever steps are named; they
# count as made once written whole (.complete: a call cut off mid-write leaves a config.json before the weights).
if [[ -f $ckpt/.complete && -f $tokens ]]; then echo "make: reusing $ckpt and $tokens"
else
  t=$(date +%s)
  rm -rf "$ckpt"
  ref --make-checkpoint "$ckpt" --make-tokens "$tokens" --rows "$BATCH" > "$out/make.log" 2>&1 \
    || { tail -20 "$out/make.log"; exit 1; }
  touch "$ckpt/.complete"
  echo "make: $(( $(date +%s) - t )) s, $(du -sh "$ckpt" | cut -f1)"
fi

echo "| run | ms/step (median) | tokens/s | peak GB (steady) | first step s | losses of the first steps |"
echo "|---|---|---|---|---|---|"
peft() {  # peft MODE
  ref --checkpoint "$ckpt" --tokens "$tokens" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" --modes "$1" \
    ${PEFT_EXTRA:-} > "$out/peft_$1${PEFT_TAG:-}.log" 2>&1 || tail -5 "$out/peft_$1${PEFT_TAG:-}.log"
  grep -h "^torch " "$out/peft_$1${PEFT_TAG:-}.log" | head -1 >> "$out/versions.txt"
  # The reference's own row has more columns (MFU, peak of the whole run, load time); here the common ones.
  grep -h -e "^| peft" -e "^| torch full" "$out/peft_$1${PEFT_TAG:-}.log" | awk -F'|' '{printf "|%s|%s|%s|%s|%s|%s|\n", $2, $8, $9, $12, $14, $16}'
}
# ingot_row NAME RUN_DIR: the same columns from metrics.jsonl (steps after the warm-up) and the log.
ingot_row() {
  python3 - "$1" "$2/metrics.jsonl" "$WARMUP" <<'EOF'
import json, statistics, sys
name, path, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
recs = [json.loads(l) for l in open(path) if l.strip()]
recs = [r for r in recs if r.get("kind") == "train"]
timed = recs[warmup:] or recs[1:]
rate = statistics.median(r["tokens_per_s"] for r in timed)
tokens = recs[0]["tokens"] / recs[0]["step"]  # per step (the tokens so far; a resumed run starts later)
peak = max(r["peak_memory_bytes"] for r in recs[1:]) if len(recs) > 1 else recs[0]["peak_memory_bytes"]
first, first_peak = recs[0]["time_s"], recs[0]["peak_memory_bytes"]
losses = " ".join("%.4f" % r["loss"] for r in recs[:6])
print(f"| {name} | {tokens / rate * 1e3:.1f} | {rate:.0f} | {peak / 1e9:.2f} (first step {first_peak / 1e9:.2f}) | "
      f"{first:.1f} | {losses} |")
EOF
}
ingot_run() {  # ingot_run NAME key=value... (RECIPE_YAML: another config of bench/configs/llama_8b)
  local name=$1; shift
  (cd "$src" && timeout 400 ${LAUNCH:-} ingot run ${RECIPE_YAML:-bench/configs/llama_8b/lora_finetune.yaml} model.path="$ckpt" \
    data.path="$tokens" data.seq_len="$SEQ" train.batch_size="$BATCH" max_steps=$((WARMUP + STEPS)) \
    output_dir="$WORK/run_$name" compile.cache_dir=/tmp/ingot-lora-cache "$@" ${INGOT_EXTRA:-} \
    --summary "$WORK/run_$name.summary.json") > "$out/ingot_$name.log" 2>&1 || { tail -8 "$out/ingot_$name.log"; return 0; }
  cp "$WORK/run_$name/metrics.jsonl" "$out/ingot_$name.metrics.jsonl" 2>/dev/null
  # A full fine-tune's export is the whole model (16 GB for the 8B): a few would fill the machine's disk.
  [[ -n ${RECIPE_YAML:-} ]] && rm -rf "$WORK/run_$name/hf"
  cp "$WORK/run_$name.summary.json" "$out/" 2>/dev/null
  ingot_row "ingot $name" "$WORK/run_$name"
}
want ingot && ingot_run compiled compile.enabled=true
want autotune && ingot_run max_autotune compile.enabled=true compile.mode=max-autotune
want autotune_nocg && ingot_run max_autotune_nocg compile.enabled=true compile.mode=max-autotune-no-cudagraphs
want overhead && ingot_run reduce_overhead compile.enabled=true compile.mode=reduce-overhead
want qlora && ingot_run qlora compile.enabled=true lora.quantize_base=nf4
want qlora_ckpt && ingot_run qlora_ckpt compile.enabled=true lora.quantize_base=nf4 train.activation_checkpointing=blocks
want qlora_mlp && ingot_run qlora_mlp compile.enabled=true lora.quantize_base=nf4 train.activation_checkpointing=mlp
want mlp && ingot_run compiled_mlp compile.enabled=true train.activation_checkpointing=mlp
want ckpt && ingot_run compiled_ckpt compile.enabled=true train.activation_checkpointing=blocks
want full && RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full compile.enabled=true
# full_inbwd: full with each parameter updated in its backward (train.optimizer_in_backward): no step holds all 16 GB
# of gradients; full_inbwd_eager: the same eagerly; full_torch_inbwd: PyTorch's with torchtune's optimizer_in_bwd.
want full_inbwd && RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full_inbwd compile.enabled=true \
  train.optimizer_in_backward=true
want full_inbwd_eager && RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full_inbwd_eager \
  train.optimizer_in_backward=true
# full_offload: full_inbwd_eager with AdamW8bit's state in page-locked host memory (train.optimizer_offload).
want full_offload && RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full_offload \
  train.optimizer_in_backward=true train.optimizer_offload=true
# full_offload_24g: the same with the allocator held to 23 GiB (a 24 GB card less its CUDA context).
want full_offload_24g && INGOT_CUDA_MEMORY_LIMIT_GIB=23 RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml \
  ingot_run full_offload_24g train.optimizer_in_backward=true train.optimizer_offload=true
# full_offload_compiled(_24g): the same compiled (each update's state bound just in time; the first step eager).
want full_offload_compiled && RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full_offload_compiled \
  compile.enabled=true train.optimizer_in_backward=true train.optimizer_offload=true
want full_offload_compiled_24g && INGOT_CUDA_MEMORY_LIMIT_GIB=23 RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml \
  ingot_run full_offload_compiled_24g compile.enabled=true train.optimizer_in_backward=true train.optimizer_offload=true
want full_adamw && RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full_adamw compile.enabled=true \
  optimizer.name=adamw
want full_masters && RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full_masters compile.enabled=true \
  train.master_weights=true
want full_f32 && RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full_f32 compile.enabled=true \
  train.master_weights=true dtype=f32
# Plain DDP on the machine's GPUs (BATCH: the global batch, e.g. 4 for 2 x 2048 per GPU on two).
want full_ddp && LAUNCH="ingot launch --nproc-per-node gpu --" RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml \
  ingot_run full_ddp compile.enabled=true
# ZeRO-3 on the machine's GPUs: about 6 bytes a parameter over the GPUs (bf16 shard, its bf16 gradient, 8-bit moments).
zero3=(distributed.zero_stage=3 distributed.reduce_dtype=bf16 compile.enabled=true)
want full_zero3 && LAUNCH="ingot launch --nproc-per-node gpu --" RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml \
  ingot_run full_zero3 "${zero3[@]}"
want full_zero3_nockpt && LAUNCH="ingot launch --nproc-per-node gpu --" \
  RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full_zero3_nockpt "${zero3[@]}" \
  train.activation_checkpointing=none
# full_zero3_resume: full_zero3 for WARMUP + STEPS steps, the same stopped after 4 steps with a sharded checkpoint,
# and a run resumed from it: the resumed run's losses beside the uninterrupted one's, the checkpoint's size and each
# run's wall time (loading, compiling, the checkpoint write and the final export included).
if want full_zero3_resume; then
  for leg in full_zero3 "full_zero3_stop checkpoint.save_every=4 max_steps=4" \
             "full_zero3_resumed resume_from=$WORK/run_full_zero3_stop/checkpoints/step_00000004"; do
    t=$(date +%s)
    # shellcheck disable=SC2086
    LAUNCH="ingot launch --nproc-per-node gpu --" RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml \
      ingot_run ${leg%% *} "${zero3[@]}" $( [[ $leg == *" "* ]] && echo "${leg#* }" )
    echo "${leg%% *}: $(( $(date +%s) - t )) s wall"
  done
  legs=(full_zero3_resumed)
  if [[ -n ${RESUME_GPUS:-} ]]; then
    t=$(date +%s)
    CUDA_VISIBLE_DEVICES=$RESUME_GPUS LAUNCH="ingot launch --nproc-per-node $(tr ',' '\n' <<< "$RESUME_GPUS" | wc -l) --" \
      RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full_zero3_resumed_on "${zero3[@]}" \
      resume_from="$WORK/run_full_zero3_stop/checkpoints/step_00000004"
    echo "full_zero3_resumed_on GPUs $RESUME_GPUS: $(( $(date +%s) - t )) s wall"
    legs+=(full_zero3_resumed_on)
  fi
  du -sh "$WORK/run_full_zero3_stop/checkpoints/step_00000004" 2>/dev/null
  grep -h "^checkpoint |" "$out/ingot_full_zero3_stop.log"
  for leg in "${legs[@]}"; do
    grep -h "^checkpoint |" "$out/ingot_$leg.log"
    python3 - "$WORK/run_full_zero3/metrics.jsonl" "$WORK/run_$leg/metrics.jsonl" "$leg" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if r.get("kind") == "train"}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
for step in sorted(b):
    print(f"resume ({sys.argv[3]}): step {step}: uninterrupted {a.get(step, float('nan')):.6f} resumed {b[step]:.6f}")
PY
  done
  rm -rf "$WORK/run_full_zero3_stop/checkpoints"
fi
# The same with f32 masters and f32 AdamW state over the shards (16 bytes a parameter over the GPUs, FSDP2's layout).
want full_zero3_masters && LAUNCH="ingot launch --nproc-per-node gpu --" \
  RECIPE_YAML=bench/configs/llama_8b/full_finetune.yaml ingot_run full_zero3_masters distributed.zero_stage=3 \
  compile.enabled=true train.master_weights=true optimizer.name=adamw
if want full_fsdp2; then
  ngpu=$(nvidia-smi -L | wc -l)
  timeout 400 python3 -m torch.distributed.run --standalone --nproc-per-node "$ngpu" \
    "$src/bench/reference/fsdp2_llama.py" --config "$config" --layers "$LAYERS" --checkpoint "$ckpt" \
    --tokens "$tokens" --batch $((BATCH / ngpu)) --seq "$SEQ" --steps "$STEPS" --warmup "$WARMUP" --modes compile \
    --pure-bf16 --grad-ckpt > "$out/fsdp2_full.log" 2>&1 || tail -5 "$out/fsdp2_full.log"
  grep -h "^| transformers\|^first step" "$out/fsdp2_full.log"
fi
want full_torch && PEFT_TAG=_full PEFT_EXTRA="${PEFT_EXTRA:-} --full --grad-ckpt --lr 1e-5" peft compile
want full_torch_inbwd && PEFT_TAG=_full_inbwd PEFT_EXTRA="${PEFT_EXTRA:-} --full --grad-ckpt --optim-in-bwd --lr 1e-5" \
  peft compile
TEXT_STEPS=${TEXT_STEPS:-50} TEXT_TOKENS=${TEXT_TOKENS:-.device/text50_tokens.bin.xz}
# text50_row NAME METRICS [BF16_METRICS]: the run's losses at steps 1, 10, 25, TEXT_STEPS (and the mean of the
# last 5), its tokens/s and peak; with BF16_METRICS also the ratio of its last losses to bf16's.
text50_row() {
  python3 - "$TEXT_STEPS" "$@" <<'EOF'
import json, statistics, sys
steps, name, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def train_records(p):
    recs = [json.loads(l) for l in open(p) if l.strip()]
    return [r for r in recs if r.get("kind") == "train"]
recs = train_records(path)
if len(recs) < steps:
    print(f"text50 {name}: only {len(recs)} of {steps} steps logged")
    sys.exit(0)
loss = [r["loss"] for r in recs[:steps]]
at = ", ".join(f"{s}: {loss[s - 1]:.4f}" for s in sorted({1, 10, 25, steps}) if s <= steps)
last5 = statistics.mean(loss[-5:])
rate = statistics.median(r["tokens_per_s"] for r in recs[1:steps]) if steps > 1 else recs[0]["tokens_per_s"]
peak = max(r["peak_memory_bytes"] for r in recs[:steps])
print(f"text50 {name}: loss at steps {at}; mean of steps {max(1, steps - 4)}-{steps}: {last5:.4f} "
      f"({rate:.0f} tokens/s median after the first step, peak {peak / 1e9:.2f} GB)")
if len(sys.argv) > 4:
    ref = [r["loss"] for r in train_records(sys.argv[4])[:steps]]
    if len(ref) == steps:
        print(f"text50: qlora/bf16 loss after {steps} steps = {loss[-1] / ref[-1]:.4f} (target within 2%; "
              f"mean of steps {max(1, steps - 4)}-{steps}: {last5 / statistics.mean(ref[-5:]):.4f})")
EOF
}
text50_run() {  # text50_run NAME key=value...: TEXT_STEPS compiled steps on the text rows
  local name=$1; shift
  (cd "$src" && timeout 400 ingot run bench/configs/llama_8b/lora_finetune.yaml model.path="$ckpt" \
    data.path="$text_tokens" data.seq_len="$SEQ" train.batch_size="$BATCH" max_steps="$TEXT_STEPS" \
    output_dir="$WORK/run_text50_$name" compile.enabled=true compile.cache_dir=/tmp/ingot-lora-cache "$@" \
    ${INGOT_EXTRA:-}) > "$out/text50_$name.log" 2>&1 || { tail -8 "$out/text50_$name.log"; return 1; }
  cp "$WORK/run_text50_$name/metrics.jsonl" "$out/text50_$name.metrics.jsonl"
}
if want text50; then
  text_tokens=$WORK/text50_tokens_${SEQ}.bin
  rm -f "$text_tokens"  # never an earlier call's rows when TEXT_TOKENS is missing
  if [[ $TEXT_TOKENS == *.xz ]]; then xz -dc "$TEXT_TOKENS" > "$text_tokens"; else cp "$TEXT_TOKENS" "$text_tokens"; fi
  if [[ ! -s $text_tokens ]]; then echo "text50: no tokens in $TEXT_TOKENS (see this script's header to make them)"
  else
    rows=$(( $(stat -c %s "$text_tokens") / 4 / (SEQ + 1) ))
    (( rows >= TEXT_STEPS * BATCH )) \
      || echo "text50: $TEXT_TOKENS has $rows rows of $((SEQ + 1)) ids, fewer than $TEXT_STEPS x $BATCH: rows repeat"
    if text50_run bf16; then
      text50_row "bf16 LoRA" "$WORK/run_text50_bf16/metrics.jsonl"
      text50_run qlora lora.quantize_base=nf4 ${TEXT_QLORA_EXTRA:-} \
        && text50_row "QLoRA nf4" "$WORK/run_text50_qlora/metrics.jsonl" "$WORK/run_text50_bf16/metrics.jsonl"
    fi
  fi
fi
want peft && peft compile
want budget && ingot_run "budget_${BUDGET:-0.5}" compile.enabled=true compile.memory_budget="${BUDGET:-0.5}"
want ingot_eager && ingot_run eager compile.enabled=false
want peft_eager && peft eager
LONG_SEQ=${LONG_SEQ:-8192}
long_tokens=$WORK/tokens_1x${LONG_SEQ}.bin
long_run() {  # long_run NAME key=value...: batch 1 x LONG_SEQ on its own token row (fsdp2_llama.write_tokens)
  if [[ ! -f $long_tokens ]]; then
    python3 - "$src/bench/reference" "$config" "$LONG_SEQ" "$long_tokens" > "$out/long_tokens.log" 2>&1 <<'EOF2' \
      || { tail -5 "$out/long_tokens.log"; return 0; }
import json, sys, types
sys.path.insert(0, sys.argv[1])
import fsdp2_llama
cfg = types.SimpleNamespace(vocab_size=json.load(open(sys.argv[2]))["vocab_size"])
fsdp2_llama.write_tokens(types.SimpleNamespace(rows=1, seq=int(sys.argv[3]), make_tokens=sys.argv[4]), cfg)
EOF2
  fi
  local name=$1; shift
  ingot_run "$name" data.path="$long_tokens" data.seq_len="$LONG_SEQ" train.batch_size=1 "$@"
}
want long && long_run "long_${LONG_SEQ}_ckpt" compile.enabled=true train.activation_checkpointing=blocks
want long_eager && long_run "long_${LONG_SEQ}_ckpt_eager" compile.enabled=false train.activation_checkpointing=blocks
want long_plain && long_run "long_${LONG_SEQ}_plain" compile.enabled=true
if want memory; then
  (cd "$src" && INGOT_LOGS=memory timeout 300 ingot run bench/configs/llama_8b/lora_finetune.yaml model.path="$ckpt" \
    data.path="$tokens" data.seq_len="$SEQ" train.batch_size="$BATCH" max_steps=2 output_dir="$WORK/run_memory" \
    compile.enabled=true compile.cache_dir=/tmp/ingot-lora-cache ${INGOT_EXTRA:-}) > "$out/ingot_memory.log" 2>&1
  grep -iE "peak|alive" "$out/ingot_memory.log" | head -40
fi
cat "$out/versions.txt" 2>/dev/null | sort -u
echo "total: $(( $(date +%s) - t0 )) s"
