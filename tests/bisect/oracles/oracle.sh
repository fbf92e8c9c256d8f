#!/bin/sh
# A trial command with known culprits, for `crashreplay bisect -- ...`.
#
#   oracle.sh [--seed=N] RULE...      RULE = KEYS[~PCT]:ACTION
#
# The configuration is the TOML file in $CRASHREPLAY_CONFIG. A rule fires
# when every key of KEYS ("k003+k012", or "*" for any configuration) is true
# and, with ~PCT, with probability PCT% per run: the draw is fixed by the
# seed, the configuration and how many times that configuration ran before,
# so a search is repeatable. The first rule that fires decides; none: exit 0.
#
# ACTION prints what engines really print when they fail that way:
#   oom        torch.OutOfMemoryError (CUDA caching allocator)
#   kvcache    sglang: KV cache pool does not fit (--mem-fraction-static)
#   assert     a CUDA device assert in IndexKernel.cu, as torch reports it
#   assert2    a CUDA device assert in Loss.cu
#   illegal, misaligned, launch, noimage
#              torch's "CUDA error: <cudaGetErrorString text>"
#   nccl       torch.distributed.DistBackendError ... ncclRemoteError
#   nan        torch.multinomial's non-finite probabilities
#   keyerror   a Python traceback ending in KeyError
#   exitN      exit N, printing nothing
#   segv, abort
#              die by SIGSEGV / SIGABRT
#   oomkill    die by SIGKILL, as under the kernel's OOM killer
#   memory     allocate 64 GiB in Python (MemoryError under --memory-limit)
#   hang       sleep for a minute (for --timeout)
#   skip       exit 125 (cannot be judged)
set -u
cfg="$CRASHREPLAY_CONFIG"
seed=0
case "${1:-}" in --seed=*) seed="${1#--seed=}"; shift ;; esac

on() { grep -qx "$1 = true" "$cfg"; }

all_on() {
  [ "$1" = "*" ] && return 0
  for k in $(printf '%s' "$1" | tr '+' ' '); do on "$k" || return 1; done
  return 0
}

# How many times this configuration ran before, atomically (parallel runs).
run_number() {
  state="$(dirname "$cfg")/oracle-state"
  mkdir -p "$state"
  key=$(grep -v '^#' "$cfg" | cksum | cut -d' ' -f1)
  (
    flock 9
    n=$(cat "$state/$key" 2>/dev/null || echo 0)
    echo $((n + 1)) > "$state/$key"
    echo "$n"
  ) 9>"$state/$key.lock"
}

chance() {
  n=$(run_number)
  h=$(printf '%s %s %s' "$seed" "$(grep -v '^#' "$cfg" | cksum)" "$n" | cksum | cut -d' ' -f1)
  [ $((h % 100)) -lt "$1" ]
}

act() {
  case "$1" in
    oom)
      echo "Traceback (most recent call last):" >&2
      echo '  File "/srv/engine/model_runner.py", line 412, in init_memory_pool' >&2
      echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 3.12 GiB is free." >&2
      exit 1 ;;
    kvcache)
      echo "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.1" >&2
      exit 1 ;;
    assert)
      echo '/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0], thread: [0,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.'
      echo "torch.AcceleratorError: CUDA error: device-side assert triggered" >&2
      echo "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect." >&2
      echo "For debugging consider passing CUDA_LAUNCH_BLOCKING=1" >&2
      exit 1 ;;
    assert2)
      echo '/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: [0,0,0] Assertion `t >= 0 && t < n_classes` failed.'
      echo "torch.AcceleratorError: CUDA error: device-side assert triggered" >&2
      exit 1 ;;
    illegal) echo "RuntimeError: CUDA error: an illegal memory access was encountered" >&2; exit 1 ;;
    misaligned) echo "torch.AcceleratorError: CUDA error: misaligned address" >&2; exit 1 ;;
    launch) echo "RuntimeError: CUDA error: unspecified launch failure" >&2; exit 1 ;;
    noimage) echo "RuntimeError: CUDA error: no kernel image is available for execution on the device" >&2; exit 1 ;;
    nccl)
      echo "[rank1]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, remote process exited or there was a network error, NCCL version 2.26.2" >&2
      echo "[rank1]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely." >&2
      exit 1 ;;
    nan) echo "RuntimeError: probability tensor contains either \`inf\`, \`nan\` or element < 0" >&2; exit 1 ;;
    keyerror)
      printf 'Traceback (most recent call last):\n  File "/srv/serve.py", line 3, in <module>\n    backend = BACKENDS[name]\nKeyError: %s\n' "'flash'" >&2
      exit 1 ;;
    exit*) exit "${1#exit}" ;;
    segv) kill -SEGV $$ ;;
    abort) kill -ABRT $$ ;;
    oomkill) kill -KILL $$ ;;
    memory) exec python3 -c "buf = bytearray(1 << 36)" ;;
    hang) exec sleep 60 ;;
    skip) exit 125 ;;
    ok) exit 0 ;;
    *) echo "oracle.sh: unknown action '$1'" >&2; exit 255 ;;
  esac
}

for rule in "$@"; do
  keys="${rule%%:*}"
  action="${rule#*:}"
  pct=100
  case "$keys" in *~*) pct="${keys#*~}"; keys="${keys%%~*}" ;; esac
  all_on "$keys" || continue
  if [ "$pct" -lt 100 ]; then chance "$pct" || continue; fi
  act "$action"
done
exit 0
