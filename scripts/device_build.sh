#!/usr/bin/env bash
# Builds ingot with CUDA on a lent GPU machine (16 cores; Ubuntu without our -dev packages), from Debian 12
# packages carried in debs/ (made here with `apt-get download ...`, see below) and unpacked away from /.
#   scripts/device_build.sh SRC_DIR BUILD_DIR [targets...]
# Debian packages to carry: libyaml-cpp-dev libyaml-cpp0.7 libprotobuf-dev libprotobuf32 libprotobuf-lite32
# protobuf-compiler libprotoc32 libgtest-dev libgmock-dev googletest nlohmann-json3-dev libopenblas-dev
# libopenblas0-pthread libopenblas-pthread-dev libopenblas0 libgloo-dev libgloo0 libpcre2-dev libpcre2-8-0
# libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libgfortran5 zlib1g-dev libpng-dev libpng16-16 libicu-dev libicu72 libhiredis0.14
# libssl-dev libssl3 libcli11-dev libcairo2-dev libcairo2 libpixman-1-0 libfontconfig1 fontconfig-config libfreetype6
# libxcb-shm0 libxcb1 libxcb-render0 libxrender1 libx11-6 libx11-data libxext6 libxau6 libxdmcp6 libbsd0 libmd0
# libexpat1 libbrotli1
# With BUNDLE=ARCHIVE (made here by scripts/device_bundle.sh) nothing is compiled: the programs are unpacked into
# BUILD_DIR/bin and their libraries into the folder the device scripts put on LD_LIBRARY_PATH, beside links to the
# machine's CUDA libraries and to cuDNN and NCCL from PyTorch's pip folders (the binaries name them by soname).
set -euo pipefail
src=$1; build=$2; shift 2
deps=${DEPS:-/opt/deps}  # DEPS: another folder, to try the script off the GPU machine
if [[ -n ${BUNDLE:-} ]]; then
  multi=$deps/usr/lib/x86_64-linux-gnu
  mkdir -p "$build/bin" "$multi"
  tmp=$(mktemp -d "$deps/.unpack.XXXX"); tar xJf "$BUNDLE" -C "$tmp"  # beside $multi: each mv a rename
  # Moved into place, not copied over: a library a running process (or this script's own cp, through an inherited
  # LD_LIBRARY_PATH) has mapped keeps its old file; overwriting it in place crashed a second unpack on one machine.
  for f in "$tmp"/bin/* "$tmp"/lib/*; do
    d=$build/bin; [[ $f == "$tmp"/lib/* ]] && d=$multi
    mv -f "$f" "$d/"
  done
  rm -rf "$tmp"
  for f in /usr/local/cuda/lib64/lib*.so*; do [[ -e $f ]] && ln -sfn "$f" "$multi/$(basename "$f")"; done
  nv=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia 2>/dev/null | head -1 || true)
  for f in "$nv"/cudnn/lib/lib*.so* "$nv"/nccl/lib/lib*.so*; do [[ -e $f ]] && ln -sfn "$f" "$multi/$(basename "$f")"; done
  for t in "$@"; do [[ -x $build/bin/$t ]] || { echo "device_build: $t is not in $BUNDLE"; exit 1; }; done
  missing=$(LD_LIBRARY_PATH="$multi:${LD_LIBRARY_PATH:-}" ldd "$build"/bin/* | grep "not found" | sort -u || true)
  [[ -z $missing ]] || { echo "device_build: still missing: $missing"; exit 1; }
  echo "device_build: unpacked $BUNDLE into $build (no compile)"
  exit 0
fi
if [[ ! -d $deps/usr ]]; then
  for f in debs/*.deb; do dpkg -x "$f" "$deps"; done
  # Debian's absolute symlinks (libfoo.so -> /usr/lib/...) must point into $deps.
  find "$deps" -type l | while read -r l; do
    t=$(readlink "$l"); [[ $t == /* && ! -e $t ]] && ln -sfn "$deps$t" "$l" || true
  done
  # Gloo's CMake targets name /usr/lib/libgloo.so.* absolutely.
  sed -i "s|\"/usr/lib/|\"$deps/usr/lib/|g" "$deps"/usr/share/cmake/Gloo/GlooTargets-*.cmake
fi
multi=$deps/usr/lib/x86_64-linux-gnu
# cairo.pc names the X11/glib/fontconfig -dev modules as Requires.private, which pkg-config resolves even for the
# shared library; only cairo's runtime libraries are carried (the linker finds them through LD_LIBRARY_PATH).
[[ -f $multi/pkgconfig/cairo.pc ]] && sed -i '/^Requires.private/d' "$multi/pkgconfig/cairo.pc"
export LD_LIBRARY_PATH="$multi:$multi/openblas-pthread:${LD_LIBRARY_PATH:-}"
export PKG_CONFIG_PATH="$multi/openblas-pthread/pkgconfig:$multi/pkgconfig:$deps/usr/share/pkgconfig" PKG_CONFIG_SYSROOT_DIR=$deps
export PATH="$deps/usr/bin:$PATH"
# cuDNN and NCCL may live only in PyTorch's pip folders there.
extra=()
nv=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia 2>/dev/null | head -1 || true)
if [[ ! -f /usr/local/cuda/include/cudnn.h && -n $nv && -d $nv/cudnn ]]; then
  extra+=(-DCUDNN_INCLUDE_DIR=$nv/cudnn/include -DCUDNN_LIBRARY=$(ls $nv/cudnn/lib/libcudnn.so* | head -1))
fi
if [[ ! -f /usr/local/cuda/include/nccl.h && -n $nv && -d $nv/nccl ]]; then
  extra+=(-DNCCL_INCLUDE_DIR=$nv/nccl/include -DNCCL_LIBRARY=$(ls $nv/nccl/lib/libnccl.so* | head -1))
fi
cmake -S "$src" -B "$build" -G Ninja "${extra[@]}" -DCMAKE_BUILD_TYPE=Release -DINGOT_CUDA=ON \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_PREFIX_PATH="$deps/usr;$multi/cmake" \
  -DProtobuf_PROTOC_EXECUTABLE=$deps/usr/bin/protoc -DGloo_DIR=$deps/usr/share/cmake/Gloo > "$build.configure.log" 2>&1 \
  || { tail -40 "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" ${1:+--target "$@"} -- -k 0 > "$build.build.log" 2>&1 \
  || { grep -E "error|FAILED" "$build.build.log" | head -40; exit 1; }
echo "device_build: built $build"
