"""Measures the CPU-dependent kernel knobs on this machine (issue 16 item 3): each candidate value is timed on a
synthetic MoE layer of the model's (or a preset's) shape, candidates interleaved round by round so a noisy moment
hurts them all alike, and the best median wins; a knob keeps its default unless another value is measurably faster
(MARGIN). The result is a record for tessera/engine/tuned.py.

What is tuned, and on which work (only knobs the chosen backend reads are measured):
  spin_us                 pool workers' spin after a job before they sleep: decode steps (T=1), every native backend
  prefetch_bytes          how far ahead the AVX512/AVX2 bf16 kernels prefetch weight panels: decode steps
  amx_tile_min_rows       experts with at least this many rows use AMX tiles: prefill of PREFILL_T tokens, AMX backends
  quant_moe_chunk_tokens  tokens per pass of the quantized (GGUF blocks) MoE: a QUANT_PREFILL_T-token prefill call on
                          random Q4_K blocks, every backend with a SIMD quantized ISA (AVX512*, AMX*, AVX2). Only
                          `tessera-cli tune` measures it (a prefill call takes ~0.5 s here; the first load's
                          calibration stays ~2 s): until then the default (0: 2048 tokens, quant_driver.cpp's
                          quant_moe_default_chunk) is used.
  vnni_gemm_min_tokens    from how many tokens an expert's block takes the AVX-512 VNNI GEMM instead of the mat-vec per
                          token (0: the kernels' 12): the same quantized prefill, backends on avx512_vnni; `tune` only.
  decode_streams          sequential row streams per thread of the quantized decode mat-vecs (1 or 2; 0: the CPU's
                          default, Intel 2, others 1): one-token steps of the quantized MoE on random Q4_K blocks
                          (weights from memory), every backend with a SIMD quantized ISA.
  avx2_gemm_min_tokens    from how many tokens an expert's block takes the AVX2 GEMM instead of the row tiles (0: the
                          kernels' table per type and dot, 2-4 tokens): a QUANT_SHORT_T-token quantized prefill (about
                          2 tokens an expert, where this threshold decides), backends whose quantized ISA is avx2;
                          `tune` only. The tables were measured on a Zen 4 and an Intel Xeon and disagree
                          (docs/BENCHMARKS.md, session 16): the user's CPU settles it.
The synthetic layer has the real H, I and k and only as many experts as fit in LAYER_BYTES (weights still far larger
than the caches, so decode streams them from memory as a real layer does). The quantized prefill routes over all E
experts as the random-weight files do (per-expert logit offsets N(0, 2) plus per-token N(0, 1), top-k) and drops the
slots of experts the synthetic layer lacks, so each expert present gets the tokens it would get in the real layer.

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
QUANT_PREFILL_T = 2048  # = generate.PREFILL_CHUNK: the longest call the engine makes
QUANT_SHORT_T = 32  # a short prompt (a chat turn): ~2 tokens an expert on Qwen3-30B-A3B (32 x 8 slots, 128 experts)
QUANT_TYPE = "Q4_K"  # the quantized synthetic layer's type (the common GGUF experts' type)


@dataclass(frozen=True)
class Knob:
    name: str
    default: int  # the value the kernels use without a record (tessera/tuning.h)
    candidates: tuple[int, ...]
    workload: str  # "decode", "prefill" (bf16 layer), "quant_prefill", "quant_prefill_short", "quant_decode" (Q4_K)
    on_load: bool = True  # measured by the first load's short calibration too (else by `tessera-cli tune` only)


SPIN = Knob("spin_us", 50, (0, 10, 50, 200), "decode")
PREFETCH = Knob("prefetch_bytes", -1, (-1, 0, 2048, 4096, 16384), "decode")  # -1: kKC * 64 = 8192 bytes
AMX_TILE_ROWS = Knob("amx_tile_min_rows", 0, (0, 1, 2, 4, 8, 16, 32), "prefill")  # 0: per format (bf16 2, int8 16)
# Values above QUANT_PREFILL_T act as QUANT_PREFILL_T on the engine's calls: not candidates.
# 0: the kernels' default (quant_driver.cpp quant_moe_default_chunk: 2048 tokens on every quantized ISA).
QUANT_CHUNK = Knob("quant_moe_chunk_tokens", 0, (0, 128, 256, 512, 1024, 2048), "quant_prefill", on_load=False)
# 0: quant_kernels.h kGemmMinTokens (12), the kernels' default; the kernel never goes below 2 (decode: the mat-vec).
VNNI_GEMM_MIN = Knob("vnni_gemm_min_tokens", 0, (0, 4, 8, 16, 24), "quant_prefill", on_load=False)
# 0: the per-vendor default of native/include/tessera/tuning.h decode_streams() (Intel 2, others 1).
DECODE_STREAMS = Knob("decode_streams", 0, (0, 1, 2), "quant_decode")
# 0: quant_kernels.h avx2_gemm_min_tokens (per type and dot); one value here applies to every type (the knob's meaning).
AVX2_GEMM_MIN = Knob("avx2_gemm_min_tokens", 0, (0, 2, 3, 4, 6), "quant_prefill_short", on_load=False)


def knobs_for(backend: str, *, on_load: bool = False) -> list[Knob]:
    """The knobs `backend`'s kernels read (moe_body.inc's prefetch: AVX512 and AVX2; tiles: AMX*; the quantized MoE's
    chunk: every backend whose quantized ISA is SIMD), and with `on_load` only those the first load measures."""
    out = [SPIN]
    if backend in ("AVX512", "AVX2"):
        out.append(PREFETCH)
    if backend.startswith("AMX") and not backend.endswith("-emulated"):
        out.append(AMX_TILE_ROWS)
    if backend.startswith(("AVX512", "AVX2", "AMX")):
        out += [QUANT_CHUNK, DECODE_STREAMS]
    if backend.startswith(("AVX512", "AMX")):  # quantized ISA amx_int8 / avx512_vnni where the CPU has it (run checks)
        out.append(VNNI_GEMM_MIN)
    if backend.startswith(("AVX512", "AVX2")):  # quantized ISA avx2: AVX2, or AVX-512 without VNNI (run checks)
        out.append(AVX2_GEMM_MIN)
    return [kn for kn in out if kn.on_load or not on_load]


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
    (never fewer than k): gate/up [E', I, H], down [E', H, I]. One expert is drawn at random and copied to the others:
    the kernels' time depends on the bytes they stream (each expert its own copy in memory), not on the values, and
    drawing all of them (75 M normal values for Qwen3-30B-A3B's shape) was 1.3 s of the first load's calibration."""
    import torch

    from tessera.engine.experts import LayerExperts

    n = int(max(k, min(E, LAYER_BYTES // (3 * H * I * 2))))
    gen = torch.Generator().manual_seed(seed)

    def weights(*shape):  # [n, out, in] bf16, unit-variance outputs: n copies of one random [out, in] expert
        one = (torch.randn(*shape[1:], generator=gen) * shape[-1] ** -0.5).to(torch.bfloat16)  # [out, in]
        return one.expand(*shape).contiguous()

    return LayerExperts(gate_proj=weights(n, I, H), up_proj=weights(n, I, H), down_proj=weights(n, H, I)), n


def random_q4k(rows: int, K: int, lead: int, gen):
    """[lead, rows, row_bytes] uint8 of random Q4_K blocks (144 bytes per 256 values): random codes and sub-scales,
    d and dmin of 2^-9 (finite, weights of order 0.01-0.1): timing only, the values mean nothing."""
    import torch

    from tessera.engine import native

    nb = K // 256
    raw = torch.randint(0, 256, (lead, rows, nb, 144), dtype=torch.uint8, generator=gen)
    scale = torch.tensor([2.0**-9, 2.0**-9], dtype=torch.float16).view(torch.uint8)  # d, dmin: bytes 0-3
    raw[..., 0:4] = scale
    assert nb * 144 == native.quant_row_bytes(QUANT_TYPE, K)
    return raw.reshape(lead, rows, nb * 144)


def synthetic_quant_layer(E: int, H: int, I: int, k: int, seed: int = 2):
    """(gate, up, down, n, gen): a random Q4_K layer of the real H, I with n of the E experts (as many as LAYER_BYTES
    holds, at least k): gate/up [n, I, row_bytes(H)], down [n, H, row_bytes(I)]; gen: the generator, for the routing."""
    import torch

    from tessera.engine import native

    per_expert = 2 * I * native.quant_row_bytes(QUANT_TYPE, H) + H * native.quant_row_bytes(QUANT_TYPE, I)
    n = int(max(k, min(E, LAYER_BYTES // per_expert)))
    gen = torch.Generator().manual_seed(seed)
    return random_q4k(I, H, n, gen), random_q4k(I, H, n, gen), random_q4k(H, I, n, gen), n, gen


def synthetic_quant_decode(layer, k: int, pool, isa: str):
    """`run()`: one quant_moe_forward of one token on `layer` (synthetic_quant_layer's), k fresh random experts each
    call from a cycle of 64 draws, so the weights come from memory as in a real decode step."""
    import torch

    from tessera.engine import native

    gate, up, down, n, gen = layer
    H = down.shape[1]
    draws = [torch.randperm(n, generator=gen)[:k].reshape(1, k).contiguous() for _ in range(64)]  # [1, k] each
    x = torch.randn(1, H, generator=gen)  # [1, H]
    weights = torch.softmax(torch.randn(1, k, generator=gen), -1)  # [1, k]
    out = torch.empty(1, H)  # [1, H]
    state = {"i": 0}

    def run() -> None:
        state["i"] = (state["i"] + 1) % len(draws)
        native.quant_moe_forward(QUANT_TYPE, gate, QUANT_TYPE, up, QUANT_TYPE, down, draws[state["i"]], weights, x, out,
                                 pool, isa)

    return run


def synthetic_quant_prefill(layer, E: int, k: int, T: int, pool, isa: str):
    """`run()` is one quant_moe_forward of T tokens on `layer` (synthetic_quant_layer's: n of the E experts), routed
    as described at the top of this file."""
    import torch

    from tessera.engine import native

    gate, up, down, n, gen = layer
    H = down.shape[1]
    logits = 2 * torch.randn(1, E, generator=gen) + torch.randn(T, E, generator=gen)  # [T, E]
    top, ids = torch.topk(logits, k, dim=1)  # [T, k]
    weights = torch.softmax(top, -1).float().contiguous()  # [T, k]
    perm = torch.randperm(E, generator=gen)  # which n of the E experts the layer holds: a random sample
    ids = perm[ids]
    ids = torch.where(ids < n, ids, torch.full_like(ids, -1)).contiguous()  # [T, k], -1: an expert not held
    x = torch.randn(T, H, generator=gen)  # [T, H]
    out = torch.empty(T, H)  # [T, H]

    def run() -> None:
        native.quant_moe_forward(QUANT_TYPE, gate, QUANT_TYPE, up, QUANT_TYPE, down, ids, weights, x, out, pool, isa)

    return run


def run(backend: str, E: int, H: int, I: int, k: int, *, threads: int | None = None, seconds: float = 3.0,
        rounds: int = 5, on_load: bool = False, progress: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.perf_counter) -> dict:
    """Calibrates the knobs `backend` reads ("Auto" resolved) on a synthetic layer of shape E, H, I, k within about
    `seconds` of timing (packing the layer comes on top), and returns the record engine.tuned.save stores. `on_load`:
    only the knobs the first load measures (Knob.on_load); the others are left out of the record (defaults)."""
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
    todo = [kn for kn in knobs_for(concrete, on_load=on_load) if tuned.KNOBS[kn.name] not in env]
    quantized = ("quant_prefill", "quant_prefill_short", "quant_decode")
    if any(kn.workload in quantized for kn in todo) and (H % 256 or I % 256):
        say(f"quantized knobs: not measured, H={H} and I={I} are not whole {QUANT_TYPE} blocks (256 values)")
        todo = [kn for kn in todo if kn.workload not in quantized]
    if VNNI_GEMM_MIN in todo and native.quant_isa_for_backend(concrete) not in ("amx_int8", "avx512_vnni"):
        todo.remove(VNNI_GEMM_MIN)  # this CPU's AVX-512 lacks VNNI: the quantized kernels are AVX2's
    if AVX2_GEMM_MIN in todo and native.quant_isa_for_backend(concrete) != "avx2":
        todo.remove(AVX2_GEMM_MIN)  # the quantized kernels are AVX-512 VNNI's
    shape = {"E": E, "H": H, "I": I, "k": k, "experts_timed": n}
    isa = native.quant_isa_for_backend(concrete)
    if any(kn.workload in quantized for kn in todo):
        qlayer = synthetic_quant_layer(E, H, I, k)
        shape["quant_experts_timed"] = qlayer[3]
    for workload, T in (("quant_prefill", QUANT_PREFILL_T), ("quant_prefill_short", QUANT_SHORT_T)):
        if any(kn.workload == workload for kn in todo):
            work[workload] = synthetic_quant_prefill(qlayer, E, k, T, experts.pool, isa)
            say(f"quantized prefill: {T} tokens on {qlayer[3]} of {E} random {QUANT_TYPE} experts")
    if any(kn.workload == "quant_decode" for kn in todo):
        work["quant_decode"] = synthetic_quant_decode(qlayer, k, experts.pool, isa)
        say(f"quantized decode: one token on {k} of {qlayer[3]} random {QUANT_TYPE} experts a step")
    for kn in knobs_for(concrete, on_load=on_load):
        if tuned.KNOBS[kn.name] in env:
            say(f"{kn.name}: not measured, {tuned.KNOBS[kn.name]} is set in the environment (it wins)")
    if not todo:
        raise TesseraError("tune", "every knob this backend reads is set in the environment; nothing to measure")
    per_knob = seconds / len(todo)
    knobs = {}
    for knob in todo:
        fn = work[knob.workload]
        fn()
        once = max(timed_steps(fn, 3, clock), 1e-6)
        # at least 3 calls per value and round: one ~40 ms quantized prefill call per round stored a noisy threshold
        # (docs/BENCHMARKS.md "Self-tuning, second pass"), so tune takes longer than `seconds` where calls are long
        steps = max(3, int(per_knob / (rounds * len(knob.candidates) * once)))
        say(f"{knob.name}: {len(knob.candidates)} values x {rounds} rounds x {steps} {knob.workload} steps")
        best, medians = measure_knob(knob, fn, steps, rounds, clock)
        knobs[knob.name] = {"value": int(best), "default": knob.default, "workload": knob.workload,
                            "median_ms": {str(c): round(1e3 * t, 4) for c, t in medians.items()}}
        say(f"{knob.name} = {best} (" + ", ".join(f"{c}: {1e3 * t:.3f} ms" for c, t in medians.items()) + ")")
    return {"tessera_tuning": tuned.RECORD_VERSION, "cpu": tuned.cpu_model(), "build": tuned.build_id(),
            "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "seconds": round(time.perf_counter() - t_start, 2), "backend": concrete, "threads": experts.threads,
            "shape": shape, "knobs": knobs}
