"""`tessera-cli cache list|clear`: what the packed-weight cache holds (per model: backend, size, last load) and how to
empty it. The folder is engine.pack_cache.default_root() (TESSERA_PACK_CACHE_DIR overrides it)."""

from __future__ import annotations

import argparse

HELP = "show or clear the packed-weight cache (packed expert copies kept between loads)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="each cached model with its backend, size and last load; the budget")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub.add_parser("clear", help="delete every packed copy (the next load of each model packs again)")
    sub.add_parser("path", help="print the cache folder")


def run(args: argparse.Namespace) -> int:
    import json
    import time

    from tessera.engine.pack_cache import PackCache, default_root, human_bytes
    from tessera.engine.text import terminal_safe

    root = default_root()
    if args.action == "path":
        print(root)
        return 0
    cache = PackCache(root)
    if args.action == "clear":
        if not cache.usable:
            print(f"{terminal_safe(str(root))}: nothing to clear")
            return 0
        freed = cache.clear()
        print(f"cleared {human_bytes(freed)} from {terminal_safe(str(root))}")
        return 0
    models = cache.models()
    held = cache.held_bytes() if cache.usable else 0
    budget, why = cache.budget_explained() if cache.usable else (0, "no usable folder")
    stored = {m.id: sum(cache.layer_path(k).is_file() for k in m.keys) for m in models}
    if args.json:
        print(json.dumps({"folder": str(root), "bytes": held, "budget": budget, "budget_from": why,
                          "models": [{"model": m.model, "backend": m.backend, "bytes": m.bytes,
                                      "layers": len(m.keys), "layers_stored": stored[m.id],
                                      "last_used": m.last_used} for m in models]}))
        return 0
    print(f"packed-weight cache: {terminal_safe(str(root))}")
    for m in reversed(models):  # most recent first
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.last_used))
        part = "" if stored[m.id] == len(m.keys) else (
            f"  ({stored[m.id]} of {len(m.keys)} layers stored; the next load packs the others, and stores those the "
            "budget allows)")
        print(f"  {human_bytes(m.bytes):>10}  {m.backend:<11} {when}  {terminal_safe(m.model)}{part}")
    if not models:
        print("  (empty)")
    print(f"total {human_bytes(held)} of a {human_bytes(budget)} budget ({why})")
    return 0
