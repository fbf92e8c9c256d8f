#!/usr/bin/env bash
# Builds the CUDA backend (Release, sm_90 for an H200/H100 unless
# CRASHREPLAY_CUDA_ARCHS says otherwise) and runs the whole GPU suite plus the
# GPU benchmark in one call. Logs and results go to $OUT (or ./gpu-results).
# Exit status: non-zero if the build or any test failed.
set -uo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${OUT:-$SRC/gpu-results}"
BUILD="${BUILD_DIR:-$SRC/build-gpu}"
ARCHS="${CRASHREPLAY_CUDA_ARCHS:-90}"
JOBS="${JOBS:-$(nproc)}"
mkdir -p "$OUT"
status=0
{
  echo "== $(date -u +%FT%TZ) on $(hostname)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
} | tee "$OUT/env.txt"

echo "== configure + build (archs $ARCHS)" | tee "$OUT/build.log"
start=$(date +%s)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if ! { cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCRASHREPLAY_CUDA=ON \
         -DCRASHREPLAY_CUDA_ARCHS="$ARCHS" &&
       cmake --build "$BUILD" -j"$JOBS" --target gpu_test replay_test gpu_bench crashreplay; } >>"$OUT/build.log" 2>&1; then
  echo "BUILD FAILED (see $OUT/build.log)"; tail -30 "$OUT/build.log"; exit 2
fi
echo "build took $(( $(date +%s) - start )) s" | tee -a "$OUT/build.log"

run() {  # name command...
  local name="$1"; shift
  echo "== $name"
  if "$@" >"$OUT/$name.log" 2>&1; then echo "   ok"; else echo "   FAILED (rc $?)"; status=1; fi
  tail -5 "$OUT/$name.log"
}
run devices "$BUILD/tools/crashreplay" devices --device cuda
run gpu_test "$BUILD/tests/gpu_test" --gtest_output="xml:$OUT/gpu_test.xml"
run cpu_parity "$BUILD/tests/replay_test" --gtest_filter='*StepOnFreshCpuExecutor*:StepFaults*:StepOnCpu*:ExecutorRegistry*' --gtest_output="xml:$OUT/cpu_parity.xml"
run cli_cuda "$SRC/tests/gpu/cli_cuda.sh" "$BUILD/tools/crashreplay"
run gpu_bench "$BUILD/bench/gpu_bench"
# The Python module's CUDA paths (torch CUDA staging, the fingerprint hooks'
# device path, a real device-side assert), where torch with CUDA and the extension are importable.
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  if cmake --build "$BUILD" -j"$JOBS" --target _crashreplay >>"$OUT/build.log" 2>&1; then
    run python_cuda env PYTHONPATH="$BUILD/python:$SRC/python" CRASHREPLAY_BIN="$BUILD/tools/crashreplay" \
      python3 -m pytest -q "$SRC/python/tests/test_cuda_staging.py" "$SRC/python/tests/test_cuda_fingerprints.py"
  else
    echo "== python_cuda: the extension did not build (see $OUT/build.log)"; status=1
  fi
else
  echo "== python_cuda: skipped (no torch with CUDA)"
fi
cat "$OUT/gpu_bench.log"
grep -hE "SKIPPED|FAILED|PASSED" "$OUT/gpu_test.log" | tee "$OUT/summary.txt"
exit $status
