#!/usr/bin/env bash
# Set up Tessera with its test dependencies in ./.venv (first run only), lint with ruff, and run the whole test suite.
# Extra arguments go to pytest, e.g. ./test.sh tests/engine -k gguf
set -euo pipefail
cd "$(dirname "$0")"
TESSERA_EXTRAS=test source scripts/setup_env.sh
.venv/bin/ruff check --quiet . || { echo "tessera: ruff found problems (above); fix them before the tests run" >&2; exit 1; }
export QT_QPA_PLATFORM=offscreen
exec .venv/bin/python -m pytest "$@"
