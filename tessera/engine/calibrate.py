"""Measures the CPU-dependent kernel knobs on this machine (issue 16 item 3): each candidate value is timed on a
synthetic MoE layer of the model's (or a preset's) shape, candidates interleaved round by round so a noisy moment
hurts them all alike, and the best median wins; a knob keeps its default unless another value is measurably faster
(MARGIN). The result is a record for tessera/engine/tuned.py.

What is tuned, and on which work (only knobs the chosen backend reads are measured):
  spin_us            pool workers' spin after a job before they sleep: decode steps (T=1), every native backend
  prefetch_bytes     how far ahead the AVX512/AVX2 bf16 kernels prefetch weight panels: decode steps
  amx_tile_min_rows  experts with at least this many rows use AMX tiles: prefill of PREFILL_T tokens, AMX backends
The synthetic layer has the real H, I and k and only as many experts as fit in LAYER_BYTES (weights still far larger
than the caches, so decode streams them from memory as a real layer does).

Letters: T tokens, H hidden, I intermediate, E experts, k experts per token.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

MARGIN = 0.02  # a candidate replaces the default only when its median is at least 2 % lower
LAYER_BYTES = 160e6  # bf16 weights of the synthetic layer, at most (and at least k experts)
PREFILL_T = 64


@dataclass(frozen=True)
class Knob:
    name: str
    default: int  # the value the kernels use without a record (tessera/tuning.h)
    candidates: tuple[int, ...]
    workload: str  # "decode" or "prefill"


SPIN = Knob("spin_us", 50, (0, 10, 50, 200), "decode")
PREFETCH = Knob("prefetch_bytes", -1, (-1, 0, 2048, 4096, 16384), "decode")  # -1: kKC * 64 = 8192 bytes
AMX_TILE_ROWS = Knob("amx_tile_min_rows", 16, (1, 2, 4, 8, 16, 32), "prefill")


def knobs_for(backend: str) -> list[Knob]:
    """The knobs `backend`'s kernels read (moe_body.inc's prefetch: AVX512 and AVX2; tiles: AMX*)."""
    out = [SPIN]
    if backend in ("AVX512", "AVX2"):
        out.append(PREFETCH)
    if backend.startswith("AMX") and not backend.endswith("-emulated"):
        out.append(AMX_TILE_ROWS)
    return out


def pick(knob: Knob, measure: Callable[[int], float], rounds: int) -> tuple[int, dict[int, float]]:
    """(best value, median seconds per candidate): `rounds` rounds, each timing every candidate once with
    `measure(value)` (the order rotated each round). The default stays unless a candidate's median beats the
    default's by MARGIN."""
    times: dict[int, list[float]] = {c: [] for c in knob.candidates}
    order = list(knob.candidates)
    for r in range(rounds):
        for c in order[r % len(order):] + order[:r % len(order)]:
            times[c].append(measure(c))
    medians = {c: statistics.median(ts) for c, ts in times.items()}
    best = min(knob.candidates, key=lambda c: (medians[c], c != knob.default))
    base = medians.get(knob.default)
    if base is not None and medians[best] > base * (1 - MARGIN):
        best = knob.default
    return best, medians


def timed_steps(run: Callable[[], None], steps: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call of `run` over `steps` calls (one measurement of one candidate)."""
    t0 = clock()
    for _ in range(steps):
        run()
    return (clock() - t0) / steps


def measure_knob(knob: Knob, work: Callable[[], None], steps: int, rounds: int,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[int, dict[int, float]]:
    """Times `work` with the native knob set to each candidate in turn (engine.native.set_tuning_knob) and picks as
    `pick` does; the knob is left at the default afterwards (the caller applies the record)."""
    from tessera.engine import native

    def measure(value: int) -> float:
        native.set_tuning_knob(knob.name, value)
        work()  # one untimed call after the change (pool workers settle, pages warm)
        return timed_steps(work, steps, clock)

    previous = native.set_tuning_knob(knob.name, knob.default)
    try:
        return pick(knob, measure, rounds)
    finally:
        native.set_tuning_knob(knob.name, previous)


def synthetic_layer(E: int, H: int, I: int, k: int, seed: int = 0):
    """A LayerExperts of random bf16 weights with the real H, I and as many of the E experts as LAYER_BYTES allows
    (never fewer than k): gate/up [E', I, H], down [E', H, I]."""
    import torch

    from tessera.engine.experts import LayerExperts

    n = int(max(k, min(E, LAYER_BYTES // (3 * H * I * 2))))
    gen = torch.Generator().manual_seed(seed)

    def weights(*shape):  # [n, out, in] bf16, unit-variance outputs; one expert at a time (small f32 transient)
        out = torch.empty(*shape, dtype=torch.bfloat16)
        for e in range(shape[0]):
            out[e] = torch.randn(*shape[1:], generator=gen) * shape[-1] ** -0.5
        return out

    return LayerExperts(gate_proj=weights(n, I, H), up_proj=weights(n, I, H), down_proj=weights(n, H, I)), n


def run(backend: str, E: int, H: int, I: int, k: int, *, threads: int | None = None, seconds: float = 3.0,
        rounds: int = 5, progress: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.perf_counter) -> dict:
    """Calibrates the knobs `backend` reads ("Auto" resolved) on a synthetic layer of shape E, H, I, k within about
    `seconds` of timing (packing the layer comes on top), and returns the record engine.tuned.save stores."""
    import datetime

    import torch

    from tessera.engine import native, tuned
    from tessera.engine.backends import resolve
    from tessera.engine.errors import TesseraError

    concrete, _ = resolve(backend)
    if concrete == "Torch":
        raise TesseraError(f"backend {backend}", "the torch experts have no native knobs to tune")
    say = progress or (lambda _m: None)
    t_start = time.perf_counter()
    layer, n = synthetic_layer(E, H, I, k)
    experts = native.make_backend(concrete, {0: layer}, threads=threads)
    gen = torch.Generator().manual_seed(1)
    x1 = torch.randn(1, H, generator=gen)  # [1, H]
    w1 = torch.softmax(torch.randn(1, k, generator=gen), -1)  # [1, k]
    draws = [torch.argsort(torch.rand(1, n, generator=gen), dim=1)[:, :k].contiguous() for _ in range(64)]
    state = {"i": 0}

    def decode() -> None:  # one T=1 step on fresh random experts (weights from memory, not cache)
        state["i"] = (state["i"] + 1) % len(draws)
        experts.forward(0, x1, draws[state["i"]], w1)

    xp = torch.randn(PREFILL_T, H, generator=gen)  # [T, H]
    wp = torch.softmax(torch.randn(PREFILL_T, k, generator=gen), -1)  # [T, k]
    idp = torch.argsort(torch.rand(PREFILL_T, n, generator=gen), dim=1)[:, :k].contiguous()  # [T, k]

    def prefill() -> None:
        experts.forward(0, xp, idp, wp)

    work = {"decode": decode, "prefill": prefill}
    env = set(native.tuning()["from_environment"])
    todo = [kn for kn in knobs_for(concrete) if tuned.KNOBS[kn.name] not in env]
    for kn in knobs_for(concrete):
        if kn not in todo:
            say(f"{kn.name}: not measured, {tuned.KNOBS[kn.name]} is set in the environment (it wins)")
    if not todo:
        raise TesseraError("tune", "every knob this backend reads is set in the environment; nothing to measure")
    per_knob = seconds / len(todo)
    knobs = {}
    for knob in todo:
        fn = work[knob.workload]
        fn()
        once = max(timed_steps(fn, 3, clock), 1e-6)
        steps = max(3, int(per_knob / (rounds * len(knob.candidates) * once)))
        say(f"{knob.name}: {len(knob.candidates)} values x {rounds} rounds x {steps} {knob.workload} steps")
        best, medians = measure_knob(knob, fn, steps, rounds, clock)
        knobs[knob.name] = {"value": int(best), "default": knob.default, "workload": knob.workload,
                            "median_ms": {str(c): round(1e3 * t, 4) for c, t in medians.items()}}
        say(f"{knob.name} = {best} (" + ", ".join(f"{c}: {1e3 * t:.3f} ms" for c, t in medians.items()) + ")")
    return {"tessera_tuning": tuned.RECORD_VERSION, "cpu": tuned.cpu_model(), "build": tuned.build_id(),
            "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "seconds": round(time.perf_counter() - t_start, 2), "backend": concrete, "threads": experts.threads,
            "shape": {"E": E, "H": H, "I": I, "k": k, "experts_timed": n}, "knobs": knobs}
