#!/usr/bin/env bash
# Remove what packaging/install.sh installed: exactly the paths in its manifest, last created first. Files it did not
# create are never touched; folders it created are removed only when empty (something else may have moved in).
set -euo pipefail

die() { echo "tessera-uninstall: error: $*" >&2; exit 1; }
prefix="${XDG_DATA_HOME:-$HOME/.local/share}/tessera" quiet=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a folder"; prefix="$2"; shift ;;
    --quiet) quiet=1 ;;
    -h|--help) echo "usage: packaging/uninstall.sh [--prefix DIR] [--quiet]"; exit 0 ;;
    *) die "unknown option $1" ;;
  esac
  shift
done
say() { [ "$quiet" = 1 ] || echo "tessera-uninstall: $*" >&2; }
manifest="$prefix/install-manifest.txt"
[ -f "$manifest" ] || die "$manifest: not found (nothing installed there?)"

mapfile -t lines < <(grep -v '^#' "$manifest")
for (( i=${#lines[@]}-1; i>=0; i-- )); do
  kind="${lines[i]%% *}" path="${lines[i]#* }"
  case "$path" in /*) ;; *) die "$manifest: line '${lines[i]}' is not an absolute path; stopping" ;; esac
  case "$kind" in
    file) rm -f -- "$path" ;;
    tree)
      case "$path" in "$prefix"/*) rm -rf -- "$path" ;;
        *) die "$manifest: refusing to remove $path recursively (outside $prefix)" ;; esac ;;
    dir) rmdir -- "$path" 2>/dev/null || { [ -d "$path" ] && say "kept $path (not empty)"; } || true ;;
    *) die "$manifest: unknown entry kind '$kind'" ;;
  esac
done
say "removed Tessera from $prefix"
