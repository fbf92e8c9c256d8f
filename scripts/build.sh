#!/usr/bin/env bash
# Configures and builds crashreplay into build/ (or $CRASHREPLAY_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${CRASHREPLAY_BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
fi
cmake --build "$BUILD" -j "$(nproc)"
