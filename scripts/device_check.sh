#!/usr/bin/env bash
# The GPU check run on a lent GPU machine (see bench/RESULTS.md for results): CUDA tests, the GPT-2 eager step
# benchmark next to PyTorch eager and torch.compile on the same GPU, and (optionally) the HF reference fixtures.
# Expects a bundle made here with: shared/device/bundle.sh .device build-cuda/bin/{ingot_tests,bench_gpt2_step,...}
#   scripts/device_check.sh [gpu] [tests] [bench] [fixtures] [hf] [llama] [profile]   (default: tests bench); logs to $OUT
#   gpu: only the GPU suites; tests: the whole ingot_tests
#   hf: transformers/peft load ingot's exports; make them here first (CPU) and carry them packed:
#       INGOT_HF_EXPORT_DIR=/tmp/hfx ingot_tests --gtest_filter='HFExport.*:Finetune.Exports*:LoRA.Peft*'
#       tar czf .device/hfx.tgz -C /tmp hfx
#   llama: ~1B Llama full fine-tune step (bench_llama_step) next to transformers eager and torch.compile
#   profile: GPU time per kernel of one compiled GPT-2 step (ncu) next to torch.compile's (torch.profiler)
set -uo pipefail
out="${OUT:-out}"; mkdir -p "$out"
# The bundle may travel packed (the carry limit is 64 MiB).
if [[ -f .device/bundle.tgz ]]; then tar xzf .device/bundle.tgz -C .device; fi
source .device/env.sh
export INGOT_TEST_ROOT=$PWD  # tests find configs and fixtures in this checkout (tests/test_root.h)
nvidia-smi -L | tee "$out/gpu.txt"
want() { [[ $# -eq 0 ]] && return 0; local w; for w in "${steps[@]}"; do [[ "$w" == "$1" ]] && return 0; done; return 1; }
steps=("$@"); [[ ${#steps[@]} -eq 0 ]] && steps=(tests bench)

if want fixtures; then
  mkdir -p /tmp/tok && tar xzf .device/tok.tgz -C /tmp/tok
  python3 tests/fixtures/make_fixtures.py --tokenizers /tmp/tok --out "$out/fixtures" > "$out/fixtures.log" 2>&1
  tail -12 "$out/fixtures.log"
fi
if want gpu; then
  # Only the GPU suites (CUDA kernels vs CPU, CUDA codegen, compiled GPU steps, models on CUDA), one process per
  # suite so that a crash in one still reports the others.
  for f in 'CompileCudaStep*' 'CodegenCuda*' 'Cuda*' 'ModelsCuda*'; do
    log="$out/gpu_${f%%\**}.log"
    INGOT_CRASH_BACKTRACE=1 timeout 300 ingot_tests --gtest_filter="$f" > "$log" 2>&1; rc=$?
    echo "== $f: exit $rc"; grep -E "^\[  FAILED|^\[  PASSED|^\[ compare|^\[ kernels|Failure" "$log" | head -20
    [[ $rc -eq 0 ]] || tail -40 "$log"
  done
fi
if want tests; then
  ingot_tests --gtest_brief=1 > "$out/tests.log" 2>&1; echo "ingot_tests exit $?"
  grep -E "FAILED|PASSED|SKIPPED \[" "$out/tests.log" | tail -25
fi
if want bench; then
  # ingot eager, ingot compiled (cold cache, then warm cache in a second process), then PyTorch eager and
  # torch.compile, all in this call on this GPU.
  for b in 16 4; do
    bench_gpt2_step --device cuda --dtype bf16 --batch $b --seq 1024 --steps 20 --warmup 5 \
      > "$out/bench_ingot_b$b.log" 2>&1; tail -1 "$out/bench_ingot_b$b.log"
    rm -rf /tmp/ingot-bench-cache
    for pass in cold warm; do
      bench_gpt2_step --device cuda --dtype bf16 --batch $b --seq 1024 --steps 20 --warmup 5 --compile default \
        --cache-dir /tmp/ingot-bench-cache > "$out/bench_ingot_compile_${pass}_b$b.log" 2>&1
      echo "($pass cache)"; tail -2 "$out/bench_ingot_compile_${pass}_b$b.log"
    done
    bench_gpt2_step --device cuda --dtype bf16 --batch $b --seq 1024 --steps 20 --warmup 5 --compile reduce-overhead \
      --cache-dir /tmp/ingot-bench-cache > "$out/bench_ingot_ro_b$b.log" 2>&1
    echo "(reduce-overhead)"; tail -3 "$out/bench_ingot_ro_b$b.log"
    bench_gpt2_step --device cuda --dtype bf16 --batch $b --seq 1024 --steps 20 --warmup 5 --compile max-autotune \
      --cache-dir /tmp/ingot-bench-cache > "$out/bench_ingot_ma_b$b.log" 2>&1
    echo "(max-autotune: tuning + CUDA graphs)"; tail -3 "$out/bench_ingot_ma_b$b.log"
    # Regional compilation: repeated blocks compiled once (compare first call and step with the default rows).
    rm -rf /tmp/ingot-bench-regional
    for pass in cold warm; do
      bench_gpt2_step --device cuda --dtype bf16 --batch $b --seq 1024 --steps 20 --warmup 5 --compile default \
        --regional --cache-dir /tmp/ingot-bench-regional > "$out/bench_ingot_regional_${pass}_b$b.log" 2>&1
      echo "(regional, $pass cache)"; tail -2 "$out/bench_ingot_regional_${pass}_b$b.log"
    done
    python3 bench/reference/torch_gpt2.py --batch $b --seq 1024 --steps 20 --warmup 5 \
      > "$out/bench_torch_b$b.log" 2>&1; tail -4 "$out/bench_torch_b$b.log"
  done
fi
if want hf; then
  tar xzf .device/hfx.tgz -C /tmp
  python3 tests/fixtures/check_hf_export.py /tmp/hfx > "$out/hf_check.log" 2>&1; echo "check_hf_export exit $?"
  grep -E "OK|FAIL|checked" "$out/hf_check.log"
fi
if want profile; then
  # One step between cudaProfilerStart/Stop under ncu (no per-op synchronization), summed by kernel name.
  ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
    bench_gpt2_step --device cuda --dtype bf16 --batch 16 --seq 1024 --steps 1 --warmup 1 --compile default \
    --profiler-range > "$out/ncu_gpt2.csv" 2> "$out/ncu_gpt2.err"
  python3 bench/reference/ncu_summary.py "$out/ncu_gpt2.csv" 40
  python3 bench/reference/torch_gpt2.py --batch 16 --seq 1024 --steps 10 --warmup 3 --modes compile --kernels 40 \
    2>&1 | grep -v -i warn
fi
if want llama; then
  c=bench/configs/llama_1b/config.json
  bench_llama_step --config $c --device cuda --batch 2 --seq 2048 --steps 20 --warmup 5 2>&1 | tail -1
  bench_llama_step --config $c --device cuda --batch 2 --seq 2048 --steps 20 --warmup 5 --compile default \
    --cache-dir /tmp/ingot-llama-cache 2>&1 | tail -2
  python3 bench/reference/hf_llama.py --config $c --batch 2 --seq 2048 --steps 20 --warmup 5 2>&1 | grep "^|"
fi
