#!/usr/bin/env bash
# `run` and `replay` through the CLI on the GPU (the CUDA executor runs the
# same kernel list as the CPU): a CUDA recording replays on the GPU with the
# same bits (reproduced), the CPU replay of it runs clean, a kernel check
# fires on the device with the same signature as on the CPU, and a CPU
# recording replays on the GPU without a failure; layer streaming on the GPU
# (one layer uploaded at a time) gives the per-kernel digests of resident
# weights.
# Usage: cli_cuda.sh BIN.
# Exit 0 when every check holds; prints each check.
set -uo pipefail
BIN="$1"
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
fail=0
check() {  # description, then a command that must succeed
  local what="$1"; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi
}
# field FILE KEY...: the JSON value at that path (a missing file or key is an
# error, so a check on it fails rather than comparing an empty string).
field() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))
for k in sys.argv[2:]: v=v[k]
print(v)' "$@"; }
one_of() { local v="$1"; shift; for w in "$@"; do [ "$v" = "$w" ] && return 0; done; echo "  got '$v'"; return 1; }

"$BIN" make-model "$W/m" --arch glm4_moe --quant nvfp4 >/dev/null || { echo "FAIL make-model"; exit 1; }
"$BIN" run "$W/m" --prompt "Say hello in one sentence" --max-new-tokens 4 --temperature 0.8 \
  --set device=cuda --set tp_size=2 --record "$W/cuda" --json >"$W/run_cuda.json"
check "run --set device=cuda exits 0" test $? -eq 0
check "run on cuda records device=cuda" test "$(field "$W/run_cuda.json" config device)" = cuda
"$BIN" replay "$W/cuda" --from-start --json >"$W/replay_cuda.json"
check "replay of the cuda recording on cuda: reproduced (exit 0)" test $? -eq 0
check "replay on cuda ran on cuda" test "$(field "$W/replay_cuda.json" config device)" = cuda
"$BIN" replay "$W/cuda" --from-start --set device=cpu --json >"$W/replay_cpu.json"
check "the cpu replay of the cuda recording runs without a failure" \
  one_of "$(field "$W/replay_cpu.json" outcome)" reproduced diverged

"$BIN" run "$W/m" --prompt "Say hello in one sentence" --max-new-tokens 4 --record "$W/cpu" >/dev/null
"$BIN" replay "$W/cpu" --from-start --set device=cuda --json >"$W/cpu_on_cuda.json"
check "a cpu recording replays on cuda without a failure" \
  one_of "$(field "$W/cpu_on_cuda.json" outcome)" reproduced diverged

"$BIN" run "$W/m" --prompt "Say hello in one sentence" --max-new-tokens 4 --set device=cuda \
  --set attention_backend=paged64 --set page_size=16 --json >"$W/assert.json"
check "a device-side check in decode: exit 1" test $? -eq 1
check "its signature is the cpu's" test "$(field "$W/assert.json" signature check)" = page_size_is_64
digests() { python3 -c "import json; print([(k['name'], k['digest']) for k in json.load(open('$1'))['kernels']])"; }
"$BIN" replay "$W/cuda" --from-start --set weights=resident --json >"$W/resident.json"
"$BIN" replay "$W/cuda" --from-start --set weights=stream --json >"$W/stream.json"
check "replay on cuda with weights=stream: reproduced (exit 0)" test $? -eq 0
check "weights=stream on cuda: the per-kernel digests of resident weights" \
  test "$(digests "$W/stream.json")" = "$(digests "$W/resident.json")"
exit $fail
