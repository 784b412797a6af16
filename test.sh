#!/usr/bin/env bash
# Set up Tessera with its test dependencies in ./.venv (first run only) and run the whole test suite.
# Extra arguments go to pytest, e.g. ./test.sh tests/engine -k gguf
set -euo pipefail
cd "$(dirname "$0")"
TESSERA_EXTRAS=test source scripts/setup_env.sh
export QT_QPA_PLATFORM=offscreen
exec .venv/bin/python -m pytest "$@"
