#!/usr/bin/env bash
# Packs the GPU suite for a machine that has a GPU, the CUDA driver and
# Python but none of crashreplay's Debian libraries (the device machines this
# project is lent have no package registry): the stripped binaries built here
# (crashreplay, gpu_test, gpu_bench, the Python extension) and the shared libraries they load that
# are neither glibc, the CUDA driver nor NCCL, in one .tgz (about 17 MB for
# sm_90/100/120). tests/gpu/run_bundle.sh unpacks and runs it there.
# Usage: bundle.sh [BUILD_DIR [OUT.tgz]]   (default: build, gpu-bundle/bundle.tgz)
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$SRC/build}"
OUTF="${2:-$SRC/gpu-bundle/bundle.tgz}"
grep -q "CRASHREPLAY_HAVE_CUDA" "$BUILD/compile_commands.json" 2>/dev/null ||
  { echo "bundle.sh: $BUILD has no CUDA backend (configure where nvcc is installed)"; exit 2; }
cmake --build "$BUILD" -j "$(nproc)" --target crashreplay gpu_test gpu_bench >/dev/null
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bin" "$T/lib" "$T/lib-cxx" "$(dirname "$OUTF")"
bins=("$BUILD/tools/crashreplay" "$BUILD/tests/gpu_test" "$BUILD/bench/gpu_bench")
for b in "${bins[@]}"; do strip --strip-debug -o "$T/bin/$(basename "$b")" "$b"; done
# The Python extension too, where it was built (run_bundle.sh runs the
# Python CUDA tests with it when the machine's python3 has torch with CUDA
# and is the version it was built for).
mkdir -p "$T/py/crashreplay"
if cmake --build "$BUILD" -j "$(nproc)" --target _crashreplay >/dev/null 2>&1; then
  for x in "$BUILD"/python/crashreplay/_crashreplay*.so; do
    [ -f "$x" ] && strip --strip-debug -o "$T/py/crashreplay/$(basename "$x")" "$x" && bins+=("$x")
  done
fi
for l in $(ldd "${bins[@]}" | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u); do
  case "$(basename "$l")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libnccl*) ;;
    # The C++ runtime only where the machine's own is older (run_bundle.sh).
    libstdc++.so*|libgcc_s.so*) cp -L "$l" "$T/lib-cxx/" ;;
    *) cp -L "$l" "$T/lib/" ;;
  esac
done
tar czf "$OUTF" -C "$T" bin lib lib-cxx py
echo "bundle.sh: wrote $OUTF ($(du -h "$OUTF" | cut -f1)); on the GPU machine: tests/gpu/run_bundle.sh $OUTF"
