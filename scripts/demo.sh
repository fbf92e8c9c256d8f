#!/usr/bin/env bash
# Installs what is missing, builds, and runs the end-to-end demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec ./build/tools/crashreplay demo "$@"
