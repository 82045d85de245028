#!/usr/bin/env bash
# Bisects a GPU test failure over earlier commits in one device call, building incrementally (only the files that
# differ between points are rebuilt). The checkout that travels is the newest point ("head"); each older point
# travels as a patch made here:
#   for c in C1 C2 ...; do eval git diff --no-renames HEAD $c -- $(scripts/device_bisect.sh --paths) | xz > .device/bisect/$c.patch.xz; done
# On the device:
#   RUNS=2 scripts/device_bisect.sh FILTER C1 C2 ... head      (points oldest first)
# Each point runs FILTER RUNS times in fresh processes; a point is bad when any run fails. The newest and the
# oldest point run first; when the oldest is good and the newest bad, the points between are bisected. Logs and a
# table: $OUT (or ./out). EXTRA_FILTERS (gtest filters) also run at the newest point, for context.
set -uo pipefail
code_paths="autograd bench cmake compile distributed models optim recipes runtime tests tools CMakeLists.txt"
[[ ${1:-} == --paths ]] && { echo "$code_paths ':!tests/fixtures'"; exit 0; }
filter=$1; shift
points=("$@")
out="${OUT:-out}"; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
nvidia-smi -L | tee "$out/gpu.txt"
head=$PWD base=/tmp/bisect-base src=/tmp/bisect-src build=/tmp/bisect-build
multi=/opt/deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$multi:$multi/openblas-pthread:${LD_LIBRARY_PATH:-}"

# The tree of a point: head's code paths with the point's patch applied.
make_tree() {  # make_tree POINT DIR
  rm -rf "$2"; mkdir -p "$2"
  # The newest point: .device/bisect/head.tar.xz when present (`git archive HEAD -- <paths> configs scripts`: a commit,
  # not a working tree that others are editing), else the carried checkout.
  if [[ -f $head/.device/bisect/head.tar.xz ]]; then tar xJf "$head/.device/bisect/head.tar.xz" -C "$2"
  else (cd "$head" && tar cf - --exclude=tests/fixtures --exclude=data $code_paths configs scripts) | tar xf - -C "$2"; fi
  [[ $1 == head ]] && return 0
  python3 -c 'import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$head/.device/bisect/$1.patch.xz" \
    | (cd "$2" && patch -p1 -s -E) || { echo "patch $1 failed"; return 1; }
}
# Copies into $src only the files whose bytes differ (ninja rebuilds by mtime) and removes the ones gone.
sync_tree() {
  python3 - "$1" "$src" <<'EOF'
import filecmp, os, shutil, sys
new, dst = sys.argv[1], sys.argv[2]
seen = set()
for root, _, files in os.walk(new):
    for f in files:
        rel = os.path.relpath(os.path.join(root, f), new); seen.add(rel)
        d = os.path.join(dst, rel)
        if not os.path.exists(d) or not filecmp.cmp(os.path.join(new, rel), d, shallow=False):
            os.makedirs(os.path.dirname(d), exist_ok=True); shutil.copyfile(os.path.join(new, rel), d)
for root, _, files in os.walk(dst):
    for f in files:
        rel = os.path.relpath(os.path.join(root, f), dst)
        if rel not in seen: os.remove(os.path.join(dst, rel))
EOF
}
declare -A verdict
try_point() {  # try_point POINT -> sets verdict[POINT] to good/bad/broken
  local p=$1 t0 fails=0 i
  [[ -n ${verdict[$p]:-} ]] && return 0
  t0=$(date +%s)
  make_tree "$p" "$base" || { verdict[$p]=broken; return 0; }
  mkdir -p "$src"; sync_tree "$base"
  if ! (cd "$head" && scripts/device_build.sh "$src" "$build" ingot_tests > "$out/build_$p.log" 2>&1); then
    tail -20 "$out/build_$p.log"; verdict[$p]=broken; return 0
  fi
  for ((i = 1; i <= ${RUNS:-2}; i++)); do
    (cd "$src" && INGOT_TEST_ROOT=$src INGOT_CRASH_BACKTRACE=1 timeout ${TEST_TIMEOUT:-240} \
      "$build/bin/ingot_tests" --gtest_filter="$filter" > "$out/test_${p}_$i.log" 2>&1) || fails=$((fails + 1))
  done
  verdict[$p]=$([[ $fails -eq 0 ]] && echo good || echo bad)
  echo "point $p: ${verdict[$p]} ($fails of ${RUNS:-2} runs failed; $(( $(date +%s) - t0 )) s)"
  grep -h "Which is\|step [0-9]\|parameter [0-9]" "$out"/test_${p}_*.log | head -4
}
n=${#points[@]}
try_point "${points[n-1]}"
for f in ${EXTRA_FILTERS:-}; do
  (cd "$src" && INGOT_TEST_ROOT=$src timeout ${TEST_TIMEOUT:-240} "$build/bin/ingot_tests" --gtest_filter="$f" \
    > "$out/extra_${f%%\**}.log" 2>&1); echo "extra $f at ${points[n-1]}: exit $?"
  grep -E "^\[  FAILED|^\[  PASSED|Which is" "$out/extra_${f%%\**}.log" | head -6
done
(( n > 1 )) && try_point "${points[0]}"
lo=0 hi=$((n - 1))
if [[ ${verdict[${points[0]}]:-} == good && ${verdict[${points[n-1]}]} == bad ]]; then
  while (( hi - lo > 1 )); do
    mid=$(( (lo + hi) / 2 ))
    try_point "${points[mid]}"
    case ${verdict[${points[mid]}]} in
      good) lo=$mid ;; bad) hi=$mid ;; *) echo "point ${points[mid]} broken: stopping"; break ;;
    esac
  done
  echo "first bad point: ${points[hi]} (last good: ${points[lo]})"
fi
echo "| point | verdict |"
for p in "${points[@]}"; do echo "| $p | ${verdict[$p]:-not run} |"; done
