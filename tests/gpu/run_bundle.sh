#!/usr/bin/env bash
# Runs the GPU suite from tests/gpu/bundle.sh's archive on a machine with a
# GPU but without crashreplay's build dependencies: `crashreplay devices`,
# gpu_test, tests/gpu/cli_cuda.sh, gpu_bench, the Python CUDA tests (where
# torch with CUDA is installed), the replay in vLLM (where vLLM is installed), and compute-sanitizer's memcheck
# on a glm_moe_dsa run where the tool is installed. Each part has a time
# limit, cut to what is left of BUDGET_S seconds for the whole run (default
# 900; a part with under 10 s left is skipped); logs and gpu_test's JUnit XML
# go to $OUT (or ./gpu-results).
# Usage: run_bundle.sh [BUNDLE.tgz]   (default: gpu-bundle/bundle.tgz)
# Exit status: non-zero if any part failed.
set -uo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
BUNDLE="${1:-$SRC/gpu-bundle/bundle.tgz}"
OUT="${OUT:-$SRC/gpu-results}"
mkdir -p "$OUT"
G="$(mktemp -d)"
tar xzf "$BUNDLE" -C "$G" || { echo "run_bundle.sh: cannot unpack $BUNDLE"; exit 2; }
# NCCL from the machine's Python wheels (gpu_test links it), if present.
NCCL="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$G/lib${NCCL:+:$NCCL}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! "$G/bin/crashreplay" --help >/dev/null 2>&1; then
  export LD_LIBRARY_PATH="$G/lib-cxx:$LD_LIBRARY_PATH"  # the machine's C++ runtime is older than the build's
fi
B="$G/bin"
status=0
deadline=$((SECONDS + ${BUDGET_S:-900}))
part() {  # name, seconds, command...
  local name="$1" limit="$2"; shift 2
  local left=$((deadline - SECONDS - 5))
  [ $left -lt $limit ] && limit=$left
  if [ $limit -lt 10 ]; then echo "== $name: skipped, out of time"; status=1; return 1; fi
  local start=$SECONDS
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - start)) s"
  [ $rc -eq 0 ] || status=1
  return $rc
}
{
  echo "== $(date -u +%FT%TZ) on $(hostname)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  ldd --version 2>&1 | head -1
} | tee "$OUT/env.txt"
part devices 60 "$B/crashreplay" devices --device cuda; cat "$OUT/devices.log"
part gpu_test 240 "$B/gpu_test" --gtest_filter='-CoredumpArmed.*' --gtest_output="xml:$OUT/gpu_test.xml"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |: Failure" "$OUT/gpu_test.log" | head -40
# GPU core dumps armed by the recorder (tests/gpu/coredump_armed_test.cc;
# never run yet): a real device assert's dump named by the failure record,
# and the step time with dumps armed and not (docs/capture.md, "GPU core dumps").
part coredump 180 "$B/gpu_test" --gtest_filter='CoredumpArmed.*' --gtest_output="xml:$OUT/coredump.xml"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |: Failure|^coredumps |^dump " "$OUT/coredump.log" | head -20
part cli_cuda 240 bash "$SRC/tests/gpu/cli_cuda.sh" "$B/crashreplay"; grep -E "^(ok|FAIL)" "$OUT/cli_cuda.log"
part gpu_bench 120 "$B/gpu_bench"; cat "$OUT/gpu_bench.log"
# The Python CUDA tests (staging, the fingerprint hooks' device path, a real
# device-side assert) with the bundled extension, where this python3 has
# torch with CUDA and can import the extension.
if PYTHONPATH="$G/py:$SRC/python" python3 -c \
     "import torch, crashreplay._crashreplay; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  part python_cuda 180 env PYTHONPATH="$G/py:$SRC/python" CRASHREPLAY_BIN="$B/crashreplay" \
    python3 -m pytest -q -p no:cacheprovider "$SRC/python/tests/test_cuda_staging.py" \
    "$SRC/python/tests/test_cuda_fingerprints.py"
  tail -5 "$OUT/python_cuda.log"
else
  echo "== python_cuda: skipped (no torch with CUDA, or the bundled extension does not import here)"
fi
# Replay in vLLM itself (python/tests/test_engine_replay_vllm.py): where this
# python3 has vLLM and torch with CUDA. The device machines lent here have
# neither (no package registry): scripts/test-engines.sh on a GPU machine
# with network runs the same file.
if PYTHONPATH="$G/py:$SRC/python" python3 -c \
     "import torch, vllm, crashreplay._crashreplay; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  part engine_vllm 300 env PYTHONPATH="$G/py:$SRC/python" CRASHREPLAY_BIN="$B/crashreplay" \
    python3 -m pytest -q -p no:cacheprovider "$SRC/python/tests/test_engine_replay_vllm.py"
  tail -5 "$OUT/engine_vllm.log"
else
  echo "== engine_vllm: skipped (no vLLM with torch CUDA in this python3)"
fi
if command -v compute-sanitizer >/dev/null; then
  W="$(mktemp -d)"
  "$B/crashreplay" make-model "$W/dsa" --arch glm_moe_dsa --quant nvfp4 >/dev/null 2>&1
  part memcheck 180 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    "$B/crashreplay" run "$W/dsa" --prompt "Say hello" --max-new-tokens 2 --set device=cuda --set tp_size=2
  tail -5 "$OUT/memcheck.log"
fi
exit $status
