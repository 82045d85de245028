#!/usr/bin/env bash
# Before / after on one lent GPU (issue 23's guard rail: "behaviour and speed unchanged"), all in one call: build
# bench_gpt2_step and bench_llama_step from two source snapshots with scripts/device_build.sh, then run the GPT-2
# 124M table (eager, default, reduce-overhead, max-autotune at batch 16 and 4, seq 1024, bf16) and the ~1B Llama
# step (bench/configs/llama_1b, 2 x 2048, compiled default) alternating old, new, old, new for each row on the same
# GPU, each tree with its own compile cache. Prints one row per configuration: the medians of each run, the mean of
# each side and new / old - 1; full logs in $OUT/logs.tgz.
#   scripts/device_ab.sh OLD_SNAPSHOT NEW_SNAPSHOT   (each a `git archive | xz` tarball, e.g. .device/old.tar.xz)
# A second call on the same warm machine reuses the builds and caches (run the rows left with ROWS=...).
# Environment: ROWS (default all: "eager16 default16 ro16 ma16 eager4 default4 ro4 ma4 llama"), REPEATS (2),
# DEADLINE (seconds after start at which no new row starts, default 540).
set -uo pipefail
final="${OUT:-out}"; mkdir -p "$final"
out=$(mktemp -d /tmp/ingot-ab-logs.XXXX)
trap 'tar czf "$final/logs.tgz" -C "$out" .' EXIT
start=$(date +%s)
old_snap=$1 new_snap=$2
nvidia-smi -L | tee "$out/gpu.txt"
for side in old new; do
  snap=$old_snap; [[ $side == new ]] && snap=$new_snap
  # Extracted again only when the snapshot changed (new mtimes would rebuild everything on a warm machine).
  sum=$(md5sum < "$snap")
  if [[ "$(cat /tmp/ab-src-$side.md5 2>/dev/null)" != "$sum" ]]; then
    rm -rf /tmp/ab-src-$side; mkdir -p /tmp/ab-src-$side; tar xf "$snap" -C /tmp/ab-src-$side
    echo "$sum" > /tmp/ab-src-$side.md5
  fi
  t=$(date +%s)
  scripts/device_build.sh /tmp/ab-src-$side /tmp/ab-build-$side bench_gpt2_step bench_llama_step \
    > "$out/build_$side.log" 2>&1 || { tail -30 "$out/build_$side.log"; exit 1; }
  echo "build $side: $(( $(date +%s) - t )) s"
done
multi=/opt/deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$multi:$multi/openblas-pthread:${LD_LIBRARY_PATH:-}" OMP_WAIT_POLICY=passive

args_of() {  # the bench command line of a row (without the binary)
  local gpt="--device cuda --dtype bf16 --seq 1024 --steps 20 --warmup 5"
  case $1 in
    eager16) echo "$gpt --batch 16" ;;
    default16) echo "$gpt --batch 16 --compile default" ;;
    ro16) echo "$gpt --batch 16 --compile reduce-overhead" ;;
    ma16) echo "$gpt --batch 16 --compile max-autotune" ;;
    eager4) echo "$gpt --batch 4" ;;
    default4) echo "$gpt --batch 4 --compile default" ;;
    ro4) echo "$gpt --batch 4 --compile reduce-overhead" ;;
    ma4) echo "$gpt --batch 4 --compile max-autotune" ;;
    llama) echo "--config /tmp/ab-src-new/bench/configs/llama_1b/config.json --device cuda --dtype bf16 --batch 2
      --seq 2048 --steps 10 --warmup 3 --compile default" ;;
  esac
}
# The median ms/step of a bench log: column 7 of its '| ingot' row (both benches print it there).
ms_of() { grep -h "^| ingot" "$1" | tail -1 | awk -F'|' '{gsub(/ /, "", $7); print $7}'; }

echo "| row | old ms/step (runs) | new ms/step (runs) | new / old - 1 |"
echo "|---|---|---|---|"
for row in ${ROWS:-eager16 default16 ro16 ma16 eager4 default4 ro4 ma4 llama}; do
  (( $(date +%s) - start < ${DEADLINE:-540} )) || { echo "skipped $row: out of time"; continue; }
  bin=bench_gpt2_step; [[ $row == llama ]] && bin=bench_llama_step
  declare -A runs=([old]="" [new]="")
  for ((i = 1; i <= ${REPEATS:-2}; i++)); do
    for side in old new; do
      log="$out/${row}_${side}_$i.log"
      (cd /tmp/ab-src-$side && timeout 150 /tmp/ab-build-$side/bin/$bin $(args_of $row) \
        --cache-dir /tmp/ab-cache-$side > "$log" 2>&1)
      runs[$side]="${runs[$side]} $(ms_of "$log")"
    done
  done
  python3 - "$row" "${runs[old]}" "${runs[new]}" <<'EOF'
import sys
row, old, new = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def mean(v):
    v = [float(x) for x in v if x.replace('.', '', 1).isdigit()]
    return sum(v) / len(v) if v else float('nan')
o, n = mean(old), mean(new)
print(f"| {row} | {o:.2f} ({', '.join(old)}) | {n:.2f} ({', '.join(new)}) | {100 * (n / o - 1):+.2f}% |")
EOF
done
echo "total: $(( $(date +%s) - start )) s"
