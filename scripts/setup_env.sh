# Sourced by run.sh and test.sh: create ./.venv and install Tessera into it (editable, native module built by
# scikit-build-core). Re-running is cheap: it reinstalls only when pyproject.toml or native/ changed.
# torch is installed explicitly first, chosen by scripts/torch_choice.sh (shared with packaging/install.sh): the CUDA
# build when nvidia-smi finds a GPU, else the CPU build from PyTorch's CPU index; TESSERA_TORCH names another. A bare
# `torch` requirement would pull a multi-GB CUDA build onto a machine without a GPU.
pip_quiet() {  # run pip, hiding the noise of this machine's offline index mirrors; keep its exit status
  local log rc=0; log="$(mktemp)"
  "$@" >"$log" 2>&1 || rc=$?
  grep -v "is ignored: it is neither a file nor a directory" "$log" >&2 || true
  rm -f "$log"; return "$rc"
}
TESSERA_TORCH_DEFAULT="torch==2.13.0"
TESSERA_EXTRAS="${TESSERA_EXTRAS:-}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "tessera: creating .venv with $($PY --version)" >&2
  "$PY" -m venv .venv
fi
stamp=".venv/.tessera-installed${TESSERA_EXTRAS:+-$TESSERA_EXTRAS}"
want="$(cat pyproject.toml CMakeLists.txt $(find native -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.inc' -o -name 'CMakeLists.txt' \) | sort) | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  source scripts/torch_choice.sh
  choose_torch "${TESSERA_TORCH:-}" "$TESSERA_TORCH_DEFAULT"
  echo "tessera: installing into .venv; torch: $torch_spec${torch_index:+ from $torch_index}, $torch_kind" >&2
  pip_quiet .venv/bin/python -m pip install -q --upgrade pip
  build_tools="scikit-build-core nanobind"
  command -v cmake >/dev/null 2>&1 || build_tools="$build_tools cmake"
  command -v ninja >/dev/null 2>&1 || build_tools="$build_tools ninja"
  pip_quiet .venv/bin/python -m pip install -q "$torch_spec" ${torch_index:+--index-url "$torch_index"}
  built="$(.venv/bin/python -c 'import torch; v = torch.version.cuda
print(torch.__version__, "CUDA " + v if v else "CPU build")' 2>/dev/null || echo "not importable")"
  echo "tessera: torch in .venv: $built" >&2
  pip_quiet .venv/bin/python -m pip install -q $build_tools
  pip_quiet .venv/bin/python -m pip install -q --no-build-isolation -e ".${TESSERA_EXTRAS:+[$TESSERA_EXTRAS]}"
  echo "$want" > "$stamp"
fi
# Tessera's own modules compiled to bytecode now: an editable install leaves that to the first import, and where
# PYTHONDONTWRITEBYTECODE is set (containers, CI) it never happens, so every command compiled them again: 0.2-0.3 s
# of each `tessera-cli generate` (Zen 4, 2 cores, docs/BENCHMARKS.md session 8). Up-to-date files cost a stat each.
.venv/bin/python -m compileall -q tessera >/dev/null 2>&1 || true
# tests/packaging validates the launcher's .desktop entry with desktop-file-validate (Debian: desktop-file-utils).
if [ -n "$TESSERA_EXTRAS" ] && ! command -v desktop-file-validate >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "tessera: installing desktop-file-utils (desktop-file-validate, for tests/packaging)" >&2
    { apt-get install -y -q desktop-file-utils || { apt-get update -q && apt-get install -y -q desktop-file-utils; }; } \
      >/dev/null 2>&1 || echo "tessera: could not install desktop-file-utils; the .desktop validation test will skip" >&2
  else
    echo "tessera: desktop-file-validate is missing; 'sudo apt-get install desktop-file-utils' lets the tests validate" \
      "the launcher's .desktop entry (that test skips without it)" >&2
  fi
fi
