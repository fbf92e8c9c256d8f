#!/usr/bin/env bash
# `run` and `replay` through the CLI on the GPU (the CUDA executor runs the
# same kernel list as the CPU): a CUDA recording replays on the GPU with the
# same bits (reproduced), the CPU replay of it runs clean, a kernel check
# fires on the device with the same signature as on the CPU, and a CPU
# recording replays on the GPU without a failure; layer streaming on the GPU
# (one layer uploaded at a time) gives the per-kernel digests of resident
# weights; the seed's model (glm_moe_dsa: MLA + the DSA indexer, NVFP4)
# runs on CUDA at tp 2 and its recording replays on both devices; and a
# bisection whose trials run on CUDA finds the CPU's culprit.
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
# same_digests A.json B.json: both replays printed a kernel table, and the same one.
same_digests() { python3 -c 'import json,sys
t=[[(k["name"], k["digest"]) for k in json.load(open(f))["kernels"]] for f in sys.argv[1:]]
sys.exit(0 if t[0] and t[0] == t[1] else 1)' "$@"; }
"$BIN" replay "$W/cuda" --from-start --set weights=resident --json >"$W/resident.json"
"$BIN" replay "$W/cuda" --from-start --set weights=stream --json >"$W/stream.json"
check "replay on cuda with weights=stream: reproduced (exit 0)" test $? -eq 0
check "weights=stream on cuda: the per-kernel digests of resident weights" \
  same_digests "$W/stream.json" "$W/resident.json"

"$BIN" make-model "$W/dsa" --arch glm_moe_dsa --quant nvfp4 >/dev/null || { echo "FAIL make-model glm_moe_dsa"; exit 1; }
"$BIN" run "$W/dsa" --prompt "Say hello in one sentence" --max-new-tokens 4 --set device=cuda --set tp_size=2 \
  --record "$W/dsa_rec" --json >"$W/dsa_run.json"
check "glm_moe_dsa tp 2 on cuda: run exits 0" test $? -eq 0
"$BIN" replay "$W/dsa_rec" --from-start --json >"$W/dsa_replay.json"
check "glm_moe_dsa: the cuda recording replays on cuda, reproduced (exit 0)" test $? -eq 0
"$BIN" replay "$W/dsa_rec" --from-start --set device=cpu --json >"$W/dsa_cpu.json"
check "glm_moe_dsa: the cpu replay of the cuda recording runs without a failure" \
  one_of "$(field "$W/dsa_cpu.json" outcome)" reproduced diverged

printf 'device = "cuda"\n' >"$W/good.toml"
printf 'device = "cuda"\nattention_backend = "paged64"\npage_size = 16\nscale_format = "ue8m0"\n' >"$W/bad.toml"
mkdir -p "$W/bisect"
"$BIN" bisect "$W/cpu" --good "$W/good.toml" --bad "$W/bad.toml" --json -q --workdir "$W/bisect" >"$W/bisect.json"
check "bisect with cuda trials: culprit found (exit 0)" test $? -eq 0
check "bisect with cuda trials: the culprit is scale_format" \
  test "$(field "$W/bisect.json" culprit scale_format)" = ue8m0
check "bisect with cuda trials: the first bad kernel is the failing projection" \
  test "$(field "$W/bisect.json" first_bad_kernel kernel)" = L0.q_proj
exit $fail
