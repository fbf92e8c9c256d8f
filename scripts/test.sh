#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite:
#   1. every GoogleTest and regression corpus under ctest,
#   2. the Python tests (pytest),
#   3. the command built without CUDA (the code only such a build compiles);
#   4. the formats tests again under AddressSanitizer + UBSan;
# first of all, that every source is laid out as .clang-format says.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== format"
bash scripts/format.sh --check
bash scripts/build.sh

echo "== ctest"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600

if compgen -G "python/tests/test_*.py" >/dev/null; then
  echo "== pytest"
  CRASHREPLAY_BIN="$PWD/build/tools/crashreplay" PYTHONPATH="$PWD/build/python:$PWD/python" \
    python3 -m pytest -q python/tests
fi

echo "== the command built without CUDA (as pip install builds it)"
# This machine has nvcc, so build/ compiles the CUDA side; the code a build
# without it compiles (#if !CRASHREPLAY_HAVE_CUDA) is compiled here.
if [ ! -f build-nocuda/CMakeCache.txt ]; then
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  cmake -S . -B build-nocuda "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCRASHREPLAY_CUDA=OFF >/dev/null
fi
cmake --build build-nocuda -j "$(nproc)" --target crashreplay
build-nocuda/tools/crashreplay devices

echo "== formats tests under ASan + UBSan"
if [ ! -f build-asan/CMakeCache.txt ]; then
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  cmake -S . -B build-asan "${GEN[@]}" -DCMAKE_BUILD_TYPE=Debug \
    -DCRASHREPLAY_SANITIZE=ON -DCRASHREPLAY_FORMATS_ONLY=ON >/dev/null
fi
cmake --build build-asan -j "$(nproc)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$(nproc)" --timeout 900
