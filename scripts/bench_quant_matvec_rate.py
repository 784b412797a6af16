"""Is the decode mat-vec compute-bound or memory-bound? The same quantized mat-vec (engine.native.quant_matvec_multi,
T = 1) timed on weights that stay in L2, in L3, and that stream from memory, on 1 and 2 threads, with the machine's
read bandwidth probed beside it. If the in-cache rate of one thread is not well above the memory rate per core, the
kernel's instructions, not the memory, set decode's speed.

    python scripts/bench_quant_matvec_rate.py [--types Q4_K,Q6_K] [--threads 1,2] [--rounds 5] [--isa avx512_vnni]
                                              [--file-map DIR]

Sizes (rows x 2048 values): L2 (per thread ~0.4 MB), L3 (~8 MB), memory (~600 MB, several matrices in turn so no
pass finds the previous one's rows in the L3). Prints one line per (type, threads, size): median GB/s of weight
bytes over --rounds rounds, each round the best of batches over ~0.3 s. Figures only: no assertion.
--file-map DIR adds "file map": the memory-size matrices written to a file in DIR, then read through a read-only
shared map of it (the page cache's 4 KiB pages, as the model's GGUF map is read), populated first; numpy's own arrays
(the other rows) are anonymous memory, which numpy advises onto transparent huge pages where the kernel allows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

import numpy as np
import torch

from tessera.engine import _native as nat
from tessera.engine.cli.bench_moe_quant import random_blocks

TYPE_IDS = {"Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_XS": 23}
K = 2048


def _rate(ws, qtype: int, x, outs, pool, isa: str, seconds: float) -> float:
    """Best GB/s over batches of one pass over every matrix in ws (each a separate call)."""
    nbytes = sum(w.nbytes for w in ws)
    best, t_end = float("inf"), time.perf_counter() + seconds
    reps = max(1, int(2e6 // nbytes))  # small weights: several passes per batch (timer resolution)
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        for _ in range(reps):
            for w, o in zip(ws, outs):
                nat.quant_matvec_multi(x, [qtype], [w], [o], pool, isa)
        best = min(best, (time.perf_counter() - t0) / reps)
    return nbytes / best / 1e9


def _file_mapped(ws, folder: str) -> list:
    """The same matrices, read through a read-only shared map of a file holding them (page-cache pages), populated
    by one read pass. The file is unlinked at once: the map keeps it alive until the process ends."""
    fd, path = tempfile.mkstemp(dir=folder, suffix=".blocks")
    with os.fdopen(fd, "wb") as f:
        for w in ws:
            f.write(w.numpy().tobytes())
    m = np.memmap(path, dtype=np.uint8, mode="r")
    os.unlink(path)
    int(m[::4096].sum())  # fault every page into the map
    out, off = [], 0
    for w in ws:
        with warnings.catch_warnings():  # read-only: the kernels never write their weights
            warnings.simplefilter("ignore", UserWarning)
            out.append(torch.from_numpy(np.asarray(m[off:off + w.nbytes]).reshape(w.shape)))
        off += w.nbytes
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default="Q4_K,Q6_K")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--isa", default="avx512_vnni")
    p.add_argument("--file-map", metavar="DIR", help="also read the memory-size matrices from a file map in DIR")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    x = torch.randn(1, K)
    print(f"K={K}, isa={a.isa}; GB/s of weight bytes, median of {a.rounds} rounds (best batch of each)", flush=True)
    for tname in a.types.split(","):
        qt = TYPE_IDS[tname]
        sizes = {  # name: (rows per matrix, matrices)
            "L2": (256, 1),
            "L3": (4096, 1),
            "memory": (8192, 48),
        }
        mats = {s: [torch.from_numpy(random_blocks(tname, 1, r, K, rng)[0]) for _ in range(n)]
                for s, (r, n) in sizes.items()}
        if a.file_map:
            mats["file map"] = _file_mapped(mats["memory"], a.file_map)
        for th in [int(t) for t in a.threads.split(",")]:
            pool = nat.Pool(th)
            for s, ws in mats.items():
                outs = [torch.empty(1, w.shape[0]) for w in ws]
                rates, bws = [], []
                for _ in range(a.rounds):
                    bws.append(nat.read_bandwidth(pool, 256, 0.2))
                    rates.append(_rate(ws, qt, x, outs, pool, a.isa, 0.3))
                mb = sum(w.nbytes for w in ws) / 1e6 / len(ws)
                print(f"{tname:6} threads={th} {s:6} ({mb:7.2f} MB a matrix): {statistics.median(rates):6.1f} GB/s "
                      f"(rounds {min(rates):.1f}-{max(rates):.1f}); read probe {statistics.median(bws):.1f} GB/s",
                      flush=True)


if __name__ == "__main__":
    main()
