"""`tessera-cli bench-moe --dtype q4_k|...`: one Qwen3-MoE expert layer stored as GGUF quantized blocks (random valid
blocks: random bytes, finite f16 scales), run by the quantized kernels read in place
(`engine.native.quant_moe_forward`).

Decode (T=1, k experts) as microseconds and GB/s of quantized weight bytes read (3 projections x k experts), also as a
percentage of this machine's read bandwidth: median over rounds that each probe the bandwidth and time decode back to
back, interleaved across ISAs. Each decode step routes to fresh random experts and the steps cycle through copies of
the layer (decode_copies), the probe reading a buffer of the same size, so that weights come from memory, not from a
last-level cache larger than one layer. Prefill (each --prompt-lengths T) as milliseconds and GFLOP/s (2 * k * 3 * H
* I per token), median of runs.
Reference is checked for error, not timed. Letters: T tokens, H hidden, I intermediate, E experts, k experts per token.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

# --dtype -> (gate, up, down) GGML type names. The _m mixes put ffn_down one type above gate/up, as llama-quantize's
# Q4_K_M / Q5_K_M do for (most of) a layer's down projections.
DTYPES = {
    "q4_k": ("Q4_K", "Q4_K", "Q4_K"), "q5_k": ("Q5_K", "Q5_K", "Q5_K"), "q6_k": ("Q6_K", "Q6_K", "Q6_K"),
    "q8_0": ("Q8_0", "Q8_0", "Q8_0"), "q4_0": ("Q4_0", "Q4_0", "Q4_0"), "iq4_xs": ("IQ4_XS", "IQ4_XS", "IQ4_XS"),
    "q4_k_m": ("Q4_K", "Q4_K", "Q6_K"), "q5_k_m": ("Q5_K", "Q5_K", "Q6_K"),
}
_SCALE_OFFSETS = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,)}


def random_blocks(type_name: str, E: int, rows: int, K: int, rng: np.random.Generator) -> np.ndarray:
    """[E, rows, row_bytes] uint8 of valid blocks: random codes/sub-scales, f16 scales of magnitude 1e-3..2e-2."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    raw = rng.integers(0, 256, size=(E, rows, K // block, size), dtype=np.uint8)
    for off in _SCALE_OFFSETS[type_name]:
        scale = (rng.uniform(1e-3, 2e-2, raw.shape[:-1]) * rng.choice([-1.0, 1.0], raw.shape[:-1])).astype(np.float16)
        raw[..., off:off + 2] = scale.view(np.uint8).reshape(*raw.shape[:-1], 2)
    return raw.reshape(E, rows, -1)


def last_level_cache_bytes(cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The largest cache of CPU 0 as Linux reports it (sysfs `index*/size`, e.g. "491520K"), 0 where it says nothing."""
    sizes = [0]
    for f in cpu.glob("index*/size"):
        text = f.read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes)


def decode_copies(layer_bytes: int, cache_bytes: int, free_bytes: int) -> int:
    """How many copies of the layer the decode steps cycle through: enough for a working set of twice the last-level
    cache (an AMX Xeon VM reports a 480 MB L3: one 392 MB Q4_K_M layer decoded alone stayed partly in it between steps
    and read "110 %" of the memory probe; docs/BENCHMARKS.md, session 18), at most 16 and a quarter of the free RAM."""
    want = -(-2 * cache_bytes // max(layer_bytes, 1))
    room = free_bytes // 4 // max(layer_bytes, 1)
    return int(max(1, min(want, 16, room)))


def run(args, E: int, H: int, I: int, k: int, threads: int, lengths: tuple[int, ...], log) -> dict:
    import torch

    import tessera.engine.native as N
    from tessera.engine.errors import TesseraError

    types = DTYPES[args.dtype]
    for t in types:
        block = 256 if t not in ("Q8_0", "Q4_0") else 32
        if H % block or I % block:
            raise TesseraError("--shape", f"{args.shape} has H={H}, I={I}: {t} rows need a multiple of {block} values "
                                          f"(use --shape tiny-q for a small quantized layer)")
    isas = [i["name"] for i in N.quant_isas() if i["available"]]
    if args.isas:
        wanted = [n.strip() for n in args.isas.split(",") if n.strip()]
        for n in wanted:
            if n not in isas:
                raise TesseraError("--isas",
                                   f"quantized ISA {n!r} is not available here (available: {', '.join(isas)})")
        isas = wanted
    timed = [i for i in isas if i != "reference"]
    log(f"bench-moe {args.shape} --dtype {args.dtype} (gate {types[0]}, up {types[1]}, down {types[2]}): "
        f"E={E} H={H} I={I} k={k}, {threads} threads; quantized ISAs: {', '.join(isas)}")
    rng = np.random.default_rng(0)
    gate = random_blocks(types[0], E, I, H, rng)
    up = random_blocks(types[1], E, I, H, rng)
    down = random_blocks(types[2], E, H, I, rng)
    bytes_per_expert = (gate.nbytes + up.nbytes + down.nbytes) / E
    log(f"layer: {(gate.nbytes + up.nbytes + down.nbytes) / 1e6:.0f} MB of blocks, {bytes_per_expert / 1e6:.2f} MB "
        f"per expert; decode reads {k * bytes_per_expert / 1e6:.1f} MB per token")
    pool = N.make_pool(threads)
    gen = torch.Generator().manual_seed(0)
    flops_per_token = 2 * k * 3 * H * I

    def draw(T):
        return torch.argsort(torch.rand(T, E, generator=gen), dim=1)[:, :k].contiguous()

    def forward(isa, ids, w, x, out, layer=None):  # layer: (gate, up, down), default the layer drawn above
        g_, u_, d_ = layer or (gate, up, down)
        N.quant_moe_forward(types[0], g_, types[1], u_, types[2], d_, ids, w, x, out, pool, isa)

    # Error: each ISA against float64 experts on the dequantized weights of the experts used (T=4).
    x4, ids4 = torch.randn(4, H, generator=gen), draw(4)
    w4 = torch.softmax(torch.randn(4, k, generator=gen), -1)
    used = sorted(set(ids4.flatten().tolist()))

    dq = {}
    for e in used:
        mats = []
        for t, raw, K in ((types[0], gate, H), (types[1], up, H), (types[2], down, I)):
            m = np.empty((raw.shape[1], K), np.float32)
            N.quant_dequantize(t, raw[e], m, pool)
            mats.append(torch.from_numpy(m).double())
        dq[e] = mats
    exact = torch.zeros(4, H, dtype=torch.float64)
    for t in range(4):
        for j in range(k):
            g_, u_, d_ = dq[int(ids4[t, j])]
            xt = x4[t].double()
            exact[t] += float(w4[t, j]) * (d_ @ (torch.nn.functional.silu(g_ @ xt) * (u_ @ xt)))

    results = {}
    for isa in isas:
        out = torch.empty(4, H)
        forward(isa, ids4, w4, x4, out)
        results[isa] = {"rel_err_vs_float64": float((out.double() - exact).norm() / exact.norm())}

    layer_bytes, cache_bytes = gate.nbytes + up.nbytes + down.nbytes, last_level_cache_bytes()
    copies = decode_copies(layer_bytes, cache_bytes, N.free_ram())
    layers = [(gate, up, down)] + [(gate.copy(), up.copy(), down.copy()) for _ in range(copies - 1)]
    working_set = copies * layer_bytes
    log(f"decode: {copies} copies of the layer cycled ({working_set / 1e6:.0f} MB; last-level cache "
        f"{cache_bytes / 1e6:.0f} MB), the probe reads as much")

    def decode_step_best(isa, seconds):
        x, w = torch.randn(1, H, generator=gen), torch.softmax(torch.randn(1, k, generator=gen), -1)
        out = torch.empty(1, H)
        ids = [draw(1) for _ in range(1000)]
        forward(isa, ids[0], w, x, out)
        n, t0, best, tb = 0, time.perf_counter(), float("inf"), time.perf_counter()
        while n < len(ids) and (n < 20 or time.perf_counter() - t0 < seconds):
            forward(isa, ids[n], w, x, out, layers[n % copies])  # fresh random experts, layer copy n % copies
            n += 1
            if n % 10 == 0:
                best, tb = min(best, (time.perf_counter() - tb) / 10), time.perf_counter()
        return (time.perf_counter() - t0) / n, best

    rounds = max(3, args.rounds)
    decode_bytes = k * bytes_per_expert
    per_round = {isa: [] for isa in timed}
    bandwidths = []
    for _ in range(rounds):  # interleaved: probe, then each ISA, every round
        bw = N.read_bandwidth(threads, seconds=0.2, buffer_mib=max(256, working_set / (1 << 20)))
        bandwidths.append(bw)
        for isa in timed:
            mean, best = decode_step_best(isa, args.seconds / rounds)
            per_round[isa].append((mean, best, bw))
    bandwidth = statistics.median(bandwidths)
    for isa in timed:
        r = results[isa]
        r["decode_us"] = 1e6 * statistics.median(m for m, _, _ in per_round[isa])
        r["decode_best_us"] = 1e6 * statistics.median(b for _, b, _ in per_round[isa])
        r["decode_gbs"] = decode_bytes / (r["decode_best_us"] * 1e-6) / 1e9
        r["decode_pct_of_bandwidth"] = 100 * statistics.median(decode_bytes / b / 1e9 / bw
                                                               for _, b, bw in per_round[isa])
        for T in lengths:
            x, w, ids = torch.randn(T, H, generator=gen), torch.softmax(torch.randn(T, k, generator=gen), -1), draw(T)
            out = torch.empty(T, H)
            forward(isa, ids, w, x, out)  # warm-up
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                forward(isa, ids, w, x, out)
                times.append(time.perf_counter() - t0)
            dt = statistics.median(times)
            r[f"prefill{T}_ms"] = 1e3 * dt
            r[f"prefill{T}_gflops"] = flops_per_token * T / dt / 1e9
        log(f"{isa:>12}: decode {r['decode_best_us']:7.0f} us {r['decode_gbs']:6.1f} GB/s "
            f"({r['decode_pct_of_bandwidth']:4.0f} % "
            f"of bandwidth, median of {rounds} interleaved rounds) | prefill "
            + ", ".join(f"T={T} {r[f'prefill{T}_ms']:6.0f} ms {r[f'prefill{T}_gflops']:6.1f} GFLOP/s" for T in lengths)
            + f" | rel err vs float64 {100 * r['rel_err_vs_float64']:.2f} %")
    for isa in isas:
        if isa not in timed:
            results[isa]["not_timed"] = "scalar correctness twin"
            log(f"{isa:>12}: not timed (scalar correctness twin) | rel err vs float64 "
                f"{100 * results[isa]['rel_err_vs_float64']:.2f} %")
    log(f"read bandwidth (median of the rounds' probes) {bandwidth:.1f} GB/s")
    return {"shape": args.shape, "dtype": args.dtype, "types": list(types), "threads": threads,
            "bandwidth_gbs": bandwidth, "bytes_per_expert": bytes_per_expert, "decode_layer_copies": copies,
            "decode_working_set_bytes": working_set, "isas": results}
