"""Does 512-bit vector work run beside AMX tile work on this core? The question behind every tile kernel's epilogue
(the quantized tile GEMM's per-super-block f32 step, AMXInt8's per-group step): if it does, an epilogue placed among the
tile instructions costs nothing; if not, it adds its own time to the tiles'.

    python scripts/bench_amx_overlap.py [--blocks 0 8 16 32 64] [--rounds 7] [--items 20000] [--json]

Per FMA count (blocks x 12 independent vfmadd231ps) and round, `engine.native.amx_overlap` times one item of 16
TDPBSSD (a 32 x 32 block over 4 K-steps, operands reloaded from L1, C tiles zeroed and stored) four ways on the
calling thread: tiles only, FMAs only, the FMAs after each item's tiles, and spread over its K-steps. Prints the
medians in ns per item and the hidden share of the vector work: (tiles + vector - combined) / vector, 100 % when it
runs entirely beside the tiles, 0 % when the two add up, below 0 when they slow each other down. Needs AMX int8 and
AVX-512 (`tessera-cli check`). Prints figures only.
"""

from __future__ import annotations

import argparse
import json
import statistics

from tessera.engine import native

KEYS = ("tiles_ns", "vector_ns", "after_ns", "spread_ns")


def hidden(tiles: float, vector: float, combined: float) -> float | None:
    """Share of the vector time that the combined run did not add to the tiles' time (None without vector work)."""
    return None if vector <= 0.5 else (tiles + vector - combined) / vector


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, nargs="+", default=[0, 4, 8, 16, 32, 64],
                   help="FMA blocks of 12 per item (default 0 4 8 16 32 64)")
    p.add_argument("--rounds", type=int, default=7, help="rounds per FMA count; medians are printed")
    p.add_argument("--items", type=int, default=20000, help="items per timed run (default 20000)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    rows = []
    for blocks in a.blocks:
        runs = [native.amx_overlap(blocks, a.items) for _ in range(a.rounds)]
        med = {k: statistics.median(r[k] for r in runs) for k in KEYS}
        rows.append(dict(fmas=12 * blocks, **med,
                         hidden_after=hidden(med["tiles_ns"], med["vector_ns"], med["after_ns"]),
                         hidden_spread=hidden(med["tiles_ns"], med["vector_ns"], med["spread_ns"])))
    if a.json:
        print(json.dumps(dict(rounds=a.rounds, items=a.items, rows=rows)))
        return 0

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f} %"

    print(f"one thread, medians of {a.rounds} rounds, ns per item of 16 TDPBSSD")
    print(f"{'FMAs':>5} {'tiles':>8} {'vector':>8} {'after':>8} {'spread':>8} "
          f"{'hidden after':>13} {'hidden spread':>14}")
    for r in rows:
        print(f"{r['fmas']:>5} {r['tiles_ns']:>8.1f} {r['vector_ns']:>8.1f} {r['after_ns']:>8.1f} "
              f"{r['spread_ns']:>8.1f} {pct(r['hidden_after']):>13} {pct(r['hidden_spread']):>14}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
