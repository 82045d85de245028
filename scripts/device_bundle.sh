#!/usr/bin/env bash
# Packs ingot's programs built on this machine (Debian 12, a CUDA build for sm_90) with the shared libraries the
# GPU machine lacks into one archive, so a device call unpacks it instead of compiling (the build took 80-115 s of
# device time on every fresh machine, bench/RESULTS.md sixteenth session):
#   scripts/device_bundle.sh [BUILD_DIR] [ARCHIVE]        (defaults: build, .device/bundle.tar.xz)
# Carry [".device"] without debs/ (the archive holds the libraries: ~43 MB of the 64 MiB a call may carry, the source
# snapshot written beside it ~4 MB) and run
# the device scripts with BUNDLE=.device/bundle.tar.xz: scripts/device_build.sh then unpacks instead of building.
# Left out, as the GPU machine has its own: glibc, libstdc++, libgcc, and the CUDA driver, cudart, cuBLAS, cuDNN,
# NCCL and NVRTC libraries (device_build.sh links the machine's beside the bundled ones). Binaries built here run
# there: glibc 2.36 here, 2.39 there.
set -euo pipefail
build=${1:-build}; archive=${2:-.device/bundle.tar.xz}
programs=(ingot ingot_tests bench_gpt2_step bench_llama_step bench_allreduce bench_cuda_kernels)
own='linux-vdso|ld-linux|/libc\.so|/libm\.so|/libstdc\+\+|/libgcc_s|/libpthread|/libdl\.so|/librt\.so|/libcuda\.so'
cuda='/usr/local/cuda|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink'
# Built first, so the archive never carries a program older than the tree (a stale `ingot` beside a fresh ingot_tests
# once made an A/B compare two identical binaries: bench/RESULTS.md 2026-11-27, twenty-seventh session).
if [[ -f $build/build.ninja ]]; then
  ninja -C "$build" "${programs[@]}" > /dev/null || { echo "device_bundle: building ${programs[*]} in $build failed" >&2; exit 1; }
fi
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for p in "${programs[@]}"; do
  f=$build/bin/$p
  [[ -x $f ]] || { echo "device_bundle: $f is missing (ninja -C $build $p)" >&2; exit 1; }
  cp "$f" "$stage/bin/"
  ldd "$f" | awk '/=>/ && $3 ~ /^\// {print $3}' | { grep -Ev "$own|$cuda" || true; } |
    while read -r lib; do cp -Lu "$lib" "$stage/lib/"; done
done
mkdir -p "$(dirname "$archive")"
tar cf - -C "$stage" bin lib | xz -T0 -6 > "$archive.tmp"
mv "$archive.tmp" "$archive"
echo "device_bundle: $(ls "$stage/bin" | wc -l) programs, $(ls "$stage/lib" | wc -l) libraries -> $archive ($(du -h "$archive" | cut -f1))"
# Beside it, the source snapshot the device scripts unpack (scripts/device_dist.sh, device_lora.sh): HEAD (a commit,
# not the working tree) without data/tokenizers (23 MB; the device tests that read them skip), with tests/fixtures
# (4 MB compressed; the LoRA tests read tests/fixtures/hf). SNAPSHOT= (empty) skips it.
snapshot=${SNAPSHOT-$(dirname "$archive")/src.tar.xz}
if [[ -n $snapshot ]]; then
  git archive HEAD -- . ':!data/tokenizers' | xz -T0 > "$snapshot.tmp"
  mv "$snapshot.tmp" "$snapshot"
  echo "device_bundle: source snapshot of $(git rev-parse --short HEAD) -> $snapshot ($(du -h "$snapshot" | cut -f1))"
fi
