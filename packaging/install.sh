#!/usr/bin/env bash
# Install Tessera for the current user: an isolated virtual environment, the right torch build (CUDA when an NVIDIA
# driver answers, else CPU), the icon, and a freedesktop menu entry (and a desktop icon with --desktop) that starts the
# GUI without a terminal. Every path created is recorded in a manifest; packaging/uninstall.sh removes exactly those.
# See packaging/README.md.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: packaging/install.sh [options]
  --desktop                also put the launcher on the desktop
  --prefix DIR             install into DIR (default: ${XDG_DATA_HOME:-~/.local/share}/tessera)
  --source DIR             Tessera source checkout to install (default: the one containing this script)
  --torch SPEC             pip requirement for torch, overriding the automatic CPU/CUDA choice
  --system-site-packages   let the environment see the interpreter's packages (torch, PySide6, ...; a virtual
                           environment's own included) and install
                           Tessera without downloading dependencies (offline installs, CI, tests)
  --editable               install the source checkout in editable mode (developers; reuses its build/ folder)
  --show-torch             print the torch requirement that would be installed, and exit
  --reinstall              uninstall a previous installation first
  -h, --help               this text
Environment: PYTHON (interpreter for the environment, default python3), XDG_DATA_HOME, XDG_DESKTOP_DIR.
USAGE
}

die() { echo "tessera-install: error: $*" >&2; exit 1; }
say() { echo "tessera-install: $*" >&2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data_home="${XDG_DATA_HOME:-$HOME/.local/share}"
prefix="$data_home/tessera"
source_dir="$(dirname "$here")"
desktop=0 system_site=0 editable=0 show_torch=0 reinstall=0 torch_spec=""
while [ $# -gt 0 ]; do
  case "$1" in
    --desktop) desktop=1 ;;
    --prefix) [ $# -ge 2 ] || die "--prefix needs a folder"; prefix="$2"; shift ;;
    --source) [ $# -ge 2 ] || die "--source needs a folder"; source_dir="$2"; shift ;;
    --torch) [ $# -ge 2 ] || die "--torch needs a requirement"; torch_spec="$2"; shift ;;
    --system-site-packages) system_site=1 ;;
    --editable) editable=1 ;;
    --show-torch) show_torch=1 ;;
    --reinstall) reinstall=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
  shift
done

# torch: the CUDA build when an NVIDIA driver answers (PyPI's Linux wheel bundles the CUDA runtime), else the CPU build
# from PyTorch's CPU index (a bare `pip install torch` would download gigabytes of CUDA libraries for nothing). The
# choice, and its fallback when that index cannot be reached, is shared with ./run.sh and ./test.sh.
source "$here/../scripts/torch_choice.sh"
choose_torch "$torch_spec" "torch"
if [ "$show_torch" = 1 ]; then
  echo "$torch_spec${torch_index:+ --index-url $torch_index}  # $torch_kind"
  exit 0
fi

case "$prefix" in /*) ;; *) prefix="$PWD/$prefix" ;; esac
source_dir="$(cd "$source_dir" && pwd)" || die "--source: no such folder"
[ -f "$source_dir/pyproject.toml" ] && [ -d "$source_dir/tessera/app" ] && [ -d "$source_dir/tessera/engine" ] \
  || die "$source_dir: not a Tessera source checkout (pyproject.toml, tessera/app/, tessera/engine/ expected)"
icons="$source_dir/tessera/resources/icons"
[ -f "$icons/tessera.svg" ] || die "$icons/tessera.svg: missing (the launcher's icon)"
manifest="$prefix/install-manifest.txt"
if [ -f "$manifest" ]; then
  if [ "$reinstall" = 1 ]; then
    "$here/uninstall.sh" --prefix "$prefix"
  else
    die "$prefix: Tessera is already installed here (use --reinstall, or packaging/uninstall.sh first)"
  fi
fi

# --- the manifest: one "KIND PATH" line per thing created, removed in reverse order by uninstall.sh.
#     file: remove the file; tree: remove the folder and everything in it (only the environment, inside the prefix);
#     dir: remove the folder if it is empty (folders such as ~/.local/share/applications that did not exist before).
entries=()
record() { entries+=("$1 $2"); }
write_manifest() {
  mkdir -p "$prefix"
  { echo "# Tessera install manifest: uninstall.sh removes these, last line first"; printf '%s\n' "${entries[@]}"
    echo "file $manifest"; } > "$manifest.tmp"
  mv "$manifest.tmp" "$manifest"
}
mkdir_tracked() {  # create a folder and each missing parent, recording only those this script created
  local path="$1" missing=()
  while [ ! -d "$path" ]; do missing=("$path" "${missing[@]}"); path="$(dirname "$path")"; done
  for path in "${missing[@]}"; do mkdir "$path"; record dir "$path"; done
}
install_file() {  # install_file SRC DEST [MODE]
  mkdir_tracked "$(dirname "$2")"
  install -m "${3:-644}" "$1" "$2"
  record file "$2"
}
failed=1
cleanup() {  # a failed install removes what it made so far
  if [ "$failed" = 1 ] && [ ${#entries[@]} -gt 0 ]; then
    say "install failed; removing what was created"
    write_manifest
    "$here/uninstall.sh" --prefix "$prefix" --quiet || true
  fi
}
trap cleanup EXIT

python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || die "$python: not found (set PYTHON to a Python >= 3.10)"
"$python" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' \
  || die "$python: Python >= 3.10 with the venv module is needed"

mkdir_tracked "$prefix"
venv="$prefix/venv"
say "creating the environment in $venv"
if [ "$system_site" = 1 ]; then "$python" -m venv --system-site-packages "$venv"; else "$python" -m venv "$venv"; fi
record tree "$venv"
if [ "$system_site" = 1 ]; then
  # When $python is itself a virtual environment, --system-site-packages shows only its base interpreter's packages;
  # a .pth file adds the environment's own site-packages too (after the new environment's, as for system packages).
  parent_sites="$("$python" -c 'import site, sys
if sys.prefix != sys.base_prefix: print("\n".join(site.getsitepackages()))')"
  if [ -n "$parent_sites" ]; then
    own_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    printf '%s\n' "$parent_sites" > "$own_site/tessera-parent-env.pth"
  fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
# Tessera's own wheel is built here and installed once: keep it out of the user's pip cache (pip caches a wheel built
# from a folder whose name looks like name-version, e.g. tessera-0.1.0), so uninstall.sh leaves HOME as it was.
own=(--no-cache-dir)
target="$source_dir"
if [ "$system_site" = 1 ]; then
  # Offline: torch, PySide6 and the build tools come from the interpreter's site-packages; nothing is downloaded.
  "$venv/bin/python" -c 'import torch, PySide6, scikit_build_core, nanobind' 2>/dev/null \
    || die "$python: --system-site-packages needs torch, PySide6, scikit-build-core and nanobind installed there"
  say "installing Tessera from $source_dir (no downloads)"
  if [ "$editable" = 1 ]; then
    "${pip[@]}" install -q "${own[@]}" --no-deps --no-build-isolation --no-index -e "$target" >&2
  else
    "${pip[@]}" install -q "${own[@]}" --no-deps --no-build-isolation --no-index "$target" >&2
  fi
else
  say "installing torch: $torch_kind"
  "${pip[@]}" install -q --upgrade pip >&2
  "${pip[@]}" install -q "$torch_spec" ${torch_index:+--index-url "$torch_index"} >&2
  say "installing Tessera from $source_dir"
  if [ "$editable" = 1 ]; then "${pip[@]}" install -q "${own[@]}" -e "$target" >&2
  else "${pip[@]}" install -q "${own[@]}" "$target" >&2; fi
fi
[ -x "$venv/bin/tessera" ] || die "$venv/bin/tessera: the GUI entry point was not installed"

# --- icon: the SVG and every PNG size, in the user's hicolor theme (an absolute path in the entry needs no cache).
icon_root="$data_home/icons/hicolor"
install_file "$icons/tessera.svg" "$icon_root/scalable/apps/tessera.svg"
icon="$icon_root/scalable/apps/tessera.svg"
for png in "$icons"/tessera-*.png; do
  [ -e "$png" ] || continue
  n="${png##*/tessera-}"; n="${n%.png}"
  install_file "$png" "$icon_root/${n}x${n}/apps/tessera.png"
  [ "$n" = 256 ] && icon="$icon_root/256x256/apps/tessera.png"
done

# --- the menu entry. Exec quoting per the Desktop Entry spec: a path with spaces or reserved characters is put in
#     double quotes and % is doubled; the four characters that would need backslash escapes inside quotes are refused.
exec_path="$venv/bin/tessera"
case "$exec_path" in *[\"\`\$\\]*) die "$prefix: the path contains \" \` \$ or \\, which a menu entry cannot hold safely; choose another --prefix" ;; esac
exec_line="${exec_path//%/%%}"
if [[ "$exec_path" =~ [[:space:]\'\;\&\|\<\>\(\)\*\?\#~=] ]]; then exec_line="\"$exec_line\""; fi
entry="$(mktemp)"
while IFS= read -r line || [ -n "$line" ]; do
  line="${line//@EXEC@/$exec_line}"; line="${line//@TRYEXEC@/$exec_path}"; line="${line//@ICON@/$icon}"
  printf '%s\n' "$line"
done < "$here/tessera.desktop.in" > "$entry"
install_file "$entry" "$data_home/applications/tessera.desktop"
if [ "$desktop" = 1 ]; then
  desk="${XDG_DESKTOP_DIR:-}"
  [ -n "$desk" ] || desk="$(xdg-user-dir DESKTOP 2>/dev/null || true)"
  [ -n "$desk" ] && [ "$desk" != "$HOME" ] || desk="$HOME/Desktop"
  install_file "$entry" "$desk/tessera.desktop" 755
  command -v gio >/dev/null 2>&1 && gio set "$desk/tessera.desktop" metadata::trusted true 2>/dev/null || true
fi
rm -f "$entry"
if command -v desktop-file-validate >/dev/null 2>&1; then
  desktop-file-validate "$data_home/applications/tessera.desktop" || say "warning: desktop-file-validate complained"
fi
write_manifest
failed=0
say "installed. Start Tessera from the applications menu (Tessera) or run $exec_path"
say "to remove it: $here/uninstall.sh${prefix:+ --prefix \"$prefix\"}"
