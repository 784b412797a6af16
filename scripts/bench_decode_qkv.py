"""A decode step's bf16 q/k/v projections on Qwen3-30B-A3B's shapes: one dense_matvec call per matrix (three pool
dispatches a layer) against one dense_matvec_multi call (one dispatch), alternating in one process, in ms per pass
over all layers and weight GB/s, beside the machine's streaming-read probe.

    python scripts/bench_decode_qkv.py [--threads 2] [--layers 8] [--rounds 9] [--passes 10] [--json]

Random bf16 weights for --layers layers (q 4096x2048, k and v 512x2048, and o 2048x4096 for reference), resident in
anonymous memory; each pass runs the layers in order, so no layer's weights are still in the caches when it runs
again (as in a decode step). Median over --rounds rounds of --passes passes. Prints figures only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from tessera.engine import native

H, Q, KV = 2048, 4096, 512  # hidden size, nh * hd, nkv * hd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--passes", type=int, default=10)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()

    pool = native.make_pool(a.threads)
    g = torch.Generator().manual_seed(0)
    layers = [[(torch.randn(n, H, generator=g) * 0.02).bfloat16() for n in (Q, KV, KV)] for _ in range(a.layers)]
    o_ws = [(torch.randn(H, Q, generator=g) * 0.02).bfloat16() for _ in range(a.layers)]  # [H, nh*hd]
    x = torch.randn(1, H, generator=g)  # [1, H]
    xo = torch.randn(1, Q, generator=g)  # [1, nh*hd]
    outs = [torch.empty(1, n) for n in (Q, KV, KV)]
    out_o = torch.empty(1, H)

    def separate():
        for ws in layers:
            for w, out in zip(ws, outs):
                native.dense_matvec(w, x, out, pool)

    def multi():
        for ws in layers:
            native.dense_matvec_multi(ws, x, outs, pool)

    def o_proj():
        for w in o_ws:
            native.dense_matvec(w, xo, out_o, pool)

    modes = {"separate": separate, "multi": multi, "o_proj": o_proj}
    times: dict[str, list[float]] = {m: [] for m in modes}
    for fn in modes.values():
        fn()  # warm: first touches
    for _ in range(a.rounds):
        for name, fn in modes.items():
            t0 = time.perf_counter()
            for _ in range(a.passes):
                fn()
            times[name].append((time.perf_counter() - t0) / a.passes * 1e3)
    qkv_bytes = a.layers * (Q + 2 * KV) * H * 2
    nbytes = {"separate": qkv_bytes, "multi": qkv_bytes, "o_proj": a.layers * H * Q * 2}
    med = {m: statistics.median(t) for m, t in times.items()}
    result = {"threads": a.threads, "layers": a.layers, "ms": med,
              "GB_s": {m: nbytes[m] / (med[m] * 1e-3) / 1e9 for m in med},
              "read_bandwidth_GB_s": native.read_bandwidth(a.threads, seconds=0.5)}
    if a.json:
        print(json.dumps(result))
        return
    print(f"{a.layers} layers, {a.threads} threads, medians of {a.rounds} rounds x {a.passes} passes; "
          f"read probe {result['read_bandwidth_GB_s']:.1f} GB/s")
    for m in modes:
        print(f"  {m:9s} {med[m]:7.2f} ms  {result['GB_s'][m]:5.1f} GB/s  (rounds: "
              + " ".join(f"{t:.2f}" for t in times[m]) + ")")


if __name__ == "__main__":
    main()
