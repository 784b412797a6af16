#!/usr/bin/env bash
# Remove what packaging/install.sh installed: exactly the paths in its manifest, last created first. Files it did not
# create are never touched; folders it created are removed only when empty (something else may have moved in).
set -euo pipefail

die() { echo "tessera-uninstall: error: $*" >&2; exit 1; }
prefix="${XDG_DATA_HOME:-$HOME/.local/share}/tessera" quiet=0 cache_choice=ask
# The packed-weight cache (tessera/engine/pack_cache.py default_root): packed expert copies, often tens of GB.
cache="${TESSERA_PACK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/packed}"
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a folder"; prefix="$2"; shift ;;
    --quiet) quiet=1 ;;
    --remove-cache) cache_choice=remove ;;
    --keep-cache) cache_choice=keep ;;
    -h|--help) echo "usage: packaging/uninstall.sh [--prefix DIR] [--quiet] [--remove-cache | --keep-cache]"
               echo "  without either cache option, asks on a terminal whether to remove $cache (kept otherwise)"
               exit 0 ;;
    *) die "unknown option $1" ;;
  esac
  shift
done
say() { [ "$quiet" = 1 ] || echo "tessera-uninstall: $*" >&2; }
manifest="$prefix/install-manifest.txt"
if [ ! -f "$manifest" ]; then  # already uninstalled: only the cache may be left to remove
  [ "$cache_choice" = remove ] || die "$manifest: not found (nothing installed there?)"
  lines=()
else
  mapfile -t lines < <(grep -v '^#' "$manifest")
fi
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
[ ${#lines[@]} -eq 0 ] || say "removed Tessera from $prefix"

# Only the cache's own entries go (layers/, models/, format-1 <model>-<backend>-v<N>/ folders); anything else a user
# put in that folder stays, and the folder itself is removed only when that leaves it empty.
if [ -d "$cache" ]; then
  size="$(du -sh -- "$cache" 2>/dev/null | cut -f1)"
  if [ "$cache_choice" = ask ]; then
    cache_choice=keep
    if [ -t 0 ]; then
      read -r -p "tessera-uninstall: also remove the packed-weight cache $cache (${size:-?})? [y/N] " answer || true
      case "$answer" in [yY]*) cache_choice=remove ;; esac
    else
      say "kept the packed-weight cache $cache (${size:-?}); run again with --remove-cache to remove it"
    fi
  fi
  if [ "$cache_choice" = remove ]; then
    rm -rf -- "$cache/layers" "$cache/models"
    for d in "$cache"/*-v[0-9]*; do [ -d "$d" ] && rm -rf -- "$d"; done
    rmdir -- "$cache" 2>/dev/null && [ "$(basename -- "$(dirname -- "$cache")")" = tessera ] &&
      rmdir -- "$(dirname -- "$cache")" 2>/dev/null || true
    say "removed the packed-weight cache $cache"
  fi
fi
