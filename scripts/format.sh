#!/usr/bin/env bash
# The C++, CUDA and C sources in clang-format's layout (.clang-format at the
# root), with one pinned clang-format from PyPI so every machine lays the code
# out the same (scripts/setup.sh installs it).
#
#   scripts/format.sh            format every tracked source in place
#   scripts/format.sh --check    change nothing; fail naming each source that
#                                is not formatted (CI: scripts/test.sh)
#   scripts/format.sh [--check] FILE...   only these files
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT_VERSION=19.1.7
PY=${PYTHON:-python3}

CF=$($PY -c 'import clang_format, os; print(os.path.join(os.path.dirname(clang_format.__file__), "data", "bin", "clang-format"))' 2>/dev/null || true)
if [ -z "$CF" ] || [ ! -x "$CF" ] || ! "$CF" --version | grep -q "version $CLANG_FORMAT_VERSION\b"; then
  echo "format: clang-format $CLANG_FORMAT_VERSION (PyPI: clang-format==$CLANG_FORMAT_VERSION) is not installed for $PY;" \
       "run scripts/setup.sh" >&2
  exit 2
fi

check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files -- '*.cc' '*.h' '*.cu' '*.cuh' '*.c')
fi
[ ${#files[@]} -gt 0 ] || exit 0

if [ $check -eq 0 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 -P "$(nproc)" "$CF" -i --style=file
  exit 0
fi
# --dry-run --Werror prints each unformatted place and exits non-zero.
if ! printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$CF" --dry-run --Werror --style=file \
     2>/tmp/crashreplay-format.$$; then
  grep -o '^[^:]*:[0-9]*:[0-9]*: error' /tmp/crashreplay-format.$$ | cut -d: -f1 | sort -u | sed 's/^/format: not formatted: /' >&2
  head -40 /tmp/crashreplay-format.$$ >&2
  rm -f /tmp/crashreplay-format.$$
  echo "format: run scripts/format.sh to lay these out as .clang-format says" >&2
  exit 1
fi
rm -f /tmp/crashreplay-format.$$
echo "format: ${#files[@]} sources formatted"
