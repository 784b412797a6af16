#!/usr/bin/env bash
# Set up Tessera in ./.venv (first run only) and launch the app. Extra arguments go to the app, e.g. --model PATH.
# With no --model, the app opens on the built-in demo model.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup_env.sh
# Before the window: can Qt open the display? If not, say which system packages are missing and how to install them.
case " $* " in
  *" -h "*|*" --help "*) ;;
  *) .venv/bin/python -m tessera.app.display_check || exit 1 ;;
esac
exec .venv/bin/python -m tessera.app "$@"
