"""Quantized MoE decode, before/after in one process: an older build of engine._native (copied to OLD_DIR/oldq/) against
this tree's, interleaved with the read-bandwidth probe, on the Qwen3-30B-A3B layer shape (bench-moe's random blocks).

usage: python scripts/quant_decode_ab.py DTYPE[,DTYPE...] [rounds] [T]     (AB_E=8: experts fit the L3: compute only)
  mkdir -p /tmp/qk/old/oldq && touch /tmp/qk/old/oldq/__init__.py &&
  cp OTHER_TREE/.venv/lib/python3.11/site-packages/tessera/engine/_native*.so /tmp/qk/old/oldq/
Per round: probe (2 threads), then each build's best 10-step batch (order alternating); medians over rounds. "%" =
median of quantized bytes per token / step time / that round's probe (T=1 only).
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import time
import warnings

TYPE_IDS = {"Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_XS": 23}


def main() -> None:
    warnings.filterwarnings("ignore")  # nanobind: the second module's types are registered already
    sys.path.insert(0, ".")
    sys.path.insert(0, os.environ.get("OLD_DIR", "/tmp/qk/old"))
    import numpy as np
    import torch

    from tessera.engine import _native as new
    from tessera.engine.cli.bench_moe_quant import DTYPES, random_blocks
    old = importlib.import_module("oldq._native")
    E, H, I, k = int(os.environ.get("AB_E", 128)), 2048, 768, 8
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    T = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    pool = new.Pool(2)
    for dt in sys.argv[1].split(","):
        names = DTYPES[dt]
        ty = [TYPE_IDS[t] for t in names]
        rng = np.random.default_rng(0)
        g, u, d = (random_blocks(names[0], E, I, H, rng), random_blocks(names[1], E, I, H, rng),
                   random_blocks(names[2], E, H, I, rng))
        per_tok = k * (g.nbytes + u.nbytes + d.nbytes) / E
        gen = torch.Generator().manual_seed(0)
        x, w = torch.randn(T, H, generator=gen), torch.softmax(torch.randn(T, k, generator=gen), -1)
        ids = [torch.argsort(torch.rand(T, E, generator=gen), dim=1)[:, :k].contiguous() for _ in range(500)]
        outs, res, n = {}, {"old": [], "new": []}, 0
        for r in range(rounds):
            bw = new.read_bandwidth(pool, 256, 0.2)
            order = (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old))
            for name, mod in order:
                out = torch.empty(T, H)
                best, t_end = float("inf"), time.perf_counter() + 0.4
                while time.perf_counter() < t_end:
                    t0 = time.perf_counter()
                    for _ in range(10):
                        mod.quant_moe_forward(ty[0], g, ty[1], u, ty[2], d, ids[n % 500], w, x, out, pool,
                                              "avx512_vnni")
                        n += 1
                    best = min(best, (time.perf_counter() - t0) / 10)
                res[name].append((best, bw))
                mod.quant_moe_forward(ty[0], g, ty[1], u, ty[2], d, ids[0], w, x, out, pool, "avx512_vnni")
                outs[name] = out.clone()
        rel = float((outs["new"] - outs["old"]).norm() / outs["old"].norm())
        line = f"{dt:7} T={T}:"
        for name in ("old", "new"):
            us = statistics.median(b for b, _ in res[name]) * 1e6
            line += f"  {name} {us:6.0f} us"
            if T == 1:
                pct = statistics.median(100 * per_tok / b / 1e9 / bw for b, bw in res[name])
                line += f" {per_tok / us / 1e3:5.1f} GB/s {pct:4.0f} %"
        bws = [bw for _, bw in res["new"]]
        print(line + f"  | probe {min(bws):.1f}-{max(bws):.1f} GB/s, new vs old rel diff {rel:.1e}", flush=True)


if __name__ == "__main__":
    main()
