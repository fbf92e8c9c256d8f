#!/usr/bin/env bash
# The suites that hold crashreplay against code nobody here wrote -
# transformers (with nvidia-modelopt's exporter), sglang's and vLLM's own
# classes, torch tensors - in one command on a fresh machine:
#
#   bash scripts/test-engines.sh                  # install, build, run every such suite
#   bash scripts/test-engines.sh --fidelity       # only the fidelity table and test_hf_transformers.py
#   bash scripts/test-engines.sh --fidelity --update   # the same, the cases written over tests/data/fidelity
#
# CI runs none of these: they need torch, whose PyPI wheel is a CUDA build
# that pulls several GB of NVIDIA libraries. This script puts everything in
# a virtual environment of its own, $ENGINES_VENV (default build/engines-venv;
# reused while the versions below and scripts/engines-requirements.txt are
# the ones it was made with, made anew otherwise), created from $PYTHON
# (default python3, the interpreter the build compiles the extension for):
#
#   1. torch $TORCH_VERSION (PyPI's default wheel) and the torchvision pip
#      pairs with it;
#   2. transformers, safetensors, nvidia-modelopt and the test tools
#      (pytest, numpy, ml_dtypes, msgspec, tokenizers), with their
#      dependencies, under constraints pinning the versions chosen here;
#   3. sglang and vLLM with --no-deps (their pins want other torch builds
#      and GPU kernel packages that nothing here runs);
#   4. what their import chains need, from scripts/engines-requirements.txt,
#      under the same constraints;
#   5. Debian's chromium (outside the environment), which renders the bisect
#      report the way its reader sees it.
#
# Then it builds crashreplay (scripts/setup.sh, scripts/build.sh) and runs
# every python/tests/test_*.py that importorskips torch, transformers,
# sglang, vllm or modelopt, one file at a time. It exits non-zero on any
# failure, on a file where no test ran (unless the file skipped itself as a
# whole for a reason screened as below), and on any test skipped because a
# module does not import (the skip reason says "No module named ...",
# "could not import ...", "does not import" or "is not installed"); skips for other reasons (no
# CUDA device, a feature this engine version lacks) are listed and allowed.
#
# Knobs (printed at the start):
#   TORCH_VERSION (2.15.0)  TRANSFORMERS_VERSION (5.25.0)  SGLANG_VERSION (0.5.23)
#   VLLM_VERSION (0.34.0)   MODELOPT_VERSION (0.47.0)
#   ENGINES_VENV            the environment's folder (default build/engines-venv)
#   PYTHON                  the interpreter the environment is made from (python3)
#   CRASHREPLAY_BIN         a crashreplay executable already built: skips setup.sh and
#                           build.sh; the Python extension is then read from
#                           CRASHREPLAY_PYDIR (default $CRASHREPLAY_BUILD_DIR/python, i.e.
#                           build/python)
#   CRASHREPLAY_BUILD_DIR   the build folder (default build), as for scripts/build.sh
#
# pip's output goes to $ENGINES_VENV/install.log, the build's to
# $ENGINES_VENV/build.log; each suite's output is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

TORCH_VERSION=${TORCH_VERSION:-2.15.0}
TRANSFORMERS_VERSION=${TRANSFORMERS_VERSION:-5.25.0}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
VLLM_VERSION=${VLLM_VERSION:-0.34.0}
MODELOPT_VERSION=${MODELOPT_VERSION:-0.47.0}
BUILD=${CRASHREPLAY_BUILD_DIR:-build}
ENGINES_VENV=${ENGINES_VENV:-$ROOT/build/engines-venv}
PY=${PYTHON:-python3}
REQS=$ROOT/scripts/engines-requirements.txt

fidelity=0
update=0
for a in "$@"; do
  case "$a" in
    --fidelity) fidelity=1 ;;
    --update) update=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "test-engines: unknown argument '$a' (see --help)" >&2; exit 2 ;;
  esac
done
if [ $update = 1 ] && [ $fidelity = 0 ]; then
  echo "test-engines: --update goes with --fidelity (it rewrites tests/data/fidelity)" >&2
  exit 2
fi

say() { echo "test-engines: $*"; }
die() { echo "test-engines: FAILED: $*" >&2; exit 1; }

pyver=$($PY -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
say "torch $TORCH_VERSION, transformers $TRANSFORMERS_VERSION, nvidia-modelopt $MODELOPT_VERSION," \
    "sglang $SGLANG_VERSION, vLLM $VLLM_VERSION; Python $pyver ($PY)"
say "environment: $ENGINES_VENV"

# ---- the virtual environment --------------------------------------------
STAMP=$ENGINES_VENV/.crashreplay-engines
want_stamp=$(printf 'python=%s\ntorch=%s\ntransformers=%s\nsglang=%s\nvllm=%s\nmodelopt=%s\nrequirements=%s\n' \
  "$pyver" "$TORCH_VERSION" "$TRANSFORMERS_VERSION" "$SGLANG_VERSION" "$VLLM_VERSION" "$MODELOPT_VERSION" \
  "$(sha256sum "$REQS" | cut -c1-16)")
VPY=$ENGINES_VENV/bin/python
LOG=$ENGINES_VENV/install.log

pip_step() {  # pip_step "what" pip-args...: one progress line, pip's output to the log
  local what=$1; shift
  say "  $what"
  echo "== pip install $*" >>"$LOG"
  if ! "$VPY" -m pip install --disable-pip-version-check "$@" >>"$LOG" 2>&1; then
    tail -n 25 "$LOG" >&2
    die "pip install $* (full output: $LOG)"
  fi
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] && [ -x "$VPY" ]; then
  say "reusing it (made with these versions)"
else
  if [ -e "$ENGINES_VENV" ]; then
    if [ -f "$STAMP" ]; then
      say "it was made with other versions (or not finished): making it anew"
      rm -rf "$ENGINES_VENV"
    elif [ -n "$(ls -A "$ENGINES_VENV" 2>/dev/null)" ]; then
      die "$ENGINES_VENV exists and was not made by this script; remove it or set ENGINES_VENV"
    fi
  fi
  if ! $PY -c 'import ensurepip' 2>/dev/null; then  # Debian ships venv's pip apart
    say "installing python3-venv (Debian)"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "python$(
      $PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv" >/dev/null
  fi
  say "installing (pip's output: $LOG)"
  $PY -m venv "$ENGINES_VENV"
  echo "incomplete" >"$STAMP"
  : >"$LOG"
  pip_step "pip itself" --upgrade pip
  pip_step "torch $TORCH_VERSION and its torchvision (the CUDA build PyPI serves: a few GB)" \
    "torch==$TORCH_VERSION" torchvision
  tv=$("$VPY" -c 'import importlib.metadata as m; print(m.version("torchvision"))')
  CONS=$ENGINES_VENV/constraints.txt
  printf 'torch==%s\ntorchvision==%s\ntransformers==%s\nnvidia-modelopt==%s\nsglang==%s\nvllm==%s\n' \
    "$TORCH_VERSION" "$tv" "$TRANSFORMERS_VERSION" "$MODELOPT_VERSION" "$SGLANG_VERSION" "$VLLM_VERSION" >"$CONS"
  pip_step "transformers $TRANSFORMERS_VERSION, safetensors, nvidia-modelopt $MODELOPT_VERSION, pytest" \
    -c "$CONS" "transformers==$TRANSFORMERS_VERSION" safetensors "nvidia-modelopt==$MODELOPT_VERSION" \
    pytest numpy ml_dtypes msgspec tokenizers
  pip_step "sglang $SGLANG_VERSION and vLLM $VLLM_VERSION (--no-deps)" \
    --no-deps "sglang==$SGLANG_VERSION" "vllm==$VLLM_VERSION"
  pip_step "their import chains (scripts/engines-requirements.txt)" -c "$CONS" -r "$REQS"
  "$VPY" -m pip freeze >"$ENGINES_VENV/freeze.txt" 2>/dev/null
  printf '%s\n' "$want_stamp" >"$STAMP"
fi

# Every top-level import, and the versions that actually ran.
if ! versions=$("$VPY" - 2>"$ENGINES_VENV/import.log" <<'EOF'
import importlib, importlib.metadata as md, warnings
warnings.filterwarnings("ignore")
for mod, dist in [("torch", "torch"), ("torchvision", "torchvision"), ("transformers", "transformers"),
                  ("safetensors", "safetensors"), ("modelopt", "nvidia-modelopt"), ("sglang", "sglang"),
                  ("vllm", "vllm")]:
    importlib.import_module(mod)
    print(f"{dist} {md.version(dist)}", end="; ")
print()
EOF
); then
  tail -n 5 "$ENGINES_VENV/import.log" >&2
  die "an engine package does not import in $ENGINES_VENV" \
      "(a missing module belongs in scripts/engines-requirements.txt)"
fi
versions=${versions%; }
say "installed: $versions"

# ---- a browser for the reports ------------------------------------------
# The bisect report is checked as its reader sees it, rendered by headless
# Chromium (Debian's package).
if ! command -v chromium >/dev/null 2>&1; then
  say "installing chromium (Debian) for the report tests"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

# ---- crashreplay --------------------------------------------------------
if [ -n "${CRASHREPLAY_BIN:-}" ]; then
  BIN=$CRASHREPLAY_BIN
  PYDIR=${CRASHREPLAY_PYDIR:-$ROOT/$BUILD/python}
  say "crashreplay: $BIN (CRASHREPLAY_BIN: setup.sh and build.sh skipped), extension from $PYDIR"
else
  say "crashreplay: scripts/setup.sh, then scripts/build.sh (log: $ENGINES_VENV/build.log)"
  bash scripts/setup.sh
  if ! bash scripts/build.sh >"$ENGINES_VENV/build.log" 2>&1; then
    tail -n 30 "$ENGINES_VENV/build.log" >&2
    die "scripts/build.sh (full output: $ENGINES_VENV/build.log)"
  fi
  BIN=$ROOT/$BUILD/tools/crashreplay
  PYDIR=$ROOT/$BUILD/python
fi
[ -x "$BIN" ] || die "no crashreplay executable at $BIN"
export CRASHREPLAY_BIN=$BIN
export PYTHONPATH=$PYDIR:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
"$VPY" -c 'import crashreplay._crashreplay' 2>/dev/null ||
  die "the crashreplay extension does not import from $PYDIR with $VPY (built for another Python?)"

# ---- the suites ---------------------------------------------------------
# Nothing is fetched from the Hugging Face hub (the checkpoints are made
# here), and its progress bars would bury the suites' own lines.
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
failed=()
missing=()
run_suite() {  # run_suite FILE [pytest args]: output printed and kept for the checks
  local f=$1; shift
  local out; out=$(mktemp)
  say "== $f"
  set +e
  "$VPY" -m pytest -q -rs -p no:cacheprovider --disable-warnings "$@" "$f" 2>&1 | tee "$out"
  local rc=${PIPESTATUS[0]}
  set -e
  # Exit 5 (nothing ran) is a failure unless the file was skipped as a whole
  # for a reason of its own (no CUDA device), which the check below screens.
  if [ "$rc" -ne 0 ] && ! { [ "$rc" -eq 5 ] && grep -q '^SKIPPED' "$out"; }; then
    failed+=("$f (pytest exit $rc)")
  fi
  # A skip whose reason is an import that failed means a package is missing.
  if grep -E '^SKIPPED' "$out" |
      grep -Eq "No module named|could not import|does not import|ModuleNotFoundError|ImportError|is not installed"; then
    missing+=("$f")
  fi
  rm -f "$out"
}

if [ $fidelity = 1 ]; then
  if [ $update = 1 ]; then
    out=tests/data/fidelity
    rm -rf "$out"
  else
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
  fi
  say "== fidelity cases (python/tests/fidelity_cases.py) into $out"
  "$VPY" python/tests/fidelity_cases.py write "$out" 2>/dev/null | sed 's/^/  /'
  "$VPY" python/tests/fidelity_cases.py compare "$out" --bin "$BIN" || failed+=("fidelity_cases.py compare")
  FIDELITY_DIR=$out run_suite python/tests/test_hf_transformers.py -s
else
  mapfile -t suites < <(grep -lE "importorskip\(\s*[\"'](torch|transformers|sglang|vllm|modelopt)[\"'.]" \
    python/tests/test_*.py | sort)
  [ ${#suites[@]} -gt 0 ] || die "no test file importorskips an engine package: nothing to run"
  say "suites: ${suites[*]}"
  for f in "${suites[@]}"; do
    if [ "$f" = python/tests/test_hf_transformers.py ]; then
      run_suite "$f" -s  # its lines name each case's max |engine - reference| and midpoint elements
    else
      run_suite "$f"
    fi
  done
fi

say "versions: $versions"
if [ ${#missing[@]} -gt 0 ]; then
  say "FAILED: skipped for a module that does not import: ${missing[*]}" \
      "(add the module's distribution to scripts/engines-requirements.txt)"
fi
if [ ${#failed[@]} -gt 0 ]; then
  say "FAILED: ${failed[*]}"
fi
if [ ${#missing[@]} -gt 0 ] || [ ${#failed[@]} -gt 0 ]; then
  exit 1
fi
say "every suite passed, none skipped for a missing package"
