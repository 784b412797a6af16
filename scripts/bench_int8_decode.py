"""Int8 MoE decode side by side, interleaved with the read-bandwidth probe, on the Qwen3-30B-A3B layer shape
(bench-moe's random bf16 weights): AVX512Int8 and AMXInt8 by default. Where the CPU lacks AMX, name AMXInt8-emulated
instead: at decode (one row per expert, below the tile threshold) it runs exactly AMXInt8's vector kernel on the same
packed bytes, so its decode time is AMXInt8's on this CPU; only its prefill is emulated (not timed here).

usage: python scripts/bench_int8_decode.py [BACKEND,BACKEND...] [rounds] [threads]
Per round: probe, then each backend's best 10-step batch (order alternating between rounds); medians over rounds.
"% bw" = median of (packed bytes of the k experts read per step / step time / that round's probe).
"""

from __future__ import annotations

import statistics
import sys
import time


def main() -> None:
    import torch

    import tessera.engine.native as N

    _native = N._native
    names = (sys.argv[1] if len(sys.argv) > 1 else "AVX512Int8,AMXInt8").split(",")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else N.physical_cores()
    E, H, I, k = 128, 2048, 768, 8
    pool = _native.Pool(threads)
    gen = torch.Generator().manual_seed(0)

    def weights(*shape):  # [.., out, in] bf16, unit-variance outputs (bench-moe's recipe)
        return (torch.randn(*shape, generator=gen) * shape[-1] ** -0.5).to(torch.bfloat16).contiguous()

    gate, up, down = weights(E, I, H), weights(E, I, H), weights(E, H, I)
    blobs = {}
    for n in names:
        b = _native.backend(n)  # raises naming the backend when it is unknown
        status = {s["name"]: s for s in _native.backends()}[n]
        if not status["available"]:
            raise SystemExit(f"{n}: {status['reason']}")
        blob = _native.aligned_empty(b.packed_bytes(E, H, I, "bfloat16"))
        b.pack(gate, up, down, blob, pool)
        blobs[n] = (b, blob, blob.nbytes / E * k)
    del gate, up, down
    x = torch.randn(1, H, generator=gen)  # [1, H]
    w = torch.softmax(torch.randn(1, k, generator=gen), -1)  # [1, k]
    out = torch.empty(1, H)
    ids = [torch.argsort(torch.rand(1, E, generator=gen), dim=1)[:, :k].contiguous() for _ in range(400)]

    def best_step(n):  # best mean over batches of 10 decode steps, fresh experts every step
        b, blob, _ = blobs[n]
        b.forward(blob, ids[0], w, x, out, pool)
        best = float("inf")
        for s in range(0, len(ids), 10):
            t0 = time.perf_counter()
            for i in ids[s : s + 10]:
                b.forward(blob, i, w, x, out, pool)
            best = min(best, (time.perf_counter() - t0) / 10)
        return best

    pct = {n: [] for n in names}
    gbs = {n: [] for n in names}
    probes = []
    for r in range(rounds):
        bw = float(_native.read_bandwidth(pool, 256.0, 0.1))
        probes.append(bw)
        for n in names if r % 2 == 0 else names[::-1]:
            g = blobs[n][2] / best_step(n) / 1e9
            gbs[n].append(g)
            pct[n].append(100 * g / bw)
    print(f"{threads} threads, {rounds} rounds, probe median {statistics.median(probes):.1f} GB/s "
          f"(min {min(probes):.1f}, max {max(probes):.1f})")
    for n in names:
        step_us = blobs[n][2] / statistics.median(gbs[n]) / 1e3
        print(f"{n:>18}: decode {step_us:7.0f} us, {statistics.median(gbs[n]):5.1f} GB/s, "
              f"{statistics.median(pct[n]):5.1f} % of bandwidth (interleaved median; rounds "
              f"{', '.join(f'{p:.0f}' for p in pct[n])})")


if __name__ == "__main__":
    main()
