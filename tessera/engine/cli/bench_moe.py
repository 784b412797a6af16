"""`tessera-cli bench-moe`: one real Qwen3-MoE expert layer with random bf16 weights, timed per native backend.

Decode (T=1) as microseconds and effective GB/s of packed expert weights read, also as a percentage of this machine's
read bandwidth measured by the same command (native multi-threaded probe, same thread count); prefill (T=128, 512, 2048,
4096) as GFLOP/s and as a percentage of the register peak of the instruction the backend's prefill runs on, probed by
the same command (PREFILL_PEAK: tdpbf16ps / tdpbssd tiles where the CPU has AMX, vdpbf16ps, vpdpbusd, f32 FMA); the
naive pure-torch experts side by side. Each timed iteration draws fresh random experts, so weights come
from memory, not cache. Emulated backends (the AMX emulator) and the scalar Reference are checked for error but not
timed. Letters: T tokens, H hidden, I intermediate, E experts, k experts per token.
"""

from __future__ import annotations

from tessera.engine.config import PUBLISHED

HELP = "benchmark the CPU MoE kernels on one real Qwen3-MoE layer shape (random weights)"

SHAPES = {  # E, H, I, k: the published configs' values, and tiny ones for tests of the command itself
    **{n: (c.num_experts, c.hidden_size, c.moe_intermediate_size, c.num_experts_per_tok) for n, c in PUBLISHED.items()},
    "tiny": (16, 64, 32, 4),
    "tiny-q": (16, 256, 256, 4),  # rows of whole 256-value super-blocks (quantized --dtype)
}


PROMPT_LENGTHS = (128, 512, 2048, 4096)
# Register peaks probed (engine.native.peak_gflops names), with the instruction each measures, for the log.
PEAKS = {"amx_bf16": "tdpbf16ps", "amx_int8": "tdpbssd", "bf16_dot": "vdpbf16ps", "int8_dot": "vpdpbusd",
         "fp32_fma": "fp32 FMA"}


def prefill_peak(name: str, peaks: dict[str, float]) -> str | None:
    """The peak a backend's prefill is judged by: the instruction its prefill multiplies with on this CPU (AMX tiles
    for AMX*, vpdpbusd for AVX512Int8, vdpbf16ps for AVX512 where the CPU has avx512_bf16 and f32 FMA where not, f32
    FMA for AVX2); None for a backend no peak describes."""
    if name.startswith("AMX"):
        return "amx_int8" if "Int8" in name else "amx_bf16"
    if name == "AVX512Int8":
        return "int8_dot"
    if name == "AVX512":
        return "bf16_dot" if peaks.get("bf16_dot", -1) >= 0 else "fp32_fma"
    if name == "AVX2":
        return "fp32_fma"
    return None


def _gflops(peak: float, unit: str = "GFLOP/s") -> str:
    """A register peak for the log: the probe returns a negative number when the CPU lacks the instruction."""
    return f"{peak:.0f} {unit}" if peak >= 0 else "n/a (CPU lacks it)"


def _peaks_line(peaks: dict[str, float]) -> str:
    return ", ".join(f"{PEAKS[w]} {_gflops(p, 'GOP/s' if 'int8' in w else 'GFLOP/s')}" for w, p in peaks.items())


def _or_none(peak: float) -> float | None:
    return peak if peak >= 0 else None


def add_arguments(p) -> None:
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b", help="layer shape (default %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="threads for kernels and the bandwidth probe "
                   "(default: physical cores)")
    p.add_argument("--backends", default=None, help="comma-separated subset to time (default: every available one)")
    p.add_argument("--seconds", type=float, default=2.0,
                   help="time budget per decode measurement (default %(default)s)")
    p.add_argument("--no-torch", action="store_true", help="skip the naive torch baseline")
    p.add_argument("--prompt-lengths", default=",".join(map(str, PROMPT_LENGTHS)), metavar="T,T,...",
                   help="prefill lengths to time (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--dtype", default="bf16", choices=["bf16", *sorted(_quant_dtypes())],
                   help="expert weights: bf16 (packed per backend) or GGUF quantized blocks read in place by the "
                        "quantized kernels (q4_k_m / q5_k_m: down one type above gate/up) (default %(default)s)")
    p.add_argument("--isas", default=None, help="with a quantized --dtype: comma-separated quantized ISAs to run "
                   "(amx_int8, avx512_vnni, avx2, reference; default: every available one)")
    p.add_argument("--rounds", type=int, default=5, help="with a quantized --dtype: interleaved decode rounds "
                   "(default %(default)s)")


def _quant_dtypes():
    from tessera.engine.cli.bench_moe_quant import DTYPES

    return DTYPES


def run(args) -> int:
    import json
    import statistics
    import time

    import torch

    import tessera.engine.backends as backends
    import tessera.engine.native as N
    from tessera.engine.errors import TesseraError
    from tessera.engine.experts import LayerExperts, TorchExperts

    E, H, I, k = SHAPES[args.shape]
    lengths = _prompt_lengths(args.prompt_lengths)
    threads = args.threads or N.physical_cores()
    if threads < 1:
        raise TesseraError("--threads", f"must be at least 1, got {threads}")
    torch.set_num_threads(threads)
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))
    if getattr(args, "dtype", "bf16") != "bf16":  # quantized GGUF blocks: tessera/engine/cli/bench_moe_quant.py
        from tessera.engine.cli import bench_moe_quant

        result = bench_moe_quant.run(args, E, H, I, k, threads, lengths, log)
        if args.json:
            print(json.dumps(result))
        return 0
    info = {b["name"]: b for b in backends.compiled()}
    if args.backends:
        wanted = [n.strip() for n in args.backends.split(",") if n.strip()]
        for n in wanted:
            backends.resolve(n)  # named error for unknown/unavailable ones
    else:
        wanted = [n for n, b in info.items() if b["available"]]
    timed = [n for n in wanted if not info[n]["emulated"] and n != "Reference"]
    checked_only = [n for n in wanted if n not in timed]

    log(f"bench-moe {args.shape}: E={E} H={H} I={I} k={k}, {threads} threads")
    def probe():  # best of a read-bandwidth pass and register peaks; run before and after the backends
        bw = N.read_bandwidth(threads, seconds=min(1.0, args.seconds), buffer_mib=1024 if E * H * I > 1e6 else 64)
        return bw, {w: N.peak_gflops(w, threads, seconds=min(0.5, args.seconds)) for w in PEAKS}

    bandwidth, peaks = probe()
    log(f"read bandwidth {bandwidth:.1f} GB/s; register peaks: {_peaks_line(peaks)} (probed again at the end; the "
        "best of both is used)")

    gen = torch.Generator().manual_seed(0)

    def weights(*shape):  # [.., out, in] bf16, unit-variance outputs
        return (torch.randn(*shape, generator=gen) * shape[-1] ** -0.5).to(torch.bfloat16)

    layer = LayerExperts(gate_proj=weights(E, I, H), up_proj=weights(E, I, H), down_proj=weights(E, H, I))
    layers = {0: layer}
    flops_per_token = 2 * k * 3 * H * I

    def draw(T):  # [T, k] distinct random experts per token, fresh per iteration
        return torch.argsort(torch.rand(T, E, generator=gen), dim=1)[:, :k].contiguous()

    def inputs(T):
        return torch.randn(T, H, generator=gen), torch.softmax(torch.randn(T, k, generator=gen), -1)

    def time_decode(backend, seconds=None, copies=1):
        """(mean, best batch-of-10 mean) seconds per decode step over about `seconds`, the steps cycling through
        `copies` packed copies of the layer (layer ids 0 .. copies - 1)."""
        x, w = inputs(1)
        backend.forward(0, x, draw(1), w)
        ids = [draw(1) for _ in range(2000)]
        n, t0, best, tb = 0, time.perf_counter(), float("inf"), time.perf_counter()
        while n < len(ids) and (n < 10 or time.perf_counter() - t0 < (seconds or args.seconds)):
            backend.forward(n % copies, x, ids[n], w)
            n += 1
            if n % 10 == 0:
                best, tb = min(best, (time.perf_counter() - tb) / 10), time.perf_counter()
        return (time.perf_counter() - t0) / n, best

    def interleaved_pct(backend, decode_bytes, copies, rounds=5):
        """Median over rounds of (decode GB/s / probe GB/s), probe and decode back to back, both as their best pass
        (the probe reports its best pass): on a shared machine one probe and one decode timing rarely see the same
        load. The probe reads as many bytes as the decode steps' copies of the layer hold."""
        mib = max(256, copies * backend.load_stats.packed_bytes / (1 << 20)) if E * H * I > 1e6 else 16
        ratios = []
        for _ in range(rounds):
            bw = N.read_bandwidth(threads, seconds=0.1, buffer_mib=mib)
            ratios.append(decode_bytes / time_decode(backend, args.seconds / rounds, copies)[1] / 1e9 / bw)
        return 100 * statistics.median(ratios)

    def time_prefill(backend, T, budget):
        x, w = inputs(T)
        backend.forward(0, x, draw(T), w)  # warm-up (scratch buffers, pages)
        n, t0 = 0, time.perf_counter()
        while n < 1 or (n < 5 and time.perf_counter() - t0 < budget):
            backend.forward(0, x, draw(T), w)
            n += 1
        return (time.perf_counter() - t0) / n

    # Error reference: fp32 torch on the same bf16 weights, T=1 and T=128 (prefill path).
    ref_torch = TorchExperts(layers)
    err_inputs = []
    for T in (1, 128):
        x, w = inputs(T)
        ids = draw(T)
        err_inputs.append((x, ids, w, ref_torch.forward(0, x, ids, w)))

    def max_rel_err(backend):
        return max(float((backend.forward(0, x, ids, w) - ref).norm() / ref.norm()) for x, ids, w, ref in err_inputs)

    from tessera.engine.cli.bench_moe_quant import decode_copies, last_level_cache_bytes

    results = {}
    for name in timed + checked_only:
        t0 = time.perf_counter()
        backend = N.make_backend(name, layers, threads=threads)
        pack_s = time.perf_counter() - t0
        bytes_per_expert = backend.load_stats.packed_bytes / E
        r = {"max_rel_err": max_rel_err(backend), "pack_s": pack_s}
        if name in timed:
            # Decode cycles through packed copies of the layer past the last-level cache (a ~640 MB int8 layer
            # decoded alone stays partly in a 480 MB L3 between steps): the same weights packed again as layers 1..
            copies = decode_copies(backend.load_stats.packed_bytes, last_level_cache_bytes(), N.free_ram())
            if copies > 1:
                del backend
                backend = N.make_backend(name, {i: layer for i in range(copies)}, threads=threads)
            dt, _ = time_decode(backend, copies=copies)
            gbs = k * bytes_per_expert / dt / 1e9
            r.update(decode_us=dt * 1e6, decode_gbs=gbs, decode_pct_of_bandwidth=100 * gbs / bandwidth,
                     decode_pct_interleaved=interleaved_pct(backend, k * bytes_per_expert, copies),
                     decode_layer_copies=copies)
            for T in lengths:
                r[f"prefill{T}_gflops"] = flops_per_token * T / time_prefill(backend, T, args.seconds) / 1e9
            r["prefill_peak"] = prefill_peak(name, peaks)
            log(f"{name:>11}: decode {r['decode_us']:8.0f} us {gbs:6.1f} GB/s "
                f"({r['decode_pct_of_bandwidth']:4.0f} % of "
                f"bandwidth; {r['decode_pct_interleaved']:4.0f} % interleaved) | max rel err "
                f"{100 * r['max_rel_err']:.2f} % | pack {pack_s:.1f} s")
        else:
            why = "emulated" if info[name]["emulated"] else "scalar correctness twin"
            r["not_timed"] = why
            log(f"{name:>11}: not timed ({why}) | max rel err {100 * r['max_rel_err']:.2f} %")
        results[name] = r
        del backend

    bandwidth_end, peaks_end = probe()  # on a shared machine the first probe may have been unlucky: keep the best
    if bandwidth_end > bandwidth:
        bandwidth = bandwidth_end
        for r in results.values():
            if "decode_gbs" in r:
                r["decode_pct_of_bandwidth"] = 100 * r["decode_gbs"] / bandwidth
    peaks = {w: max(peaks[w], peaks_end[w]) for w in peaks}
    log(f"read bandwidth (best of start/end) {bandwidth:.1f} GB/s; peaks {_peaks_line(peaks)}; decode percentages are "
        "of this bandwidth, prefill percentages of the peak of the instruction each backend's prefill runs on")
    for name, r in results.items():  # prefill as % of the best peak, once both probes are in
        if "prefill_peak" not in r:
            continue
        peak = peaks.get(r["prefill_peak"], -1) if r["prefill_peak"] else -1
        for T in lengths:
            r[f"prefill{T}_pct_of_peak"] = 100 * r[f"prefill{T}_gflops"] / peak if peak > 0 else None
        unit = "GOP/s" if "int8" in r["prefill_peak"] else "GFLOP/s"
        of = f"{PEAKS[r['prefill_peak']]} {_gflops(peak, unit)}" if peak > 0 else "no peak applies"
        log(f"{name:>11}: prefill " + ", ".join(
            f"T={T} {r[f'prefill{T}_gflops']:6.1f} GFLOP/s"
            + (f" ({r[f'prefill{T}_pct_of_peak']:3.0f} %)" if r[f"prefill{T}_pct_of_peak"] is not None else "")
            for T in lengths) + f" | % of {of}")

    torch_baseline = None
    if not args.no_torch:
        naive = TorchExperts(layers)
        dt, _ = time_decode(naive)
        gbs = k * 3 * H * I * 2 / dt / 1e9
        torch_baseline = {"decode_us": dt * 1e6, "decode_gbs": gbs, "decode_pct_of_bandwidth": 100 * gbs / bandwidth}
        for T in lengths:
            torch_baseline[f"prefill{T}_gflops"] = flops_per_token * T / time_prefill(naive, T, args.seconds) / 1e9
        log(f"{'torch':>11}: decode {torch_baseline['decode_us']:8.0f} us {gbs:6.1f} GB/s "
            f"({torch_baseline['decode_pct_of_bandwidth']:4.0f} % of bandwidth) | prefill "
            + ", ".join(f"T={T} {torch_baseline[f'prefill{T}_gflops']:6.1f} GFLOP/s" for T in lengths)
            + " (naive: bf16 -> f32 per expert per call)")
    if args.json:
        print(json.dumps({"shape": args.shape, "threads": threads, "bandwidth_gbs": bandwidth,
                          "peak_bf16_gflops": _or_none(peaks["bf16_dot"]),
                          "peak_fp32_gflops": _or_none(peaks["fp32_fma"]),
                          "peak_int8_gops": _or_none(peaks["int8_dot"]),
                          "amx_bf16_peak_gflops": _or_none(peaks["amx_bf16"]),
                          "amx_int8_peak_gops": _or_none(peaks["amx_int8"]),
                          "prompt_lengths": list(lengths),
                          "backends": {n: r for n, r in results.items() if "not_timed" not in r},
                          "not_timed": {n: r for n, r in results.items() if "not_timed" in r},
                          "torch_baseline": torch_baseline}))
    return 0


def _prompt_lengths(text: str) -> tuple[int, ...]:
    """--prompt-lengths "128,512": positive whole numbers, else a TesseraError naming the flag."""
    from tessera.engine.errors import TesseraError

    try:
        lengths = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 1:
        raise TesseraError("--prompt-lengths", f"expected comma-separated token counts >= 1, got {text!r}")
    return lengths
