#!/usr/bin/env bash
# Installs everything crashreplay needs to build and test, from Debian's
# packages and PyPI only. Idempotent: packages already present are skipped,
# so a second run costs a few seconds.
set -euo pipefail

apt_packages=(
  build-essential cmake ninja-build pkg-config
  capnproto libcapnp-dev
  libzstd-dev zstd
  libxxhash-dev xxhash
  libabsl-dev
  nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev
  libopenblas-dev libonig-dev
  clang libclang-rt-14-dev
)
py_packages=(numpy ml_dtypes safetensors nanobind pytest msgspec tokenizers)

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
py_missing=()
for p in "${py_packages[@]}"; do
  $PY -c "import $p" 2>/dev/null || py_missing+=("$p")
done
if [ ${#py_missing[@]} -gt 0 ]; then
  echo "setup: installing Python packages: ${py_missing[*]}"
  $PY -m pip install -q --disable-pip-version-check --root-user-action=ignore "${py_missing[@]}"
fi
# The Python package's build backend (`pip install .`); its import name
# differs from its PyPI name, so it is checked on its own.
$PY -c "import scikit_build_core" 2>/dev/null || {
  echo "setup: installing Python package: scikit-build-core"
  $PY -m pip install -q --disable-pip-version-check --root-user-action=ignore scikit-build-core
}
# The one clang-format version scripts/format.sh lays the sources out with.
cf_version=$(sed -n 's/^CLANG_FORMAT_VERSION=//p' "$(dirname "$0")/format.sh")
$PY -c "import clang_format, importlib.metadata as m, sys; sys.exit(m.version('clang-format') != '$cf_version')" \
  2>/dev/null || {
  echo "setup: installing Python package: clang-format==$cf_version"
  $PY -m pip install -q --disable-pip-version-check --root-user-action=ignore "clang-format==$cf_version"
}
echo "setup: dependencies present"
