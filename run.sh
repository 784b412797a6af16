#!/usr/bin/env bash
# Set up Tessera in ./.venv (first run only) and launch the app. Extra arguments go to the app, e.g. --model PATH.
# With no --model, the app opens on the built-in demo model.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup_env.sh
exec .venv/bin/python -m app "$@"
