"""Threads per phase: is a decode step (T = 1) or a prefill call faster on fewer threads than the pool has? One MoE
layer of Qwen3-30B-A3B's shape (calibrate.synthetic_layer: random bf16 weights, as many experts as 160 MB hold) on the
given backend, and the quantized MoE on random Q4_K blocks (calibrate.synthetic_quant_prefill), each on pools of every
thread count asked for, the pools alternating call by call in one process (a busy moment hurts them all alike); median
milliseconds per call.

    python scripts/bench_phase_threads.py [--backend Auto] [--threads 1 2] [--rounds 15] [--prefill-tokens 128]

Prints figures only; nothing is asserted. If no thread count below the pool's wins either phase, a per-phase thread
count has nothing to tune on this CPU (tessera/tuning.h, the fixed constants; docs/BENCHMARKS.md "Self-tuning,
second pass").
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="Auto")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--prefill-tokens", type=int, default=128)
    args = p.parse_args()

    import torch

    from tessera.engine import calibrate, native
    from tessera.engine.backends import resolve
    from tessera.engine.cli.bench_moe import SHAPES

    E, H, I, k = SHAPES["qwen3-30b-a3b"]
    concrete, _ = resolve(args.backend)
    layer, n = calibrate.synthetic_layer(E, H, I, k)
    backends = {t: native.make_backend(concrete, {0: layer}, threads=t) for t in args.threads}
    gen = torch.Generator().manual_seed(1)
    x1 = torch.randn(1, H, generator=gen)  # [1, H]
    w1 = torch.softmax(torch.randn(1, k, generator=gen), -1)  # [1, k]
    draws = [torch.argsort(torch.rand(1, n, generator=gen), dim=1)[:, :k].contiguous() for _ in range(64)]
    T = args.prefill_tokens
    xp = torch.randn(T, H, generator=gen)  # [T, H]
    wp = torch.softmax(torch.randn(T, k, generator=gen), -1)  # [T, k]
    idp = torch.argsort(torch.rand(T, n, generator=gen), dim=1)[:, :k].contiguous()  # [T, k]
    isa = native.quant_isa_for_backend(concrete)
    qlayer = calibrate.synthetic_quant_layer(E, H, I, k)
    quant = {t: calibrate.synthetic_quant_prefill(qlayer, E, k, T, backends[t].pool, isa) for t in args.threads}
    state = {"i": 0}

    def decode(t: int) -> None:  # 8 steps on fresh random experts (weights from memory)
        for _ in range(8):
            state["i"] = (state["i"] + 1) % len(draws)
            backends[t].forward(0, x1, draws[state["i"]], w1)

    work = {"decode x8": decode, f"prefill T={T}": lambda t: backends[t].forward(0, xp, idp, wp),
            f"Q4_K prefill T={T} ({isa})": lambda t: quant[t]()}
    times = {(w, t): [] for w in work for t in args.threads}
    for fn in work.values():  # warm every pool and page once
        for t in args.threads:
            fn(t)
    for r in range(args.rounds):
        for w, fn in work.items():
            order = args.threads if r % 2 == 0 else args.threads[::-1]
            for t in order:
                t0 = time.perf_counter()
                fn(t)
                times[(w, t)].append(1e3 * (time.perf_counter() - t0))
    print(f"backend {concrete}, {n} of {E} experts (bf16), quantized ISA {isa}, {args.rounds} interleaved rounds; "
          "median ms per call (min-max)")
    for w in work:
        print(f"  {w}: " + ", ".join(f"{t} threads {statistics.median(times[(w, t)]):.2f} "
                                     f"({min(times[(w, t)]):.2f}-{max(times[(w, t)]):.2f})" for t in args.threads))


if __name__ == "__main__":
    main()
