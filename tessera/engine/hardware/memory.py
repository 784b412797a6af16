"""The memory section: totals, hugepage/THP state, and a measured read bandwidth (multi-threaded and one thread).

Bandwidth comes from the native probe (`engine.native.read_bandwidth(threads, seconds)`) when the module has it, else
from a numpy fallback: each thread OR-reduces its own buffer (numpy releases the GIL in the reduction), far larger than
the last-level cache, over and over until its time is up. The report names which one ran (`bandwidth_source`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tessera.engine.errors import Cancelled
from tessera.engine.events import ProgressEvent
from tessera.engine.hardware.dimms import read_dimms, theoretical_gbs

GB = 1e9
# Per-thread buffer of the numpy fallback: several times any desktop or server L3 slice per core.
FALLBACK_BUFFER_BYTES = 96 << 20
SLICES_PER_RUN = 8  # progress ticks (and cancel checks) per measurement


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def hugepages(meminfo_text: str | None = None, thp_root: str = "/sys/kernel/mm/transparent_hugepage") -> dict:
    """THP mode (the bracketed word of .../enabled), defrag mode, and the explicit hugepage pool."""

    def bracketed(text: str) -> str | None:
        for word in text.split():
            if word.startswith("[") and word.endswith("]"):
                return word[1:-1]
        return None

    info: dict[str, int] = {}
    for line in (meminfo_text if meminfo_text is not None else _read("/proc/meminfo")).splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            info[key.strip()] = int(parts[0])
    return {
        "thp_enabled": bracketed(_read(f"{thp_root}/enabled")),
        "thp_defrag": bracketed(_read(f"{thp_root}/defrag")),
        "hugepages_total": info.get("HugePages_Total", 0),
        "hugepages_free": info.get("HugePages_Free", 0),
        "hugepage_size_kb": info.get("Hugepagesize", 0),
    }


def _native_probe() -> Callable[[int, float], float] | None:
    from tessera.engine.errors import TesseraError

    try:
        from tessera.engine import native  # optional until the native module is built

        native.layout_version()  # raises BackendUnavailableError when engine._native is not built
    except (ImportError, AttributeError, TesseraError):
        return None
    return getattr(native, "read_bandwidth", None)


def _numpy_probe(threads: int, seconds: float, buffers: list) -> float:
    """GB/s read by `threads` threads, each OR-reducing its own buffer for `seconds`."""
    import numpy as np

    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        buf = buffers[i]
        barrier.wait()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            np.bitwise_or.reduce(buf)
            counts[i] += buf.nbytes

    pool = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - t0) / GB


def _native_with_ticks(native: Callable[[int, float], float], threads: int, seconds: float, stage: str,
                       progress: Callable[[ProgressEvent], None] | None) -> float:
    """One native measurement (it cannot report progress itself): a helper thread ticks progress by elapsed time."""
    stop = threading.Event()

    def tick() -> None:
        for i in range(1, SLICES_PER_RUN):
            if stop.wait(seconds / SLICES_PER_RUN):
                return
            progress(ProgressEvent(stage, i, SLICES_PER_RUN, f"{threads} thread(s): measuring"))

    ticker = threading.Thread(target=tick, daemon=True) if progress is not None else None
    if ticker is not None:
        ticker.start()
    try:
        gbs = float(native(threads, seconds))
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
    if progress is not None:
        progress(ProgressEvent(stage, SLICES_PER_RUN, SLICES_PER_RUN, f"{threads} thread(s): {gbs:.1f} GB/s"))
    return gbs


def measure_read_bandwidth(threads: int, seconds: float, *, stage: str = "bandwidth",
                           progress: Callable[[ProgressEvent], None] | None = None,
                           cancel: threading.Event | None = None) -> tuple[float, str]:
    """(GB/s, source) of a sustained multi-threaded read, measured for about `seconds`.

    `progress` gets SLICES_PER_RUN ProgressEvents (done 1..SLICES_PER_RUN); `cancel` is checked between slices of the
    numpy fallback and before the native call (which runs to its end once started) and raises Cancelled.
    """
    threads = max(1, int(threads))
    if cancel is not None and cancel.is_set():
        raise Cancelled()
    native = _native_probe()
    if native is not None:
        # Short runs use a smaller buffer (still far beyond a desktop L3) so setting it up does not dominate.
        mib = 256.0 if seconds < 1.0 else 1024.0

        def probe(n, s):
            return native(n, s, mib)

        gbs = _native_with_ticks(probe, threads, seconds, stage, progress)
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        return gbs, "native"
    import numpy as np

    buffers = [np.ones(FALLBACK_BUFFER_BYTES // 8, dtype=np.uint64) for _ in range(threads)]  # [N] per thread
    slice_s = max(0.02, seconds / SLICES_PER_RUN)
    rates = []
    for i in range(SLICES_PER_RUN):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        rates.append(_numpy_probe(threads, slice_s, buffers))
        if progress is not None:
            progress(ProgressEvent(stage, i + 1, SLICES_PER_RUN, f"{threads} thread(s): {max(rates):.1f} GB/s"))
    # The best slice is the sustained figure the machine can give; slower slices are other processes' noise.
    return max(rates), "numpy-fallback"


def probe_memory(threads: int, seconds: float, *, progress=None, cancel=None) -> dict:
    """The report's `memory` object. `threads` for the multi-threaded figure (physical cores is the sensible choice)."""
    vm = psutil.virtual_memory()
    multi, source = measure_read_bandwidth(threads, seconds, stage="bandwidth", progress=progress, cancel=cancel)
    single, _ = measure_read_bandwidth(1, seconds / 2, stage="bandwidth-1t", progress=progress, cancel=cancel)
    dimms, dimms_note = read_dimms()
    peak = theoretical_gbs(dimms)
    return {
        "total_gb": round(vm.total / GB, 2),
        "available_gb": round(vm.available / GB, 2),
        "read_bandwidth_gbs": round(multi, 2),
        "read_bandwidth_1t_gbs": round(single, 2),
        "bandwidth_threads": threads,
        "bandwidth_source": source,
        **hugepages(),
        "dimms": dimms,
        "dimms_note": dimms_note,
        "theoretical_gbs": None if peak is None else round(peak, 1),
    }
